package chaos

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
)

// checkpointInfo is what the harness reads of a capture's durable checkpoint (a merge.Position,
// or the Airbyte state that carries one).
type checkpointInfo struct {
	raw       string              // the checkpoint as stored: it changed iff a run wrote another
	LSN       pglogrepl.LSN       // where the next run resumes
	Timeline  int32               // the server's timeline when it was taken
	Tables    map[string]bool     // the tables it has progress for
	Refresh   map[string]bool     // the tables whose re-backfill is asked for and not started yet
	Files     map[string][]uint32 // the storage files each table had when last looked at
	Members   map[string]string   // each table's membership of the publication (chunker.Membership)
	Invisible string              // the commits not yet visible, as ranges of xids ("1042-1050,1077")
}

// invisible reports whether the checkpoint lists xid (its low 32 bits) among the commits not
// yet visible.
func (c *checkpointInfo) invisible(xid uint32) bool {
	for _, part := range strings.Split(c.Invisible, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		if !isRange {
			hi = lo
		}
		a, err1 := strconv.ParseUint(strings.TrimSpace(lo), 10, 32)
		b, err2 := strconv.ParseUint(strings.TrimSpace(hi), 10, 32)
		if err1 == nil && err2 == nil && uint64(xid) >= a && uint64(xid) <= b {
			return true
		}
	}
	return false
}

// started reports whether the re-backfill of table (of every one of all for "") has started:
// its progress is there, and no longer asks for one.
func (c *checkpointInfo) started(table string, all map[string][]string) bool {
	names := []string{table}
	if table == "" {
		names = names[:0]
		for name := range all {
			names = append(names, name)
		}
	}
	for _, name := range names {
		if !c.Tables[name] || c.Refresh[name] {
			return false
		}
	}
	return true
}

// parsePosition reads a merge.Position in its JSON form.
func parsePosition(raw []byte) (*checkpointInfo, error) {
	var p struct {
		LSN       string `json:"lsn"`
		Timeline  int32  `json:"timeline"`
		Invisible string `json:"invisible"`
		Tables    map[string]struct {
			Refresh     bool     `json:"refresh"`
			Files       []uint32 `json:"files"`
			Publication string   `json:"publication"`
		} `json:"tables"`
	}
	if err := json.Unmarshal(raw, &p); err != nil {
		return nil, fmt.Errorf("position: %w", err)
	}
	lsn, err := pglogrepl.ParseLSN(p.LSN)
	if err != nil {
		return nil, fmt.Errorf("position lsn %q: %w", p.LSN, err)
	}
	c := &checkpointInfo{raw: string(raw), LSN: lsn, Timeline: p.Timeline, Invisible: p.Invisible, Tables: map[string]bool{}, Refresh: map[string]bool{}, Files: map[string][]uint32{}, Members: map[string]string{}}
	for name, t := range p.Tables {
		c.Tables[name] = true
		c.Refresh[name] = t.Refresh
		c.Files[name] = t.Files
		c.Members[name] = t.Publication
	}
	return c, nil
}

// parseAirbyteState reads the platform's state (an array of state messages with one GLOBAL
// state: see cmd/source-postgres/state.go).
func parseAirbyteState(raw []byte) (*checkpointInfo, error) {
	var msgs []struct {
		Global struct {
			Shared struct {
				LSN       uint64 `json:"lsn"`
				Timeline  int32  `json:"timeline"`
				Invisible string `json:"invisible"`
			} `json:"shared_state"`
			Streams []struct {
				Descriptor struct {
					Name      string `json:"name"`
					Namespace string `json:"namespace"`
				} `json:"stream_descriptor"`
				State struct {
					Refresh     bool     `json:"refresh"`
					Publication string   `json:"publication"`
					Key         []string `json:"key"`
				} `json:"stream_state"`
			} `json:"stream_states"`
		} `json:"global"`
	}
	if err := json.Unmarshal(raw, &msgs); err != nil {
		return nil, fmt.Errorf("state: %w", err)
	}
	if len(msgs) == 0 {
		return nil, nil
	}
	g := msgs[len(msgs)-1].Global
	c := &checkpointInfo{raw: string(raw), LSN: pglogrepl.LSN(g.Shared.LSN), Timeline: g.Shared.Timeline, Invisible: g.Shared.Invisible,
		Tables: map[string]bool{}, Refresh: map[string]bool{}, Members: map[string]string{}}
	for _, st := range g.Streams {
		if len(st.State.Key) == 0 {
			// No progress yet: the state of a read before its first checkpoint (no position),
			// which starts nothing.
			continue
		}
		name := st.Descriptor.Namespace + "." + st.Descriptor.Name
		c.Tables[name] = true
		c.Refresh[name] = st.State.Refresh
		c.Members[name] = st.State.Publication
	}
	return c, nil
}

// isUndefinedTable reports a PostgreSQL error for a table that does not exist (yet).
func isUndefinedTable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42P01"
}
