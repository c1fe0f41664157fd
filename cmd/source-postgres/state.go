package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/jackc/pglogrepl"
	"github.com/tidemark/tidemark/merge"
)

// The connector's state is one GLOBAL state:
//
//	{"type":"GLOBAL","global":{
//	   "shared_state":{"tidemark":1,"lsn":23456789,"lsn_text":"0/165E915","system_id":"7301...","slot":"airbyte_slot"},
//	   "stream_states":[{"stream_descriptor":{"name":"users","namespace":"public"},
//	                     "stream_state":{"sync_mode":"incremental","done":false,"cursor":["1000"],"max_key":["99999"],"key":["id"],"rows":1000,"chunks":1}}]},
//	 "sourceStats":{"recordCount":1000.0}}
//
// shared_state holds the merge.Position's LSN (a number, the unit of _ab_cdc_lsn, and its text),
// the cluster and the slot; each stream_state holds its table's backfill progress
// (merge.TableProgress), or, for a full refresh stream, the progress of its current read.
//
// With the Standard and Xmin methods, each stream has a STREAM state of its own, as Airbyte's
// connector writes them (methods.go): a methodState for an incremental stream, a tableState for
// a full refresh one.

// sharedState is the GLOBAL state's shared part.
type sharedState struct {
	Tidemark int    `json:"tidemark"` // the format's version; its presence tells Tidemark's state from Airbyte's
	LSN      uint64 `json:"lsn"`
	LSNText  string `json:"lsn_text"`
	SystemID string `json:"system_id,omitempty"`
	Timeline int32  `json:"timeline,omitempty"`
	Database string `json:"database,omitempty"`
	// Invisible: commits streamed that no snapshot had shown visible yet (merge.Position).
	Invisible *merge.XIDs `json:"invisible,omitempty"`
	Slot      string      `json:"slot,omitempty"`
}

// tableState is one stream's state.
type tableState struct {
	SyncMode string `json:"sync_mode"` // incremental or full_refresh
	merge.TableProgress
}

// inputState is what read starts from.
type inputState struct {
	pos         *merge.Position            // nil: no CDC position (a first sync)
	fullRefresh map[string]*tableState     // full refresh streams' progress, by "schema.table"
	streams     map[string]json.RawMessage // per-stream states of incremental streams (STREAM, or a legacy state's streams), by "schema.table"
	migrated    string                     // non-empty: the state came from Airbyte's connector, as described
	ignored     []string                   // parts of the state that could not be used, described
}

// streamKey names a stream's table.
func streamKey(namespace, name string) string { return namespace + "." + name }

// maxStateFile bounds the state file read: a connection's state is kilobytes to a few megabytes
// (a position per stream); one over this is not a state this connector wrote.
const maxStateFile = 256 << 20

// readBounded reads a file of at most limit bytes, refusing a larger one before reading it.
func readBounded(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s is larger than %d MiB", filepath.Base(path), limit>>20)
	}
	return b, nil
}

// loadState reads the --state file: a JSON array of state messages (what the platform writes),
// one state message, or a legacy state object; an empty array, {} and null are no state. Airbyte
// source-postgres states (Debezium offsets) are migrated.
func loadState(path string) (*inputState, error) {
	st := &inputState{fullRefresh: map[string]*tableState{}, streams: map[string]json.RawMessage{}}
	if path == "" {
		return st, nil
	}
	b, err := readBounded(path, maxStateFile)
	if err != nil {
		return nil, configErrorf("read the state file: %w", err)
	}
	b = bytes.TrimSpace(b)
	if len(b) == 0 || string(b) == "null" || string(b) == "{}" || string(b) == "[]" {
		return st, nil
	}
	var msgs []json.RawMessage
	if b[0] == '[' {
		if err := json.Unmarshal(b, &msgs); err != nil {
			return nil, configErrorf("the state file %s is not valid: %s", filepath.Base(path), jsonProblem(err))
		}
	} else {
		msgs = []json.RawMessage{b}
	}
	for _, raw := range msgs {
		if err := st.add(raw); err != nil {
			return nil, configErrorf("the state file %s is not a state this connector can resume from: %w; reset the connection's state (Airbyte: Settings, Reset or Clear data) to start over", filepath.Base(path), err)
		}
	}
	return st, nil
}

