package verify

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark/tidemark/chunker"
)

// Postgres compares the tables of o with a PostgreSQL target (a connection with the pinned
// session settings), whose tables are in schema (""; each source table's own).
func Postgres(ctx context.Context, o Options, target *pgx.Conn, schema string) (*Report, error) {
	o.defaults()
	rep := &Report{}
	for _, spec := range o.Tables {
		start := time.Now()
		tr, err := comparePostgres(ctx, &o, target, schema, spec)
		if err != nil {
			return rep, fmt.Errorf("verify %s: %w", spec, err)
		}
		tr.Elapsed = time.Since(start)
		rep.Tables = append(rep.Tables, tr)
		if o.Progress != nil {
			o.Progress(tr)
		}
	}
	return rep, nil
}

// pgTable is one table compared with a PostgreSQL target.
type pgTable struct {
	o        *Options
	src, tgt *chunker.Table
	cols     []int // per source column, its index in tgt.Columns
	sr, tr   *chunker.Reader
	rep      *TableReport
	kept     []*pending
}

func comparePostgres(ctx context.Context, o *Options, target *pgx.Conn, schema string, spec Table) (*TableReport, error) {
	rep := &TableReport{Table: spec.String()}
	src, err := discover(ctx, o, spec)
	if err != nil {
		return nil, err
	}
	if schema == "" {
		schema = src.Schema
	}
	tgt, err := chunker.DiscoverKeyed(ctx, target, schema, src.Name, src.KeyNames())
	if err != nil {
		if errors.Is(err, chunker.ErrNoTable) {
			rep.Problem = fmt.Sprintf("the target has no table %s.%s", schema, src.Name)
			return rep, nil
		}
		rep.Problem = fmt.Sprintf("target table %s.%s: %v", schema, src.Name, err)
		return rep, nil
	}
	c := &pgTable{o: o, src: src, tgt: tgt, rep: rep}
	var lacking []string
	for _, col := range src.Columns {
		i := slices.IndexFunc(tgt.Columns, func(tc chunker.Column) bool { return tc.Name == col.Name })
		if i < 0 {
			lacking = append(lacking, col.Name)
		}
		c.cols = append(c.cols, i)
	}
	for i, col := range tgt.Columns {
		if !slices.Contains(c.cols, i) {
			rep.Ignored = append(rep.Ignored, col.Name)
		}
	}
	if len(lacking) > 0 {
		rep.Problem = fmt.Sprintf("the target table %s.%s has no column %v", schema, src.Name, lacking)
		return rep, nil
	}
	cfg := chunker.Config{MaxBytes: o.MaxChunkBytes}
	if c.sr, err = chunker.NewReader(o.Source, cfg); err != nil {
		return nil, err
	}
	if c.tr, err = chunker.NewReader(target, cfg); err != nil {
		return nil, err
	}
	if err := c.run(ctx); err != nil {
		return nil, err
	}
	settled, err := recheck(ctx, o, c.kept, c.readSource, c.readTarget)
	if err != nil {
		return nil, err
	}
	rep.Differences = differences(settled)
	return rep, nil
}

// targetValues are a target row's values in the source's column order.
func (c *pgTable) targetValues(row chunker.Row) [][]byte {
	vals := make([][]byte, len(c.cols))
	for i, j := range c.cols {
		vals[i] = row[j]
	}
	return vals
}

// run reads the source chunk by chunk, each with the target's rows of its key range, then the
// target's rows past the source's last key.
func (c *pgTable) run(ctx context.Context) error {
	limit := c.o.ChunkSize
	ch, err := c.sr.First(ctx, c.src, limit)
	if err != nil {
		return err
	}
	upper := ch.Upper
	var last []string
	for ch != nil && len(ch.Rows) > 0 {
		c.rep.Chunks++
		c.rep.SourceRows += int64(len(ch.Rows))
		if err := c.compareChunk(ctx, ch); err != nil {
			return err
		}
		last = ch.Last
		if ch.Done {
			break
		}
		if ch, err = c.sr.Next(ctx, c.src, last, upper, limit); err != nil {
			return err
		}
	}
	// The target's rows past the source's last key (all of them for an empty source).
	return c.targetRange(ctx, last, nil, func(id string, row chunker.Row) error {
		return c.differ(id, c.targetKey(row), Extra, nil, side{}, side{present: true, d: rowDigest(c.targetValues(row))})
	})
}

// targetKey is the key's text values of a target row.
func (c *pgTable) targetKey(row chunker.Row) []string { return keyText(c.tgt, row) }

