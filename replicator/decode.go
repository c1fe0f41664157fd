package replicator

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
)

// ErrProtocol reports a pgoutput message that could not be decoded or that arrived out of place.
var ErrProtocol = errors.New("pgoutput protocol violation")

// decoder turns pgoutput messages (protocol version 1, no streaming of in-progress transactions)
// into Events. It holds the relation cache of one replication session and the open transaction.
// The message formats are those of
// https://www.postgresql.org/docs/current/protocol-logicalrep-message-formats.html.
//
// decode never panics, whatever the input: every read is bounds-checked (FuzzDecode).
type decoder struct {
	rels  map[uint32]*Relation // relation cache of this session, by table OID
	types map[uint32]*TypeInfo // type messages of this session, by type OID
	inTxn bool                 // between Begin and Commit
	xid   uint32               // xid of the open transaction
}

func newDecoder() *decoder {
	return &decoder{rels: map[uint32]*Relation{}, types: map[uint32]*TypeInfo{}}
}

// decode decodes one pgoutput message found at WAL position lsn. The returned event may reference
// data, which the caller must not reuse.
func (d *decoder) decode(lsn pglogrepl.LSN, data []byte) (Event, error) {
	if len(data) == 0 {
		return nil, fmt.Errorf("%w: empty message", ErrProtocol)
	}
	r := reader{buf: data[1:]}
	tag := data[0]
	var ev Event
	switch tag {
	case 'B':
		ev = d.begin(&r)
	case 'C':
		ev = d.commit(&r)
	case 'O':
		ev = &Origin{LSN: pglogrepl.LSN(r.u64()), Name: r.str()}
	case 'R':
		ev = d.relation(&r)
	case 'Y':
		t := &TypeInfo{OID: r.u32(), Schema: r.str(), Name: r.str()}
		if r.err == nil {
			d.types[t.OID] = t
		}
		ev = t
	case 'I', 'U', 'D':
		ev = d.change(&r, Op(tag), lsn)
	case 'T':
		ev = d.truncate(&r, lsn)
	case 'M':
		ev = d.message(&r)
	default:
		return nil, fmt.Errorf("%w: unexpected message type %q", ErrProtocol, tag)
	}
	if r.err != nil {
		return nil, fmt.Errorf("%w: %q message: %w", ErrProtocol, tag, r.err)
	}
	if len(r.buf) != 0 {
		return nil, fmt.Errorf("%w: %q message has %d trailing bytes", ErrProtocol, tag, len(r.buf))
	}
	return ev, nil
}

func (d *decoder) begin(r *reader) Event {
	b := &Begin{FinalLSN: pglogrepl.LSN(r.u64()), Time: pgTime(r.u64()), XID: r.u32()}
	if r.err == nil && d.inTxn {
		r.fail("Begin of xid %d inside transaction %d", b.XID, d.xid)
	}
	d.inTxn, d.xid = true, b.XID
	return b
}

func (d *decoder) commit(r *reader) Event {
	r.u8() // flags, unused
	c := &Commit{LSN: pglogrepl.LSN(r.u64()), EndLSN: pglogrepl.LSN(r.u64()), Time: pgTime(r.u64()), XID: d.xid}
	if r.err == nil && !d.inTxn {
		r.fail("Commit outside a transaction")
	}
	d.inTxn = false
	return c
}

func (d *decoder) relation(r *reader) Event {
	rel := &Relation{ID: r.u32(), Schema: r.str(), Table: r.str(), ReplicaIdentity: ReplicaIdentity(r.u8())}
	n := int(r.u16())
	if r.err != nil {
		return nil
	}
	// Each column takes at least 10 bytes: a short count cannot ask for a huge allocation.
	if n > len(r.buf)/10 {
		r.fail("relation claims %d columns in %d bytes", n, len(r.buf))
		return nil
	}
	rel.Columns = make([]Column, n)
	for i := range rel.Columns {
		flags := r.u8()
		rel.Columns[i] = Column{Key: flags&1 != 0, Name: r.str(), TypeOID: r.u32(), TypeMod: int32(r.u32())}
	}
	if r.err == nil {
		d.rels[rel.ID] = rel
	}
	return rel
}

func (d *decoder) change(r *reader, op Op, lsn pglogrepl.LSN) Event {
	c := &Change{Op: op, LSN: lsn, XID: d.xid}
	id := r.u32()
	if r.err != nil {
		return nil
	}
	if !d.inTxn {
		r.fail("%s outside a transaction", op)
		return nil
	}
	if c.Rel = d.rels[id]; c.Rel == nil {
		r.fail("%s of relation %d before its Relation message", op, id)
		return nil
	}
	switch op {
	case Insert:
		r.expect('N')
		c.New = r.tuple(len(c.Rel.Columns))
	case Update:
		switch k := r.u8(); k {
		case 'K', 'O':
			c.OldKind = OldKind(k)
			c.Old = r.tuple(len(c.Rel.Columns))
			r.expect('N')
		case 'N':
		default:
			r.fail("update tuple marker %q", k)
			return nil
		}
		c.New = r.tuple(len(c.Rel.Columns))
	case Delete:
		switch k := r.u8(); k {
		case 'K', 'O':
			c.OldKind = OldKind(k)
			c.Old = r.tuple(len(c.Rel.Columns))
		default:
			r.fail("delete tuple marker %q", k)
			return nil
		}
	}
	return c
}