func (st *inputState) add(raw json.RawMessage) error {
	if string(bytes.TrimSpace(raw)) == "null" {
		return nil
	}
	var m struct {
		stateMessage
		// A legacy object has none of a state message's fields.
		CDC      *bool             `json:"cdc"`
		CDCState json.RawMessage   `json:"cdc_state"`
		Streams  []json.RawMessage `json:"streams"`
	}
	if err := json.Unmarshal(raw, &m); err != nil {
		return fmt.Errorf("%s", jsonProblem(err))
	}
	switch {
	case m.Type == "GLOBAL" && m.Global != nil:
		return st.addGlobal(m.Global)
	case m.Type == "STREAM":
		var ss streamState
		if err := json.Unmarshal(m.Stream, &ss); err != nil {
			return fmt.Errorf("a STREAM state: %s", jsonProblem(err))
		}
		if ss.StreamDescriptor.Name == "" {
			return fmt.Errorf("a STREAM state without a stream_descriptor")
		}
		st.addStream(streamKey(namespaceOr(ss.StreamDescriptor.Namespace), ss.StreamDescriptor.Name), ss.StreamState)
		return nil
	case m.Type == "LEGACY" || m.Type == "" && len(m.Data) > 0:
		return st.add(m.Data)
	case m.CDC != nil || m.CDCState != nil:
		// Airbyte source-postgres's legacy state: {"cdc":true,"cdc_state":{"state":{...}},"streams":[...]},
		// each stream {"stream_name", "stream_namespace", "cursor_field", "cursor", "cursor_record_count"}.
		type legacyStream struct {
			Name      string  `json:"stream_name"`
			Namespace *string `json:"stream_namespace"`
		}
		var names []legacyStream
		for _, raw := range m.Streams {
			var s legacyStream
			if err := json.Unmarshal(raw, &s); err != nil || s.Name == "" {
				return fmt.Errorf("a legacy state's stream without a stream_name")
			}
			names = append(names, s)
		}
		if m.CDC == nil || !*m.CDC || len(m.CDCState) == 0 {
			// Without CDC, each stream's entry is its cursor.
			for i, s := range names {
				st.addStream(streamKey(namespaceOr(s.Namespace), s.Name), m.Streams[i])
			}
			if len(names) > 0 {
				st.migrated = fmt.Sprintf("Airbyte source-postgres legacy state, %d streams", len(names))
			}
			return nil
		}
		lsn, err := debeziumLSN(m.CDCState)
		if err != nil {
			return err
		}
		st.pos = &merge.Position{Version: merge.PositionVersion, LSN: lsn, Tables: map[string]*merge.TableProgress{}}
		for _, s := range names {
			st.pos.Tables[streamKey(namespaceOr(s.Namespace), s.Name)] = &merge.TableProgress{Done: true}
		}
		st.migrated = fmt.Sprintf("Airbyte source-postgres legacy state at LSN %s, %d streams", lsn, len(names))
		return nil
	case m.Type == "":
		return fmt.Errorf("a state message without a type")
	default:
		return fmt.Errorf("a %s state without its content", m.Type)
	}
}

func (st *inputState) addGlobal(g *globalState) error {
	var probe map[string]json.RawMessage
	if len(g.SharedState) > 0 && string(g.SharedState) != "null" {
		if err := json.Unmarshal(g.SharedState, &probe); err != nil {
			return fmt.Errorf("shared_state: %s", jsonProblem(err))
		}
	}
	switch {
	case probe["tidemark"] != nil || len(probe) == 0:
		// Tidemark's state; without a shared state (no incremental stream yet), only full
		// refresh progress.
		if len(probe) > 0 {
			var s sharedState
			if err := json.Unmarshal(g.SharedState, &s); err != nil {
				return fmt.Errorf("shared_state: %s", jsonProblem(err))
			}
			if s.Tidemark != 1 {
				return fmt.Errorf("shared_state has format version %d; this connector reads version 1 (was the image downgraded?)", s.Tidemark)
			}
			st.pos = &merge.Position{Version: merge.PositionVersion, LSN: pglogrepl.LSN(s.LSN), SystemID: s.SystemID, Timeline: s.Timeline, Database: s.Database, Slot: s.Slot, Invisible: s.Invisible, Tables: map[string]*merge.TableProgress{}}
		}
		for _, ss := range g.StreamStates {
			if len(ss.StreamState) == 0 || string(ss.StreamState) == "null" {
				continue // a reset stream: backfilled again
			}
			var ts tableState
			if err := json.Unmarshal(ss.StreamState, &ts); err != nil {
				return fmt.Errorf("stream_state of %s: %s", ss.StreamDescriptor.Name, jsonProblem(err))
			}
			if err := ts.TableProgress.Check(); err != nil {
				return fmt.Errorf("stream_state of %s: %w", ss.StreamDescriptor.Name, err)
			}
			name := streamKey(namespaceOr(ss.StreamDescriptor.Namespace), ss.StreamDescriptor.Name)
			switch {
			case ts.SyncMode == "full_refresh":
				st.fullRefresh[name] = &ts
			case st.pos != nil:
				p := ts.TableProgress
				st.pos.Tables[name] = &p
			}
		}
		return nil
	case probe["state"] != nil:
		// Airbyte source-postgres (Debezium): shared_state {"state":{"[\"db\",{...}]":"{\"lsn\":...}"}}.
		lsn, err := debeziumLSN(g.SharedState)
		if err != nil {
			return err
		}
		st.pos = &merge.Position{Version: merge.PositionVersion, LSN: lsn, Tables: map[string]*merge.TableProgress{}}
		for _, ss := range g.StreamStates {
			if airbyteStreamDone(ss.StreamState) {
				st.pos.Tables[streamKey(namespaceOr(ss.StreamDescriptor.Namespace), ss.StreamDescriptor.Name)] = &merge.TableProgress{Done: true}
			}
		}
		st.migrated = fmt.Sprintf("Airbyte source-postgres state at LSN %s, %d of %d streams past their initial load", lsn, len(st.pos.Tables), len(g.StreamStates))
		return nil
	default:
		return fmt.Errorf("shared_state is neither Tidemark's nor Airbyte source-postgres's")
	}
}

