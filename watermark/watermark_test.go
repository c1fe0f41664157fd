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
