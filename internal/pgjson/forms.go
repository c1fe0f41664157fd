package pgjson

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"unicode/utf16"
)

// The temporal types' text under DateStyle ISO and TimeZone UTC, and the two profiles' forms of
// it. Both profiles write dates and timestamps as Airbyte's well-known types define them: RFC 3339
// with a " BC" suffix for years before 1, and (as ISO 8601's expanded years and the Java
// connector have it) a leading "+" for years past 9999. ±infinity has no such form: it is written
// as null, marked lossy, so that its text travels beside (meta.changes, "original").

// stamp is a date, time of day, timestamp or timestamptz as PostgreSQL prints it.
type stamp struct {
	year, md   string // "2024", "-02-29"
	clock      clock
	hasClock   bool
	offset     string // "+00", "+05:30", "-08", "+05:30:15"; "" for none
	bc         bool
	infinity   bool // infinity or -infinity (sign in neg)
	neg        bool
	hasDate    bool
	offsetSecs bool // the offset has seconds
}

// clock is a time of day: two-digit hours, minutes and seconds, and the fraction's digits.
type clock struct{ h, m, s, frac string }

func (c clock) zeroSeconds() bool { return c.s == "00" && strings.Trim(c.frac, "0") == "" }

// parseStamp reads the text of a date, time, timetz, timestamp or timestamptz.
func parseStamp(text []byte, date, clk, zone bool) (stamp, error) {
	s := string(text)
	var st stamp
	switch s {
	case "infinity":
		st.infinity = true
		return st, nil
	case "-infinity":
		st.infinity, st.neg = true, true
		return st, nil
	}
	bad := func() (stamp, error) {
		return stamp{}, fmt.Errorf("%w: %q is not a date or time as PostgreSQL prints it", errSyntax, s)
	}
	if rest, ok := strings.CutSuffix(s, " BC"); ok {
		st.bc, s = true, rest
	}
	if date {
		i := strings.IndexByte(s, '-')
		if i < 4 || len(s) < i+6 || !digits(s[:i]) || s[i+3] != '-' || !digits(s[i+1:i+3]) || !digits(s[i+4:i+6]) {
			return bad()
		}
		st.year, st.md, st.hasDate = s[:i], s[i:i+6], true
		s = s[i+6:]
		if clk {
			if len(s) == 0 || s[0] != ' ' {
				return bad()
			}
			s = s[1:]
		}
	}
	if clk {
		if len(s) < 8 || s[2] != ':' || s[5] != ':' || !digits(s[:2]) || !digits(s[3:5]) || !digits(s[6:8]) {
			return bad()
		}
		st.clock, st.hasClock = clock{h: s[:2], m: s[3:5], s: s[6:8]}, true
		s = s[8:]
		if len(s) > 0 && s[0] == '.' {
			j := 1
			for j < len(s) && s[j] >= '0' && s[j] <= '9' {
				j++
			}
			if j == 1 {
				return bad()
			}
			st.clock.frac, s = s[1:j], s[j:]
		}
	}
	if zone {
		if len(s) < 3 || (s[0] != '+' && s[0] != '-') || !digits(s[1:3]) {
			return bad()
		}
		st.offset = s
		// ±HH, ±HH:MM or ±HH:MM:SS, read in place (no split: this runs for every value).
		groups := 0
		for off := s[1:]; ; off = off[1:] {
			if len(off) < 2 || !digits(off[:2]) || groups == 3 {
				return bad()
			}
			groups, off = groups+1, off[2:]
			if off == "" {
				break
			}
			if off[0] != ':' {
				return bad()
			}
		}
		st.offsetSecs = groups == 3
		s = ""
	}
	if s != "" {
		return bad()
	}
	return st, nil
}

func digits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// date writes the date part: the year with a "+" past 9999.
func (st stamp) date(b []byte) []byte {
	if len(st.year) > 4 {
		b = append(b, '+')
	}
	return append(append(b, st.year...), st.md...)
}

