package pgjson

import (
	"crypto/md5"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
)

// The Debezium format's values: how Debezium's PostgreSQL connector writes each type with its
// default settings (time.precision.mode adaptive, binary.handling.mode bytes,
// interval.handling.mode numeric, hstore.handling.mode json) and the decimal.handling.mode
// given, through Kafka Connect's JSON converter (bytes and Decimal as base64). docs/cli.md, "The
// Debezium format", has the table; docs/types.md the Tidemark forms these differ from. The text
// read is the pinned session's (pgconf): DateStyle ISO, TimeZone UTC, IntervalStyle iso_8601.

// DecimalMode is Debezium's decimal.handling.mode: how numeric and money values are written.
type DecimalMode uint8

const (
	// DecimalPrecise: the exact value as Kafka Connect's Decimal (the unscaled integer's
	// big-endian two's-complement bytes, base64; the scale in the schema), or, for a numeric
	// without a declared scale, Debezium's VariableScaleDecimal ({"scale":s,"value":bytes}).
	// NaN and the infinities have no form: the value is refused.
	DecimalPrecise DecimalMode = iota
	// DecimalDouble: a JSON number (the nearest double; NaN and the infinities as strings).
	DecimalDouble
	// DecimalString: the plain decimal text ("NAN", "POSITIVE_INFINITY", "NEGATIVE_INFINITY").
	DecimalString
)

// DecimalModes are the modes by name, as Debezium's decimal.handling.mode spells them.
var DecimalModes = map[string]DecimalMode{"precise": DecimalPrecise, "double": DecimalDouble, "string": DecimalString}

func (m DecimalMode) String() string {
	for n, v := range DecimalModes {
		if v == m {
			return n
		}
	}
	return fmt.Sprintf("DecimalMode(%d)", uint8(m))
}

// dform is a value's form in the Debezium format.
type dform uint8

const (
	dString dform = iota // the text, as a string
	dBool
	dInt16
	dInt32
	dInt64
	dFloat32
	dFloat64
	dDecimal     // numeric
	dMoney       // money (scale 2)
	dBytes       // bytea: base64
	dJSON        // json, jsonb: the text, as a string (io.debezium.data.Json)
	dUUID        // io.debezium.data.Uuid
	dXML         // io.debezium.data.Xml
	dDate        // days since 1970-01-01
	dTime        // milliseconds (precision <= 3) or microseconds of the day
	dTimeTZ      // "HH:MM:SS[.f]Z", in UTC
	dTimestamp   // milliseconds or microseconds since 1970-01-01T00:00
	dTimestampTZ // ISO 8601 in UTC, the fraction as wide as the precision
	dInterval    // microseconds, a month as 365.25/12 days
	dHstore      // its JSON text, as a string
	dBitBool     // bit(1), varbit(1): a boolean
	dBits        // bit(n), varbit(n): the bits' little-endian bytes, base64
	dTsvector    // its text (io.debezium.data.Tsvector)
	dArray
)

// Debezium is how one column's values are written in the Debezium format: its type, with the
// type modifier the column declares, in a decimal mode.
type Debezium struct {
	form   dform
	name   string // the type's name, for errors
	base   string // Type.base
	scale  int    // numeric with a declared scale; money: 2
	prec   int    // numeric: the declared precision (0: none)
	fixed  bool   // numeric: the scale is declared
	micros bool   // time, timestamp: microseconds (the precision is over 3)
	width  int    // timestamptz: the fraction's digits (0: as many as needed)
	length int    // bit, varbit: the declared length
	mode   DecimalMode
	elem   *Debezium // arrays
	delim  byte
	oneDim bool // arrays: one dimension only (OneDimension)
}

// OneDimension returns d refusing arrays of more than one dimension: a schema declares an array
// of the element type, which nested arrays do not match (PostgreSQL does not enforce a column's
// declared dimensions, so the schema cannot declare them either).
func (d *Debezium) OneDimension() *Debezium {
	c := *d
	c.oneDim = true
	return &c
}

// temporalPrecision is a time, timetz, timestamp, timestamptz or interval type modifier's
// precision: 6 when none is declared.
func temporalPrecision(typmod int32) int {
	if typmod < 0 {
		return 6
	}
	return int(typmod & 0xffff)
}

