package replicator

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// backendMsg frames a backend message: type, length, body.
func backendMsg(typ byte, body []byte) []byte {
	out := []byte{typ, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(out[1:], uint32(len(body)+4))
	return append(out, body...)
}

// xlog is a CopyData carrying an XLogData with wal.
func xlog(wal []byte) []byte {
	body := append([]byte{'w'}, make([]byte, 24)...)
	return backendMsg('d', append(body, wal...))
}

// logicalMessage is pgoutput's 'M' with prefix and content (the flags say transactional).
func logicalMessage(prefix string, content []byte) []byte {
	m := []byte{'M', 1, 0, 0, 0, 0, 0, 0, 0x12, 0x34}
	m = append(append(m, prefix...), 0)
	m = binary.BigEndian.AppendUint32(m, uint32(len(content)))
	return append(m, content...)
}

var errTimeout = errors.New("i/o timeout")

// chunky reads src in pieces of random sizes, and now and then fails with errTimeout without
// reading anything, as a connection with a read deadline does.
type chunky struct {
	src *bytes.Reader
	rnd *rand.Rand
}

func (c *chunky) Read(p []byte) (int, error) {
	if c.rnd.IntN(5) == 0 {
		return 0, errTimeout
	}
	n := 1 + c.rnd.IntN(40)
	if c.rnd.IntN(10) == 0 {
		n = 1 << 16
	}
	return c.src.Read(p[:min(len(p), n)])
}

// readAll reads f to its end, past timeouts, as the stream does.
func readAll(t *testing.T, f io.Reader) []byte {
	var out bytes.Buffer
	buf := make([]byte, 1+rand.IntN(300))
	for i := 0; ; i++ {
		require.Less(t, i, 10_000_000, "the filter does not end")
		n, err := f.Read(buf)
		out.Write(buf[:n])
		if errors.Is(err, io.EOF) {
			return out.Bytes()
		}
		if err != nil && !errors.Is(err, errTimeout) {
			t.Fatal(err)
		}
	}
}

// TestMessageFilter: through the filter, every message comes out as it went in but the logical
// messages not kept (another prefix, a content over MaxMessage, a prefix too long to be
// Tidemark's), which come out with no content; whatever pieces the socket gives and however
// often a read deadline interrupts it.
func TestMessageFilter(t *testing.T) {
	big := bytes.Repeat([]byte("x"), MaxMessage+1)
	long := strings.Repeat("p", 400)
	var in, want bytes.Buffer
	add := func(msg, out []byte) {
		in.Write(msg)
		if out == nil {
			out = msg
		}
		want.Write(out)
	}
	add(backendMsg('Z', []byte{'I'}), nil)
	add(backendMsg('d', append([]byte{'k'}, make([]byte, 17)...)), nil)
	add(xlog([]byte{'B', 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20}), nil)
	add(xlog(logicalMessage("tidemark", []byte(`{"slot":"s","run":"r","chunk":1,"kind":"L"}`))), nil)
	add(xlog(logicalMessage("other", bytes.Repeat([]byte("o"), 10000))), xlog(logicalMessage("other", nil)))
	add(xlog(logicalMessage("tidemark", big)), xlog(logicalMessage("tidemark", nil)))
	add(xlog(logicalMessage(long, []byte("c"))), xlog(logicalMessage("", nil)))
	add(xlog(logicalMessage("other", nil)), nil)
	add(xlog(append([]byte{'I'}, bytes.Repeat([]byte("r"), 100000)...)), nil) // a large row passes
	add(backendMsg('d', []byte{'w'}), nil)                                    // too short to be a message
	add(backendMsg('E', []byte("SERROR\x00")), nil)
	for seed := range uint64(50) {
		var dropped []string
		f := newMessageFilter(&chunky{src: bytes.NewReader(in.Bytes()), rnd: rand.New(rand.NewPCG(seed, seed))},
			func(p string) bool { return p == "tidemark" }, func(p string, n int64) { dropped = append(dropped, p) })
		got := readAll(t, f)
		require.Equal(t, want.Bytes(), got, "seed %d", seed)
		require.Equal(t, []string{"other", "tidemark", strings.Repeat("p", 64), "other"}, dropped, "seed %d", seed)
	}
}

// TestMessageFilterPrefixLengths: a message is dropped whatever its prefix's length, including
// the lengths whose NUL falls inside the bytes the filter reads first but whose content length
// does not (256 to 259 bytes): such a message came out whole, content and all.
func TestMessageFilterPrefixLengths(t *testing.T) {
	content := bytes.Repeat([]byte("x"), 1<<20)
	for n := 240; n <= 300; n++ {
		prefix := strings.Repeat("p", n)
		var dropped int
		f := newMessageFilter(bytes.NewReader(xlog(logicalMessage(prefix, content))),
			func(p string) bool { return p == "tidemark" }, func(string, int64) { dropped++ })
		got := readAll(t, f)
		require.Equal(t, 1, dropped, "prefix of %d bytes", n)
		require.LessOrEqual(t, len(got), 5+25+10+256+4, "prefix of %d bytes: the message's content came through", n)
		kept := prefix
		if n > 255 {
			kept = ""
		}
		require.Equal(t, xlog(logicalMessage(kept, nil)), got, "prefix of %d bytes", n)
	}
}

// FuzzMessageFilter: whatever the socket gives, the filter ends, never panics, and returns no
// more than a message's header and the start of its body for what it drops.
func FuzzMessageFilter(f *testing.F) {
	f.Add(xlog(logicalMessage("other", []byte("content"))))
	f.Add(backendMsg('d', []byte{'w', 0, 0}))
	f.Add([]byte{'d', 0xff, 0xff, 0xff, 0xff, 'w'})
	f.Add([]byte{'d', 0, 0, 0, 3})
	f.Fuzz(func(t *testing.T, in []byte) {
		filter := newMessageFilter(bytes.NewReader(in), func(p string) bool { return p == "tidemark" }, nil)
		n, err := io.Copy(io.Discard, filter)
		if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatal(err)
		}
		require.LessOrEqual(t, n, int64(len(in)), "the filter returns no more than it read")
	})
}

// FuzzMessageFilterDrops: a well-formed logical message that is not kept (another prefix, of any
// length, or a content over MaxMessage) comes out with no content, at most a header and a
// 255-byte prefix long; one that is kept comes out whole.
func FuzzMessageFilterDrops(f *testing.F) {
	f.Add([]byte("other"), uint32(10))
	f.Add([]byte("tidemark"), uint32(MaxMessage+1))
	f.Add(bytes.Repeat([]byte("p"), 257), uint32(5000))
	f.Add([]byte("tidemark"), uint32(40))
	f.Fuzz(func(t *testing.T, prefix []byte, size uint32) {
		prefix = bytes.ReplaceAll(prefix, []byte{0}, []byte("z"))
		size %= 4 * MaxMessage
		msg := xlog(logicalMessage(string(prefix), bytes.Repeat([]byte("c"), int(size))))
		got := readAll(t, newMessageFilter(&chunky{src: bytes.NewReader(msg), rnd: rand.New(rand.NewPCG(uint64(size), 1))},
			func(p string) bool { return p == "tidemark" }, nil))
		if string(prefix) == "tidemark" && size <= MaxMessage {
			require.Equal(t, msg, got)
			return
		}
		require.LessOrEqual(t, len(got), 5+25+10+256+4, "a message not kept came through with its content")
		require.Equal(t, byte('M'), got[5+25])
		require.Equal(t, []byte{0, 0, 0, 0}, got[len(got)-4:], "no content")
	})
}
