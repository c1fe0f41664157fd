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
		// Most text is plain ASCII: eight bytes at a time while none needs a look.
		for i+8 <= len(s) && plain8(load8(s, i)) {
			i += 8
		}
		if i == len(s) {
			break
		}
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

// load8 reads s[i:i+8] as a little-endian word.
func load8[T string | []byte](s T, i int) uint64 {
	_ = s[i+7]
	return uint64(s[i]) | uint64(s[i+1])<<8 | uint64(s[i+2])<<16 | uint64(s[i+3])<<24 |
		uint64(s[i+4])<<32 | uint64(s[i+5])<<40 | uint64(s[i+6])<<48 | uint64(s[i+7])<<56
}

const (
	ones  = 0x0101010101010101
	highs = 0x8080808080808080
)

// plain8 reports whether the eight bytes of w are all safe: ASCII, not a control character,
// not a quote or a backslash. The tests are the classic word-at-a-time ones: a byte below n
// sets its high bit in (w - n*ones) &^ w (for bytes below 0x80, checked first), and a byte
// equal to c leaves a zero byte in w ^ c*ones. They have no false negatives; a false positive
// would only send a safe word to the byte loop.
func plain8(w uint64) bool {
	if w&highs != 0 {
		return false
	}
	zero := func(v uint64) bool { return (v-ones)&^v&highs != 0 }
	return (w-0x20*ones)&^w&highs == 0 && !zero(w^'"'*ones) && !zero(w^'\\'*ones)
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
