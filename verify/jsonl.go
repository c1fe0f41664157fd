package verify

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/tidemark/tidemark/chunker"
	"github.com/tidemark/tidemark/internal/pgerr"
	"github.com/tidemark/tidemark/internal/pgjson"
	"github.com/tidemark/tidemark/sink/jsonl/line"
)

// JSONLines compares the tables of o with the JSON lines output at path, replayed.
func JSONLines(ctx context.Context, o Options, path string) (*Report, error) {
	o.defaults()
	v := &jsVerify{o: &o, path: path, tables: map[string]*jsTable{}, types: pgjson.NewRegistry(o.Source)}
	rep := &Report{}
	for _, spec := range o.Tables {
		src, err := discover(ctx, &o, spec)
		if err != nil {
			return nil, fmt.Errorf("verify %s: %w", spec, err)
		}
		t := &jsTable{index: len(v.order), src: src, rep: &TableReport{Table: spec.String()}, keep: o.Keep}
		for _, c := range src.Columns {
			typ, err := v.types.Type(ctx, c.TypeOID)
			if err != nil {
				return nil, fmt.Errorf("verify %s: column %s: %w", spec, c.Name, err)
			}
			t.types = append(t.types, typ)
		}
		if t.reader, err = chunker.NewReader(o.Source, chunker.Config{MaxBytes: o.MaxChunkBytes}); err != nil {
			return nil, err
		}
		v.tables[spec.String()] = t
		v.order = append(v.order, t)
		rep.Tables = append(rep.Tables, t.rep)
	}
	fi, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("the output %s does not exist: give --to the file the sync writes (or a PostgreSQL connection string)", path)
	}
	if err != nil {
		return nil, fmt.Errorf("the output: %w", err)
	}
	parts := int(1 + fi.Size()/o.PartBytes)
	if parts == 1 {
		err = v.inMemory(ctx)
	} else {
		err = v.partitioned(ctx, parts)
	}
	if err != nil {
		return nil, err
	}
	for _, t := range v.order {
		start := time.Now()
		// In the order of the keys' JSON forms: a partition's order is its hash's.
		slices.SortStableFunc(t.kept, func(a, b *pending) int { return strings.Compare(a.id, b.id) })
		settled, err := recheck(ctx, v.o, t.kept, func(ctx context.Context, keys []*pending) (map[string]side, error) {
			return v.readSource(ctx, t, keys)
		}, func(ctx context.Context, keys []*pending) (map[string]side, error) {
			return v.readOutput(ctx, t, keys)
		})
		if err != nil {
			return nil, err
		}
		t.rep.Differences = differences(settled)
		t.rep.Elapsed += time.Since(start)
		if o.Progress != nil {
			o.Progress(t.rep)
		}
	}
	return rep, nil
}

type jsVerify struct {
	o      *Options
	path   string
	tables map[string]*jsTable // by schema.name
	order  []*jsTable
	types  *pgjson.Registry
	end    int64 // the bytes of the output the first read replayed
}

// jsTable is one table compared with the output.
type jsTable struct {
	index  int
	src    *chunker.Table
	types  []*pgjson.Type // per column
	reader *chunker.Reader
	rep    *TableReport
	kept   []*pending
	keep   int   // Options.Keep
	end    int64 // where the last read of the output for this table's re-check ended
}

// jsRow is a replayed row: each column's JSON form (with "\x00" and the original text where the
// line gave one); a column never set is absent.
type jsRow map[string][]byte

// state is the replay: rows by table and encoded key.
type state map[*jsTable]map[string]jsRow

// scanLines calls fn with each complete line of r (without its newline); a last line without
// one is being written and is left out. It returns the bytes of the lines it read.
func scanLines(r io.Reader, fn func(n int, raw []byte) error) (consumed int64, err error) {
	br := bufio.NewReaderSize(r, 1<<20)
	for n := 1; ; n++ {
		raw, err := br.ReadBytes('\n')
		if errors.Is(err, io.EOF) {
			return consumed, nil // a partial last line, or none
		}
		if err != nil {
			return consumed, err
		}
		if err := fn(n, raw[:len(raw)-1]); err != nil {
			return consumed, err
		}
		consumed += int64(len(raw))
	}
}

