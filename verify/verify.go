package verify

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/tidemark/tidemark/chunker"
)

// Table is a table to compare, with its key override (nil: the table's own key, as sync
// chooses it).
type Table struct {
	Schema, Name string
	Key          []string
}

func (t Table) String() string { return t.Schema + "." + t.Name }

// Options configure a comparison.
type Options struct {
	// Source is a connection to the source with the pinned session settings (pgconf.Open).
	Source *pgx.Conn
	Tables []Table
	// Publication is the capture's publication: a table in it is compared within its column
	// list. "" or a publication that does not hold the table: every column.
	Publication string
	// ChunkSize is the rows of a source chunk. Zero: 10000.
	ChunkSize int
	// MaxChunkBytes bounds a chunk's values, as the backfill's. Zero: 32 MiB.
	MaxChunkBytes int
	// RecheckFor is the longest time differing keys are read again while they change. Zero: no
	// re-check (a source that no longer changes).
	RecheckFor time.Duration
	// RecheckEvery is the pause between two reads of differing keys. Zero: 1s.
	RecheckEvery time.Duration
	// Keep is the differing keys kept per table, re-checked and reported; the count of the
	// others is reported. Zero: 1000.
	Keep int
	// PartBytes is the JSON lines output above which the replay is split into partition files,
	// each of about that size (a replayed partition takes a few times its size in memory). Zero:
	// 64 MiB.
	PartBytes int64
	// TempDir holds the partition files; "" the system's.
	TempDir string
	// Progress, when set, is called after each table.
	Progress func(*TableReport)
	// Log says when the replay goes to partition files, and each re-check round (debug).
	Log zerolog.Logger
}

func (o *Options) defaults() {
	if o.ChunkSize <= 0 {
		o.ChunkSize = 10000
	}
	if o.RecheckEvery <= 0 {
		o.RecheckEvery = time.Second
	}
	if o.Keep <= 0 {
		o.Keep = 1000
	}
	if o.PartBytes <= 0 {
		o.PartBytes = 64 << 20
	}
}

// Kind is how a key differs.
type Kind int

// The kinds of difference.
const (
	Missing         Kind = iota + 1 // in the source, not in the output
	Extra                           // in the output, not in the source
	Differs                         // in both, with other values
	SourceDuplicate                 // on more than one row of the source: its key does not identify rows
	TargetDuplicate                 // on more than one row of the output
)

func (k Kind) String() string {
	switch k {
	case Missing:
		return "missing in the target"
	case Extra:
		return "not in the source"
	case Differs:
		return "values differ"
	case SourceDuplicate:
		return "on more than one row of the source (the key does not identify its rows)"
	case TargetDuplicate:
		return "on more than one row of the target"
	}
	return "?"
}

// Difference is one differing key.
type Difference struct {
	Key      string   // the key, col=value, ...
	Kind     Kind     // as last read
	Columns  []string // Differs: the columns whose values differ, when known
	Changing bool     // the source row kept changing through the re-checks: not confirmed either way
}

func (d Difference) String() string {
	s := d.Key + ": " + d.Kind.String()
	if len(d.Columns) > 0 {
		s += " (" + strings.Join(d.Columns, ", ") + ")"
	}
	if d.Changing {
		s += ", and still changing on the source"
	}
	return s
}

// TableReport is one table's result.
type TableReport struct {
	Table      string
	SourceRows int64 // rows read from the source
	TargetRows int64 // rows of the output
	Chunks     int   // source chunks read
	// Problem is a difference of definition that stopped the table's comparison (a missing
	// target table or column).
	Problem string
	// Differences are the differing keys kept (Options.Keep), after the re-checks.
	Differences []Difference
	// Unchecked counts the differing keys found beyond those kept: neither shown nor re-checked.
	Unchecked int64
	// Ignored lists the target's columns that the capture does not carry (not on the source, or
	// outside the publication's column list): not compared.
	Ignored []string
	Elapsed time.Duration
}

