package pgjson

import (
	"testing"
)

// TestTextInvertsAppend: the text Text gives back for a value's exact JSON form is the text the
// form was written from (for texts PostgreSQL prints; others as PostgreSQL reads them alike).
func TestTextInvertsAppend(t *testing.T) {
	inner := &Type{Name: "pair", kind: kComposite, fields: []Field{{"n", typ(kInteger)}, {"s", typ(kString)}}}
	cases := []struct {
		typ        *Type
		text, back string // back: "" for text itself
	}{
		{typ(kInteger), "-9223372036854775808", ""},
		{typ(kNumber), "1.10", ""},
		{typ(kNumber), "-0", ""},
		{typ(kNumber), "1e+300", ""},
		{typ(kMoney), "$1,234.50", "1234.50"},
		{typ(kBool), "t", ""},
		{typ(kBytea), `\x00ff10`, ""},
		{typ(kBytea), `\x`, ""},
		{typ(kString), `{"a": 1,   "a": 2 }`, ""},
		{typ(kDate), "2024-02-29", ""},
		{typ(kDate), "0044-03-15 BC", ""},
		{typ(kDate), "12345-06-07", ""},
		{typ(kTimestamp), "2024-02-29 13:14:15.5", ""},
		{typ(kTimestamp), "0044-03-15 10:00:00 BC", ""},
		{typ(kTimestampTZ), "2024-02-29 11:14:15.123456+00", ""},
		{typ(kTimestampTZ), "0044-03-15 10:00:00+00 BC", ""},
		{typ(kTime), "24:00:00", ""},
		{typ(kTimeTZ), "13:14:15+05:30", ""},
		{typ(kInterval), "P1Y2M3DT4H5M6.5S", ""},
		{typ(kVector), "1 2 3", ""},
		{typ(kHstore), `"k"=>"v \"q\" \\", "n"=>NULL`, ""},
		{&Type{Name: "int4[]", kind: kArray, elem: typ(kInteger), delim: ','}, "{{1,2},{NULL,4}}", ""},
		{&Type{Name: "text[]", kind: kArray, elem: typ(kString), delim: ','}, `{"","a b","NULL",null,"q\"\\",x}`, `{"","a b","NULL",NULL,"q\"\\",x}`},
		{&Type{Name: "box[]", kind: kArray, elem: typ(kString), delim: ';'}, "{(1,1),(0,0);(2,2),(1,1)}", ""},
		{&Type{Name: "bytea[]", kind: kArray, elem: typ(kBytea), delim: ','}, `{"\\x00ff",NULL}`, ""},
		{inner, `(2,"x y")`, ""},
		{inner, `(,"")`, ""},
		{&Type{Name: "pair[]", kind: kArray, elem: inner, delim: ','}, `{"(1,a)",NULL}`, ""},
	}
	for _, c := range cases {
		form, lossy, err := c.typ.Append(nil, []byte(c.text))
		if err != nil || lossy {
			t.Fatalf("%s %q: Append: %v (lossy %v)", c.typ.Name, c.text, err, lossy)
		}
		back, null, err := c.typ.Text(nil, form)
		if err != nil || null {
			t.Fatalf("%s %q (form %s): Text: %v (null %v)", c.typ.Name, c.text, form, err, null)
		}
		want := c.back
		if want == "" {
			want = c.text
		}
		if c.typ.kind == kHstore {
			// An object's members come back in any order: compare a one-pair value exactly.
			continue
		}
		if string(back) != want {
			t.Errorf("%s %q: form %s, back %q, want %q", c.typ.Name, c.text, form, back, want)
		}
	}
	// hstore: one pair, exactly.
	h := typ(kHstore)
	form, _, _ := h.Append(nil, []byte(`"k"=>"v \"q\" \\"`))
	if back, _, err := h.Text(nil, form); err != nil || string(back) != `"k"=>"v \"q\" \\"` {
		t.Errorf("hstore: back %q, %v", back, err)
	}
	// A lossy value is null: its text travels beside it.
	if _, null, _ := typ(kNumber).Text(nil, []byte("null")); !null {
		t.Error("null is not null")
	}
	for _, bad := range []struct {
		typ  *Type
		form string
	}{{typ(kInteger), `"1"`}, {typ(kBool), `1`}, {typ(kBytea), `"%%"`}, {inner, `{"n":1}`}, {inner, `{"n":1,"x":2}`}, {typ(kString), `1`}} {
		if _, _, err := bad.typ.Text(nil, []byte(bad.form)); err == nil {
			t.Errorf("%s %s: no error", bad.typ.Name, bad.form)
		}
	}
}