// Debezium returns the Debezium form of t's values in a column of type modifier typmod. An
// array's elements take the column's modifier, as Debezium's connector gives them.
func (t *Type) Debezium(typmod int32, mode DecimalMode) *Debezium {
	d := &Debezium{name: t.Name, base: t.base, mode: mode}
	if typmod < 0 && t.hasDomTypmod {
		typmod = t.domTypmod // a domain's column: the domain declares it
	}
	if t.kind == kArray {
		d.form, d.elem, d.delim = dArray, t.elem.Debezium(typmod, mode), t.delim
		return d
	}
	switch t.base {
	case "bool":
		d.form = dBool
	case "int2":
		d.form = dInt16
	case "int4":
		d.form = dInt32
	case "int8", "oid":
		d.form = dInt64
	case "float4":
		d.form = dFloat32
	case "float8":
		d.form = dFloat64
	case "numeric":
		d.form = dDecimal
		if typmod >= 4 {
			// numeric's typmod: ((precision << 16) | scale) + 4, the scale an 11-bit signed field.
			m := typmod - 4
			d.fixed, d.prec, d.scale = true, int((m>>16)&0xffff), int(((m&0x7ff)^1024)-1024)
		}
	case "money":
		d.form, d.scale = dMoney, 2
	case "bytea":
		d.form = dBytes
	case "json", "jsonb":
		d.form = dJSON
	case "uuid":
		d.form = dUUID
	case "xml":
		d.form = dXML
	case "date":
		d.form = dDate
	case "time":
		d.form, d.micros = dTime, temporalPrecision(typmod) > 3
	case "timetz":
		d.form = dTimeTZ
	case "timestamp":
		d.form, d.micros = dTimestamp, temporalPrecision(typmod) > 3
	case "timestamptz":
		d.form, d.width = dTimestampTZ, temporalPrecision(typmod)
	case "interval":
		d.form = dInterval
	case "hstore":
		d.form = dHstore
	case "tsvector":
		d.form = dTsvector
	case "bit", "varbit":
		d.form = dBits
		d.length = math.MaxInt32 // pgjdbc's length of a varbit without one
		if typmod > 0 {
			d.length = int(typmod)
		}
		if d.length == 1 {
			d.form = dBitBool
		}
	}
	return d
}

// IsArray reports whether the values are JSON arrays.
func (d *Debezium) IsArray() bool { return d.form == dArray }

// IsBytes reports whether the values are bytes (base64 strings).
func (d *Debezium) IsBytes() bool { return d.form == dBytes }

