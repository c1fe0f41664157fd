package main

import (
	"bufio"
	"encoding/json"
	"io"
	"strconv"
	"sync"
	"time"

	"github.com/tidemark/tidemark/internal/secret"
)

// The Airbyte protocol's messages (Airbyte's protocol v0; the tests check every message against
// its YAML schema, testdata/airbyte_protocol.yaml), as far as a source writes or reads them.
// Field names are copied exactly, camelCase where the protocol has it.

type message struct {
	Type             string            `json:"type"`
	Log              *logMessage       `json:"log,omitempty"`
	Spec             json.RawMessage   `json:"spec,omitempty"`
	ConnectionStatus *connectionStatus `json:"connectionStatus,omitempty"`
	Catalog          *catalog          `json:"catalog,omitempty"`
	State            *stateMessage     `json:"state,omitempty"`
	Trace            *traceMessage     `json:"trace,omitempty"`
}

type logMessage struct {
	Level   string `json:"level"`
	Message string `json:"message"`
}

type connectionStatus struct {
	Status  string `json:"status"` // SUCCEEDED or FAILED
	Message string `json:"message,omitempty"`
}

type catalog struct {
	Streams []stream `json:"streams"`
}

type stream struct {
	Name                    string         `json:"name"`
	Namespace               *string        `json:"namespace,omitempty"`
	JSONSchema              map[string]any `json:"json_schema"`
	SupportedSyncModes      []string       `json:"supported_sync_modes"`
	SourceDefinedCursor     bool           `json:"source_defined_cursor,omitempty"`
	DefaultCursorField      []string       `json:"default_cursor_field,omitempty"`
	SourceDefinedPrimaryKey [][]string     `json:"source_defined_primary_key,omitempty"`
	IsResumable             bool           `json:"is_resumable,omitempty"`
}

type configuredCatalog struct {
	Streams []configuredStream `json:"streams"`
}

type configuredStream struct {
	Stream              stream     `json:"stream"`
	SyncMode            string     `json:"sync_mode"`
	DestinationSyncMode string     `json:"destination_sync_mode"`
	CursorField         []string   `json:"cursor_field,omitempty"`
	PrimaryKey          [][]string `json:"primary_key,omitempty"`
}

type streamDescriptor struct {
	Name      string  `json:"name"`
	Namespace *string `json:"namespace,omitempty"`
}

type stateMessage struct {
	Type        string          `json:"type,omitempty"` // GLOBAL, STREAM or LEGACY (absent: LEGACY)
	Global      *globalState    `json:"global,omitempty"`
	Stream      json.RawMessage `json:"stream,omitempty"`
	Data        json.RawMessage `json:"data,omitempty"`
	SourceStats *stateStats     `json:"sourceStats,omitempty"`
}

type globalState struct {
	SharedState  json.RawMessage `json:"shared_state,omitempty"`
	StreamStates []streamState   `json:"stream_states"`
}

type streamState struct {
	StreamDescriptor streamDescriptor `json:"stream_descriptor"`
	StreamState      json.RawMessage  `json:"stream_state"`
}

// stateStats carries the record count, which the protocol wants written with a decimal point.
type stateStats struct {
	RecordCount recordCount `json:"recordCount"`
}

type recordCount int64

func (n recordCount) MarshalJSON() ([]byte, error) {
	return append(strconv.AppendInt(nil, int64(n), 10), ".0"...), nil
}

func (n *recordCount) UnmarshalJSON(b []byte) error {
	var f float64
	if err := json.Unmarshal(b, &f); err != nil {
		return err
	}
	*n = recordCount(f)
	return nil
}

type traceMessage struct {
	Type         string             `json:"type"` // ERROR, ESTIMATE, STREAM_STATUS, ANALYTICS
	EmittedAt    emittedAt          `json:"emitted_at"`
	Error        *errorTrace        `json:"error,omitempty"`
	Estimate     *estimateTrace     `json:"estimate,omitempty"`
	StreamStatus *streamStatusTrace `json:"stream_status,omitempty"`
	Analytics    *analyticsTrace    `json:"analytics,omitempty"`
}

// emittedAt is a trace's time in epoch milliseconds; the protocol types it as a number.
type emittedAt time.Time

