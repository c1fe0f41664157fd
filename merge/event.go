package merge

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/tidemark/tidemark/chunker"

	"github.com/tidemark/tidemark/replicator"
)

// Op is what an Event does to its row.
type Op byte

// The event kinds.
const (
	Insert   Op = 'c' // a new row from the change stream
	Update   Op = 'u' // a changed row from the change stream
	Delete   Op = 'd' // a deleted row: only the key columns are set (all columns under REPLICA IDENTITY FULL)
	Snapshot Op = 'r' // a row read by the backfill, as of its chunk's high watermark
	Truncate Op = 't' // every row of the table is gone: a TRUNCATE on the source
	// Refresh starts the table's output over: every row the output had for it is gone, and its
	// backfill from the start follows (rows as Snapshot events, changes as usual). Unlike
	// Truncate it is not a change of the source: it is placed where a re-backfill asked for
	// (TableProgress.Refresh) begins, and sinks that cannot remove rows may ignore it.
	Refresh Op = 'R'
)

func (o Op) String() string {
	switch o {
	case Insert:
		return "insert"
	case Update:
		return "update"
	case Delete:
		return "delete"
	case Snapshot:
		return "snapshot"
	case Truncate:
		return "truncate"
	case Refresh:
		return "refresh"
	}
	return "unknown"
}

// Columns describes the values of Events: a table's columns, with its key. Events of one table
// share a Columns until the table's definition changes; a Columns is immutable.
type Columns struct {
	Schema   string   // namespace
	Table    string   // table name
	Names    []string // column names
	Types    []uint32 // data type OIDs
	TypeMods []int32  // type modifiers
	Key      []int    // indexes of the key columns, in key order
}

// Event is the only type a sink sees: one row change, one backfilled row, or a truncate, in
// output order. Its values are read with Col, whichever path the row came from.
type Event struct {
	Op      Op
	Columns *Columns         // what the values are
	vals    replicator.Tuple // a change's values
	row     [][]byte         // a snapshot row's values, as the chunk read them (nil for NULL)
	old     replicator.Tuple // an Update's row before it, under REPLICA IDENTITY FULL; nil otherwise
	Key     []byte           // the row's canonical key (FoundationDB tuple); nil for Truncate
	LSN     pglogrepl.LSN    // commit LSN of the source transaction; for Snapshot rows, of their chunk's high watermark
	Seq     int              // order among the events of one LSN: (LSN, Seq) increases along the output
	XID     uint32           // source transaction; 0 for Snapshot rows
	Time    time.Time        // commit time of the source transaction or of the high watermark
}

// NumCols is the number of values: len(Columns.Names), or 0 for a Truncate or a Refresh.
func (e *Event) NumCols() int {
	if e.row != nil {
		return len(e.row)
	}
	return len(e.vals)
}

// Col returns value i. A Delete has only its key columns set (all columns under REPLICA
// IDENTITY FULL); an Unchanged value is a TOASTed value the server did not send, never NULL.
func (e *Event) Col(i int) replicator.Value {
	if e.row != nil {
		if v := e.row[i]; v != nil {
			return replicator.Value{Kind: replicator.Text, Data: v}
		}
		return replicator.Value{Kind: replicator.Null}
	}
	return e.vals[i]
}

// HasOld reports whether the event is an Update that carries the row before it: the stream
// gives it under REPLICA IDENTITY FULL (Debezium's "before").
func (e *Event) HasOld() bool { return e.old != nil }

// OldCol returns value i of the row before an Update (HasOld).
func (e *Event) OldCol(i int) replicator.Value { return e.old[i] }

// Value returns the text of column name, and whether the event has it (not NULL, not unchanged).
func (e *Event) Value(name string) (string, bool) {
	for i, n := range e.Columns.Names {
		if n == name && i < e.NumCols() {
			if v := e.Col(i); v.Kind == replicator.Text || v.Kind == replicator.Binary {
				return string(v.Data), true
			}
		}
	}
	return "", false
}

// PositionVersion is the version of the Position format this package writes and reads.
const PositionVersion = 1