// rfcOffset writes an offset as RFC 3339 does: Z for UTC when zulu, else ±HH:MM.
func (st stamp) rfcOffset(b []byte, zulu bool) []byte {
	off := st.offset
	if zulu && (off == "+00" || off == "+00:00") {
		return append(b, 'Z')
	}
	if len(off) == 3 {
		return append(append(b, off...), ":00"...)
	}
	return append(b, off...)
}

// javaOffset writes an offset as java.time's ZoneOffset id (and the XXX pattern) does: Z for
// zero, else ±HH:MM.
func (st stamp) javaOffset(b []byte) []byte {
	if strings.Trim(st.offset[1:], "0:") == "" {
		return append(b, 'Z')
	}
	return st.rfcOffset(b, false)
}

// javaClock writes a time of day as the Java connector does: "HH:mm:ss.SSSSSS" when the seconds
// and their fraction are zero, java.time.LocalTime.toString() otherwise (the fraction in groups
// of three digits: 3, 6 or 9).
func javaClock(b []byte, c clock) []byte {
	b = append(append(append(append(append(b, c.h...), ':'), c.m...), ':'), c.s...)
	if c.zeroSeconds() {
		return append(b, ".000000"...)
	}
	f := strings.TrimRight(c.frac, "0")
	switch {
	case f == "":
	case len(f) <= 3:
		b = append(append(b, '.'), (f + "000")[:3]...)
	case len(f) <= 6:
		b = append(append(b, '.'), (f + "000000")[:6]...)
	default:
		b = append(append(b, '.'), (f + "000000000")[:9]...)
	}
	return b
}

// rfcClock writes a time of day as PostgreSQL prints it.
func rfcClock(b []byte, c clock) []byte {
	b = append(append(append(append(append(b, c.h...), ':'), c.m...), ':'), c.s...)
	if c.frac != "" {
		b = append(append(b, '.'), c.frac...)
	}
	return b
}

// endOfDay is java.time.LocalTime.MAX, which the Java connector's driver reads 24:00:00 as.
var endOfDay = clock{h: "23", m: "59", s: "59", frac: "999999999"}

// appendTemporal writes a value of a temporal kind in t's profile.
func (t *Type) appendTemporal(dst, text []byte) ([]byte, bool, error) {
	date := t.kind == kDate || t.kind == kTimestamp || t.kind == kTimestampTZ
	clk := t.kind != kDate
	zone := t.kind == kTimeTZ || t.kind == kTimestampTZ
	st, err := parseStamp(text, date, clk, zone)
	if err != nil {
		return dst, false, err
	}
	if st.infinity || st.offsetSecs {
		// No form in the column's format: null, the text kept beside.
		return append(dst, "null"...), true, nil
	}
	lossy := false
	b := append(dst, '"')
	if st.hasDate {
		b = append(st.date(b), 'T')
		if t.kind == kDate {
			b = b[:len(b)-1]
		}
	}
	if clk {
		c := st.clock
		if t.prof == Airbyte && c.h == "24" {
			// The Java connector's driver reads 24:00:00 as the last nanosecond of the day; its
			// form is kept, marked lossy.
			c, lossy = endOfDay, true
		}
		switch {
		case t.prof == Airbyte && t.kind == kTimestampTZ:
			b = append(append(append(append(append(append(b, c.h...), ':'), c.m...), ':'), c.s...), '.')
			n := min(len(c.frac), 6) // microseconds: the fraction's first six digits, padded
			b = append(b, c.frac[:n]...)
			b = append(b, "000000"[n:]...)
		case t.prof == Airbyte:
			b = javaClock(b, c)
		default:
			b = rfcClock(b, c)
		}
	}
	if zone {
		if t.prof == Airbyte {
			b = st.javaOffset(b)
		} else {
			b = st.rfcOffset(b, t.kind == kTimestampTZ)
		}
	}
	if st.bc {
		b = append(b, " BC"...)
	}
	return append(b, '"'), lossy, nil
}

