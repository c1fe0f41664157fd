package replicator

import (
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// msg builds pgoutput messages for tests, following the documented formats.
type msg []byte

func (m msg) u8(b byte) msg      { return append(m, b) }
func (m msg) u16(v uint16) msg   { return binary.BigEndian.AppendUint16(m, v) }
func (m msg) u32(v uint32) msg   { return binary.BigEndian.AppendUint32(m, v) }
func (m msg) u64(v uint64) msg   { return binary.BigEndian.AppendUint64(m, v) }
func (m msg) str(s string) msg   { return append(append(m, s...), 0) }
func (m msg) raw(b []byte) msg   { return append(m, b...) }
func (m msg) text(s string) msg  { return m.u8('t').u32(uint32(len(s))).raw([]byte(s)) }
func (m msg) tuple(n uint16) msg { return m.u16(n) }

func beginMsg(lsn uint64, xid uint32) msg { return msg{'B'}.u64(lsn).u64(0).u32(xid) }
func commitMsg(lsn, end uint64) msg       { return msg{'C'}.u8(0).u64(lsn).u64(end).u64(0) }
func relationMsg(id uint32) msg {
	return msg{'R'}.u32(id).str("public").str("t").u8('d').u16(2).
		u8(1).str("id").u32(23).u32(0xffffffff).
		u8(0).str("v").u32(25).u32(0xffffffff)
}
func insertMsg(id uint32, k, v string) msg {
	return msg{'I'}.u32(id).u8('N').tuple(2).text(k).text(v)
}

func decodeAll(t *testing.T, msgs ...msg) []Event {
	t.Helper()
	d := newDecoder()
	var evs []Event
	for i, m := range msgs {
		ev, err := d.decode(0, m)
		require.NoError(t, err, "message %d", i)
		evs = append(evs, ev)
	}
	return evs
}

func TestDecodeTransaction(t *testing.T) {
	upd := msg{'U'}.u32(7).u8('K').tuple(2).text("1").u8('n').u8('N').tuple(2).text("2").u8('u')
	del := msg{'D'}.u32(7).u8('O').tuple(2).text("2").text("old")
	trunc := msg{'T'}.u32(1).u8(3).u32(7)
	message := msg{'M'}.u8(1).u64(99).str("tm").u32(3).raw([]byte("abc"))
	// Times in microseconds since 2000-01-01: one day and 123 µs; the commit 2 s later.
	begin := msg{'B'}.u64(100).u64(86_400_000_123).u32(5)
	commit := msg{'C'}.u8(0).u64(100).u64(120).u64(86_402_000_123)
	evs := decodeAll(t, begin, relationMsg(7), insertMsg(7, "1", "a"), upd, del, trunc, message, commit)

	at := time.Date(2000, 1, 2, 0, 0, 0, 123_000, time.UTC)
	require.Equal(t, &Begin{FinalLSN: 100, XID: 5, Time: at}, evs[0])
	rel := evs[1].(*Relation)
	require.Equal(t, []Column{{Name: "id", TypeOID: 23, TypeMod: -1, Key: true}, {Name: "v", TypeOID: 25, TypeMod: -1}}, rel.Columns)
	ins := evs[2].(*Change)
	require.Equal(t, Insert, ins.Op)
	require.Same(t, rel, ins.Rel)
	require.Equal(t, Tuple{{Kind: Text, Data: []byte("1")}, {Kind: Text, Data: []byte("a")}}, ins.New)
	u := evs[3].(*Change)
	require.Equal(t, OldKey, u.OldKind)
	require.Equal(t, Null, u.Old[1].Kind)
	require.Equal(t, Unchanged, u.New[1].Kind, "unchanged TOAST is not NULL")
	d := evs[4].(*Change)
	require.Equal(t, OldRow, d.OldKind)
	require.Nil(t, d.New)
	tr := evs[5].(*Truncate)
	require.True(t, tr.Cascade)
	require.True(t, tr.RestartIdentity)
	require.Equal(t, []*Relation{rel}, tr.Rels)
	m := evs[6].(*Message)
	require.Equal(t, &Message{LSN: 99, XID: 5, Transactional: true, Prefix: "tm", Content: []byte("abc")}, m)
	require.Equal(t, &Commit{LSN: 100, EndLSN: 120, XID: 5, Time: at.Add(2 * time.Second)}, evs[7])
}

func TestDecodeErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		msgs []msg
		want string
	}{
		{"empty", []msg{{}}, "empty message"},
		{"unknown type", []msg{{'Z'}}, "unexpected message type"},
		{"short begin", []msg{{'B', 1, 2}}, "need 8 bytes"},
		{"change outside transaction", []msg{relationMsg(7), insertMsg(7, "1", "a")}, "outside a transaction"},
		{"unknown relation", []msg{beginMsg(1, 1), insertMsg(8, "1", "a")}, "before its Relation message"},
		{"begin in transaction", []msg{beginMsg(1, 1), beginMsg(2, 2)}, "inside transaction"},
		{"commit outside", []msg{commitMsg(1, 2)}, "outside a transaction"},
		{"change after the commit", []msg{beginMsg(1, 1), relationMsg(7), commitMsg(1, 2), insertMsg(7, "1", "a")}, "outside a transaction"},
		{"column count", []msg{beginMsg(1, 1), relationMsg(7), msg{'I'}.u32(7).u8('N').tuple(1).text("1")}, "tuple has 1 columns, relation has 2"},
		{"oversized value", []msg{beginMsg(1, 1), relationMsg(7), msg{'I'}.u32(7).u8('N').tuple(2).u8('t').u32(1 << 30)}, "claims 1073741824 bytes"},
		{"bad kind", []msg{beginMsg(1, 1), relationMsg(7), msg{'I'}.u32(7).u8('N').tuple(2).u8('x')}, "has kind 'x'"},
		{"trailing bytes", []msg{beginMsg(1, 1).u8(0)}, "trailing bytes"},
		{"huge column count", []msg{msg{'R'}.u32(1).str("s").str("t").u8('d').u16(65535)}, "claims 65535 columns"},
		{"unterminated string", []msg{msg{'R'}.u32(1).raw([]byte("abc"))}, "unterminated string"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newDecoder()
			var err error
			for _, m := range tc.msgs {
				if _, err = d.decode(0, m); err != nil {
					break
				}
			}
			require.ErrorIs(t, err, ErrProtocol)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

// splitFuzz cuts fuzz input into messages: each is a 2-byte length and that many bytes.
func splitFuzz(data []byte) [][]byte {
	var out [][]byte
	for len(data) >= 2 {
		n := int(binary.BigEndian.Uint16(data))
		data = data[2:]
		n = min(n, len(data))
		out = append(out, data[:n])
		data = data[n:]
	}
	return out
}

func joinFuzz(msgs ...msg) []byte {
	var b []byte
	for _, m := range msgs {
		b = binary.BigEndian.AppendUint16(b, uint16(len(m)))
		b = append(b, m...)
	}
	return b
}

func fuzzSeeds() [][]byte {
	upd := msg{'U'}.u32(7).u8('O').tuple(2).text("1").text("x").u8('N').tuple(2).text("2").u8('u')
	return [][]byte{
		joinFuzz(beginMsg(100, 5), relationMsg(7), insertMsg(7, "1", "a"), upd, commitMsg(100, 120)),
		joinFuzz(beginMsg(1, 1), relationMsg(7), msg{'D'}.u32(7).u8('K').tuple(2).text("1").u8('n'), commitMsg(1, 2)),
		joinFuzz(beginMsg(1, 1), relationMsg(7), msg{'T'}.u32(1).u8(0).u32(7), commitMsg(1, 2)),
		joinFuzz(msg{'M'}.u8(0).u64(9).str("p").u32(2).raw([]byte("hi")), msg{'Y'}.u32(16384).str("public").str("mood")),
		joinFuzz(msg{'O'}.u64(7).str("origin")),
	}
}

// TestFuzzSeedsDecode: every seed of FuzzDecode is a well-formed stream that the decoder reads
// to its end without an error, into the events it stands for. FuzzDecode accepts errors (most
// mutated inputs are refused early); a seed refused at its first message would leave the fuzzer
// mutating inputs that never reach the tuple and relation code, and nothing else would say so.
func TestFuzzSeedsDecode(t *testing.T) {
	want := [][]string{
		{"*replicator.Begin", "*replicator.Relation", "*replicator.Change", "*replicator.Change", "*replicator.Commit"},
		{"*replicator.Begin", "*replicator.Relation", "*replicator.Change", "*replicator.Commit"},
		{"*replicator.Begin", "*replicator.Relation", "*replicator.Truncate", "*replicator.Commit"},
		{"*replicator.Message", "*replicator.TypeInfo"},
		{"*replicator.Origin"},
	}
	seeds := fuzzSeeds()
	require.Len(t, seeds, len(want))
	for i, seed := range seeds {
		d := newDecoder()
		var got []string
		for j, m := range splitFuzz(seed) {
			ev, err := d.decode(0, m)
			require.NoError(t, err, "seed %d, message %d", i, j)
			got = append(got, fmt.Sprintf("%T", ev))
		}
		require.Equal(t, want[i], got, "seed %d", i)
	}
}

// FuzzDecode: no input makes the decoder panic, and what it accepts is well formed.
func FuzzDecode(f *testing.F) {
	for _, s := range fuzzSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		d := newDecoder()
		for _, m := range splitFuzz(data) {
			ev, err := d.decode(0, m)
			if err != nil {
				d.reset()
				continue
			}
			if c, ok := ev.(*Change); ok {
				if c.New != nil && len(c.New) != len(c.Rel.Columns) || c.Old != nil && len(c.Old) != len(c.Rel.Columns) {
					t.Fatalf("tuple does not match its relation: %+v", c)
				}
				if c.Op != Insert && c.Op != Update && c.Op != Delete {
					t.Fatalf("bad op %v", c.Op)
				}
			}
		}
	})
}