// Position is the only persisted state: where to resume the stream and how far each table's
// backfill got, as of one consistent point of the output (a transaction boundary). Every event
// before it is reflected by it, none after it; a chunk counts in Tables iff its high watermark
// precedes LSN. It encodes to JSON (and is the Airbyte connector's state).
//
// Its identity fields say where it was read: a position is resumed only on the same cluster,
// database and slot, and only while its WAL is still the server's history (see Engine.Run).
type Position struct {
	Version  int                       `json:"version"`
	LSN      pglogrepl.LSN             `json:"-"`
	SystemID string                    `json:"system_id,omitempty"` // the source cluster: a restored or different cluster has another
	Timeline int32                     `json:"timeline,omitempty"`  // the server's timeline when the position was taken
	Database string                    `json:"database,omitempty"`  // the database the slot belongs to
	Slot     string                    `json:"slot,omitempty"`      // the slot the position belongs to
	Tables   map[string]*TableProgress `json:"tables"`              // by configured "schema.table"
	// Invisible are the transactions whose commits the stream showed before LSN that no
	// snapshot had shown visible yet (a commit waiting for a synchronous standby): the next
	// run's stream will not show them, so its visibility guard starts with them. nil: not known
	// (a first run, or a position of an older Tidemark): the next run starts with every
	// transaction invisible when it starts, if the server has synchronous standbys.
	Invisible *XIDs `json:"invisible,omitempty"`
}

// XIDs is a set of transaction ids (their low 32 bits), sorted. It encodes to JSON as ranges
// ("1042-1050,1077"), which keeps a run of consecutive ids short.
type XIDs []uint32

// MarshalJSON encodes the set as a string of ranges.
func (x XIDs) MarshalJSON() ([]byte, error) {
	var b []byte
	for i := 0; i < len(x); {
		j := i
		for j+1 < len(x) && x[j+1] == x[j]+1 {
			j++
		}
		if len(b) > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendUint(b, uint64(x[i]), 10)
		if j > i {
			b = append(b, '-')
			b = strconv.AppendUint(b, uint64(x[j]), 10)
		}
		i = j + 1
	}
	return json.Marshal(string(b))
}

// MaxInvisible is the most invisible transactions a position may list: commits streamed that
// no snapshot showed yet are those in flight around one moment (connections, prepared
// transactions), not millions. A state or checkpoint from outside listing more is refused
// before its ranges are expanded.
const MaxInvisible = 1 << 20

// UnmarshalJSON decodes the ranges MarshalJSON writes.
func (x *XIDs) UnmarshalJSON(data []byte) error {
	var s string
	if err := json.Unmarshal(data, &s); err != nil {
		return fmt.Errorf("invisible transactions: %w", err)
	}
	out := XIDs{}
	total := uint64(0)
	for _, r := range strings.Split(s, ",") {
		if r == "" {
			continue
		}
		lo, hi, isRange := strings.Cut(r, "-")
		a, err := strconv.ParseUint(lo, 10, 32)
		if err != nil {
			return fmt.Errorf("invisible transactions %q: %w", r, err)
		}
		b := a
		if isRange {
			if b, err = strconv.ParseUint(hi, 10, 32); err != nil || b < a || b-a > 1<<24 {
				return fmt.Errorf("invisible transactions: range %q", r)
			}
		}
		if total += b - a + 1; total > MaxInvisible {
			return fmt.Errorf("invisible transactions: more than %d listed; the state or checkpoint is not one Tidemark wrote", MaxInvisible)
		}
		for v := a; v <= b; v++ {
			out = append(out, uint32(v))
		}
	}
	*x = out
	return nil
}

