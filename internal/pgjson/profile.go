package pgjson

import "fmt"

// Profile selects the JSON forms the encoder writes. Both profiles read the same text (the
// pinned session settings' output, whichever path read the value) and differ only in how they
// write it; docs/types.md lists both forms of every type.
type Profile uint8

const (
	// Exact writes every value in its most faithful JSON form (docs/types.md, the "exact"
	// column): bytea as base64, composites and hstore as objects, intervals in ISO 8601. The
	// CLI writes these.
	Exact Profile = iota
	// Airbyte writes the forms of Airbyte's Java Postgres source, as its data type table and
	// datatype tests publish them: bytea as \x hex text; json, jsonb, hstore, composites,
	// intervals and geometric types as strings; temporal types as its date-time converter
	// prints them. A connection switched from that connector keeps its destination's columns.
	Airbyte
)

// Profiles are the profiles by name, as configs spell them.
var Profiles = map[string]Profile{"exact": Exact, "airbyte": Airbyte}

func (p Profile) String() string {
	switch p {
	case Exact:
		return "exact"
	case Airbyte:
		return "airbyte"
	}
	return fmt.Sprintf("Profile(%d)", uint8(p))
}
