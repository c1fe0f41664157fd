package oracle

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/tidemark/tidemark/sink/jsonl/line"
)

// ParseJSONL reads `tidemark sync` JSON lines output into records whose values (and key parts)
// are the raw JSON of each value, to compare with SourceRowsJSON. keys gives the key columns of
// each table (schema.table), in key order. A line that cannot be read fails it.
func ParseJSONL(r io.Reader, keys map[string][]string) ([]Record, error) {
	var out []Record
	err := ReadJSONL(r, keys, func(rec Record) { out = append(out, rec) }, nil)
	return out, err
}

// ReadJSONL reads JSON lines output as ParseJSONL does, handing each record to apply. A line
// that cannot be read goes to damaged, with its number, and the reading goes on; with damaged
// nil it ends the reading with its error. A value the line lists in "original" (one whose JSON
// form does not carry it) becomes Lossy and its text; the "unchanged" columns are kept; the
// transaction id becomes Txn.
func ReadJSONL(r io.Reader, keys map[string][]string, apply func(Record), damaged func(line int, err error)) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 256<<20)
	for n := 1; sc.Scan(); n++ {
		rec, err := parseLine(sc.Bytes(), keys)
		if err != nil {
			if damaged == nil {
				return fmt.Errorf("line %d: %w", n, err)
			}
			damaged(n, err)
			continue
		}
		apply(rec)
	}
	return sc.Err()
}

// parseLine reads a line with the output's own reader (sink/jsonl: the format is defined there
// once, and a field it does not know fails the line).
func parseLine(text []byte, keys map[string][]string) (Record, error) {
	l, err := line.Decode(text)
	if err != nil {
		return Record{}, err
	}
	rec := Record{Table: l.Table, Op: l.Op, LSN: uint64(l.LSN), Seq: l.Seq, Unchanged: l.Unchanged}
	if l.XID != 0 {
		rec.Txn = strconv.FormatUint(uint64(l.XID), 10)
	}
	if l.Op != "truncate" && l.Op != "refresh" {
		kc, ok := keys[l.Table]
		if !ok {
			return Record{}, fmt.Errorf("no key columns given for table %s", l.Table)
		}
		var kv []string
		for _, k := range kc {
			raw, ok := l.Key[k]
			if !ok {
				return Record{}, fmt.Errorf("no key column %s", k)
			}
			// As the key's = compares: a lossy form by its text, a number by its value.
			if text, ok := l.Original[k]; ok {
				kv = append(kv, Lossy+text)
			} else {
				kv = append(kv, string(line.CanonicalNumber(raw)))
			}
		}
		rec.Key = strings.Join(kv, KeySep)
	}
	if l.After != nil {
		rec.Values = map[string]*string{}
		for c, raw := range l.After {
			v := string(raw)
			if text, ok := l.Original[c]; ok {
				v = Lossy + text
			}
			rec.Values[c] = &v
		}
	}
	return rec, nil
}