// targetRange reads the target's rows with keys in (after, upTo] in pages, calling fn with each
// and its encoded key.
func (c *pgTable) targetRange(ctx context.Context, after, upTo []string, fn func(id string, row chunker.Row) error) error {
	for {
		page, err := c.tr.Next(ctx, c.tgt, after, upTo, c.o.ChunkSize)
		if err != nil {
			return fmt.Errorf("target: %w", err)
		}
		for _, row := range page.Rows {
			c.rep.TargetRows++
			id, err := encodeKey(c.src, c.targetKey(row))
			if err != nil {
				return err
			}
			if err := fn(id, row); err != nil {
				return err
			}
		}
		if page.Done || len(page.Rows) == 0 {
			return nil
		}
		after = page.Last
	}
}

// compareChunk compares one source chunk with the target's rows of its key range, row by row
// as they come (a target row is held only while it is compared); the order-free digests of both
// sides are a last check that no difference went unrecorded.
func (c *pgTable) compareChunk(ctx context.Context, ch *chunker.Chunk) error {
	type srcRow struct {
		i    int
		d    digest
		seen bool
	}
	// The chunk's differences, in the order of their encoded keys (key order for most types).
	type found struct {
		id       string
		key      []string
		kind     Kind
		cols     []string
		src, tgt side
	}
	var diffs []found
	recorded := 0 // differences found, kept or not
	add := func(f found) {
		recorded++
		if len(diffs) < 2*c.o.Keep {
			diffs = append(diffs, f)
		} else {
			c.rep.Unchecked++
		}
	}
	rows := make(map[string]*srcRow, len(ch.Rows))
	var srcSum, tgtSum sumDigest
	for i, row := range ch.Rows {
		id, err := encodeKey(c.src, keyText(c.src, row))
		if err != nil {
			return err
		}
		d := rowDigest(row)
		srcSum.add(d)
		if rows[id] != nil {
			add(found{id, keyText(c.src, row), SourceDuplicate, nil, side{present: true, d: d}, side{}})
			continue
		}
		rows[id] = &srcRow{i: i, d: d}
	}
	err := c.targetRange(ctx, ch.After, ch.Last, func(id string, row chunker.Row) error {
		vals := c.targetValues(row)
		d := rowDigest(vals)
		tgtSum.add(d)
		s := rows[id]
		switch {
		case s == nil:
			add(found{id, c.targetKey(row), Extra, nil, side{}, side{present: true, d: d}})
		case s.seen:
			add(found{id, c.targetKey(row), TargetDuplicate, nil, side{present: true, d: s.d}, side{present: true, d: d}})
		case s.d != d:
			s.seen = true
			var cols []string
			for j, col := range c.src.Columns {
				if !bytes.Equal(ch.Rows[s.i][j], vals[j]) || (ch.Rows[s.i][j] == nil) != (vals[j] == nil) {
					cols = append(cols, col.Name)
				}
			}
			add(found{id, c.targetKey(row), Differs, cols, side{present: true, d: s.d}, side{present: true, d: d}})
		default:
			s.seen = true
		}
		return nil
	})
	if err != nil {
		return err
	}
	for id, s := range rows {
		if !s.seen {
			add(found{id, keyText(c.src, ch.Rows[s.i]), Missing, nil, side{present: true, d: s.d}, side{}})
		}
	}
	if recorded == 0 && srcSum != tgtSum {
		// Cannot happen when every row was matched by key; counted rather than trusted.
		c.rep.Unchecked++
	}
	slices.SortFunc(diffs, func(a, b found) int { return strings.Compare(a.id, b.id) })
	for _, f := range diffs {
		if err := c.differ(f.id, f.key, f.kind, f.cols, f.src, f.tgt); err != nil {
			return err
		}
	}
	return nil
}

// differ records a differing key: kept for the re-check and the report while there is room,
// counted otherwise.
func (c *pgTable) differ(id string, key []string, kind Kind, cols []string, src, tgt side) error {
	if len(c.kept) >= c.o.Keep {
		c.rep.Unchecked++
		return nil
	}
	p := &pending{id: id, text: key, show: showKey(c.src.KeyNames(), key), kind: kind, columns: cols, src: src, tgt: tgt}
	if kind == SourceDuplicate || kind == TargetDuplicate {
		p.text = nil // a read by key shows one of the rows: not re-checked
	}
	c.kept = append(c.kept, p)
	return nil
}

func (c *pgTable) readSource(ctx context.Context, keys []*pending) (map[string]side, error) {
	return readKeys(ctx, c.sr, c.src, c.src, keys, func(row chunker.Row) ([][]byte, error) { return row, nil })
}

func (c *pgTable) readTarget(ctx context.Context, keys []*pending) (map[string]side, error) {
	m, err := readKeys(ctx, c.tr, c.tgt, c.src, keys, func(row chunker.Row) ([][]byte, error) { return c.targetValues(row), nil })
	if err != nil {
		return nil, fmt.Errorf("target: %w", err)
	}
	return m, nil
}