// addStream keeps a per-stream state: a full refresh stream's progress, or an incremental
// stream's state, read when the method is known (parseMethodState).
func (st *inputState) addStream(name string, raw json.RawMessage) {
	var probe struct {
		SyncMode string `json:"sync_mode"`
	}
	if json.Unmarshal(raw, &probe) == nil && probe.SyncMode == "full_refresh" {
		var ts tableState
		if json.Unmarshal(raw, &ts) == nil && ts.TableProgress.Check() == nil {
			st.fullRefresh[name] = &ts
			return
		}
	}
	st.streams[name] = raw
}

// debeziumLSN reads the resume LSN of a Debezium offset as Airbyte's source-postgres stores it:
// {"state":{"<key>":"<offset JSON text>"}}, where the offset's "lsn" is where it resumes.
func debeziumLSN(raw json.RawMessage) (pglogrepl.LSN, error) {
	var outer struct {
		State map[string]string `json:"state"`
	}
	if err := json.Unmarshal(raw, &outer); err != nil {
		return 0, fmt.Errorf("the state's Debezium offset: %s", jsonProblem(err))
	}
	for _, v := range outer.State {
		var off struct {
			LSN json.Number `json:"lsn"`
		}
		if err := json.Unmarshal([]byte(v), &off); err != nil {
			return 0, fmt.Errorf("the state's Debezium offset: %s", jsonProblem(err))
		}
		n, err := strconv.ParseUint(off.LSN.String(), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("the state's Debezium offset: lsn %q is not a number", off.LSN)
		}
		return pglogrepl.LSN(n), nil
	}
	return 0, errors.New("the state's Debezium offset has no lsn")
}

// airbyteStreamDone reports whether an Airbyte source-postgres stream state says the stream's
// initial load finished: a ctid state with a ctid is a load in progress, and a null state an
// empty table. A state that carries nothing ({}) shows no finished load: the stream is loaded
// again, which can only repeat rows, where taking it as finished could leave the table out.
func airbyteStreamDone(raw json.RawMessage) bool {
	if len(raw) == 0 || string(raw) == "null" {
		return true
	}
	var fields map[string]json.RawMessage
	if json.Unmarshal(raw, &fields) != nil || len(fields) == 0 {
		return false
	}
	var s struct {
		StateType string          `json:"state_type"`
		CTID      json.RawMessage `json:"ctid"`
	}
	if json.Unmarshal(raw, &s) != nil {
		return false
	}
	inLoad := strings.HasPrefix(s.StateType, "ctid") || s.StateType == "xmin"
	return !inLoad || len(s.CTID) == 0 || string(s.CTID) == "null"
}

func namespaceOr(ns *string) string {
	if ns == nil || *ns == "" {
		return "public"
	}
	return *ns
}

// encodeShared encodes the shared state of pos.
func encodeShared(pos *merge.Position) json.RawMessage {
	if pos == nil {
		return nil
	}
	b, _ := json.Marshal(sharedState{Tidemark: 1, LSN: uint64(pos.LSN), LSNText: pos.LSN.String(), SystemID: pos.SystemID, Timeline: pos.Timeline, Database: pos.Database, Slot: pos.Slot, Invisible: pos.Invisible})
	return b
}
