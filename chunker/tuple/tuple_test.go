package tuple

import (
	"bytes"
	"cmp"
	"math"
	"math/big"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSpecCases checks the byte sequences documented in the specification.
func TestSpecCases(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   Tuple
		want string
	}{
		{"byte string", Tuple{[]byte("foo\x00bar")}, "\x01foo\x00\xffbar\x00"},
		{"unicode string", Tuple{"F\u00d4O\u0000bar"}, "\x02F\xc3\x94O\x00\xffbar\x00"},
		{"nested tuple", Tuple{Tuple{[]byte("foo\x00bar"), nil, Tuple{}}}, "\x05\x01foo\x00\xffbar\x00\x00\xff\x05\x00\x00"},
		{"empty nested", Tuple{Tuple{}}, "\x05\x00"},
		{"nested null", Tuple{Tuple{nil}}, "\x05\x00\xff\x00"},
		{"integer", Tuple{int64(-5551212)}, "\x11\xabK\x93"},
		{"minus one", Tuple{int64(-1)}, "\x13\xfe"},
		{"zero", Tuple{0}, "\x14"},
		{"float", Tuple{float32(-42)}, "\x20\x3d\xd7\xff\xff"},
		{"false", Tuple{false}, "\x26"},
		{"true", Tuple{true}, "\x27"},
		{"null", Tuple{nil}, "\x00"},
		{"uuid", Tuple{UUID{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}}, "\x30\x00\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f"},
		{"max int64", Tuple{int64(math.MaxInt64)}, "\x1c\x7f\xff\xff\xff\xff\xff\xff\xff"},
		{"min int64", Tuple{int64(math.MinInt64)}, "\x0c\x7f\xff\xff\xff\xff\xff\xff\xff"},
		{"max uint64", Tuple{uint64(math.MaxUint64)}, "\x1c\xff\xff\xff\xff\xff\xff\xff\xff"},
		{"2^64", Tuple{new(big.Int).Lsh(big.NewInt(1), 64)}, "\x1d\x09\x01\x00\x00\x00\x00\x00\x00\x00\x00"},
		{"-2^64", Tuple{new(big.Int).Neg(new(big.Int).Lsh(big.NewInt(1), 64))}, "\x0b\xf6\xfe\xff\xff\xff\xff\xff\xff\xff\xff"},
		{"-(2^64-1)", Tuple{new(big.Int).Neg(new(big.Int).SetUint64(math.MaxUint64))}, "\x0c\x00\x00\x00\x00\x00\x00\x00\x00"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.in.Pack()
			require.Equal(t, []byte(tc.want), got)
			back, err := Unpack(got)
			require.NoError(t, err)
			require.True(t, equal(tc.in, back), "round trip: %#v != %#v", tc.in, back)
		})
	}
}

func TestUnpackErrors(t *testing.T) {
	for _, b := range []string{"\x01abc", "\x02", "\x05\x14", "\x15", "\x1d\x05\x01", "\x21\x00", "\x30\x01", "\xff", "\x0b"} {
		_, err := Unpack([]byte(b))
		require.ErrorIs(t, err, ErrInvalid, "%q", b)
	}
	_, err := Append(nil, struct{}{})
	require.ErrorIs(t, err, ErrInvalid)
}

// randElem returns a random element of a random supported type.
func randElem(r *rand.Rand, depth int) any {
	switch r.IntN(11) {
	case 0:
		return nil
	case 1:
		b := make([]byte, r.IntN(6))
		for i := range b {
			b[i] = []byte{0, 1, 0xfe, 0xff, 'a'}[r.IntN(5)]
		}
		return b
	case 2:
		return []string{"", "a", "a\x00", "a\x00b", "é", "ab", "\x00", "b"}[r.IntN(8)]
	case 3:
		if depth > 2 {
			return Tuple{}
		}
		n := r.IntN(3)
		tu := Tuple{}
		for range n {
			tu = append(tu, randElem(r, depth+1))
		}
		return tu
	case 4:
		return []int64{0, 1, -1, 255, 256, -255, -256, math.MaxInt64, math.MinInt64, 1 << 40, -(1 << 40)}[r.IntN(11)] + int64(r.IntN(3)-1)
	case 5:
		v := new(big.Int).Lsh(big.NewInt(1), uint(60+r.IntN(80)))
		v.Add(v, big.NewInt(int64(r.IntN(1000))))
		if r.IntN(2) == 0 {
			v.Neg(v)
		}
		return v
	case 6:
		return []float32{0, 1, -1, float32(math.Inf(1)), float32(math.Inf(-1)), 1.5, -1e-30}[r.IntN(7)]
	case 7:
		return []float64{0, math.Copysign(0, -1), 1, -1, math.Inf(1), math.Inf(-1), math.SmallestNonzeroFloat64, -math.MaxFloat64, r.NormFloat64()}[r.IntN(9)]
	case 8:
		return r.IntN(2) == 0
	case 9:
		var u UUID
		for i := range u {
			u[i] = byte(r.IntN(3) * 127)
		}
		return u
	default:
		return uint64(math.MaxUint64) - uint64(r.IntN(3))
	}
}

