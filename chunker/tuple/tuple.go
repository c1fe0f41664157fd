// Package tuple implements the FoundationDB tuple layer encoding, written from its published
// specification (https://github.com/apple/foundationdb/blob/main/design/tuple.md).
//
// The encoding is self-describing (every element starts with a type code), canonical (one
// encoding per value) and order-preserving (the bytes of two tuples compare as the tuples do).
// Tidemark uses it for row keys, which the engine compares for equality only: a key read by the
// backfill and the same key seen in the change stream must encode to the same bytes.
//
// Supported elements and their Go types: null (nil), byte string ([]byte), unicode string
// (string), nested tuple (Tuple), integers of any size (int, int64, uint64, *big.Int; decoded as
// int64 when they fit, else uint64 when they fit, else *big.Int), float (float32), double
// (float64), booleans (bool) and RFC 4122 UUIDs (UUID).
//
// The official Go binding's tuple package imports the cgo fdb package and cannot build without
// libfdb_c, hence this implementation.
package tuple

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/big"
)

// Type codes of the specification.
const (
	codeNull       = 0x00
	codeBytes      = 0x01
	codeString     = 0x02
	codeNested     = 0x05
	codeNegBig     = 0x0b
	codeIntZero    = 0x14
	codePosBig     = 0x1d
	codeFloat      = 0x20
	codeDouble     = 0x21
	codeFalse      = 0x26
	codeTrue       = 0x27
	codeUUID       = 0x30
	escape         = 0xff
	maxBigIntBytes = 255
)

// Tuple is an ordered list of elements.
type Tuple []any

// UUID is an RFC 4122 UUID in network byte order.
type UUID [16]byte

// ErrInvalid reports bytes that are not a valid encoding, or an element of an unsupported type.
var ErrInvalid = errors.New("invalid tuple")

// Pack encodes t. It panics on an element of an unsupported type, which is a programming error;
// use Append to get an error instead.
func (t Tuple) Pack() []byte {
	b, err := Append(nil, t...)
	if err != nil {
		panic(err)
	}
	return b
}

// Append appends the encoding of the elements to dst.
func Append(dst []byte, elems ...any) ([]byte, error) {
	return appendElems(dst, elems, false)
}

func appendElems(dst []byte, elems []any, nested bool) ([]byte, error) {
	for _, e := range elems {
		var err error
		if dst, err = appendElem(dst, e, nested); err != nil {
			return nil, err
		}
	}
	return dst, nil
}

func appendElem(dst []byte, e any, nested bool) ([]byte, error) {
	switch v := e.(type) {
	case nil:
		if nested {
			return append(dst, codeNull, escape), nil
		}
		return AppendNull(dst), nil
	case []byte:
		return AppendBytes(dst, v), nil
	case string:
		return AppendString(dst, v), nil
	case Tuple:
		dst = append(dst, codeNested)
		dst, err := appendElems(dst, v, true)
		if err != nil {
			return nil, err
		}
		return append(dst, codeNull), nil
	case int:
		return AppendInt(dst, int64(v)), nil
	case int64:
		return AppendInt(dst, v), nil
	case uint64:
		return AppendUint(dst, v), nil
	case *big.Int:
		return AppendBigInt(dst, v)
	case float32:
		return AppendFloat(dst, v), nil
	case float64:
		return AppendDouble(dst, v), nil
	case bool:
		return AppendBool(dst, v), nil
	case UUID:
		return AppendUUID(dst, v), nil
	}
	return nil, fmt.Errorf("%w: element of type %T", ErrInvalid, e)
}

// AppendNull appends a null element (top level).
func AppendNull(dst []byte) []byte { return append(dst, codeNull) }

// AppendBytes appends a byte string element.
func AppendBytes(dst, b []byte) []byte {
	dst = append(dst, codeBytes)
	return append(appendEscaped(dst, b), 0x00)
}

// AppendString appends a unicode string element; s must be UTF-8.
func AppendString(dst []byte, s string) []byte {
	dst = append(dst, codeString)
	for {
		i := indexNull(s)
		if i < 0 {
			break
		}
		dst = append(append(dst, s[:i]...), 0x00, escape)
		s = s[i+1:]
	}
	return append(append(dst, s...), 0x00)
}

// AppendStringBytes appends a unicode string element from UTF-8 bytes, without a conversion.
func AppendStringBytes(dst, s []byte) []byte {
	dst = append(dst, codeString)
	return append(appendEscaped(dst, s), 0x00)
}

