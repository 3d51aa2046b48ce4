package coordinator

import "fmt"

// Solana writes a public key in base58 with the Bitcoin alphabet (no 0, O,
// I or l): the key read as one big-endian number, in base 58, with one '1'
// for each leading zero byte.
const base58Alphabet = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"

var base58Digit = func() [256]int8 {
	var t [256]int8
	for i := range t {
		t[i] = -1
	}
	for i := 0; i < len(base58Alphabet); i++ {
		t[base58Alphabet[i]] = int8(i)
	}
	return t
}()

// String is k in Solana's base58 form.
func (k Pubkey) String() string { return Base58(k[:]) }

// ParsePubkey reads a base58 public key (Solana's address form). It refuses
// characters outside the alphabet and anything that is not 32 bytes.
func ParsePubkey(s string) (Pubkey, error) {
	var k Pubkey
	b, err := DecodeBase58(s)
	if err != nil {
		return k, err
	}
	if len(b) != len(k) {
		return k, fmt.Errorf("coordinator: address %q is %d bytes, want 32", s, len(b))
	}
	copy(k[:], b)
	return k, nil
}

// Base58 encodes bytes; each leading zero byte becomes a leading '1'.
func Base58(b []byte) string {
	zeros := 0
	for zeros < len(b) && b[zeros] == 0 {
		zeros++
	}
	// Repeated division of the big-endian number by 58, least significant
	// digit first.
	digits := make([]byte, 0, len(b)*138/100+1)
	for _, v := range b[zeros:] {
		carry := int(v)
		for i := range digits {
			carry += int(digits[i]) << 8
			digits[i] = byte(carry % 58)
			carry /= 58
		}
		for carry > 0 {
			digits = append(digits, byte(carry%58))
			carry /= 58
		}
	}
	out := make([]byte, zeros+len(digits))
	for i := 0; i < zeros; i++ {
		out[i] = '1'
	}
	for i, d := range digits {
		out[len(out)-1-i] = base58Alphabet[d]
	}
	return string(out)
}

// DecodeBase58 is the inverse of Base58.
func DecodeBase58(s string) ([]byte, error) {
	zeros := 0
	for zeros < len(s) && s[zeros] == '1' {
		zeros++
	}
	bytes := make([]byte, 0, len(s))
	for i := zeros; i < len(s); i++ {
		d := base58Digit[s[i]]
		if d < 0 {
			return nil, fmt.Errorf("coordinator: %q is not base58 (character %q)", s, s[i])
		}
		carry := int(d)
		for j := range bytes {
			carry += int(bytes[j]) * 58
			bytes[j] = byte(carry)
			carry >>= 8
		}
		for carry > 0 {
			bytes = append(bytes, byte(carry))
			carry >>= 8
		}
	}
	out := make([]byte, zeros+len(bytes))
	for i, b := range bytes {
		out[len(out)-1-i] = b
	}
	return out, nil
}