// Append appends the Debezium form of a value, given its text. A value the form cannot carry is
// an error that names the fix (a numeric NaN or infinity in the precise mode, as with Debezium).
func (d *Debezium) Append(dst, text []byte) ([]byte, error) {
	switch d.form {
	case dBool:
		switch string(text) {
		case "t":
			return append(dst, "true"...), nil
		case "f":
			return append(dst, "false"...), nil
		}
	case dInt16, dInt32, dInt64:
		if isInteger(text) {
			return append(dst, text...), nil
		}
	case dFloat32, dFloat64:
		if isNumber(text) {
			return append(dst, text...), nil
		}
		switch string(text) {
		case "NaN", "Infinity", "-Infinity":
			// Jackson, which Kafka's JSON converter writes with, quotes them.
			return AppendString(dst, text), nil
		}
	case dDecimal:
		return d.appendDecimal(dst, text)
	case dMoney:
		n, _, err := appendMoney(nil, text)
		if err != nil {
			return dst, err
		}
		return d.appendDecimal(dst, n)
	case dBytes:
		out, _, err := (&Type{Name: d.name, kind: kBytea}).Append(dst, text)
		return out, err
	case dDate:
		st, err := parseStamp(text, true, false, false)
		if err != nil {
			return dst, err
		}
		if st.infinity {
			// Debezium's reading of ±infinity: the dates -5877611-06-21 and -22.
			day := daysFromCivil(-5877611, 6, 21)
			if st.neg {
				day++
			}
			return strconv.AppendInt(dst, day, 10), nil
		}
		day, err := st.days()
		if err != nil {
			return dst, err
		}
		return strconv.AppendInt(dst, day, 10), nil
	case dTime:
		st, err := parseStamp(text, false, true, false)
		if err != nil {
			return dst, err
		}
		us := st.clock.micros()
		if !d.micros {
			us /= 1000
		}
		return strconv.AppendInt(dst, us, 10), nil
	case dTimeTZ:
		st, err := parseStamp(text, false, true, true)
		if err != nil {
			return dst, err
		}
		us := st.clock.micros()
		off := st.offsetMicros()
		if us == 24*3600e6 && off == 0 {
			return append(dst, `"24:00:00Z"`...), nil
		}
		us = ((us-off)%(24*3600e6) + 24*3600e6) % (24 * 3600e6)
		b := appendClockMicros(append(dst, '"'), us, 0)
		return append(b, `Z"`...), nil
	case dTimestamp:
		st, err := parseStamp(text, true, true, false)
		if err != nil {
			return dst, err
		}
		var us int64
		switch {
		case st.infinity && st.neg:
			us = -9223372036832400000 // Debezium's -infinity: PGStatement.DATE_NEGATIVE_INFINITY
		case st.infinity:
			us = 9223372036825200000 // PGStatement.DATE_POSITIVE_INFINITY
		case d.micros:
			day, err := st.stampDays()
			if err != nil {
				return dst, err
			}
			us = day*86400e6 + st.clock.micros()
		default:
			// Milliseconds reach PostgreSQL's last year (294276) without overflow.
			day, err := st.days()
			if err == nil && (day > 1e11 || day < -1e11) {
				err = fmt.Errorf("%w: timestamp of year %s out of range", errSyntax, st.year)
			}
			if err != nil {
				return dst, err
			}
			return strconv.AppendInt(dst, day*86400e3+st.clock.micros()/1000, 10), nil
		}
		if !d.micros {
			us = floorDiv(us, 1000)
		}
		return strconv.AppendInt(dst, us, 10), nil
	case dTimestampTZ:
		st, err := parseStamp(text, true, true, true)
		if err != nil {
			return dst, err
		}
		if st.infinity {
			return AppendString(dst, text), nil
		}
		day, err := st.days()
		if err != nil {
			return dst, err
		}
		// The day and the time apart: no product that could overflow.
		us := st.clock.micros() - st.offsetMicros()
		day, us = day+floorDiv(us, 86400e6), us-floorDiv(us, 86400e6)*86400e6
		b := appendISODate(append(dst, '"'), day)
		b = appendClockMicros(append(b, 'T'), us, d.width)
		return append(b, `Z"`...), nil
	case dInterval:
		iv, ok := parseISOInterval(string(text))
		if !ok {
			return dst, fmt.Errorf("%w: interval %q", errSyntax, text)
		}
		return strconv.AppendInt(dst, durationMicros(iv), 10), nil
	case dHstore:
		return appendJavaHstore(dst, text)
	case dBitBool:
		switch string(text) {
		case "0":
			return append(dst, "false"...), nil
		case "1":
			return append(dst, "true"...), nil
		}
	case dBits:
		if strings.Trim(string(text), "01") != "" {
			break
		}
		// java.util.BitSet of the bits, the last character bit 0, as its little-endian bytes.
		n := len(text)
		raw := make([]byte, (n+7)/8)
		top := -1
		for i := 0; i < n; i++ {
			if text[n-1-i] == '1' {
				raw[i/8] |= 1 << (i % 8)
				top = i
			}
		}
		raw = raw[:(top+8)/8]
		b := base64.StdEncoding.AppendEncode(append(dst, '"'), raw)
		return append(b, '"'), nil
	case dArray:
		items, _, err := parseArray(text, d.delim)
		if err != nil {
			return dst, err
		}
		return d.appendItems(dst, items)
	default:
		return AppendString(dst, text), nil
	}
	return dst, fmt.Errorf("%w: %s %q", errSyntax, d.name, text)
}

func (d *Debezium) appendItems(dst []byte, items []arrayItem) ([]byte, error) {
	dst = append(dst, '[')
	for i, it := range items {
		if i > 0 {
			dst = append(dst, ',')
		}
		var err error
		switch {
		case it.isSub && d.oneDim:
			return dst, fmt.Errorf("an array of %s has a value of more than one dimension, which its schema (an array of %s) cannot declare: drop --debezium-schemas (without it, such a value is written as nested arrays), or keep the column out of the output", d.elem.name, d.elem.name)
		case it.isSub:
			dst, err = d.appendItems(dst, it.nested)
		case it.null:
			dst = append(dst, "null"...)
		default:
			dst, err = d.elem.Append(dst, it.text)
		}
		if err != nil {
			return dst, err
		}
	}
	return append(dst, ']'), nil
}