// decode reads one line: its table (nil: not compared) and the key's id.
func (v *jsVerify) decode(n int, raw []byte) (line.Line, *jsTable, string, error) {
	l, err := line.Decode(raw)
	if err != nil {
		return l, nil, "", fmt.Errorf("%s, line %d: %w", v.path, n, err)
	}
	t := v.tables[l.Table]
	if t == nil || l.Op == "truncate" || l.Op == "refresh" {
		return l, t, "", nil
	}
	var id []byte
	for i, name := range t.src.KeyNames() {
		k, ok := l.Key[name]
		if !ok {
			return l, nil, "", fmt.Errorf("%s, line %d: the key has no column %s (the table's key is %v)", v.path, n, name, t.src.KeyNames())
		}
		if i > 0 {
			id = append(id, 0x1f)
		}
		orig, lossy := l.Original[name]
		id = appendKeyPart(id, k, orig, lossy)
	}
	return l, t, string(id), nil
}

// apply replays one line onto st.
func apply(st state, l line.Line, t *jsTable, id string) {
	rows := st[t]
	if rows == nil {
		rows = map[string]jsRow{}
		st[t] = rows
	}
	switch l.Op {
	case "truncate", "refresh":
		clear(rows)
	case "delete":
		delete(rows, id)
	default: // insert, update, snapshot
		row := jsRow{}
		for c, val := range l.After {
			b := []byte(val)
			if orig, ok := l.Original[c]; ok {
				b = append(append(b, 0), orig...)
			}
			row[c] = b
		}
		if old := rows[id]; old != nil {
			for _, c := range l.Unchanged {
				if val, ok := old[c]; ok {
					row[c] = val
				}
			}
		}
		rows[id] = row
	}
}

// values are a replayed row's values in the source's column order (nil: never set), with a last
// value naming the columns the source does not have, if any.
func (t *jsTable) values(row jsRow) [][]byte {
	vals := make([][]byte, 0, len(t.src.Columns)+1)
	known := 0
	for _, c := range t.src.Columns {
		v, ok := row[c.Name]
		if ok {
			known++
		}
		vals = append(vals, v)
	}
	if known < len(row) {
		var extra []string
		for c := range row {
			if !slices.ContainsFunc(t.src.Columns, func(col chunker.Column) bool { return col.Name == c }) {
				extra = append(extra, c)
			}
		}
		vals = append(vals, []byte("columns the source does not have: "+strings.Join(extra, ",")))
	}
	return vals
}

// sourceRow is a source row in the output's form: its key's id and text, and its values.
func (v *jsVerify) sourceRow(ctx context.Context, t *jsTable, row chunker.Row) (id string, key []string, vals [][]byte, err error) {
	vals = make([][]byte, len(row))
	for i, text := range row {
		if text == nil {
			vals[i] = []byte("null")
			continue
		}
		b, lossy, err := v.types.Append(ctx, t.types[i], nil, text)
		if err != nil {
			return "", nil, nil, fmt.Errorf("column %s of %s: %w", t.src.Columns[i].Name, t.src, err)
		}
		if lossy {
			b = append(append(b, 0), text...)
		}
		if !utf8.Valid(text) {
			// Bytes that are no UTF-8 (a SQL_ASCII database) have no JSON form that keeps them:
			// the output cannot equal the source.
			b = append(b, "\x00not UTF-8"...)
		}
		vals[i] = b
	}
	var b []byte
	for i, k := range t.src.Key {
		if i > 0 {
			b = append(b, 0x1f)
		}
		json, text, lossy := bytes.Cut(vals[k], []byte{0})
		b = appendKeyPart(b, json, string(text), lossy)
	}
	return string(b), keyText(t.src, row), vals, nil
}

// eachSource reads t's source rows chunk by chunk, in the output's form.
func (v *jsVerify) eachSource(ctx context.Context, t *jsTable, fn func(id string, key []string, vals [][]byte) error) error {
	limit := v.o.ChunkSize
	ch, err := t.reader.First(ctx, t.src, limit)
	if err != nil {
		return err
	}
	upper := ch.Upper
	for len(ch.Rows) > 0 {
		t.rep.Chunks++
		t.rep.SourceRows += int64(len(ch.Rows))
		for _, row := range ch.Rows {
			id, key, vals, err := v.sourceRow(ctx, t, row)
			if err != nil {
				return err
			}
			if err := fn(id, key, vals); err != nil {
				return err
			}
		}
		if ch.Done {
			return nil
		}
		if ch, err = t.reader.Next(ctx, t.src, ch.Last, upper, limit); err != nil {
			return err
		}
	}
	return nil
}