// javaDouble writes a float8's text as java.lang.Double.toString prints the same double (the
// shortest digits that read back to it, since Java 19): plain for 10^-3 <= |v| < 10^7 with at
// least one fraction digit, else d.dddE±n.
func javaDouble(b []byte, text string) ([]byte, error) {
	v, err := strconv.ParseFloat(text, 64)
	if err != nil && !isRangeErr(err) {
		return b, fmt.Errorf("%w: %q is not a number", errSyntax, text)
	}
	switch {
	case math.IsNaN(v):
		return append(b, "NaN"...), nil
	case math.IsInf(v, 1):
		return append(b, "Infinity"...), nil
	case math.IsInf(v, -1):
		return append(b, "-Infinity"...), nil
	case v == 0:
		if math.Signbit(v) {
			return append(b, "-0.0"...), nil
		}
		return append(b, "0.0"...), nil
	}
	if v < 0 {
		b = append(b, '-')
		v = -v
	}
	e := strconv.FormatFloat(v, 'e', -1, 64) // d.ddde±x
	mant, exp, _ := strings.Cut(e, "e")
	ds := strings.Replace(mant, ".", "", 1)
	x, _ := strconv.Atoi(exp)
	if len(ds) == 1 {
		// Java chooses among the decimals of one or two digits that read back to v the one
		// nearest to it (Double.toString's specification since Java 19): 4.9E-324, not 5.0E-324.
		two := strconv.FormatFloat(v, 'e', 1, 64)
		mant2, exp2, _ := strings.Cut(two, "e")
		if mant2[2] != '0' {
			ds = mant2[:1] + mant2[2:]
			x, _ = strconv.Atoi(exp2)
		}
	}
	if v >= 1e-3 && v < 1e7 {
		if x >= 0 {
			for len(ds) <= x {
				ds += "0"
			}
			frac := ds[x+1:]
			if frac == "" {
				frac = "0"
			}
			return append(append(append(b, ds[:x+1]...), '.'), frac...), nil
		}
		return append(append(append(b, "0."...), strings.Repeat("0", -x-1)...), ds...), nil
	}
	frac := ds[1:]
	if frac == "" {
		frac = "0"
	}
	return strconv.AppendInt(append(append(append(append(b, ds[0]), '.'), frac...), 'E'), int64(x), 10), nil
}

func isRangeErr(err error) bool {
	var ne *strconv.NumError
	if e, ok := err.(*strconv.NumError); ok {
		ne = e
	}
	return ne != nil && ne.Err == strconv.ErrRange
}

// geometricSeparators are the characters between the numbers of a geometric type's text.
const geometricSeparators = "()[]{}<>,"

// appendJavaGeometric writes a geometric value's text (point, line, lseg, box, path, polygon,
// circle) as the Java connector's driver prints it: the same punctuation, every number as
// Double.toString prints it ("(3,7)" becomes "(3.0,7.0)").
func appendJavaGeometric(dst, text []byte) ([]byte, error) {
	b := append(dst, '"')
	var buf []byte
	start := -1
	flush := func(end int) error {
		if start < 0 {
			return nil
		}
		var err error
		if buf, err = javaDouble(buf[:0], string(text[start:end])); err != nil {
			return err
		}
		b = append(b, buf...)
		start = -1
		return nil
	}
	for i, c := range text {
		if strings.IndexByte(geometricSeparators, c) >= 0 {
			if err := flush(i); err != nil {
				return dst, err
			}
			b = append(b, c)
			continue
		}
		if start < 0 {
			start = i
		}
	}
	if err := flush(len(text)); err != nil {
		return dst, err
	}
	return append(b, '"'), nil
}