func randTuple(r *rand.Rand) Tuple {
	n := r.IntN(4)
	t := Tuple{}
	for range n {
		t = append(t, randElem(r, 0))
	}
	return t
}

// typeRank orders element types as the specification's type codes do.
func typeRank(e any) int {
	switch e.(type) {
	case nil:
		return 0
	case []byte:
		return 1
	case string:
		return 2
	case Tuple:
		return 5
	case int, int64, uint64, *big.Int:
		return 20
	case float32:
		return 32
	case float64:
		return 33
	case bool:
		return 38
	case UUID:
		return 48
	}
	panic("unknown type")
}

func toBig(e any) *big.Int {
	switch v := e.(type) {
	case int:
		return big.NewInt(int64(v))
	case int64:
		return big.NewInt(v)
	case uint64:
		return new(big.Int).SetUint64(v)
	case *big.Int:
		return v
	}
	panic("not an integer")
}

// totalOrder is IEEE 754 totalOrder for the finite, infinite and signed-zero values used here.
func totalOrder64(a, b float64) int {
	if a == b {
		sa, sb := 0, 0 // -0 < +0
		if math.Signbit(a) {
			sa = -1
		}
		if math.Signbit(b) {
			sb = -1
		}
		return cmp.Compare(sa, sb)
	}
	return cmp.Compare(a, b)
}

// compareElems is the semantic order the encoding must preserve.
func compareElems(a, b any) int {
	if ra, rb := typeRank(a), typeRank(b); ra != rb {
		return cmp.Compare(ra, rb)
	}
	switch av := a.(type) {
	case nil:
		return 0
	case []byte:
		return bytes.Compare(av, b.([]byte))
	case string:
		return cmp.Compare(av, b.(string))
	case Tuple:
		return compareTuples(av, b.(Tuple))
	case float32:
		return totalOrder64(float64(av), float64(b.(float32)))
	case float64:
		return totalOrder64(av, b.(float64))
	case bool:
		bv := b.(bool)
		if av == bv {
			return 0
		}
		if !av {
			return -1
		}
		return 1
	case UUID:
		bv := b.(UUID)
		return bytes.Compare(av[:], bv[:])
	}
	return toBig(a).Cmp(toBig(b))
}

func compareTuples(a, b Tuple) int {
	for i := 0; i < len(a) && i < len(b); i++ {
		if c := compareElems(a[i], b[i]); c != 0 {
			return c
		}
	}
	return cmp.Compare(len(a), len(b))
}

func equal(a, b Tuple) bool { return compareTuples(a, b) == 0 }

// TestRoundTrip: every random tuple decodes to what was encoded.
func TestRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		tu := randTuple(r)
		back, err := Unpack(tu.Pack())
		require.NoError(t, err)
		require.True(t, equal(tu, back), "%#v -> %#v", tu, back)
		require.Equal(t, tu.Pack(), back.Pack(), "the encoding is canonical")
	}
}

// TestOrderPreserved: the bytes of two tuples compare as the tuples do.
func TestOrderPreserved(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for range 50000 {
		a, b := randTuple(r), randTuple(r)
		want := compareTuples(a, b)
		got := bytes.Compare(a.Pack(), b.Pack())
		require.Equal(t, want, got, "%#v vs %#v", a, b)
	}
}

// FuzzUnpack: no input makes Unpack panic, and what it decodes encodes to a valid tuple that
// decodes to the same values.
func FuzzUnpack(f *testing.F) {
	for _, s := range []string{"\x01foo\x00\xffbar\x00", "\x05\x01foo\x00\xffbar\x00\x00\xff\x05\x00\x00", "\x11\xabK\x93", "\x20\x3d\xd7\xff\xff", "\x1d\x09\x01\x00\x00\x00\x00\x00\x00\x00\x00", "\x0b\xf6\xfe\xff\xff\xff\xff\xff\xff\xff\xff"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		tu, err := Unpack(b)
		if err != nil {
			return
		}
		packed, err := Append(nil, tu...)
		if err != nil {
			t.Fatalf("decoded %#v does not encode: %v", tu, err)
		}
		back, err := Unpack(packed)
		if err != nil {
			t.Fatalf("re-encoding %x does not decode: %v", packed, err)
		}
		if len(back) != len(tu) {
			t.Fatalf("length changed: %#v vs %#v", tu, back)
		}
	})
}