// compare records how a source row (key nil: none) and a replayed row (nil: none) differ.
func (t *jsTable) compare(id string, key []string, src [][]byte, srcD *digest, out jsRow) {
	var s, o side
	if srcD != nil {
		s = side{present: true, d: *srcD}
	} else if src != nil {
		s = side{present: true, d: rowDigest(src)}
	}
	var outVals [][]byte
	if out != nil {
		outVals = t.values(out)
		o = side{present: true, d: rowDigest(outVals)}
	}
	k := kinds(s, o)
	if k == 0 {
		return
	}
	if len(t.kept) >= t.keep {
		t.rep.Unchecked++
		return
	}
	p := &pending{id: id, text: key, kind: k, src: s, tgt: o, row: out}
	if key == nil {
		p.text, p.show = outputKey(t, id)
	} else {
		p.show = showKey(t.src.KeyNames(), key)
	}
	if k == Differs && src != nil {
		for i, c := range t.src.Columns {
			if !bytes.Equal(src[i], outVals[i]) {
				p.columns = append(p.columns, c.Name)
			}
		}
	}
	t.kept = append(t.kept, p)
}

// outputKey reads back the text values of a key the output has and the source has not (for the
// re-check), from its JSON forms: a JSON string's content, or a number's or boolean's text, or
// the original text of a lossy one. A key of another form (an object, an array) gets nil: it is
// not read again.
func outputKey(t *jsTable, id string) ([]string, string) {
	parts := strings.Split(id, "\x1f")
	shown := make([]string, len(parts))
	text := make([]string, 0, len(parts))
	readable := true
	for i, p := range parts {
		form, orig, lossy := strings.Cut(p, "\x00")
		shown[i] = form
		switch {
		case lossy:
			shown[i] = orig
			text = append(text, orig)
		case strings.HasPrefix(form, `"`):
			var s string
			if json.Unmarshal([]byte(form), &s) != nil {
				readable = false
			}
			text = append(text, s)
		case form == "null" || strings.HasPrefix(form, "{") || strings.HasPrefix(form, "["):
			readable = false
		default:
			text = append(text, form)
		}
	}
	show := showKey(t.src.KeyNames(), shown)
	if !readable {
		return nil, show
	}
	return text, show
}

// inMemory replays the whole output, then compares each table's source rows with it.
func (v *jsVerify) inMemory(ctx context.Context) error {
	f, err := os.Open(v.path)
	if err != nil {
		return fmt.Errorf("the output: %w", err)
	}
	defer f.Close()
	st := state{}
	v.end, err = scanLines(f, func(n int, raw []byte) error {
		l, t, id, err := v.decode(n, raw)
		if err != nil || t == nil {
			return err
		}
		apply(st, l, t, id)
		return nil
	})
	if err != nil {
		return err
	}
	for _, t := range v.order {
		start := time.Now()
		out := st[t]
		t.rep.TargetRows = int64(len(out))
		err := v.eachSource(ctx, t, func(id string, key []string, vals [][]byte) error {
			t.compare(id, key, vals, nil, out[id])
			delete(out, id)
			return nil
		})
		if err != nil {
			return fmt.Errorf("verify %s: %w", t.src, err)
		}
		for id, row := range out {
			t.compare(id, nil, nil, nil, row)
		}
		t.rep.Elapsed = time.Since(start)
	}
	return nil
}

