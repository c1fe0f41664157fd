package watermark

import (
	"errors"
	"testing"
)

// TestTransportResolve: auto is messages from PostgreSQL 14, the signal table before; messages
// asked for on 13 are refused, not downgraded.
func TestTransportResolve(t *testing.T) {
	for _, tc := range []struct {
		t       Transport
		version int
		want    Transport
		err     bool
	}{
		{Auto, 150004, Messages, false},
		{Auto, 140000, Messages, false},
		{Auto, 130011, Table, false},
		{Table, 150004, Table, false},
		{Messages, 140000, Messages, false},
		{Messages, 130011, "", true},
	} {
		got, err := tc.t.Resolve(tc.version)
		if tc.err {
			if !errors.Is(err, ErrSetup) {
				t.Errorf("%s on %d: got %v, %v; want ErrSetup", tc.t, tc.version, got, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%s on %d: got %v, %v; want %v", tc.t, tc.version, got, err, tc.want)
		}
	}
	for _, s := range []string{"", "auto", "message", "table"} {
		if _, err := ParseTransport(s); err != nil {
			t.Errorf("ParseTransport(%q): %v", s, err)
		}
	}
	if _, err := ParseTransport("rows"); err == nil {
		t.Error("ParseTransport(rows): no error")
	}
}

// TestDecodeMessage: a message mark decodes to the mark written, for its slot and run only.
func TestDecodeMessage(t *testing.T) {
	c := Config{Slot: "s1", Run: "r1"}
	for _, m := range []Mark{{ID: 1, Kind: Low}, {ID: 1 << 40, Kind: High}, {ID: 7, Kind: Fence}} {
		got, ok := c.DecodeMessage(Prefix, []byte(c.MessageContent(m)))
		if !ok || got != m {
			t.Errorf("%+v: decoded %+v, %v", m, got, ok)
		}
	}
	content := []byte(c.MessageContent(Mark{ID: 3, Kind: High}))
	for name, other := range map[string]Config{"other slot": {Slot: "s2", Run: "r1"}, "other run": {Slot: "s1", Run: "r2"}} {
		if _, ok := other.DecodeMessage(Prefix, content); ok {
			t.Errorf("%s: decoded a mark not its own", name)
		}
	}
	for name, tc := range map[string]struct {
		prefix, content string
	}{
		"other prefix": {"debezium", string(content)},
		"not JSON":     {Prefix, "L 3"},
		"unknown kind": {Prefix, `{"slot":"s1","run":"r1","chunk":3,"kind":"X"}`},
		"long kind":    {Prefix, `{"slot":"s1","run":"r1","chunk":3,"kind":"HH"}`},
	} {
		if _, ok := c.DecodeMessage(tc.prefix, []byte(tc.content)); ok {
			t.Errorf("%s: decoded as a mark", name)
		}
	}
}

// TestDecodeRow: a signal-table row decodes to the mark written, for its slot and run only.
func TestDecodeRow(t *testing.T) {
	c := Config{Slot: "s1", Run: "r1"}
	cols := []string{"slot", "run", "chunk", "kind", "written_at"}
	row := func(slot, run, chunk, kind string) [][]byte {
		return [][]byte{[]byte(slot), []byte(run), []byte(chunk), []byte(kind), []byte("2026-01-01 00:00:00+00")}
	}
	if m, ok := c.Decode(cols, row("s1", "r1", "42", "H")); !ok || m != (Mark{ID: 42, Kind: High}) {
		t.Errorf("own mark: %+v, %v", m, ok)
	}
	for name, r := range map[string][][]byte{
		"other slot": row("s2", "r1", "42", "H"), "other run": row("s1", "r2", "42", "H"),
		"no slot": row("", "r1", "42", "H"), "bad chunk": row("s1", "r1", "x", "H"), "bad kind": row("s1", "r1", "42", "Z"),
	} {
		if _, ok := c.Decode(cols, r); ok {
			t.Errorf("%s: decoded as this run's mark", name)
		}
	}
}

// TestRunIDsDiffer: each run gets a run id of its own (random), so an earlier run's marks, which
// number their chunks from 1 too, never match a new run's.
func TestRunIDsDiffer(t *testing.T) {
	var a, b Config
	a.EnsureDefaults()
	b.EnsureDefaults()
	if a.Run == "" || a.Run == b.Run {
		t.Errorf("run ids %q and %q", a.Run, b.Run)
	}
}
