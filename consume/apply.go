package consume

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidemark/tidemark/chunker"
	"github.com/tidemark/tidemark/internal/pgjson"
	"github.com/tidemark/tidemark/internal/sqlfix"
	"github.com/tidemark/tidemark/sink/jsonl/line"
	"github.com/tidemark/tidemark/sink/kafka"
	"github.com/tidemark/tidemark/sink/postgres"
)

// table is a target table, as the consumer writes it.
type table struct {
	source string // schema.table on the source
	name   string // schema.table on the target
	ident  string // its quoted name
	topic  string
	cols   map[string]*pgjson.Type
	oids   map[string]uint32
	always map[string]bool // columns GENERATED ALWAYS AS IDENTITY
	key    []string        // the key's columns, sorted: checked once against the table's unique indexes
	keyOps []chunker.Ops   // each key column's equality, whatever search_path says
}

// op is one statement of a target transaction, and what it applies (for an error's message).
type op struct {
	sql  string
	args []any
	what string
}

// step applies the records the partitions hold, as far as they can go, in one target
// transaction with the partitions' new offsets. It returns how many records it applied.
func (c *Consumer) step(ctx context.Context) (int, error) {
	var ops []op
	start := map[tp]int64{} // the offsets the transaction moves from
	advance := func(k tp, off int64) {
		if _, ok := start[k]; !ok {
			start[k] = c.pos[k]
		}
		c.pos[k] = off + 1
		c.buf[k] = c.buf[k][1:]
	}
	topics := make([]string, 0, len(c.parts))
	for t := range c.parts {
		topics = append(topics, t)
	}
	slices.Sort(topics)
	n := 0
	for _, topic := range topics {
		for progress := true; progress; {
			progress = false
			for p := range c.parts[topic] {
				k := tp{topic, p}
				for len(c.buf[k]) > 0 {
					if _, blocked := c.block[k]; blocked {
						break
					}
					r := c.buf[k][0]
					if r.Attrs.IsControl() {
						advance(k, r.Offset)
						continue
					}
					h := headersOf(r)
					if h.op == "truncate" || h.op == "refresh" {
						// Every partition of the topic has it, at the same place: applied once all
						// have reached it.
						c.block[k] = mark{h.lsn, h.seq}
						break
					}
					o, err := c.rowOp(ctx, r, h)
					if err != nil {
						return 0, err
					}
					ops = append(ops, o)
					advance(k, r.Offset)
					n++
				}
			}
			// The barrier: every partition of the topic stopped at the same truncate or refresh.
			var at *mark
			all := true
			for p := range c.parts[topic] {
				m, ok := c.block[tp{topic, p}]
				if !ok {
					all = false
					break
				}
				if at != nil && *at != m {
					return 0, fmt.Errorf("topic %s: partition %d has a truncate or refresh at %s/%s where another has one at %s/%s: the partitions disagree on the table's history; it is not an output Tidemark wrote alone",
						topic, p, m.lsn, m.seq, at.lsn, at.seq)
				}
				at = &m
			}
			if !all || at == nil {
				continue
			}
			r := c.buf[tp{topic, 0}][0]
			h := headersOf(r)
			t, err := c.table(ctx, h.table, topic)
			if err != nil {
				return 0, err
			}
			ops = append(ops, op{sql: `DELETE FROM ` + t.ident, what: h.op + " of " + h.table + " at " + at.lsn})
			for p := range c.parts[topic] {
				k := tp{topic, p}
				advance(k, c.buf[k][0].Offset)
				delete(c.block, k)
			}
			n++
			progress = true
		}
	}
	if len(start) == 0 {
		return 0, nil
	}
	return n, c.commit(ctx, ops, start)
}