func appendEscaped(dst, b []byte) []byte {
	for {
		i := bytes.IndexByte(b, 0x00)
		if i < 0 {
			return append(dst, b...)
		}
		dst = append(append(dst, b[:i]...), 0x00, escape)
		b = b[i+1:]
	}
}

func indexNull(s string) int {
	for i := 0; i < len(s); i++ {
		if s[i] == 0 {
			return i
		}
	}
	return -1
}

// AppendInt appends an integer element.
func AppendInt(dst []byte, v int64) []byte {
	if v >= 0 {
		return AppendUint(dst, uint64(v))
	}
	// Negative: the magnitude's minimal big-endian bytes, one's complemented. -(MinInt64) is 2^63,
	// which uint64 holds.
	mag := uint64(-(v + 1)) + 1
	n := byteLen(mag)
	dst = append(dst, byte(codeIntZero-n))
	var buf [8]byte
	binary.BigEndian.PutUint64(buf[:], ^mag)
	return append(dst, buf[8-n:]...)
}

// AppendUint appends a non-negative integer element.
func AppendUint(dst []byte, v uint64) []byte {
	if v == 0 {
		return append(dst, codeIntZero)
	}
	n := byteLen(v)
	dst = append(dst, byte(codeIntZero+n))
	var buf [8]byte
	binary.BigEndian.PutUint64(buf[:], v)
	return append(dst, buf[8-n:]...)
}

// AppendBigInt appends an integer element of any size: the short forms when it fits in 8 bytes,
// else the arbitrary-precision forms (0x1d positive, 0x0b negative) with up to 255 bytes.
func AppendBigInt(dst []byte, v *big.Int) ([]byte, error) {
	if v.IsInt64() {
		return AppendInt(dst, v.Int64()), nil
	}
	if v.IsUint64() {
		return AppendUint(dst, v.Uint64()), nil
	}
	mag := new(big.Int).Abs(v).Bytes()
	if len(mag) > maxBigIntBytes {
		return nil, fmt.Errorf("%w: integer of %d bytes (at most %d)", ErrInvalid, len(mag), maxBigIntBytes)
	}
	if v.Sign() > 0 {
		dst = append(dst, codePosBig, byte(len(mag)))
		return append(dst, mag...), nil
	}
	if len(mag) <= 8 {
		// A negative magnitude of 8 bytes that is not an int64 (below -2^63): the short form.
		var buf [8]byte
		copy(buf[8-len(mag):], mag)
		dst = append(dst, byte(codeIntZero-8))
		m := binary.BigEndian.Uint64(buf[:])
		binary.BigEndian.PutUint64(buf[:], ^m)
		return append(dst, buf[:]...), nil
	}
	dst = append(dst, codeNegBig, byte(len(mag))^0xff)
	for _, b := range mag {
		dst = append(dst, ^b)
	}
	return dst, nil
}

func byteLen(v uint64) int {
	n := 0
	for v != 0 {
		n++
		v >>= 8
	}
	return n
}

// AppendFloat appends a 32-bit float element.
func AppendFloat(dst []byte, f float32) []byte {
	bits := math.Float32bits(f)
	if bits&(1<<31) != 0 {
		bits = ^bits
	} else {
		bits ^= 1 << 31
	}
	return binary.BigEndian.AppendUint32(append(dst, codeFloat), bits)
}

// AppendDouble appends a 64-bit float element.
func AppendDouble(dst []byte, f float64) []byte {
	bits := math.Float64bits(f)
	if bits&(1<<63) != 0 {
		bits = ^bits
	} else {
		bits ^= 1 << 63
	}
	return binary.BigEndian.AppendUint64(append(dst, codeDouble), bits)
}

// AppendBool appends a boolean element.
func AppendBool(dst []byte, b bool) []byte {
	if b {
		return append(dst, codeTrue)
	}
	return append(dst, codeFalse)
}

// AppendUUID appends a UUID element.
func AppendUUID(dst []byte, u UUID) []byte { return append(append(dst, codeUUID), u[:]...) }

// Unpack decodes an encoded tuple.
func Unpack(b []byte) (Tuple, error) {
	t, rest, err := decode(b, false)
	if err != nil {
		return nil, err
	}
	if len(rest) != 0 {
		return nil, fmt.Errorf("%w: %d trailing bytes", ErrInvalid, len(rest))
	}
	return t, nil
}