// appendDecimal writes a numeric's (or money's) plain decimal text in the decimal mode.
func (d *Debezium) appendDecimal(dst, text []byte) ([]byte, error) {
	special := ""
	switch string(text) {
	case "NaN":
		special = "NAN"
	case "Infinity":
		special = "POSITIVE_INFINITY"
	case "-Infinity":
		special = "NEGATIVE_INFINITY"
	}
	switch d.mode {
	case DecimalString:
		if special != "" {
			return AppendString(dst, special), nil
		}
		if !isNumber(text) {
			return dst, fmt.Errorf("%w: %s %q", errSyntax, d.name, text)
		}
		if d.fixed {
			u, _, err := unscaled(text, d.scale, true)
			if err != nil {
				return dst, err
			}
			return AppendString(dst, plain(u, d.scale)), nil
		}
		return AppendString(dst, text), nil
	case DecimalDouble:
		if special != "" {
			// Double.NaN and the infinities, which Jackson quotes.
			return AppendString(dst, text), nil
		}
		if !isNumber(text) {
			return dst, fmt.Errorf("%w: %s %q", errSyntax, d.name, text)
		}
		return javaDouble(dst, string(text))
	}
	if special != "" {
		return dst, fmt.Errorf("a %s value is %s, which Debezium's precise decimal form cannot carry (nor can Debezium's connector in that mode): give --debezium-decimal string (or double)", d.name, text)
	}
	if !isNumber(text) {
		return dst, fmt.Errorf("%w: %s %q", errSyntax, d.name, text)
	}
	if d.fixed || d.form == dMoney {
		u, _, err := unscaled(text, d.scale, true)
		if err != nil {
			return dst, err
		}
		return appendTwosComplement(append(dst, '"'), u), nil
	}
	u, scale, err := unscaled(text, 0, false)
	if err != nil {
		return dst, err
	}
	dst = strconv.AppendInt(append(dst, `{"scale":`...), int64(scale), 10)
	dst = appendTwosComplement(append(dst, `,"value":"`...), u)
	return append(dst, '}'), nil
}

// unscaled reads a plain decimal text. With fixed, it returns the unscaled integer at scale
// (the text's digits must fit it exactly); without, at the text's scale with trailing fraction
// zeros removed, as java.math.BigDecimal.stripTrailingZeros leaves it (and no scale below 0).
func unscaled(text []byte, scale int, fixed bool) (*big.Int, int, error) {
	s := string(text)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimLeft(s, "+-")
	ip, fp, _ := strings.Cut(s, ".")
	if !fixed {
		fp = strings.TrimRight(fp, "0")
		scale = len(fp)
	}
	digits := ip + fp
	switch {
	case len(fp) < scale:
		digits += strings.Repeat("0", scale-len(fp))
	case len(fp) > scale:
		// A negative declared scale, or more digits than it: the dropped ones must be zeros.
		drop := len(fp) - scale
		if drop >= len(digits) && strings.Trim(digits, "0") == "" {
			digits = "0" // zero, at any scale
			break
		}
		if drop > len(digits) || strings.Trim(digits[len(digits)-drop:], "0") != "" {
			return nil, 0, fmt.Errorf("%w: %q has more digits than the scale %d", errSyntax, text, scale)
		}
		digits = digits[:len(digits)-drop]
	}
	u, ok := new(big.Int).SetString("0"+digits, 10)
	if !ok {
		return nil, 0, fmt.Errorf("%w: decimal %q", errSyntax, text)
	}
	if neg {
		u.Neg(u)
	}
	return u, scale, nil
}

// plain writes an unscaled integer at a scale as java.math.BigDecimal.toPlainString does.
func plain(u *big.Int, scale int) string {
	s := new(big.Int).Abs(u).String()
	sign := ""
	if u.Sign() < 0 {
		sign = "-"
	}
	switch {
	case scale <= 0:
		if u.Sign() != 0 {
			s += strings.Repeat("0", -scale)
		}
		return sign + s
	case len(s) <= scale:
		s = strings.Repeat("0", scale-len(s)+1) + s
	}
	return sign + s[:len(s)-scale] + "." + s[len(s)-scale:]
}