// commit applies ops and moves the offsets of the partitions in start, in one target
// transaction. The offsets move only from where this member last read or wrote them: when
// another member of the group moved one meanwhile (this one lost the partition and took it
// back, or was thought dead), the transaction is rolled back and the partitions read again from
// the target's offsets.
func (c *Consumer) commit(ctx context.Context, ops []op, start map[tp]int64) error {
	tx, err := c.conn.Begin(ctx)
	if err != nil {
		return fmt.Errorf("target: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	// Every partition this member holds of the step's topics is checked, not only those the
	// step advanced: one stopped at a truncate without applying anything may have been moved
	// past it by another member too, and would wait for the others at a truncate they passed.
	expect := map[tp]int64{}
	for k := range c.pos {
		for j := range start {
			if j.topic == k.topic {
				expect[k] = c.pos[k]
				break
			}
		}
	}
	for k, from := range start {
		expect[k] = from
	}
	var topics []string
	var parts []int32
	for k := range expect {
		topics, parts = append(topics, k.topic), append(parts, k.part)
	}
	// One statement, rows locked in one order: two members locking the same rows never wait on
	// each other in a cycle.
	have, err := scanOffsets(tx.Query(ctx, `SELECT o.topic, o.partition, o.next_offset FROM `+OffsetsTable+` o
		JOIN unnest($2::text[], $3::int[]) AS k (topic, partition) ON o.topic = k.topic AND o.partition = k.partition
		WHERE o.group_id = $1 ORDER BY o.topic, o.partition FOR UPDATE OF o`, c.o.Group, topics, parts))
	if err != nil {
		return err
	}
	moved := false
	for k, from := range expect {
		v, ok := have[k]
		if !ok {
			return fmt.Errorf("the target's offset of group %s for topic %s partition %d is gone (its row of %s was deleted while the group ran): stop every member of the group, then start them again",
				c.o.Group, k.topic, k.part, OffsetsTable)
		}
		if v != from {
			moved = true
			c.o.Log.Warn().Str("topic", k.topic).Int32("partition", k.part).Int64("expected", from).Int64("found", v).
				Msg("another member of the group applied this partition meanwhile: its records are read again from the target's offset")
		}
	}
	if moved {
		_ = tx.Rollback(ctx)
		c.reread(have)
		return nil
	}
	b := &pgx.Batch{}
	for _, o := range ops {
		b.Queue(o.sql, o.args...)
	}
	for k := range start {
		b.Queue(`UPDATE `+OffsetsTable+` SET next_offset = $4, updated = now() WHERE group_id = $1 AND topic = $2 AND partition = $3`,
			c.o.Group, k.topic, k.part, c.pos[k])
	}
	br := tx.SendBatch(ctx, b)
	for i := range b.Len() {
		tag, err := br.Exec()
		if err != nil {
			_ = br.Close()
			if i < len(ops) {
				return fmt.Errorf("apply the %s to the target: %w", ops[i].what, err)
			}
			return fmt.Errorf("target: move the offsets of group %s: %w", c.o.Group, err)
		}
		if i >= len(ops) && tag.RowsAffected() != 1 {
			_ = br.Close()
			return fmt.Errorf("target: the offsets of group %s were not moved (%d rows): their rows of %s changed under the consumer", c.o.Group, tag.RowsAffected(), OffsetsTable)
		}
	}
	if err := br.Close(); err != nil {
		return fmt.Errorf("target: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("target: commit (the records since the last commit are applied again from the target's offsets on the next run): %w", err)
	}
	c.applied += int64(len(ops))
	// The group's offsets in Kafka follow, for the tools that show a group's lag: the target's
	// are the ones the consumer starts from.
	offs := map[string]map[int32]kgo.EpochOffset{}
	for k := range start {
		if offs[k.topic] == nil {
			offs[k.topic] = map[int32]kgo.EpochOffset{}
		}
		offs[k.topic][k.part] = kgo.EpochOffset{Epoch: -1, Offset: c.pos[k]}
	}
	c.cl.CommitOffsets(ctx, offs, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, _ *kmsg.OffsetCommitResponse, err error) {
		if err != nil {
			c.o.Log.Debug().Err(err).Msg("the group's offsets in Kafka (informative) were not moved")
		}
	})
	return nil
}

// reread undoes a step whose offsets another member moved: each partition of it (every one
// this member holds of the step's topics) is read again from the target's offset.
func (c *Consumer) reread(at map[tp]int64) {
	seek := map[string]map[int32]kgo.EpochOffset{}
	for k, v := range at {
		c.pos[k], c.buf[k] = v, nil
		delete(c.block, k)
		if seek[k.topic] == nil {
			seek[k.topic] = map[int32]kgo.EpochOffset{}
		}
		seek[k.topic][k.part] = kgo.EpochOffset{Epoch: -1, Offset: max(v, 0)}
	}
	c.cl.SetOffsets(seek)
}

// headers are a record's Tidemark headers.
type headers struct{ op, lsn, seq, table string }

func headersOf(r *kgo.Record) headers {
	var h headers
	for _, x := range r.Headers {
		switch x.Key {
		case kafka.HeaderOp:
			h.op = string(x.Value)
		case kafka.HeaderLSN:
			h.lsn = string(x.Value)
		case kafka.HeaderSeq:
			h.seq = string(x.Value)
		case kafka.HeaderTable:
			h.table = string(x.Value)
		}
	}
	return h
}

// rowOp is the statement that applies a record of a row: an upsert of its values, or a delete
// of its key.
func (c *Consumer) rowOp(ctx context.Context, r *kgo.Record, h headers) (op, error) {
	where := fmt.Sprintf("topic %s partition %d offset %d", r.Topic, r.Partition, r.Offset)
	if r.Value == nil {
		// A tombstone: a delete, the key only.
		if h.op != "delete" || h.table == "" {
			return op{}, fmt.Errorf("%s: a record without a value whose headers say op %q, table %q: not a Tidemark delete", where, h.op, h.table)
		}
		var key map[string]json.RawMessage
		if err := json.Unmarshal(r.Key, &key); err != nil || len(key) == 0 {
			return op{}, fmt.Errorf("%s: a delete whose key %q is not a JSON object", where, r.Key)
		}
		t, err := c.table(ctx, h.table, r.Topic)
		if err != nil {
			return op{}, err
		}
		return t.deleteOp(ctx, c, key, nil, where)
	}
	l, err := line.Decode(r.Value)
	if err != nil {
		return op{}, fmt.Errorf("%s: %w", where, err)
	}
	t, err := c.table(ctx, l.Table, r.Topic)
	if err != nil {
		return op{}, err
	}
	switch l.Op {
	case "insert", "update", "snapshot":
		return t.upsertOp(ctx, c, l, where)
	case "delete":
		return t.deleteOp(ctx, c, l.Key, l.Original, where)
	}
	return op{}, fmt.Errorf("%s: op %q, which tidemark consume does not know (a newer Tidemark wrote it?)", where, l.Op)
}

// table is the target table of source table name, looked up once.
func (c *Consumer) table(ctx context.Context, name, topic string) (*table, error) {
	if t := c.tables[name]; t != nil {
		return t, nil
	}
	schema, rel, ok := strings.Cut(name, ".")
	if !ok {
		return nil, fmt.Errorf("topic %s: table %q is not schema.table", topic, name)
	}
	if c.o.TargetSchema != "" {
		schema = c.o.TargetSchema
	}
	t := &table{source: name, name: schema + "." + rel, ident: sqlfix.Ident(schema, rel), topic: topic, cols: map[string]*pgjson.Type{},
		oids: map[string]uint32{}, always: map[string]bool{}}
	rows, err := c.conn.Query(ctx, postgres.TargetColumnsSQL, t.ident)
	if err != nil {
		return nil, fmt.Errorf("target: read table %s: %w", t.name, err)
	}
	for rows.Next() {
		var col, typ, base, identity string
		var oid uint32
		if err := rows.Scan(&col, &typ, &base, &identity, &oid); err != nil {
			rows.Close()
			return nil, err
		}
		t.oids[col] = oid
		t.always[col] = identity == "a"
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("target: read table %s: %w", t.name, err)
	}
	if len(t.oids) == 0 {
		return nil, fmt.Errorf("target table %s does not exist (it receives %s, from topic %s): create it as on the source (pg_dump --schema-only --table %s SOURCE | psql TARGET), then run tidemark consume again",
			t.name, name, topic, sqlfix.Literal(sqlfix.Ident(strings.Split(name, ".")...)))
	}
	for col, oid := range t.oids {
		typ, err := c.types.Type(ctx, oid)
		if err != nil {
			return nil, fmt.Errorf("target table %s column %s: %w", t.name, col, err)
		}
		t.cols[col] = typ
	}
	// A foreign key from or to the table: its tables' changes are applied each in its own
	// order, so a valid source state could violate it on the target.
	fks, err := c.conn.Query(ctx, postgres.ForeignKeysSQL, t.ident)
	if err != nil {
		return nil, fmt.Errorf("target: read the constraints of %s: %w", t.name, err)
	}
	var drops []string
	for fks.Next() {
		var con, on string
		if err := fks.Scan(&con, &on); err != nil {
			fks.Close()
			return nil, err
		}
		drops = append(drops, postgres.DropConstraintFix(on, con))
	}
	if err := fks.Err(); err != nil {
		return nil, fmt.Errorf("target: read the constraints of %s: %w", t.name, err)
	}
	if len(drops) > 0 {
		return nil, fmt.Errorf("target table %s has a foreign key: each table's changes (and each partition's) are applied in their own order, so a valid source state could violate it on the target; drop it (%s), then run tidemark consume again",
			t.name, strings.Join(drops, " "))
	}
	// One group and one source table per target table: two would apply their changes twice,
	// or mix two tables' rows (and a truncate of one would empty the other).
	if _, err := c.conn.Exec(ctx, `INSERT INTO `+TablesTable+` (target_table, group_id, topic, source_table) VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING`,
		t.name, c.o.Group, topic, name); err != nil {
		return nil, fmt.Errorf("target: %w", err)
	}
	var group, from, source string
	if err := c.conn.QueryRow(ctx, `SELECT group_id, topic, source_table FROM `+TablesTable+` WHERE target_table = $1`, t.name).Scan(&group, &from, &source); err != nil {
		return nil, fmt.Errorf("target: %w", err)
	}
	if group != c.o.Group || from != topic || source != name {
		return nil, fmt.Errorf("target table %s is applied from %s (topic %s) by consumer group %s: a second group, or a second source table, would apply other changes into it; give this consumer another --target-schema (or, for a group that is gone: DELETE FROM %s WHERE target_table = %s)",
			t.name, source, from, group, TablesTable, sqlfix.Literal(t.name))
	}
	c.tables[name] = t
	return t, nil
}

// checkKey checks, the first time, that the table has a unique index on exactly the key's
// columns: the upserts' ON CONFLICT needs it, and a key on other columns would apply one
// source row's changes to another's.
func (t *table) checkKey(ctx context.Context, c *Consumer, key map[string]json.RawMessage, where string) error {
	names := make([]string, 0, len(key))
	for k := range key {
		names = append(names, k)
	}
	slices.Sort(names)
	if t.key != nil {
		if !slices.Equal(t.key, names) {
			return fmt.Errorf("%s: a key of columns %v in table %s, whose earlier keys were of %v: the source's key changed; start the target table over (re-backfill it)", where, names, t.source, t.key)
		}
		return nil
	}
	for _, k := range names {
		if _, ok := t.cols[k]; !ok {
			return fmt.Errorf("%s: target table %s has no column %s, which is in the source's key: create the table as on the source", where, t.name, k)
		}
	}
	var ok bool
	if err := c.conn.QueryRow(ctx, postgres.KeyIndexSQL, t.ident, names).Scan(&ok); err != nil {
		return fmt.Errorf("target: read the indexes of %s: %w", t.name, err)
	}
	if !ok {
		return fmt.Errorf("target table %s has no unique index on exactly its key's columns (%s): add one (ALTER TABLE %s ADD PRIMARY KEY (%s)), then run tidemark consume again",
			t.name, strings.Join(names, ", "), t.ident, strings.Join(quoteAll(names), ", "))
	}
	if c.parts[t.topic] > 1 {
		if err := t.noOtherUnique(ctx, c, names); err != nil {
			return err
		}
	}
	for col, always := range t.always {
		if always && !slices.Contains(names, col) {
			return fmt.Errorf("target table %s: column %s is GENERATED ALWAYS AS IDENTITY, which an update cannot set to the source's value: %s then run tidemark consume again",
				t.name, col, postgres.GeneratedByDefaultFix(t.ident, col))
		}
	}
	for _, k := range names {
		ops, err := chunker.ReadOps(ctx, c.conn, t.oids[k])
		if err != nil {
			return fmt.Errorf("target table %s, key column %s: %w", t.name, k, err)
		}
		t.keyOps = append(t.keyOps, ops)
	}
	t.key = names
	return nil
}

// noOtherUnique refuses a unique index (or exclusion constraint) on other columns than the
// key, when the table's topic has several partitions: keys in different partitions are applied
// in no order between them, so a value that moved from one key to another (an email given up by
// one row and taken by another) can be written to the second row before it left the first.
func (t *table) noOtherUnique(ctx context.Context, c *Consumer, key []string) error {
	rows, err := c.conn.Query(ctx, `SELECT i.indexrelid::regclass::text, coalesce(con.conname::text, '')
		FROM pg_index i LEFT JOIN pg_constraint con ON con.conindid = i.indexrelid AND con.conrelid = i.indrelid
		WHERE i.indrelid = to_regclass($1) AND (i.indisunique OR i.indisexclusion)
		AND NOT (i.indisunique AND i.indpred IS NULL AND i.indexprs IS NULL AND i.indnkeyatts = cardinality($2::text[])
			AND (SELECT array_agg(a.attname::text ORDER BY a.attname::text) FROM pg_attribute a
				WHERE a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey[0:i.indnkeyatts - 1])) = $2::text[])
		ORDER BY 1`, t.ident, key)
	if err != nil {
		return fmt.Errorf("target: read the indexes of %s: %w", t.name, err)
	}
	var fixes []string
	var idx, con string
	if _, err := pgx.ForEachRow(rows, []any{&idx, &con}, func() error {
		if con != "" {
			fixes = append(fixes, postgres.DropConstraintFix(t.ident, con))
		} else {
			fixes = append(fixes, "DROP INDEX "+idx+";")
		}
		return nil
	}); err != nil {
		return fmt.Errorf("target: read the indexes of %s: %w", t.name, err)
	}
	if len(fixes) > 0 {
		return fmt.Errorf("target table %s has a unique index or exclusion constraint besides its key's, and its topic %s has %d partitions, whose keys are applied in no order between them: a value moved from one row to another could meet itself; drop it (%s), or sync with --kafka-partitions 1, then run tidemark consume again",
			t.name, t.topic, c.parts[t.topic], strings.Join(fixes, " "))
	}
	return nil
}

func quoteAll(names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = sqlfix.Ident(n)
	}
	return out
}

// value is the text of column col, from its JSON form or from its original text.
func (t *table) value(col string, v json.RawMessage, original map[string]string, where string) (any, error) {
	typ, ok := t.cols[col]
	if !ok {
		return nil, fmt.Errorf("%s: target table %s has no column %s, which the source's %s has: add it as on the source (ALTER TABLE %s ADD COLUMN %s <its type>), then run tidemark consume again",
			where, t.name, col, t.source, t.ident, sqlfix.Ident(col))
	}
	if o, ok := original[col]; ok {
		return o, nil
	}
	text, null, err := typ.Text(nil, v)
	if err != nil {
		return nil, fmt.Errorf("%s: column %s of %s: %w", where, col, t.source, err)
	}
	if null {
		return nil, nil
	}
	return string(text), nil
}

func (t *table) upsertOp(ctx context.Context, c *Consumer, l line.Line, where string) (op, error) {
	if err := t.checkKey(ctx, c, l.Key, where); err != nil {
		return op{}, err
	}
	cols := make([]string, 0, len(l.After))
	for col := range l.After {
		cols = append(cols, col)
	}
	slices.Sort(cols)
	args := make([]any, len(cols))
	var sets, updates, conds, params []string
	for i, col := range cols {
		v, err := t.value(col, l.After[col], l.Original, where)
		if err != nil {
			return op{}, err
		}
		args[i] = v
		param := fmt.Sprintf("$%d", i+1)
		params = append(params, param)
		if k := slices.Index(t.key, col); k >= 0 {
			conds = append(conds, sqlfix.Ident(col)+t.keyOps[k].Cast+" "+t.keyOps[k].Eq+" "+param+t.keyOps[k].Cast)
		} else {
			sets = append(sets, sqlfix.Ident(col)+" = EXCLUDED."+sqlfix.Ident(col))
			updates = append(updates, sqlfix.Ident(col)+" = "+param)
		}
	}
	what := fmt.Sprintf("%s of %s (%s)", l.Op, t.source, where)
	if l.Op == "insert" && len(l.Unchanged) > 0 {
		// A key change that left TOASTed values out: the new key's row is read again whole
		// later in this partition. Until then only a row already there (an earlier run's) is
		// brought up to date; none is made with those columns empty.
		if len(updates) == 0 {
			return op{sql: `SELECT`, what: what}, nil
		}
		return op{sql: `UPDATE ` + t.ident + ` SET ` + strings.Join(updates, ", ") + ` WHERE ` + strings.Join(conds, " AND "), args: args, what: what}, nil
	}
	conflict := "DO NOTHING"
	if len(sets) > 0 {
		conflict = "DO UPDATE SET " + strings.Join(sets, ", ")
	}
	over := ""
	for _, col := range cols {
		if t.always[col] {
			over = " OVERRIDING SYSTEM VALUE" // a key GENERATED ALWAYS AS IDENTITY takes the source's values
		}
	}
	sql := `INSERT INTO ` + t.ident + ` (` + strings.Join(quoteAll(cols), ", ") + `)` + over + ` VALUES (` + strings.Join(params, ", ") + `) ON CONFLICT (` +
		strings.Join(quoteAll(t.key), ", ") + `) ` + conflict
	return op{sql: sql, args: args, what: what}, nil
}

func (t *table) deleteOp(ctx context.Context, c *Consumer, key map[string]json.RawMessage, original map[string]string, where string) (op, error) {
	if err := t.checkKey(ctx, c, key, where); err != nil {
		return op{}, err
	}
	var conds []string
	var args []any
	for i, col := range t.key {
		v, err := t.value(col, key[col], original, where)
		if err != nil {
			return op{}, err
		}
		if v == nil {
			return op{}, fmt.Errorf("%s: a delete of %s whose key column %s has no value in the record (NaN or infinity, which a tombstone cannot carry): the row cannot be found; delete it on the target by hand, then run tidemark consume again",
				where, t.source, col)
		}
		conds = append(conds, fmt.Sprintf("%s%s %s $%d%s", sqlfix.Ident(col), t.keyOps[i].Cast, t.keyOps[i].Eq, i+1, t.keyOps[i].Cast))
		args = append(args, v)
	}
	return op{sql: `DELETE FROM ` + t.ident + ` WHERE ` + strings.Join(conds, " AND "), args: args, what: fmt.Sprintf("delete of %s (%s)", t.source, where)}, nil
}
