package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// openPTY opens a pseudo-terminal pair of cols x rows: what a person's terminal is to the
// program (slave), and what the terminal emulator reads (master).
func openPTY(cols, rows int) (master, slave *os.File, err error) {
	fd, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("open /dev/ptmx: %w", err)
	}
	master = os.NewFile(uintptr(fd), "/dev/ptmx")
	var unlock int32
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TIOCSPTLCK, uintptr(unsafe.Pointer(&unlock))); e != 0 {
		master.Close()
		return nil, nil, fmt.Errorf("unlock the pty: %w", e)
	}
	n, err := unix.IoctlGetUint32(fd, unix.TIOCGPTN)
	if err != nil {
		master.Close()
		return nil, nil, fmt.Errorf("pty number: %w", err)
	}
	slave, err = os.OpenFile("/dev/pts/"+strconv.Itoa(int(n)), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		master.Close()
		return nil, nil, err
	}
	if err := unix.IoctlSetWinsize(int(slave.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: uint16(rows), Col: uint16(cols)}); err != nil {
		master.Close()
		slave.Close()
		return nil, nil, fmt.Errorf("set the window size: %w", err)
	}
	return master, slave, nil
}

// screen is the little of a terminal emulator that the progress display and the logs use:
// printable text, carriage return, line feed, cursor up (CSI n A), erase below (CSI J) and
// erase line (CSI K); colours and other sequences are ignored. Lines scroll off the top into
// the scrollback, which is kept.
type screen struct {
	lines    [][]rune
	row, col int
}

func (s *screen) write(b []byte) {
	text := []rune(string(b))
	for i := 0; i < len(text); i++ {
		r := text[i]
		switch r {
		case '\r':
			s.col = 0
		case '\n':
			s.row++
			s.col = 0
		case 0x1b:
			i = s.escape(text, i)
		default:
			if r < ' ' {
				continue
			}
			for len(s.lines) <= s.row {
				s.lines = append(s.lines, nil)
			}
			l := s.lines[s.row]
			for len(l) <= s.col {
				l = append(l, ' ')
			}
			l[s.col] = r
			s.lines[s.row] = l
			s.col++
		}
	}
}

// escape handles the sequence starting at text[i] and returns the index of its last rune.
func (s *screen) escape(text []rune, i int) int {
	if i+1 >= len(text) || text[i+1] != '[' {
		return i + 1
	}
	j := i + 2
	for j < len(text) && (text[j] < '@' || text[j] > '~') {
		j++
	}
	if j >= len(text) {
		return j
	}
	param := string(text[i+2 : j])
	n, err := strconv.Atoi(param)
	if err != nil || n < 1 {
		n = 1
	}
	switch text[j] {
	case 'A':
		s.row = max(0, s.row-n)
	case 'J':
		if s.row < len(s.lines) {
			s.lines[s.row] = s.lines[s.row][:min(s.col, len(s.lines[s.row]))]
			s.lines = s.lines[:s.row+1]
		}
	case 'K':
		if s.row < len(s.lines) {
			s.lines[s.row] = s.lines[s.row][:min(s.col, len(s.lines[s.row]))]
		}
	}
	return j
}

// text is the screen and its scrollback, a string per line, trailing spaces trimmed.
func (s *screen) text() []string {
	out := make([]string, len(s.lines))
	for i, l := range s.lines {
		out[i] = strings.TrimRight(string(l), " ")
	}
	return out
}

// onTerminal runs f with an environment whose streams are a pseudo-terminal of cols x rows, as
// a person's shell gives them, and returns the screen's lines once f is done (skipping the test
// where there is no pseudo-terminal).
func onTerminal(t *testing.T, cols, rows int, f func(e *env)) []string {
	t.Helper()
	master, slave, err := openPTY(cols, rows)
	if err != nil {
		t.Skipf("no pseudo-terminal here: %v", err)
	}
	defer master.Close()
	var raw bytes.Buffer
	read := make(chan struct{})
	go func() {
		defer close(read)
		_, _ = io.Copy(&raw, master) // ends with EIO once the slave is closed
	}()
	e := newEnv(slave, slave)
	require.True(t, e.terminal)
	f(e)
	slave.Close()
	<-read
	var sc screen
	sc.write(raw.Bytes())
	return sc.text()
}