// partitioned splits the output's lines and the source's row digests into parts files by a hash
// of the table and key, then replays and compares one partition at a time.
func (v *jsVerify) partitioned(ctx context.Context, parts int) error {
	dir, err := os.MkdirTemp(v.o.TempDir, "tidemark-verify-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	v.o.Log.Info().Int("partitions", parts).Str("dir", dir).Msg("the output is replayed in partitions on disk, one at a time")
	part := func(t *jsTable, id string) int {
		h := fnv.New64a()
		var b [8]byte
		binary.BigEndian.PutUint64(b[:], uint64(t.index))
		h.Write(b[:])
		h.Write([]byte(id))
		return int(h.Sum64() % uint64(parts))
	}
	outs, err := createParts(dir, "output", parts)
	if err != nil {
		return err
	}
	in, err := os.Open(v.path)
	if err != nil {
		return fmt.Errorf("the output: %w", err)
	}
	v.end, err = scanLines(in, func(n int, raw []byte) error {
		_, t, id, err := v.decode(n, raw)
		if err != nil || t == nil {
			return err
		}
		raw = append(raw, '\n')
		if id == "" { // truncate, refresh: every partition
			for _, w := range outs {
				if _, err := w.Write(raw); err != nil {
					return err
				}
			}
			return nil
		}
		_, err = outs[part(t, id)].Write(raw)
		return err
	})
	in.Close()
	if err == nil {
		err = closeParts(outs)
	}
	if err != nil {
		return err
	}
	srcs, err := createParts(dir, "source", parts)
	if err != nil {
		return err
	}
	for _, t := range v.order {
		start := time.Now()
		err := v.eachSource(ctx, t, func(id string, key []string, vals [][]byte) error {
			return writeRecord(srcs[part(t, id)], t.index, id, rowDigest(vals), key)
		})
		if err != nil {
			return fmt.Errorf("verify %s: %w", t.src, err)
		}
		t.rep.Elapsed += time.Since(start)
	}
	if err := closeParts(srcs); err != nil {
		return err
	}
	for p := range parts {
		if err := v.comparePart(dir, p); err != nil {
			return err
		}
	}
	return nil
}

// comparePart replays partition p of the output and compares it with the source's digests of
// that partition.
func (v *jsVerify) comparePart(dir string, p int) error {
	st := state{}
	f, err := os.Open(partName(dir, "output", p))
	if err != nil {
		return err
	}
	_, err = scanLines(f, func(n int, raw []byte) error {
		l, t, id, err := v.decode(n, raw)
		if err != nil || t == nil {
			return err
		}
		apply(st, l, t, id)
		return nil
	})
	f.Close()
	if err != nil {
		return err
	}
	for _, t := range v.order {
		t.rep.TargetRows += int64(len(st[t]))
	}
	f, err = os.Open(partName(dir, "source", p))
	if err != nil {
		return err
	}
	defer f.Close()
	br := bufio.NewReader(f)
	for {
		index, id, d, key, err := readRecord(br)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("partition file %d: %w", p, err)
		}
		t := v.order[index]
		out := st[t]
		t.compare(id, key, nil, &d, out[id])
		delete(out, id)
	}
	for _, t := range v.order {
		for id, row := range st[t] {
			t.compare(id, nil, nil, nil, row)
		}
	}
	return nil
}

// readSource reads keys of t from the source, digested in the output's form.
func (v *jsVerify) readSource(ctx context.Context, t *jsTable, keys []*pending) (map[string]side, error) {
	out := map[string]side{}
	for start := 0; start < len(keys); start += recheckBatch {
		var ks [][]string
		for _, p := range keys[start:min(len(keys), start+recheckBatch)] {
			ks = append(ks, p.text)
		}
		rows, err := readBack(ctx, t, ks)
		if err != nil {
			return nil, err
		}
		for _, row := range rows {
			id, _, vals, err := v.sourceRow(ctx, t, row)
			if err != nil {
				return nil, err
			}
			out[id] = side{present: true, d: rowDigest(vals)}
		}
	}
	return out, nil
}

