package chunker

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"math"
	"strconv"

	"github.com/tidemark/tidemark/chunker/tuple"
)

// Type OIDs whose keys are encoded as typed tuple elements; every other type is encoded as its
// text form, which the pinned session settings make canonical.
const (
	oidBool    = 16
	oidBytea   = 17
	oidInt8    = 20
	oidInt2    = 21
	oidInt4    = 23
	oidOID     = 26
	oidFloat4  = 700
	oidFloat8  = 701
	oidNumeric = 1700
	oidUUID    = 2950
)

// AppendKey appends the canonical key of a row to dst: a FoundationDB tuple with one element per
// key column, from the columns' text values in key order (as a chunk reads them and as pgoutput
// sends them, under the same pinned session settings). Two stored keys that are equal under the
// key's = operator encode to the same bytes: numeric scale is dropped (1.0 = 1.00), float -0
// becomes 0. The encoding depends on the column types only, never on which path read the value.
func (t *Table) AppendKey(dst []byte, vals [][]byte) ([]byte, error) {
	if len(vals) != len(t.Key) {
		return nil, fmt.Errorf("key of %s has %d columns, got %d values", t, len(t.Key), len(vals))
	}
	for i, v := range vals {
		c := t.Columns[t.Key[i]]
		var err error
		if dst, err = appendKeyValue(dst, c.BaseOID, v); err != nil {
			return nil, fmt.Errorf("key column %q of %s: %w", c.Name, t, err)
		}
	}
	return dst, nil
}

func appendKeyValue(dst []byte, oid uint32, v []byte) ([]byte, error) {
	if v == nil {
		return tuple.AppendNull(dst), nil
	}
	switch oid {
	case oidInt2, oidInt4, oidInt8:
		n, ok := parseInt(v)
		if !ok {
			return nil, fmt.Errorf("integer %q", v)
		}
		return tuple.AppendInt(dst, n), nil
	case oidOID:
		n, err := strconv.ParseUint(string(v), 10, 32)
		if err != nil {
			return nil, err
		}
		return tuple.AppendUint(dst, n), nil
	case oidFloat4, oidFloat8:
		f, err := strconv.ParseFloat(string(v), 64)
		if err != nil {
			return nil, err
		}
		switch {
		case f == 0:
			f = 0 // -0 = 0
		case math.IsNaN(f):
			f = math.NaN() // one NaN
		}
		return tuple.AppendDouble(dst, f), nil
	case oidNumeric:
		return tuple.AppendStringBytes(dst, canonicalNumeric(v)), nil
	case oidBool:
		return tuple.AppendBool(dst, len(v) > 0 && v[0] == 't'), nil
	case oidUUID:
		var u tuple.UUID
		h := bytes.ReplaceAll(v, []byte("-"), nil)
		if len(h) != 32 {
			return nil, fmt.Errorf("uuid %q", v)
		}
		if _, err := hex.Decode(u[:], h); err != nil {
			return nil, err
		}
		return tuple.AppendUUID(dst, u), nil
	case oidBytea:
		if !bytes.HasPrefix(v, []byte(`\x`)) {
			return nil, fmt.Errorf("bytea %q is not in hex form", v)
		}
		b := make([]byte, hex.DecodedLen(len(v)-2))
		if _, err := hex.Decode(b, v[2:]); err != nil {
			return nil, err
		}
		return tuple.AppendBytes(dst, b), nil
	}
	return tuple.AppendStringBytes(dst, v), nil
}

// canonicalNumeric drops the scale of a numeric's text form: trailing fractional zeros and a
// bare point go, so that equal values have one form ("1.10" and "1.1000" are "1.1", "-0.0" is
// "0"). NaN and the infinities are kept as they are.
func canonicalNumeric(v []byte) []byte {
	if !bytes.ContainsRune(v, '.') {
		return v
	}
	v = bytes.TrimRight(v, "0")
	v = bytes.TrimSuffix(v, []byte("."))
	if bytes.Equal(v, []byte("-0")) || len(v) == 0 {
		return []byte("0")
	}
	return v
}

// parseInt parses a decimal int64 as PostgreSQL prints it, without allocating.
func parseInt(b []byte) (int64, bool) {
	neg := len(b) > 0 && b[0] == '-'
	if neg {
		b = b[1:]
	}
	if len(b) == 0 || len(b) > 19 {
		return 0, false
	}
	var u uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		u = u*10 + uint64(c-'0')
	}
	switch {
	case neg && u <= 1<<63:
		return -int64(u-1) - 1, true
	case !neg && u < 1<<63:
		return int64(u), true
	}
	return 0, false
}