// appendTwosComplement appends base64 of u's big-endian two's-complement bytes, as few as
// java.math.BigInteger.toByteArray gives (at least one).
func appendTwosComplement(dst []byte, u *big.Int) []byte {
	var raw []byte
	if u.Sign() >= 0 {
		raw = u.Bytes()
		if len(raw) == 0 || raw[0]&0x80 != 0 {
			raw = append([]byte{0}, raw...)
		}
	} else {
		// -u-1 in the same bytes, inverted.
		m := new(big.Int).Neg(u)
		m.Sub(m, big.NewInt(1))
		raw = m.Bytes()
		if len(raw) == 0 || raw[0]&0x80 != 0 {
			raw = append([]byte{0}, raw...)
		}
		for i := range raw {
			raw[i] = ^raw[i]
		}
	}
	dst = base64.StdEncoding.AppendEncode(dst, raw)
	return append(dst, '"')
}

// durationMicros is Debezium's MicroDuration.durationMicros over an interval's fields (a month
// as 365.25/12 days), in the same double arithmetic: each step is rounded to float64, as Java
// rounds it.
func durationMicros(iv interval) int64 {
	const daysPerMonth = 365.25 / 12.0
	// The seconds as pgjdbc's PGInterval.getSeconds gives them: whole seconds plus
	// microseconds / 1e6 (it keeps them apart, rounded to the microsecond).
	secs := float64(float64(iv.sec) + float64(float64(iv.usec)/1e6))
	months := float64(int32(iv.year*12 + iv.mon))
	days := float64(months*daysPerMonth) + float64(iv.day)
	s := float64(float64(float64(float64(float64(float64(days*24)+float64(iv.hour))*60)+float64(iv.min))*60) + secs)
	v := float64(s * 1e6)
	switch {
	case math.IsNaN(v):
		return 0
	case v >= math.MaxInt64:
		return math.MaxInt64
	case v <= math.MinInt64:
		return math.MinInt64
	}
	return int64(v) // truncation toward zero, as Java's (long) cast
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if (a%b != 0) && ((a < 0) != (b < 0)) {
		q--
	}
	return q
}

// micros is a time of day's microseconds (24:00:00 is a whole day).
func (c clock) micros() int64 {
	h, _ := strconv.ParseInt(c.h, 10, 64)
	m, _ := strconv.ParseInt(c.m, 10, 64)
	s, _ := strconv.ParseInt(c.s, 10, 64)
	f, _ := strconv.ParseInt((c.frac + "000000")[:6], 10, 64)
	return ((h*60+m)*60+s)*1e6 + f
}

// offsetMicros is a UTC offset's microseconds east of UTC.
func (st stamp) offsetMicros() int64 {
	if st.offset == "" {
		return 0
	}
	var secs int64
	mult := int64(3600)
	for _, p := range strings.Split(st.offset[1:], ":") {
		n, _ := strconv.ParseInt(p, 10, 64)
		secs += n * mult
		mult /= 60
	}
	if st.offset[0] == '-' {
		secs = -secs
	}
	return secs * 1e6
}

// days is a date's days since 1970-01-01 in the proleptic Gregorian calendar (java.time's
// LocalDate.toEpochDay): year 1 BC is year 0.
func (st stamp) days() (int64, error) {
	y, err := strconv.ParseInt(st.year, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: year %q", errSyntax, st.year)
	}
	if st.bc {
		y = 1 - y
	}
	m, _ := strconv.ParseInt(st.md[1:3], 10, 64)
	d, _ := strconv.ParseInt(st.md[4:6], 10, 64)
	return daysFromCivil(y, m, d), nil
}

// stampDays is a timestamp's days, refused past the range of 64-bit microseconds since 1970
// (PostgreSQL's timestamps end in 294276, past it: Debezium's connector writes an overflowed
// number there).
func (st stamp) stampDays() (int64, error) {
	day, err := st.days()
	if err == nil && (day > 106751990 || day < -106751990) {
		err = fmt.Errorf("%w: timestamp of year %s out of range", errSyntax, st.year)
	}
	return day, err
}

// daysFromCivil is the days from 1970-01-01 to y-m-d, proleptic Gregorian (H. Hinnant's
// algorithm).
func daysFromCivil(y, m, d int64) int64 {
	if m <= 2 {
		y--
	}
	era := floorDiv(y, 400)
	yoe := y - era*400
	mp := (m + 9) % 12
	doy := (153*mp+2)/5 + d - 1
	doe := yoe*365 + yoe/4 - yoe/100 + doy
	return era*146097 + doe - 719468
}