func (d *decoder) truncate(r *reader, lsn pglogrepl.LSN) Event {
	n := int(r.u32())
	opts := r.u8()
	if r.err != nil {
		return nil
	}
	if !d.inTxn {
		r.fail("Truncate outside a transaction")
		return nil
	}
	if n > len(r.buf)/4 {
		r.fail("truncate claims %d relations in %d bytes", n, len(r.buf))
		return nil
	}
	t := &Truncate{LSN: lsn, XID: d.xid, Cascade: opts&1 != 0, RestartIdentity: opts&2 != 0}
	for range n {
		id := r.u32()
		rel := d.rels[id]
		if r.err == nil && rel == nil {
			r.fail("truncate of relation %d before its Relation message", id)
		}
		t.Rels = append(t.Rels, rel)
	}
	return t
}

func (d *decoder) message(r *reader) Event {
	flags := r.u8()
	m := &Message{Transactional: flags&1 != 0, LSN: pglogrepl.LSN(r.u64()), Prefix: r.str()}
	n := int(r.u32())
	m.Content = r.bytes(n)
	if m.Transactional {
		if r.err == nil && !d.inTxn {
			r.fail("transactional message outside a transaction")
		}
		m.XID = d.xid
	}
	return m
}

// reset forgets the open transaction (the session ended in the middle of one). The relation cache
// belongs to the session, so a new session gets a new decoder.
func (d *decoder) reset() { d.inTxn, d.xid = false, 0 }

// reader reads big-endian fields from a message. The first failure sticks: later reads return zero
// values, and err says what went wrong.
type reader struct {
	buf []byte
	err error
}

func (r *reader) fail(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf(format, args...)
	}
}

func (r *reader) take(n int) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || n > len(r.buf) {
		r.fail("need %d bytes, have %d", n, len(r.buf))
		return nil
	}
	b := r.buf[:n:n]
	r.buf = r.buf[n:]
	return b
}

func (r *reader) u8() byte {
	if b := r.take(1); b != nil {
		return b[0]
	}
	return 0
}

func (r *reader) u16() uint16 {
	if b := r.take(2); b != nil {
		return binary.BigEndian.Uint16(b)
	}
	return 0
}

func (r *reader) u32() uint32 {
	if b := r.take(4); b != nil {
		return binary.BigEndian.Uint32(b)
	}
	return 0
}

func (r *reader) u64() uint64 {
	if b := r.take(8); b != nil {
		return binary.BigEndian.Uint64(b)
	}
	return 0
}

func (r *reader) str() string {
	if r.err != nil {
		return ""
	}
	i := bytes.IndexByte(r.buf, 0)
	if i < 0 {
		r.fail("unterminated string")
		return ""
	}
	s := string(r.buf[:i])
	r.buf = r.buf[i+1:]
	return s
}

func (r *reader) bytes(n int) []byte { return r.take(n) }

func (r *reader) expect(tag byte) {
	if got := r.u8(); r.err == nil && got != tag {
		r.fail("expected tuple marker %q, got %q", tag, got)
	}
}

// tuple reads a TupleData with exactly want columns.
func (r *reader) tuple(want int) Tuple {
	n := int(r.u16())
	if r.err != nil {
		return nil
	}
	if n != want {
		r.fail("tuple has %d columns, relation has %d", n, want)
		return nil
	}
	t := make(Tuple, n)
	for i := range t {
		k := Kind(r.u8())
		switch k {
		case Null, Unchanged:
			t[i] = Value{Kind: k}
		case Text, Binary:
			l := r.u32()
			if l > uint32(len(r.buf)) {
				r.fail("column %d claims %d bytes, have %d", i, l, len(r.buf))
				return nil
			}
			t[i] = Value{Kind: k, Data: r.take(int(l))}
		default:
			if r.err == nil {
				r.fail("column %d has kind %q", i, byte(k))
			}
			return nil
		}
	}
	return t
}

// pgEpochMicros is PostgreSQL's timestamp epoch (2000-01-01) in Unix microseconds; protocol
// timestamps count microseconds from it.
const pgEpochMicros = 946684800_000_000

func pgTime(us uint64) time.Time { return time.UnixMicro(pgEpochMicros + int64(us)).UTC() }
