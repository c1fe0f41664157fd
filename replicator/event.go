package replicator

import (
	"time"

	"github.com/jackc/pglogrepl"
)

// Event is one decoded message of the replication stream. It is one of *Begin, *Commit,
// *Relation, *TypeInfo, *Change, *Truncate, *Origin, *Message and *Keepalive; consumers
// type-switch on it. Events are delivered in stream order.
type Event interface{ isEvent() }

// Begin opens a transaction. Every Change, Truncate and transactional Message until the next
// Commit belongs to it.
type Begin struct {
	FinalLSN pglogrepl.LSN // LSN of the transaction's commit record; equals Commit.LSN
	XID      uint32        // transaction id
	Time     time.Time     // commit time on the server
}

// Commit closes the transaction opened by the last Begin. Commit LSNs strictly increase along the
// stream; change LSNs inside transactions do not.
type Commit struct {
	LSN    pglogrepl.LSN // LSN of the commit record
	EndLSN pglogrepl.LSN // LSN just past the commit record: the position to acknowledge once the transaction is durable downstream
	XID    uint32        // transaction id, from the Begin
	Time   time.Time     // commit time on the server
}

// ReplicaIdentity is a table's REPLICA IDENTITY setting as pgoutput reports it.
type ReplicaIdentity byte

// The replica identity settings.
const (
	IdentityDefault ReplicaIdentity = 'd' // the primary key
	IdentityNothing ReplicaIdentity = 'n' // no old values
	IdentityFull    ReplicaIdentity = 'f' // the whole old row
	IdentityIndex   ReplicaIdentity = 'i' // the columns of a chosen unique index
)

// Relation describes a published table. The server sends one before the first change of the table
// in each replication session, and again after its definition changes; a Relation is immutable, and
// Changes point at the version that was current when they arrived.
type Relation struct {
	ID              uint32          // table OID
	Schema          string          // namespace ("" means pg_catalog)
	Table           string          // table name
	ReplicaIdentity ReplicaIdentity // what old values UPDATE and DELETE carry
	Columns         []Column        // published columns, in tuple order
}

// Column is one column of a Relation.
type Column struct {
	Name    string // column name
	TypeOID uint32 // data type OID
	TypeMod int32  // type modifier (-1 when none)
	Key     bool   // part of the replica identity
}

// KeyColumns returns the indexes of the replica identity columns, in column order.
func (r *Relation) KeyColumns() []int {
	var idx []int
	for i, c := range r.Columns {
		if c.Key {
			idx = append(idx, i)
		}
	}
	return idx
}

// TypeInfo names a non built-in data type used by a published column. The server sends it before
// the Relation that uses the type.
type TypeInfo struct {
	OID    uint32 // type OID
	Schema string // namespace
	Name   string // type name
}

// Op is the kind of row change.
type Op byte

// The row change kinds.
const (
	Insert Op = 'I'
	Update Op = 'U'
	Delete Op = 'D'
)

func (o Op) String() string {
	switch o {
	case Insert:
		return "insert"
	case Update:
		return "update"
	case Delete:
		return "delete"
	}
	return "unknown"
}

// OldKind says what the old tuple of an Update or Delete holds.
type OldKind byte

// The old tuple kinds.
const (
	OldNone OldKind = 0   // no old tuple: an Update that did not change the replica identity
	OldKey  OldKind = 'K' // the replica identity columns (others are null)
	OldRow  OldKind = 'O' // the whole old row (REPLICA IDENTITY FULL)
)

// Change is one row change: an insert, an update or a delete.
type Change struct {
	Op      Op            // Insert, Update or Delete
	LSN     pglogrepl.LSN // WAL position of the change; not ordered across transactions
	XID     uint32        // transaction id
	Rel     *Relation     // the table, as last described
	New     Tuple         // the new row: Insert and Update
	Old     Tuple         // the old key or row: Delete always, Update when OldKind is not OldNone
	OldKind OldKind       // what Old holds
}

// Kind says what a Value holds.
type Kind byte

// The value kinds.
const (
	Null      Kind = 'n' // SQL NULL
	Unchanged Kind = 'u' // an unchanged TOASTed value that the server did not send; not NULL
	Text      Kind = 't' // the value in text form
	Binary    Kind = 'b' // the value in binary form (only with the binary option)
)

// Value is one column of a Tuple.
type Value struct {
	Kind Kind   // what Data holds
	Data []byte // the value for Text and Binary; nil otherwise
}

// Tuple is one row image: a Value per column of the Relation, in column order.
type Tuple []Value

// Truncate reports a TRUNCATE of one or more tables, in one statement.
type Truncate struct {
	LSN             pglogrepl.LSN // WAL position
	XID             uint32        // transaction id
	Rels            []*Relation   // the truncated tables
	Cascade         bool          // TRUNCATE ... CASCADE
	RestartIdentity bool          // TRUNCATE ... RESTART IDENTITY
}

// Origin reports that the transaction came from another node (replication origin).
type Origin struct {
	LSN  pglogrepl.LSN // commit LSN on the origin server
	Name string        // origin name
}

// Message is a logical decoding message written with pg_logical_emit_message.
type Message struct {
	LSN           pglogrepl.LSN // LSN of the message
	XID           uint32        // transaction id of a transactional message; 0 otherwise
	Transactional bool          // written as part of a transaction (delivered with it, dropped on abort)
	Prefix        string        // the message's prefix
	Content       []byte        // the message's content
}

// Keepalive reports the server's WAL position while no transaction is open: every transaction
// that committed before WALEnd and is published has been delivered.
type Keepalive struct {
	WALEnd pglogrepl.LSN // the server's sent position
	Time   time.Time     // server clock
}

func (*Begin) isEvent()     {}
func (*Commit) isEvent()    {}
func (*Relation) isEvent()  {}
func (*TypeInfo) isEvent()  {}
func (*Change) isEvent()    {}
func (*Truncate) isEvent()  {}
func (*Origin) isEvent()    {}
func (*Message) isEvent()   {}
func (*Keepalive) isEvent() {}
