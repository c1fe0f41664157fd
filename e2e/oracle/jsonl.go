package oracle

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/jackc/pglogrepl"
)

// jsonLine is one line of `tidemark sync --to FILE` output.
type jsonLine struct {
	Op        string                     `json:"op"`
	Table     string                     `json:"table"`
	Key       map[string]json.RawMessage `json:"key"`
	After     map[string]json.RawMessage `json:"after"`
	Unchanged []string                   `json:"unchanged"`
	LSN       string                     `json:"lsn"`
	Seq       int                        `json:"seq"`
}

// ParseJSONL reads `tidemark sync` JSON lines output into records whose values (and key parts)
// are the raw JSON of each value, to compare with SourceRowsJSON. keys gives the key columns of
// each table (schema.table), in key order.
func ParseJSONL(r io.Reader, keys map[string][]string) ([]Record, error) {
	var out []Record
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for n := 1; sc.Scan(); n++ {
		var l jsonLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		lsn, err := pglogrepl.ParseLSN(l.LSN)
		if err != nil {
			return nil, fmt.Errorf("line %d: lsn: %w", n, err)
		}
		rec := Record{Table: l.Table, Op: l.Op, LSN: uint64(lsn), Seq: l.Seq}
		if l.Op != "truncate" && l.Op != "refresh" {
			kc, ok := keys[l.Table]
			if !ok {
				return nil, fmt.Errorf("line %d: no key columns given for table %s", n, l.Table)
			}
			var kv []string
			for _, k := range kc {
				raw, ok := l.Key[k]
				if !ok {
					return nil, fmt.Errorf("line %d: no key column %s", n, k)
				}
				kv = append(kv, string(raw))
			}
			rec.Key = strings.Join(kv, KeySep)
		}
		if l.After != nil {
			rec.Values = map[string]*string{}
			for c, raw := range l.After {
				v := string(raw)
				rec.Values[c] = &v
			}
		}
		out = append(out, rec)
	}
	return out, sc.Err()
}