// civilFromDays inverts daysFromCivil.
func civilFromDays(z int64) (y, m, d int64) {
	z += 719468
	era := floorDiv(z, 146097)
	doe := z - era*146097
	yoe := (doe - doe/1460 + doe/36524 - doe/146096) / 365
	y = yoe + era*400
	doy := doe - (365*yoe + yoe/4 - yoe/100)
	mp := (5*doy + 2) / 153
	d = doy - (153*mp+2)/5 + 1
	m = mp + 3
	if m > 12 {
		m -= 12
	}
	if m <= 2 {
		y++
	}
	return y, m, d
}

// appendISODate writes a day as java.time's ISO_LOCAL_DATE: four-digit years, a sign past 9999
// and before year 0 ("-0043" is 44 BC).
func appendISODate(b []byte, day int64) []byte {
	y, m, d := civilFromDays(day)
	switch {
	case y > 9999:
		b = append(b, '+')
	case y < 0:
		b = append(b, '-')
		y = -y
	}
	ys := strconv.FormatInt(y, 10)
	b = append(b, "0000"[min(len(ys), 4):]...)
	b = append(b, ys...)
	b = append(append(b, '-', byte('0'+m/10), byte('0'+m%10)), '-', byte('0'+d/10), byte('0'+d%10))
	return b
}

// appendClockMicros writes microseconds of a day as HH:MM:SS and a fraction: width digits when
// width is 1 to 9 (java.time's fixed-width fraction), else as many as needed, none for zero
// (ISO_LOCAL_TIME).
func appendClockMicros(b []byte, us int64, width int) []byte {
	s := us / 1e6
	f := us % 1e6
	two := func(b []byte, v int64) []byte { return append(b, byte('0'+v/10), byte('0'+v%10)) }
	b = two(b, s/3600)
	b = two(append(b, ':'), s/60%60)
	b = two(append(b, ':'), s%60)
	frac := fmt.Sprintf("%06d000", f)
	switch {
	case width >= 1 && width <= 9:
		b = append(append(b, '.'), frac[:width]...)
	case f != 0:
		b = append(append(b, '.'), strings.TrimRight(frac, "0")...)
	}
	return b
}

// AppendSchema appends the Kafka Connect schema of the column's values as the JSON converter
// writes it ({"type":...,"optional":...,"name":...,"version":...,"parameters":...,"field":...}),
// with field its name ("" for none: an array's items).
func (d *Debezium) AppendSchema(b []byte, field string, optional bool) []byte {
	typ, name, version := "string", "", 0
	var params [][2]string
	switch d.form {
	case dBool, dBitBool:
		typ = "boolean"
	case dInt16:
		typ = "int16"
	case dInt32:
		typ = "int32"
	case dInt64:
		typ = "int64"
	case dFloat32:
		typ = "float"
	case dFloat64:
		typ = "double"
	case dDecimal, dMoney:
		switch {
		case d.mode == DecimalDouble:
			typ = "double"
		case d.mode == DecimalString:
		case d.fixed || d.form == dMoney:
			typ, name, version = "bytes", "org.apache.kafka.connect.data.Decimal", 1
			params = append(params, [2]string{"scale", strconv.Itoa(d.scale)})
			if d.fixed {
				params = append(params, [2]string{"connect.decimal.precision", strconv.Itoa(d.prec)})
			}
		default:
			b = append(b, `{"type":"struct","fields":[{"type":"int32","optional":false,"field":"scale"},{"type":"bytes","optional":false,"field":"value"}],"optional":`...)
			b = strconv.AppendBool(b, optional)
			b = append(b, `,"name":"io.debezium.data.VariableScaleDecimal","version":1,"doc":"Variable scaled decimal"`...)
			return endSchema(b, field)
		}
	case dBytes:
		typ = "bytes"
	case dJSON, dHstore:
		name, version = "io.debezium.data.Json", 1
	case dUUID:
		name, version = "io.debezium.data.Uuid", 1
	case dXML:
		name, version = "io.debezium.data.Xml", 1
	case dTsvector:
		name, version = "io.debezium.data.Tsvector", 1
	case dDate:
		typ, name, version = "int32", "io.debezium.time.Date", 1
	case dTime:
		typ, name, version = "int32", "io.debezium.time.Time", 1
		if d.micros {
			typ, name = "int64", "io.debezium.time.MicroTime"
		}
	case dTimeTZ:
		name, version = "io.debezium.time.ZonedTime", 1
	case dTimestamp:
		typ, name, version = "int64", "io.debezium.time.Timestamp", 1
		if d.micros {
			name = "io.debezium.time.MicroTimestamp"
		}
	case dTimestampTZ:
		name, version = "io.debezium.time.ZonedTimestamp", 1
	case dInterval:
		typ, name, version = "int64", "io.debezium.time.MicroDuration", 1
	case dBits:
		typ, name, version = "bytes", "io.debezium.data.Bits", 1
		params = append(params, [2]string{"length", strconv.Itoa(d.length)})
	case dArray:
		b = d.elem.AppendSchema(append(b, `{"type":"array","items":`...), "", true)
		b = strconv.AppendBool(append(b, `,"optional":`...), optional)
		return endSchema(b, field)
	}
	b = AppendString(append(b, `{"type":`...), typ)
	b = strconv.AppendBool(append(b, `,"optional":`...), optional)
	if name != "" {
		b = AppendString(append(b, `,"name":`...), name)
		b = strconv.AppendInt(append(b, `,"version":`...), int64(version), 10)
	}
	if len(params) > 0 {
		b = append(b, `,"parameters":{`...)
		for i, p := range params {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(AppendString(b, p[0]), ':')
			b = AppendString(b, p[1])
		}
		b = append(b, '}')
	}
	return endSchema(b, field)
}