// TableProgress is one table's backfill progress.
type TableProgress struct {
	Done   bool     `json:"done"`              // the backfill finished; only the stream carries the table now
	Cursor []string `json:"cursor,omitempty"`  // key of the last row of the last completed chunk (text values); nil before the first
	MaxKey []string `json:"max_key,omitempty"` // the backfill's upper bound, captured at its start; nil before the first chunk
	Key    []string `json:"key"`               // the key columns the cursor is in
	Rows   int64    `json:"rows"`              // rows emitted by the backfill
	Chunks int64    `json:"chunks"`            // chunks completed
	// Reread are keys (text values) whose rows must be read again whole: an update that lacked
	// unchanged TOASTed values replaced the only whole copy the output had (a chunk row).
	Reread [][]string `json:"reread,omitempty"`
	// Refresh asks for the table's output to start over: its changes are not emitted until the
	// low watermark of the refresh's first window, where a Refresh event is; the backfill then
	// starts from the beginning. Set by a re-backfill request, cleared at that low watermark.
	// Whatever the table's changes were before it (even ones that cannot be placed), the output
	// is rebuilt from the source.
	Refresh bool `json:"refresh,omitempty"`
	// OID is the table's pg_class OID when the progress was taken: a table of the same name with
	// another OID (dropped and created again) is not the table the progress belongs to.
	OID uint32 `json:"oid,omitempty"`
	// Publication identifies how the table belonged to the publication when the progress was
	// taken (chunker.Membership): a table that left the publication and came back has another,
	// and its changes in between are not in the slot.
	Publication string `json:"publication,omitempty"`
	// Partitions are the OIDs of a partitioned table's partitions when the progress was taken:
	// one attached or detached since brought or took rows without a row event.
	Partitions []uint32 `json:"partitions,omitempty"`
	// Storage is where each leaf partition's rows were stored when last looked at, when the
	// publication publishes through the root: a TRUNCATE of one partition is not streamed then,
	// and shows only as a new, empty file (chunker.Truncated).
	Storage []chunker.LeafStorage `json:"storage,omitempty"`
	// Shape is the table's columns and storage files when last looked at: a rewrite under a
	// changed column since (ErrValuesRewritten) stops the capture. Absent from the positions of
	// earlier versions: then the changes made before this run are not known.
	Shape
	// Ranges split the rest of the backfill into key ranges read by several readers at once
	// (Config.Readers, I23): nil until the split, and again after the backfill starts over.
	// Once split, Cursor is where the split was made and stays there; each range has its own
	// cursor and Done, and Done above is set once every range is done.
	Ranges []KeyRange `json:"ranges,omitempty"`
}

// KeyRange is one key range of a table's backfill split among readers: the rows after Cursor
// (exclusive) up to To (inclusive). The ranges of a table are disjoint and adjacent, each To
// the next one's first Cursor, the last To the backfill's upper bound (MaxKey).
type KeyRange struct {
	Cursor []string `json:"cursor"` // key of the last row read in the range (text values): its exclusive lower bound
	To     []string `json:"to"`     // the range's inclusive upper bound
	Done   bool     `json:"done"`   // nothing remains in the range
}

// continuesAt reports whether a range chunk read after the key after continues p's backfill:
// rng 0, p not split, at its cursor; or range rng (1-based) at its cursor, under bound to.
func (p *TableProgress) continuesAt(rng int, after, to []string) bool {
	if rng == 0 {
		return p.Ranges == nil && slices.Equal(after, p.Cursor)
	}
	return rng <= len(p.Ranges) && slices.Equal(after, p.Ranges[rng-1].Cursor) && slices.Equal(to, p.Ranges[rng-1].To)
}

// rangesDone reports whether every range of a split backfill is done.
func (p *TableProgress) rangesDone() bool {
	for _, r := range p.Ranges {
		if !r.Done {
			return false
		}
	}
	return true
}

// ColumnType is a column's catalog row as a Shape records it.
type ColumnType struct {
	Name   string `json:"name"`
	Attnum int16  `json:"attnum"`
	Type   uint32 `json:"type"` // pg_type OID
	Mod    int32  `json:"mod"`  // type modifier, -1 when none
	Xmin   uint32 `json:"xmin"` // the transaction that last wrote the row
}

// MarshalJSON encodes p with its LSN in PostgreSQL's text form.
func (p Position) MarshalJSON() ([]byte, error) {
	type plain Position
	return json.Marshal(struct {
		plain
		LSN string `json:"lsn"`
	}{plain(p), p.LSN.String()})
}