// Equal says whether the table's output equals its source.
func (t *TableReport) Equal() bool {
	return t.Problem == "" && len(t.Differences) == 0 && t.Unchecked == 0
}

// Report is the result of a comparison.
type Report struct {
	Tables []*TableReport
}

// Equal says whether every table's output equals its source.
func (r *Report) Equal() bool {
	for _, t := range r.Tables {
		if !t.Equal() {
			return false
		}
	}
	return true
}

// digest identifies a row's values: the first 16 bytes of a SHA-256 over them.
type digest [16]byte

// rowDigest hashes values (nil: NULL), each prefixed by its length, so that no two rows of
// different values share an input.
func rowDigest(vals [][]byte) digest {
	h := sha256.New()
	var n [9]byte
	for _, v := range vals {
		if v == nil {
			n[0] = 0
			h.Write(n[:1])
			continue
		}
		n[0] = 1
		binary.BigEndian.PutUint64(n[1:], uint64(len(v)))
		h.Write(n[:])
		h.Write(v)
	}
	var d digest
	copy(d[:], h.Sum(nil))
	return d
}

// sumDigest is an order-free digest of a set of rows: the XOR of their digests (keys are
// unique, so no row cancels another) and their count.
type sumDigest struct {
	x digest
	n int64
}

func (s *sumDigest) add(d digest) {
	for i := range d {
		s.x[i] ^= d[i]
	}
	s.n++
}