// readOutput reads the output's rows of keys of t again: from where the last read of t ended,
// applying what was appended since (the output grows while a sync runs) to the rows it had; the
// whole output again when it is shorter than that (a sync resumed and cut it back to its
// checkpoint).
func (v *jsVerify) readOutput(ctx context.Context, t *jsTable, keys []*pending) (map[string]side, error) {
	want := map[string]*pending{}
	for _, p := range keys {
		want[p.id] = p
	}
	f, err := os.Open(v.path)
	if err != nil {
		return nil, fmt.Errorf("the output: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("the output: %w", err)
	}
	st := state{t: map[string]jsRow{}}
	if t.end == 0 {
		t.end = v.end
	}
	if fi.Size() < t.end {
		t.end = 0
	} else {
		for id, p := range want {
			if p.row != nil {
				st[t][id] = p.row
			}
		}
	}
	if _, err := f.Seek(t.end, io.SeekStart); err != nil {
		return nil, fmt.Errorf("the output: %w", err)
	}
	n, err := scanLines(f, func(n int, raw []byte) error {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		// Lines of other tables are skipped before they are decoded.
		if !bytes.Contains(raw, t.tableField()) {
			return nil
		}
		l, lt, id, err := v.decode(n, raw)
		if err != nil || lt != t || (id != "" && want[id] == nil) {
			return err
		}
		apply(st, l, t, id)
		return nil
	})
	if err != nil {
		return nil, err
	}
	t.end += n
	out := map[string]side{}
	for id, p := range want {
		p.row = st[t][id]
		if p.row != nil {
			out[id] = side{present: true, d: rowDigest(t.values(p.row))}
		}
	}
	return out, nil
}

// tableField is the table's field as the writer writes it.
func (t *jsTable) tableField() []byte {
	return pgjson.AppendString([]byte(`"table":`), t.src.String())
}

func partName(dir, kind string, p int) string {
	return filepath.Join(dir, fmt.Sprintf("%s-%d", kind, p))
}

// partWriter is one partition file being written.
type partWriter struct {
	f *os.File
	*bufio.Writer
}

func createParts(dir, kind string, parts int) ([]*partWriter, error) {
	var ws []*partWriter
	for p := range parts {
		f, err := os.OpenFile(partName(dir, kind, p), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			_ = closeParts(ws)
			return nil, err
		}
		ws = append(ws, &partWriter{f: f, Writer: bufio.NewWriterSize(f, 64<<10)})
	}
	return ws, nil
}

func closeParts(ws []*partWriter) error {
	var errs []error
	for _, w := range ws {
		errs = append(errs, w.Flush(), w.f.Close())
	}
	return errors.Join(errs...)
}

// writeRecord writes a source row's record to a partition file: its table, key id, digest and
// key text values, each length-prefixed.
func writeRecord(w *partWriter, index int, id string, d digest, key []string) error {
	b := binary.AppendUvarint(nil, uint64(index))
	b = binary.AppendUvarint(b, uint64(len(id)))
	b = append(b, id...)
	b = append(b, d[:]...)
	b = binary.AppendUvarint(b, uint64(len(key)))
	for _, k := range key {
		b = binary.AppendUvarint(b, uint64(len(k)))
		b = append(b, k...)
	}
	_, err := w.Write(b)
	return err
}

func readRecord(r *bufio.Reader) (index int, id string, d digest, key []string, err error) {
	n, err := binary.ReadUvarint(r)
	if err != nil {
		return 0, "", d, nil, err // io.EOF at the end
	}
	index = int(n)
	str := func() (string, error) {
		n, err := binary.ReadUvarint(r)
		if err != nil {
			return "", err
		}
		b := make([]byte, n)
		_, err = io.ReadFull(r, b)
		return string(b), err
	}
	if id, err = str(); err != nil {
		return 0, "", d, nil, noEOF(err)
	}
	if _, err = io.ReadFull(r, d[:]); err != nil {
		return 0, "", d, nil, noEOF(err)
	}
	if n, err = binary.ReadUvarint(r); err != nil {
		return 0, "", d, nil, noEOF(err)
	}
	for range n {
		k, err := str()
		if err != nil {
			return 0, "", d, nil, noEOF(err)
		}
		key = append(key, k)
	}
	return index, id, d, key, nil
}

// noEOF turns an end of file inside a record into an error of its own.
func noEOF(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// readBack reads the source rows of keys; when one of them is not a value of its column's type
// (a key read back from the output's JSON form), each is read alone and such a key is left out:
// the source has no row of that form.
func readBack(ctx context.Context, t *jsTable, keys [][]string) ([]chunker.Row, error) {
	rows, err := keysAll(ctx, t.reader, t.src, keys)
	if err == nil {
		return rows, nil
	}
	if !strings.HasPrefix(pgerr.Code(err), "22") {
		return nil, err
	}
	rows = nil
	for _, k := range keys {
		c, err := t.reader.Keys(ctx, t.src, [][]string{k})
		switch {
		case err == nil:
			rows = append(rows, c.Rows...)
		case strings.HasPrefix(pgerr.Code(err), "22"):
		default:
			return nil, err
		}
	}
	return rows, nil
}

// appendKeyPart appends one key column's part of a key's id: its JSON form, a number in its
// canonical form (the key's = makes 1.0 and 1.00, 0 and -0 one key, and an update may write the
// key in the other form), and, when the JSON form is lossy (NaN, infinity: null), the value's
// text after a 0 byte, as the line's original gives it.
func appendKeyPart(b, json []byte, original string, lossy bool) []byte {
	b = append(b, line.CanonicalNumber(json)...)
	if lossy {
		b = append(append(b, 0), original...)
	}
	return b
}