// UnmarshalJSON decodes and checks a Position.
func (p *Position) UnmarshalJSON(b []byte) error {
	type plain Position
	var v struct {
		plain
		LSN string `json:"lsn"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	if v.Version != PositionVersion {
		return fmt.Errorf("position version %d: this Tidemark reads version %d", v.Version, PositionVersion)
	}
	lsn, err := pglogrepl.ParseLSN(v.LSN)
	if err != nil {
		return fmt.Errorf("position lsn %q: %w", v.LSN, err)
	}
	*p = Position(v.plain)
	p.LSN = lsn
	if p.Tables == nil {
		p.Tables = map[string]*TableProgress{}
	}
	for name, t := range p.Tables {
		if t == nil {
			return fmt.Errorf("position table %q: null", name)
		}
		if err := t.Check(); err != nil {
			return fmt.Errorf("position table %q: %w", name, err)
		}
	}
	return nil
}

// maxKeyColumns is PostgreSQL's INDEX_MAX_KEYS: no key has more columns.
const maxKeyColumns = 32

// Check checks a table's progress decoded from outside (a state, a checkpoint): its key of at
// most 32 columns, its cursor, upper bound and keys to read again of as many values as the key
// has columns, its counts not negative.
func (t *TableProgress) Check() error {
	n := len(t.Key)
	switch {
	case n > maxKeyColumns:
		return fmt.Errorf("a key of %d columns (at most %d)", n, maxKeyColumns)
	case t.Cursor != nil && len(t.Cursor) != n:
		return fmt.Errorf("a cursor of %d values for a key of %d columns", len(t.Cursor), n)
	case t.MaxKey != nil && len(t.MaxKey) != n:
		return fmt.Errorf("an upper bound of %d values for a key of %d columns", len(t.MaxKey), n)
	case t.Rows < 0 || t.Chunks < 0:
		return fmt.Errorf("negative counts (%d rows, %d chunks)", t.Rows, t.Chunks)
	}
	for _, k := range t.Reread {
		if len(k) != n {
			return fmt.Errorf("a key to read again of %d values for a key of %d columns", len(k), n)
		}
	}
	if t.Ranges == nil {
		return nil
	}
	switch {
	case len(t.Ranges) == 0:
		return errors.New("an empty list of key ranges")
	case len(t.Ranges) > MaxReaders:
		return fmt.Errorf("%d key ranges (at most %d)", len(t.Ranges), MaxReaders)
	case t.MaxKey == nil:
		return errors.New("key ranges without an upper bound")
	case t.Done != t.rangesDone():
		return fmt.Errorf("done is %v while its key ranges say %v", t.Done, t.rangesDone())
	case !slices.Equal(t.Ranges[len(t.Ranges)-1].To, t.MaxKey):
		return errors.New("the last key range does not end at the upper bound")
	}
	for i, r := range t.Ranges {
		if len(r.Cursor) != n || len(r.To) != n {
			return fmt.Errorf("key range %d: bounds of %d and %d values for a key of %d columns", i, len(r.Cursor), len(r.To), n)
		}
	}
	return nil
}

func (t *TableProgress) clone() TableProgress {
	c := *t
	c.Reread = slices.Clone(t.Reread)
	c.Partitions = slices.Clone(t.Partitions)
	c.Storage = slices.Clone(t.Storage)
	c.Columns = slices.Clone(t.Columns)
	c.Files = slices.Clone(t.Files)
	c.Ranges = slices.Clone(t.Ranges)
	return c
}

// Clone returns a deep copy of p.
func (p *Position) Clone() *Position {
	c := *p
	if p.Invisible != nil {
		inv := slices.Clone(*p.Invisible)
		c.Invisible = &inv
	}
	c.Tables = make(map[string]*TableProgress, len(p.Tables))
	for k, t := range maps.All(p.Tables) {
		tc := t.clone()
		c.Tables[k] = &tc
	}
	return &c
}

// whatTheTableIs is p without its backfill's progress: what it knows of the table itself (key,
// OID, membership, partitions, storage, shape), which a table whose output starts over keeps.
func (p *TableProgress) whatTheTableIs() TableProgress {
	return TableProgress{Key: p.Key, OID: p.OID, Publication: p.Publication, Partitions: p.Partitions, Storage: p.Storage, Shape: p.Shape}
}
