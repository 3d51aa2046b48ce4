package secagg

import (
	"errors"
	"fmt"
)

// Shamir secret sharing over GF(2⁸) (the AES field, x⁸+x⁴+x³+x+1), each
// byte of the secret with its own polynomial of degree t−1; a share's x
// coordinate is its holder's index (1..255).

var gfExp, gfLog [256]byte

func init() {
	x := byte(1)
	for i := range 255 {
		gfExp[i] = x
		gfLog[x] = byte(i)
		// multiply by the generator 3: x·2 ⊕ x
		x2 := x << 1
		if x&0x80 != 0 {
			x2 ^= 0x1b
		}
		x ^= x2
	}
	gfExp[255] = gfExp[0]
}

func gfMul(a, b byte) byte {
	if a == 0 || b == 0 {
		return 0
	}
	return gfExp[(int(gfLog[a])+int(gfLog[b]))%255]
}

func gfDiv(a, b byte) byte {
	if a == 0 {
		return 0
	}
	return gfExp[(int(gfLog[a])+255-int(gfLog[b]))%255]
}

// ErrShares reports shares that cannot rebuild a secret.
var ErrShares = errors.New("secagg: not enough consistent shares")

// split shares secret among xs with threshold t; coeffs supplies the
// (t−1)·len(secret) random coefficient bytes.
func split(secret []byte, t int, xs []byte, coeffs []byte) ([][]byte, error) {
	if t < 1 || t > len(xs) || len(coeffs) < (t-1)*len(secret) {
		return nil, fmt.Errorf("secagg: threshold %d of %d holders", t, len(xs))
	}
	out := make([][]byte, len(xs))
	for i := range out {
		out[i] = make([]byte, len(secret))
	}
	for j, s := range secret {
		c := coeffs[j*(t-1) : (j+1)*(t-1)]
		for i, x := range xs {
			if x == 0 {
				return nil, errors.New("secagg: share coordinate 0 is the secret")
			}
			// Horner: s + c0·x + c1·x² + ...
			y := byte(0)
			for k := len(c) - 1; k >= 0; k-- {
				y = gfMul(y^c[k], x)
			}
			out[i][j] = y ^ s
		}
	}
	return out, nil
}

// combine rebuilds a secret from t or more shares (x → share), by
// Lagrange interpolation at 0 over the first t coordinates given.
func combine(xs []byte, shares [][]byte, t int) ([]byte, error) {
	if len(xs) < t || len(xs) != len(shares) || t < 1 {
		return nil, fmt.Errorf("%w: %d of threshold %d", ErrShares, len(xs), t)
	}
	xs, shares = xs[:t], shares[:t]
	n := len(shares[0])
	for i, x := range xs {
		if len(shares[i]) != n || x == 0 {
			return nil, fmt.Errorf("%w: share of %d bytes at x=%d", ErrShares, len(shares[i]), x)
		}
		for _, y := range xs[:i] {
			if y == x {
				return nil, fmt.Errorf("%w: two shares at x=%d", ErrShares, x)
			}
		}
	}
	secret := make([]byte, n)
	for i, xi := range xs {
		// l_i(0) = Π_{j≠i} x_j / (x_j ⊕ x_i)
		l := byte(1)
		for j, xj := range xs {
			if j != i {
				l = gfMul(l, gfDiv(xj, xj^xi))
			}
		}
		for k := range secret {
			secret[k] ^= gfMul(l, shares[i][k])
		}
	}
	return secret, nil
}