func (t emittedAt) MarshalJSON() ([]byte, error) {
	return strconv.AppendFloat(nil, float64(time.Time(t).UnixMilli()), 'f', 1, 64), nil
}

type errorTrace struct {
	Message          string            `json:"message"`
	InternalMessage  string            `json:"internal_message,omitempty"`
	StackTrace       string            `json:"stack_trace,omitempty"`
	FailureType      string            `json:"failure_type"`
	StreamDescriptor *streamDescriptor `json:"stream_descriptor,omitempty"`
}

type estimateTrace struct {
	Name        string  `json:"name"`
	Namespace   *string `json:"namespace,omitempty"`
	Type        string  `json:"type"` // STREAM
	RowEstimate int64   `json:"row_estimate"`
}

type streamStatusTrace struct {
	StreamDescriptor streamDescriptor `json:"stream_descriptor"`
	Status           string           `json:"status"` // STARTED, RUNNING, COMPLETE, INCOMPLETE
}

type analyticsTrace struct {
	Type  string `json:"type"`
	Value string `json:"value,omitempty"`
}

// output writes protocol messages to stdout, one per line, from any goroutine. Records are
// buffered and counted; every other message is written and flushed at once, so that the platform
// sees states and traces promptly and a SIGTERM loses nothing already handed over.
type output struct {
	mu      sync.Mutex
	w       *bufio.Writer
	scrub   *secret.Scrubber // replaces secrets in text that is not a record's data
	records int64            // records written since the last state
	last    time.Time        // when the last record or state was written
	err     error            // the first write error: stdout is gone
}

func newOutput(w io.Writer, secrets []string) *output {
	return &output{w: bufio.NewWriterSize(w, 1<<16), scrub: secret.New(secrets...), last: time.Now()}
}

// write writes one message and flushes.
func (o *output) write(m *message) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	if m.Type == "LOG" || m.Type == "TRACE" || m.Type == "CONNECTION_STATUS" {
		b = []byte(o.scrub.Scrub(string(b)))
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.put(append(b, '\n'))
	if m.Type == "STATE" {
		o.records = 0
		o.last = time.Now()
	}
	o.flushLocked()
	return o.err
}

// writeRecords writes n encoded RECORD lines (each ending in a newline).
func (o *output) writeRecords(b []byte, n int) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.put(b)
	o.records += int64(n)
	o.last = time.Now()
	return o.err
}

// state writes a STATE carrying the number of records written since the previous one; make is
// called under the lock, so no record slips between the count and the state.
func (o *output) state(make func() *stateMessage) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.stateLocked(make)
}

// stateIfIdle writes a STATE made by make only when nothing was written for at least d and no
// record waits for a state, both checked under the lock that records are written under: a
// heartbeat's state never follows records it does not cover (it would commit them at an older
// position than theirs, and a read resumed from it would emit them again).
func (o *output) stateIfIdle(d time.Duration, make func() *stateMessage) (bool, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if time.Since(o.last) < d || o.records > 0 {
		return false, o.err
	}
	return true, o.stateLocked(make)
}

func (o *output) stateLocked(make func() *stateMessage) error {
	st := make()
	st.SourceStats = &stateStats{RecordCount: recordCount(o.records)}
	b, err := json.Marshal(&message{Type: "STATE", State: st})
	if err != nil {
		return err
	}
	o.put(append(b, '\n'))
	o.records = 0
	o.last = time.Now()
	o.flushLocked()
	return o.err
}

func (o *output) flush() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.flushLocked()
	return o.err
}

func (o *output) put(b []byte) {
	if o.err != nil {
		return
	}
	if _, err := o.w.Write(b); err != nil {
		o.err = err
	}
}

func (o *output) flushLocked() {
	if o.err != nil {
		return
	}
	if err := o.w.Flush(); err != nil {
		o.err = err
	}
}

func (o *output) log(level, msg string) {
	_ = o.write(&message{Type: "LOG", Log: &logMessage{Level: level, Message: msg}})
}

func (o *output) trace(t *traceMessage) {
	t.EmittedAt = emittedAt(time.Now())
	_ = o.write(&message{Type: "TRACE", Trace: t})
}

func (o *output) status(d streamDescriptor, status string) {
	o.trace(&traceMessage{Type: "STREAM_STATUS", StreamStatus: &streamStatusTrace{StreamDescriptor: d, Status: status}})
}
