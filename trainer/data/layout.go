package data

import (
	"encoding/binary"
	"fmt"
	"math"
)

// Layout is how a data file stores its tokens: Count integers of Width
// bytes each, starting Offset bytes into the file. It is the one place that
// knows the byte formats of tokens:
//
//	format                     Offset        Width       Signed  BigEndian  Count
//	token file (ours)          0             token_size  no      no         size/Width
//	nanoGPT .bin (u16 or u32)  0             token_size  no      no         size/Width
//	NumPy .npy                 header length dtype size  dtype   dtype      shape[0]
//
// Our token files and nanoGPT's train.bin/val.bin (numpy's tofile of a
// uint16 array) are the same thing: a flat little-endian array with no
// header, whose width the run names (model.token_size). A .npy file's header
// names its own dtype and length (see npy.go).
type Layout struct {
	Offset    int64 // bytes before the first token
	Width     int   // bytes per token: 1, 2, 4 or 8
	Signed    bool  // two's complement (a negative token is out of range)
	BigEndian bool
	Count     int64 // number of tokens; -1: as many as follow Offset
}

// FlatLayout is the layout of a headerless token file of tokenSize-byte
// little-endian unsigned tokens.
func FlatLayout(tokenSize int) Layout { return Layout{Width: tokenSize, Count: -1} }

func (l Layout) check() error {
	switch l.Width {
	case 1, 2, 4, 8:
	default:
		return fmt.Errorf("data: token width must be 1, 2, 4 or 8 bytes, got %d", l.Width)
	}
	if l.Offset < 0 || l.Count < -1 {
		return fmt.Errorf("data: bad layout: offset %d, count %d", l.Offset, l.Count)
	}
	return nil
}

// String describes the layout for logs and errors, as a NumPy dtype.
func (l Layout) String() string {
	order, kind := "<", "u"
	if l.BigEndian {
		order = ">"
	}
	if l.Width == 1 {
		order = "|"
	}
	if l.Signed {
		kind = "i"
	}
	return fmt.Sprintf("%s%s%d", order, kind, l.Width)
}

// decode decodes the len(b)/Width tokens in b into dst[:len(b)/Width]. A
// value that is negative or above MaxUint32 fails with ErrTokenRange and
// the index of the token in b (the error does not wrap the sentinel:
// callers add it with the file's name).
func (l Layout) decode(dst []uint32, b []byte) (int, error) {
	n := len(b) / l.Width
	dst = dst[:n]
	if !l.Signed && !l.BigEndian {
		switch l.Width {
		case 2:
			for i := range dst {
				dst[i] = uint32(binary.LittleEndian.Uint16(b[2*i:]))
			}
			return -1, nil
		case 4:
			for i := range dst {
				dst[i] = binary.LittleEndian.Uint32(b[4*i:])
			}
			return -1, nil
		}
	}
	var order binary.ByteOrder = binary.LittleEndian
	if l.BigEndian {
		order = binary.BigEndian
	}
	for i := range dst {
		var u uint64
		p := b[i*l.Width:]
		switch l.Width {
		case 1:
			u = uint64(p[0])
			if l.Signed {
				u = uint64(int64(int8(p[0])))
			}
		case 2:
			u = uint64(order.Uint16(p))
			if l.Signed {
				u = uint64(int64(int16(u)))
			}
		case 4:
			u = uint64(order.Uint32(p))
			if l.Signed {
				u = uint64(int64(int32(u)))
			}
		case 8:
			u = order.Uint64(p)
		}
		if (l.Signed && int64(u) < 0) || u > math.MaxUint32 {
			v := fmt.Sprint(u)
			if l.Signed {
				v = fmt.Sprint(int64(u))
			}
			return i, fmt.Errorf("token %s does not fit in 32 bits unsigned", v)
		}
		dst[i] = uint32(u)
	}
	return -1, nil
}