// decode decodes elements until the input ends or, when nested, until the nested tuple's end.
func decode(b []byte, nested bool) (Tuple, []byte, error) {
	t := Tuple{}
	for len(b) > 0 {
		code := b[0]
		if nested && code == codeNull {
			if len(b) > 1 && b[1] == escape {
				t = append(t, nil)
				b = b[2:]
				continue
			}
			return t, b[1:], nil
		}
		b = b[1:]
		var e any
		var err error
		switch {
		case code == codeNull:
			e = nil
		case code == codeBytes:
			e, b, err = decodeEscaped(b)
		case code == codeString:
			var raw []byte
			raw, b, err = decodeEscaped(b)
			e = string(raw)
		case code == codeNested:
			e, b, err = decode(b, true)
		case code >= codeIntZero-8 && code <= codeIntZero+8:
			e, b, err = decodeInt(code, b)
		case code == codePosBig || code == codeNegBig:
			e, b, err = decodeBigInt(code, b)
		case code == codeFloat:
			if len(b) < 4 {
				return nil, nil, fmt.Errorf("%w: short float", ErrInvalid)
			}
			bits := binary.BigEndian.Uint32(b)
			if bits&(1<<31) == 0 {
				bits = ^bits
			} else {
				bits ^= 1 << 31
			}
			e, b = math.Float32frombits(bits), b[4:]
		case code == codeDouble:
			if len(b) < 8 {
				return nil, nil, fmt.Errorf("%w: short double", ErrInvalid)
			}
			bits := binary.BigEndian.Uint64(b)
			if bits&(1<<63) == 0 {
				bits = ^bits
			} else {
				bits ^= 1 << 63
			}
			e, b = math.Float64frombits(bits), b[8:]
		case code == codeFalse:
			e = false
		case code == codeTrue:
			e = true
		case code == codeUUID:
			if len(b) < 16 {
				return nil, nil, fmt.Errorf("%w: short UUID", ErrInvalid)
			}
			var u UUID
			copy(u[:], b)
			e, b = u, b[16:]
		default:
			return nil, nil, fmt.Errorf("%w: type code 0x%02x", ErrInvalid, code)
		}
		if err != nil {
			return nil, nil, err
		}
		t = append(t, e)
	}
	if nested {
		return nil, nil, fmt.Errorf("%w: unterminated nested tuple", ErrInvalid)
	}
	return t, b, nil
}

func decodeEscaped(b []byte) ([]byte, []byte, error) {
	out := []byte{}
	for i := 0; i < len(b); i++ {
		if b[i] != 0x00 {
			out = append(out, b[i])
			continue
		}
		if i+1 < len(b) && b[i+1] == escape {
			out = append(out, 0x00)
			i++
			continue
		}
		return out, b[i+1:], nil
	}
	return nil, nil, fmt.Errorf("%w: unterminated string", ErrInvalid)
}

func decodeInt(code byte, b []byte) (any, []byte, error) {
	if code == codeIntZero {
		return int64(0), b, nil
	}
	neg := code < codeIntZero
	n := int(code) - codeIntZero
	if neg {
		n = -n
	}
	if len(b) < n {
		return nil, nil, fmt.Errorf("%w: short integer", ErrInvalid)
	}
	var buf [8]byte
	copy(buf[8-n:], b[:n])
	v := binary.BigEndian.Uint64(buf[:])
	b = b[n:]
	if !neg {
		if v <= math.MaxInt64 {
			return int64(v), b, nil
		}
		return v, b, nil
	}
	mag := ^v
	if n < 8 {
		mag &= 1<<(8*uint(n)) - 1
	}
	if mag <= 1<<63 {
		return -int64(mag-1) - 1, b, nil
	}
	return new(big.Int).Neg(new(big.Int).SetUint64(mag)), b, nil
}

func decodeBigInt(code byte, b []byte) (any, []byte, error) {
	if len(b) < 1 {
		return nil, nil, fmt.Errorf("%w: short integer", ErrInvalid)
	}
	n := int(b[0])
	if code == codeNegBig {
		n ^= 0xff
	}
	b = b[1:]
	if len(b) < n {
		return nil, nil, fmt.Errorf("%w: short integer", ErrInvalid)
	}
	mag := make([]byte, n)
	copy(mag, b[:n])
	if code == codeNegBig {
		for i := range mag {
			mag[i] = ^mag[i]
		}
	}
	v := new(big.Int).SetBytes(mag)
	if code == codeNegBig {
		v.Neg(v)
	}
	return v, b[n:], nil
}