// discover reads the source table's definition and key as sync would.
func discover(ctx context.Context, o *Options, spec Table) (*chunker.Table, error) {
	pub := ""
	if o.Publication != "" {
		var in bool
		if err := o.Source.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_catalog.pg_publication_tables WHERE pubname = $1 AND schemaname = $2 AND tablename = $3)`,
			o.Publication, spec.Schema, spec.Name).Scan(&in); err != nil {
			return nil, fmt.Errorf("read publication %q: %w", o.Publication, err)
		}
		if in {
			pub = o.Publication
		}
	}
	t, err := chunker.Discover(ctx, o.Source, spec.Schema, spec.Name, spec.Key, pub)
	if err != nil {
		return nil, fmt.Errorf("source: %w", err)
	}
	return t, nil
}

// keyText returns the key's text values of a source row.
func keyText(t *chunker.Table, row chunker.Row) []string {
	k := make([]string, len(t.Key))
	for i, c := range t.Key {
		k[i] = string(row[c])
	}
	return k
}

// showKey writes a key for people: col=value, ...
func showKey(names, vals []string) string {
	parts := make([]string, len(names))
	for i := range names {
		parts[i] = names[i] + "=" + vals[i]
	}
	return strings.Join(parts, ", ")
}

// encodeKey encodes a key's text values as chunker does.
func encodeKey(t *chunker.Table, vals []string) (string, error) {
	b := make([][]byte, len(vals))
	for i, v := range vals {
		b[i] = []byte(v)
	}
	k, err := t.AppendKey(nil, b)
	return string(k), err
}

// side is a row as read on one side of a re-check: its digest, or absent.
type side struct {
	present bool
	d       digest
}

// pending is a differing key being re-checked.
type pending struct {
	id      string   // encoded key
	text    []string // the key's text values; nil: unknown (an output key that could not be read back)
	show    string
	kind    Kind
	columns []string
	src     side
	tgt     side
	row     jsRow // JSON lines: the output's row as last read (nil: none)
	same    int   // reads in a row with the same two sides
	moved   bool  // the source row changed during the re-checks, and has not been stable since
}

// reader reads the rows of keys on one side of a re-check.
type reader func(ctx context.Context, keys []*pending) (map[string]side, error)

// kinds says how two sides differ; 0 when equal.
func kinds(src, tgt side) Kind {
	switch {
	case src.present && tgt.present && src.d == tgt.d:
		return 0
	case !src.present && !tgt.present:
		return 0
	case !tgt.present:
		return Missing
	case !src.present:
		return Extra
	}
	return Differs
}

// recheck reads the differing keys again on both sides until each is equal (dropped), stable
// for three reads (a difference), or the time is up (changing when its source row moved in its
// last reads). The keys' first read counts as the first.
func recheck(ctx context.Context, o *Options, keys []*pending, readSrc, readTgt reader) (settled []*pending, err error) {
	order := map[*pending]int{}
	for i, p := range keys {
		p.same = 1
		order[p] = i
	}
	defer func() { slices.SortFunc(settled, func(a, b *pending) int { return order[a] - order[b] }) }()
	deadline := time.Now().Add(o.RecheckFor)
	open := keys
	for len(open) > 0 && o.RecheckFor > 0 && time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(o.RecheckEvery):
		}
		var readable []*pending
		for _, p := range open {
			if p.text != nil {
				readable = append(readable, p)
			} else {
				settled = append(settled, p)
			}
		}
		if len(readable) == 0 {
			open = nil
			break
		}
		o.Log.Debug().Int("keys", len(readable)).Msg("differing keys read again on both sides")
		src, err := readSrc(ctx, readable)
		if err != nil {
			return nil, err
		}
		tgt, err := readTgt(ctx, readable)
		if err != nil {
			return nil, err
		}
		open = nil
		for _, p := range readable {
			s, t := src[p.id], tgt[p.id]
			k := kinds(s, t)
			if k == 0 {
				continue // the output caught up
			}
			if s != p.src {
				p.moved = true
			}
			if s == p.src && t == p.tgt {
				p.same++
			} else {
				p.same = 1
				p.columns = nil // read from the first rows only
			}
			p.src, p.tgt, p.kind = s, t, k
			if p.same >= 3 {
				p.moved = false // stable: a difference
				settled = append(settled, p)
				continue
			}
			open = append(open, p)
		}
	}
	// Still open when the time is up: changing if the source row moved during the re-checks.
	settled = append(settled, open...)
	return settled, nil
}

// differences turns the settled keys into the report's differences.
func differences(keys []*pending) []Difference {
	var out []Difference
	for _, p := range keys {
		out = append(out, Difference{Key: p.show, Kind: p.kind, Columns: p.columns, Changing: p.moved})
	}
	return out
}

// recheckBatch is the most keys read in one statement.
const recheckBatch = 500

// readKeys reads the rows of keys from t through r (a chunker.Reader on either side) and
// returns the digests of the values vals picks from each, by key encoded with enc (the source
// table).
func readKeys(ctx context.Context, r *chunker.Reader, t, enc *chunker.Table, keys []*pending, vals func(chunker.Row) ([][]byte, error)) (map[string]side, error) {
	out := map[string]side{}
	for start := 0; start < len(keys); start += recheckBatch {
		batch := keys[start:min(len(keys), start+recheckBatch)]
		var ks [][]string
		for _, p := range batch {
			ks = append(ks, p.text)
		}
		rows, err := keysAll(ctx, r, t, ks)
		if err != nil {
			return nil, err
		}
		for _, row := range rows {
			id, err := encodeKey(enc, keyText(t, row))
			if err != nil {
				return nil, err
			}
			v, err := vals(row)
			if err != nil {
				return nil, err
			}
			out[id] = side{present: true, d: rowDigest(v)}
		}
	}
	return out, nil
}

// keysAll reads the rows of keys from t: a read that stopped at the reader's byte bound (large
// rows) is read again in halves, so that no key is taken for absent because it was not reached.
func keysAll(ctx context.Context, r *chunker.Reader, t *chunker.Table, keys [][]string) ([]chunker.Row, error) {
	c, err := r.Keys(ctx, t, keys)
	if err != nil {
		return nil, err
	}
	if !c.Capped || len(keys) == 1 {
		return c.Rows, nil
	}
	half := len(keys) / 2
	a, err := keysAll(ctx, r, t, keys[:half])
	if err != nil {
		return nil, err
	}
	b, err := keysAll(ctx, r, t, keys[half:])
	if err != nil {
		return nil, err
	}
	return append(a, b...), nil
}