// javaStringHash is java.lang.String.hashCode: over UTF-16 code units.
func javaStringHash(s []byte) int32 {
	var h int32
	for _, r := range string(s) {
		if r >= 0x10000 {
			r1, r2 := utf16.EncodeRune(r)
			h = 31*h + int32(r1)
			h = 31*h + int32(r2)
			continue
		}
		h = 31*h + int32(r)
	}
	return h
}

// javaHashMapOrder returns the order in which a java.util.HashMap filled with keys, in this
// order, iterates them (the Java connector's driver reads an hstore into one): by bucket, then by
// insertion within a bucket, with the table doubled from 16 buckets whenever it holds more than
// three quarters of its size, or when a bucket reaches 9 entries in a table of fewer than 64
// buckets. (A larger table turns such a bucket into a tree, whose order is not modelled: a map
// of dozens of keys nine of which share their hash's low bits.)
func javaHashMapOrder(keys [][]byte) []int {
	hashes := make([]uint32, len(keys))
	for i, k := range keys {
		h := uint32(javaStringHash(k))
		hashes[i] = h ^ (h >> 16)
	}
	size := uint32(16)
	var bins map[uint32][]int
	rebuild := func(n int) {
		bins = map[uint32][]int{}
		for i := range n {
			b := hashes[i] & (size - 1)
			bins[b] = append(bins[b], i)
		}
	}
	rebuild(0)
	for i := range keys {
		b := hashes[i] & (size - 1)
		bins[b] = append(bins[b], i)
		if len(bins[b]) >= 9 && size < 64 {
			size *= 2
			rebuild(i + 1)
		}
		if float64(i+1) > float64(size)*0.75 {
			size *= 2
			rebuild(i + 1)
		}
	}
	order := make([]int, 0, len(keys))
	var buckets []uint32
	for b := range bins {
		buckets = append(buckets, b)
	}
	sort.Slice(buckets, func(i, j int) bool { return buckets[i] < buckets[j] })
	for _, b := range buckets {
		order = append(order, bins[b]...)
	}
	return order
}

// appendJavaJSONString appends s as a JSON string as Jackson writes it: quotes and backslashes
// escaped, \b \t \n \f \r short, other control characters as \u00XX in upper case hex.
func appendJavaJSONString(b, s []byte) []byte {
	b = append(b, '"')
	for _, c := range s {
		switch c {
		case '"', '\\':
			b = append(b, '\\', c)
		case '\b':
			b = append(b, '\\', 'b')
		case '\t':
			b = append(b, '\\', 't')
		case '\n':
			b = append(b, '\\', 'n')
		case '\f':
			b = append(b, '\\', 'f')
		case '\r':
			b = append(b, '\\', 'r')
		default:
			if c < 0x20 {
				b = append(b, '\\', 'u', '0', '0', "0123456789ABCDEF"[c>>4], "0123456789ABCDEF"[c&0xf])
				continue
			}
			b = append(b, c)
		}
	}
	return append(b, '"')
}

// appendJavaHstore writes an hstore as the Java connector does: the JSON text of the driver's
// HashMap of it (in that map's iteration order), as a string.
func appendJavaHstore(dst, text []byte) ([]byte, error) {
	keys, vals, err := parseHstore(text)
	if err != nil {
		return dst, err
	}
	obj := []byte{'{'}
	for n, i := range javaHashMapOrder(keys) {
		if n > 0 {
			obj = append(obj, ',')
		}
		obj = append(appendJavaJSONString(obj, keys[i]), ':')
		if vals[i] == nil {
			obj = append(obj, "null"...)
		} else {
			obj = appendJavaJSONString(obj, vals[i])
		}
	}
	obj = append(obj, '}')
	return AppendString(dst, obj), nil
}

// interval is an interval's fields as PostgreSQL's EncodeInterval has them: months split into
// years and months, days, and the time split into hours, minutes, seconds and microseconds, each
// with the sign of its part.
type interval struct {
	year, mon, day, hour, min, sec, usec int64
}

