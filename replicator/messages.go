package replicator

import (
	"bytes"
	"encoding/binary"
	"io"
	"sync/atomic"
)

// MaxMessage is the largest logical message content the stream reads; every mark Tidemark
// writes is under 200 bytes.
const MaxMessage = 64 << 10

// messageFilter sits between the replication connection's socket and its protocol reader, and
// drops logical messages Tidemark does not read before they are read into memory.
//
// pg_logical_emit_message is executable by every role, and a message of any size written by any
// role in any database reaches every logical slot of that database whose output asks for
// messages: a role with no privilege could write one of 400 MB, and the protocol reader would
// hold it whole (the stream's process grew from 15 MB to 837 MB in a review), once per restart
// of a capture that crash-loops on it while WAL piles up. So the filter reads each CopyData
// message's first bytes, and when they are an XLogData carrying a logical message ('M') whose
// prefix is not the one kept (wanted), or whose content is larger than MaxMessage, it hands the
// reader a copy of that message with its content emptied, and discards the content as it comes
// from the socket, without holding it. Everything else passes through unchanged.
//
// The layout it relies on is pgoutput's, protocol version 1 (no streamed transactions, whose
// messages carry a transaction id after the tag): CopyData 'd', length; XLogData 'w', start,
// end, time (8 bytes each); 'M', flags (1), LSN (8), prefix (NUL-terminated), content length
// (4), content.
//
// Reads keep their state across errors (a read deadline the stream sets and expects to resume
// after), so a message is never cut.
type messageFilter struct {
	src io.Reader
	// keep reports whether a message of this prefix is read (its content, if not too large).
	keep func(prefix string) bool
	// dropped is told of each message dropped: its prefix (cut at 64 bytes) and content size.
	dropped func(prefix string, size int64)

	hdr     [5]byte // the message header being read
	hdrN    int
	peek    []byte // the body's first bytes being read, for a CopyData
	peekN   int
	bodyLen int64 // the body's length, from the header

	pending     []byte // bytes ready to return
	passthrough int64  // body bytes to pass through from src
	skip        int64  // body bytes to read from src and discard
	skipSize    int64  // the size of the content being discarded, for dropped
	skipPrefix  string
	scratch     []byte

	count atomic.Int64 // messages dropped
}

// peekMax is how much of a CopyData's body is read before deciding: the XLogData header (25
// bytes), the message's tag, flags and LSN (10), a prefix of up to 255 bytes and its NUL, and the
// content length (4).
const peekMax = 25 + 10 + 256 + 4

func newMessageFilter(src io.Reader, keep func(string) bool, dropped func(string, int64)) *messageFilter {
	return &messageFilter{src: src, keep: keep, dropped: dropped, peek: make([]byte, peekMax)}
}

func (f *messageFilter) Read(p []byte) (int, error) {
	for {
		switch {
		case len(f.pending) > 0:
			n := copy(p, f.pending)
			f.pending = f.pending[n:]
			return n, nil
		case f.passthrough > 0:
			n, err := f.src.Read(p[:min(int64(len(p)), f.passthrough)])
			f.passthrough -= int64(n)
			if n > 0 || err != nil {
				return n, err
			}
		case f.skip > 0:
			if f.scratch == nil {
				f.scratch = make([]byte, 32<<10)
			}
			n, err := f.src.Read(f.scratch[:min(int64(len(f.scratch)), f.skip)])
			f.skip -= int64(n)
			if f.skip == 0 && f.dropped != nil {
				f.dropped(f.skipPrefix, f.skipSize)
			}
			if err != nil {
				return 0, err
			}
		case f.hdrN < len(f.hdr):
			n, err := f.src.Read(f.hdr[f.hdrN:])
			f.hdrN += n
			if err != nil && f.hdrN < len(f.hdr) {
				return 0, err
			}
			if f.hdrN < len(f.hdr) {
				continue
			}
			f.bodyLen = int64(binary.BigEndian.Uint32(f.hdr[1:])) - 4
			if f.hdr[0] != 'd' || f.bodyLen < 36 {
				// Not a CopyData, or too short to hold a message: as it is.
				f.pending = append(f.pending[:0], f.hdr[:]...)
				f.passthrough = max(f.bodyLen, 0)
				f.hdrN = 0
				continue
			}
			f.peekN = 0
		default:
			want := int(min(f.bodyLen, int64(len(f.peek))))
			n, err := f.src.Read(f.peek[f.peekN:want])
			f.peekN += n
			if err != nil && f.peekN < want {
				return 0, err
			}
			if f.peekN < want {
				continue
			}
			f.decide()
			f.hdrN = 0
		}
	}
}

// decide sets what to return of the CopyData whose header and first bytes were read.
func (f *messageFilter) decide() {
	body := f.peek[:f.peekN]
	rest := f.bodyLen - int64(f.peekN)
	if body[0] != 'w' || body[25] != 'M' {
		f.pending = append(append(f.pending[:0], f.hdr[:]...), body...)
		f.passthrough = rest
		return
	}
	// 'M', flags (1), LSN (8), then the prefix.
	const prefixAt = 25 + 1 + 1 + 8
	end := bytes.IndexByte(body[prefixAt:], 0)
	var prefix string
	var size int64
	var drop, tooLong bool
	switch {
	case end >= 0 && prefixAt+end+5 <= len(body):
		prefix = string(body[prefixAt : prefixAt+end])
		size = int64(binary.BigEndian.Uint32(body[prefixAt+end+1:]))
		drop = !f.keep(prefix) || size > MaxMessage
	case rest > 0:
		// The prefix and its content length do not fit in what was read: a prefix of 256 bytes or
		// more (its NUL may be among the bytes read or not), no message Tidemark reads.
		prefix, size, drop, tooLong = string(body[prefixAt:prefixAt+64]), f.bodyLen-prefixAt, true, true
	default:
		// The message ends before its content's length: as it is, for the decoder to report.
	}
	if !drop {
		f.pending = append(append(f.pending[:0], f.hdr[:]...), body...)
		f.passthrough = rest
		return
	}
	// The same message with the prefix it had (or none, if too long) and no content.
	kept := prefix
	if tooLong {
		kept = ""
	}
	out := make([]byte, 0, 5+prefixAt+len(kept)+5)
	out = append(out, 'd', 0, 0, 0, 0)
	out = append(out, body[:prefixAt]...)
	out = append(out, kept...)
	out = append(out, 0, 0, 0, 0, 0)
	binary.BigEndian.PutUint32(out[1:], uint32(len(out)-1))
	f.pending = out
	f.skip = f.bodyLen - int64(f.peekN)
	f.skipSize, f.skipPrefix = size, prefix
	f.count.Add(1)
	if f.skip == 0 && f.dropped != nil {
		f.dropped(prefix, size)
	}
}
