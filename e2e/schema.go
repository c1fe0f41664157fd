package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// Temporal formats as Airbyte's well-known types define them (airbyte/well_known_types.yaml):
// RFC 3339 extended with a " BC" suffix, the offset optional for the types without a time zone,
// and (as that file's notes ask and ISO 8601's expanded years write them) years past 9999 with a
// leading "+". Nothing else: PostgreSQL's infinity has no form here, so Tidemark writes null for
// it (with the text beside), and a UTC offset has hours and minutes only.
var (
	dateRE     = regexp.MustCompile(`^(\d{4}|\+\d{5,})-\d{2}-\d{2}( BC)?$`)
	timeRE     = regexp.MustCompile(`^\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+\-]\d{1,2}:\d{2})?$`)
	dateTimeRE = regexp.MustCompile(`^(\d{4}|\+\d{5,})-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+\-]\d{1,2}:\d{2})?( BC)?$`)
)

func pattern(name string, re *regexp.Regexp) *jsonschema.Format {
	return &jsonschema.Format{Name: name, Validate: func(v any) error {
		s, ok := v.(string)
		if !ok || re.MatchString(s) {
			return nil
		}
		return fmt.Errorf("%q is not a %s as Airbyte's well-known types define it", s, name)
	}}
}

// CompileSchema compiles a JSON schema (draft-07) for validating Tidemark's output, with the
// date, time and date-time formats of Airbyte's well-known types.
func CompileSchema(schema any) (*jsonschema.Schema, error) {
	b, err := json.Marshal(schema)
	if err != nil {
		return nil, err
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft7)
	c.RegisterFormat(pattern("date", dateRE))
	c.RegisterFormat(pattern("time", timeRE))
	c.RegisterFormat(pattern("date-time", dateTimeRE))
	if err := c.AddResource("schema.json", doc); err != nil {
		return nil, err
	}
	return c.Compile("schema.json")
}