// parseISOInterval reads an interval printed under IntervalStyle iso_8601 ("P1Y2M3DT4H5M6.5S",
// "P-1DT-1S", "PT0S").
func parseISOInterval(s string) (interval, bool) {
	var iv interval
	if len(s) < 2 || s[0] != 'P' {
		return iv, false
	}
	s = s[1:]
	inTime := false
	for s != "" {
		if s[0] == 'T' {
			if inTime {
				return iv, false
			}
			inTime, s = true, s[1:]
			continue
		}
		i := 0
		neg := false
		if s[i] == '-' {
			neg = true
			i++
		}
		j := i
		for j < len(s) && s[j] >= '0' && s[j] <= '9' {
			j++
		}
		if j == i || j >= len(s) {
			return iv, false
		}
		n, err := strconv.ParseInt(s[i:j], 10, 64)
		if err != nil {
			return iv, false
		}
		if neg {
			n = -n
		}
		var usec int64
		if s[j] == '.' && inTime {
			k := j + 1
			for k < len(s) && s[k] >= '0' && s[k] <= '9' {
				k++
			}
			f := s[j+1 : k]
			if f == "" || len(f) > 6 || k >= len(s) || s[k] != 'S' {
				return iv, false
			}
			usec, _ = strconv.ParseInt((f + "000000")[:6], 10, 64)
			if neg {
				usec = -usec
			}
			j = k
		}
		unit := s[j]
		s = s[j+1:]
		switch {
		case !inTime && unit == 'Y':
			iv.year = n
		case !inTime && unit == 'M':
			iv.mon = n
		case !inTime && unit == 'D':
			iv.day = n
		case inTime && unit == 'H':
			iv.hour = n
		case inTime && unit == 'M':
			iv.min = n
		case inTime && unit == 'S':
			iv.sec, iv.usec = n, usec
		default:
			return iv, false
		}
	}
	return iv, true
}

// appendPostgresInterval writes an interval as PostgreSQL prints it under IntervalStyle postgres
// (its default, and the Java connector's): "1 year 2 mons 3 days 04:05:06.5", "-1 days -00:00:01".
func appendPostgresInterval(b []byte, iv interval) []byte {
	isZero, isBefore := true, false
	part := func(v int64, unit string) {
		if v == 0 {
			return
		}
		if !isZero {
			b = append(b, ' ')
		}
		if isBefore && v > 0 {
			b = append(b, '+')
		}
		b = append(append(strconv.AppendInt(b, v, 10), ' '), unit...)
		if v != 1 {
			b = append(b, 's')
		}
		isBefore, isZero = v < 0, false
	}
	part(iv.year, "year")
	part(iv.mon, "mon")
	part(iv.day, "day")
	if isZero || iv.hour != 0 || iv.min != 0 || iv.sec != 0 || iv.usec != 0 {
		if !isZero {
			b = append(b, ' ')
		}
		switch {
		case iv.hour < 0 || iv.min < 0 || iv.sec < 0 || iv.usec < 0:
			b = append(b, '-')
		case isBefore:
			b = append(b, '+')
		}
		two := func(v int64) {
			if v < 0 {
				v = -v
			}
			if v < 10 {
				b = append(b, '0')
			}
			b = strconv.AppendInt(b, v, 10)
		}
		two(iv.hour)
		b = append(b, ':')
		two(iv.min)
		b = append(b, ':')
		two(iv.sec)
		if u := iv.usec; u != 0 {
			if u < 0 {
				u = -u
			}
			f := strconv.FormatInt(1_000_000+u, 10)[1:]
			b = append(append(b, '.'), strings.TrimRight(f, "0")...)
		}
	}
	return b
}

// postgresInterval converts an interval's iso_8601 text to its postgres form; text it does not
// read (an infinite interval of PostgreSQL 17, which prints alike in both styles) is kept.
func postgresInterval(text []byte) []byte {
	iv, ok := parseISOInterval(string(text))
	if !ok {
		return text
	}
	return appendPostgresInterval(nil, iv)
}
