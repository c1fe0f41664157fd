// Package pgjson encodes PostgreSQL values as JSON, the same way whichever path (backfill or
// change stream) read them, in one of two profiles (Profile): the exact forms, or the forms of
// Airbyte's Java Postgres source (docs/types.md lists both).
package pgjson

import (
	"unicode/utf8"
)

const hexDigits = "0123456789abcdef"

// safe[b] is true for the ASCII bytes a JSON string holds as they are.
var safe = func() (s [utf8.RuneSelf]bool) {
	for b := 0x20; b < utf8.RuneSelf; b++ {
		s[b] = b != '"' && b != '\\'
	}
	return s
}()

// AppendString appends s as a JSON string. Control characters, quotes and backslashes are
// escaped; invalid UTF-8 becomes U+FFFD, as encoding/json does. Unlike encoding/json, it does
// not escape <, > and & (the output is not embedded in HTML).
func AppendString[T string | []byte](dst []byte, s T) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		if b := s[i]; b < utf8.RuneSelf {
			if safe[b] {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch b {
			case '"', '\\':
				dst = append(dst, '\\', b)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[b>>4], hexDigits[b&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := decodeRune(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

func decodeRune[T string | []byte](s T) (rune, int) {
	switch v := any(s).(type) {
	case string:
		return utf8.DecodeRuneInString(v)
	case []byte:
		return utf8.DecodeRune(v)
	}
	return utf8.RuneError, 1
}