func endSchema(b []byte, field string) []byte {
	if field != "" {
		b = AppendString(append(b, `,"field":`...), field)
	}
	return append(b, '}')
}

// Unavailable is Debezium's placeholder for a TOASTed value an update did not carry.
const Unavailable = "__debezium_unavailable_value"

// AppendUnavailable appends the placeholder as Debezium's connector writes it for the column's
// type (UnchangedToastedReplicationMessageColumn): an array of it for arrays of text, varchar,
// char, json and jsonb; of its bytes for bytea[]; its bytes as numbers for int4[], date[] and
// int8[]; a name-based UUID of it for uuid[]; an hstore of it as key and value; its bytes for
// bytea; the string otherwise (where that string does not fit the column's schema, its connector
// fails: with schemas, Tidemark reads such rows again whole instead, see the sync's wiring).
func (d *Debezium) AppendUnavailable(dst []byte) []byte {
	str := func(b []byte) []byte { return AppendString(b, Unavailable) }
	bin := func(b []byte) []byte {
		return append(base64.StdEncoding.AppendEncode(append(b, '"'), []byte(Unavailable)), '"')
	}
	switch d.form {
	case dBytes:
		return bin(dst)
	case dHstore:
		return AppendString(dst, `{"`+Unavailable+`":"`+Unavailable+`"}`)
	case dArray:
		switch d.elem.base {
		case "text", "varchar", "bpchar", "json", "jsonb":
			return append(str(append(dst, '[')), ']')
		case "bytea":
			return append(bin(append(dst, '[')), ']')
		case "int4", "date", "int8":
			dst = append(dst, '[')
			for i, c := range []byte(Unavailable) {
				if i > 0 {
					dst = append(dst, ',')
				}
				dst = strconv.AppendInt(dst, int64(c), 10)
			}
			return append(dst, ']')
		case "uuid":
			// java.util.UUID.nameUUIDFromBytes: MD5, version 3, IETF variant.
			h := md5.Sum([]byte(Unavailable))
			h[6] = h[6]&0x0f | 0x30
			h[8] = h[8]&0x3f | 0x80
			x := hex.EncodeToString(h[:])
			return append(AppendString(append(dst, '['), x[:8]+"-"+x[8:12]+"-"+x[12:16]+"-"+x[16:20]+"-"+x[20:]), ']')
		}
	}
	return str(dst)
}

// UnavailableFits reports whether the placeholder fits the column's schema: a string for a
// string, bytes for bytes, an array of the element's type.
func (d *Debezium) UnavailableFits() bool {
	switch d.form {
	case dString, dJSON, dXML, dUUID, dTsvector, dTimeTZ, dTimestampTZ, dBytes, dHstore:
		return true
	case dArray:
		switch d.elem.base {
		case "text", "varchar", "bpchar", "json", "jsonb", "bytea", "int4", "int8", "uuid":
			return true
		}
	}
	return false
}
