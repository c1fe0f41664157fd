package jsonl

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/tidemark/tidemark/internal/faults"
	"github.com/tidemark/tidemark/internal/pgjson"
	"github.com/tidemark/tidemark/merge"
	"github.com/tidemark/tidemark/sink"
	"github.com/tidemark/tidemark/sink/debezium"
)

var _ sink.Output = (*Writer)(nil)

// Writer writes events as JSON lines (Line) to a file and keeps a checkpoint file beside it. A
// checkpoint holds the engine's position and the output's length at that position; on resume
// the output is cut back to that length, so the file holds every change exactly once up to its
// checkpoint, whatever point a crash came at.
type Writer struct {
	lock       *os.File // the output's lock file, held (flock) for the whole run; nil for none
	out        *os.File // nil when writing to a stream (stdout)
	stream     *os.File // a device or pipe written as a stream, closed with the writer
	w          *bufio.Writer
	checkpoint string // path of the checkpoint file; "" for none
	offset     int64  // bytes written to out
	pool       *Pool  // encodes the lines (SetEncoders)
	// dbz, when set, writes Debezium's envelopes instead (SetDebezium); format is the
	// checkpoint's format ("" for lines, debezium.Encoder.Format).
	dbz    *debezium.Encoder
	format string
	buf    []byte
}

// CheckpointFile is the checkpoint file's content.
type CheckpointFile struct {
	Version  int             `json:"version"`
	Position *merge.Position `json:"position"` // nil: no position yet (a first run)
	Offset   int64           `json:"offset"`   // output length at Position
	Output   string          `json:"output"`   // the output file's name
	// Format is what the output holds: "" for Tidemark's lines, debezium.Encoder.Format for Debezium's
	// envelopes. A run in another format is refused.
	Format string    `json:"format,omitempty"`
	Time   time.Time `json:"time"`
}

// Open opens (or resumes) output path with its checkpoint file, and returns the position
// to resume from (nil for a first run). One writer per output: it first takes an exclusive lock
// on PATH.lock (CHECKPOINT.lock for standard output), held until the sink is closed or the
// process ends, then calls ready (which checks that the slot is not in use), and only then cuts
// the output back to its checkpoint. A second sync on the same output fails before touching it.
func Open(path, checkpoint string, types *pgjson.Registry, ready func() error) (*Writer, *merge.Position, error) {
	stream, err := isStream(path)
	if err != nil {
		return nil, nil, err
	}
	if path == "-" || stream {
		// Standard output, or a device or pipe the user named (/dev/stdout, a link): written as
		// a stream, nothing cut back.
		dst, stream := os.Stdout, (*os.File)(nil)
		if path != "-" {
			f, err := openStream(path)
			if err != nil {
				return nil, nil, err
			}
			dst, stream = f, f
		}
		lock, err := lockOutput(checkpoint)
		if err != nil {
			if stream != nil {
				stream.Close()
			}
			return nil, nil, err
		}
		s := &Writer{lock: lock, w: bufio.NewWriterSize(dst, 1<<16), checkpoint: checkpoint, pool: NewPool(types, 0), stream: stream}
		pos, _, _, err := readCheckpoint(checkpoint)
		if err == nil {
			err = ready()
		}
		if err != nil {
			s.unlock()
			if stream != nil {
				stream.Close()
			}
			return nil, nil, err
		}
		return s, pos, nil
	}
	if checkpoint == "" {
		checkpoint = path + ".checkpoint"
	}
	lock, err := lockOutput(path)
	if err != nil {
		return nil, nil, err
	}
	s := &Writer{lock: lock, checkpoint: checkpoint, pool: NewPool(types, 0)}
	pos, err := s.open(path, ready)
	if err != nil {
		s.unlock()
		return nil, nil, err
	}
	return s, pos, nil
}

// lockOutput takes the exclusive lock of an output (its file NAME.lock), or says that another
// sync holds it. "" needs no lock.
func lockOutput(name string) (*os.File, error) {
	if name == "" || faults.NoFence {
		return nil, nil
	}
	f, err := openNoFollow(name+".lock", os.O_RDWR|os.O_CREATE)
	if err != nil {
		return nil, fmt.Errorf("open the output's lock file: %w", err)
	}
	if err := checkOwner(f, name+".lock", "could hold it to stop every sync of this output"); err != nil {
		f.Close()
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("another tidemark sync is writing %s (it holds %s.lock): two writers would cut and overwrite each other's output; stop the other one first", name, name)
		}
		return nil, fmt.Errorf("lock %s.lock: %w", name, err)
	}
	return f, nil
}

func (s *Writer) unlock() {
	if s.lock != nil {
		s.lock.Close() // releases the flock
		s.lock = nil
	}
}

// open resumes the output at path, locked, from its checkpoint.
func (s *Writer) open(path string, ready func() error) (*merge.Position, error) {
	checkpoint := s.checkpoint
	pos, offset, output, err := readCheckpoint(checkpoint)
	if err != nil {
		return nil, err
	}
	if cp, err := readCheckpointFile(checkpoint, true); err == nil {
		s.format = cp.Format
	}
	if output != "" && output != filepath.Base(path) {
		return nil, fmt.Errorf("checkpoint %s belongs to output %s, not %s: it would mark tables done that %s never got; give this output its own checkpoint (--checkpoint), or write to %s",
			checkpoint, output, filepath.Base(path), filepath.Base(path), output)
	}
	f, err := openOutput(path)
	if err != nil {
		return nil, fmt.Errorf("open output: %w", err)
	}
	if err := checkOwner(f, path, "could read what the sync writes, or change it"); err != nil {
		f.Close()
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("open output: %w", err)
	}
	exists := true
	if fi, err := os.Lstat(checkpoint); errors.Is(err, os.ErrNotExist) {
		exists = false
	} else if err == nil && fi.Mode()&os.ModeSymlink != 0 {
		f.Close()
		return nil, symlinkError(checkpoint)
	}
	if !exists && fi.Size() > 0 {
		f.Close()
		return nil, fmt.Errorf("output %s is not empty and has no checkpoint file %s: it is not a Tidemark output to resume; remove it or choose another file", path, checkpoint)
	}
	if fi.Size() < offset {
		f.Close()
		return nil, fmt.Errorf("output %s has %d bytes but its checkpoint says %d: the file was cut; start over with a new output file", path, fi.Size(), offset)
	}
	if !faults.NoFence {
		if err := ready(); err != nil {
			f.Close()
			return nil, err
		}
	}
	if faults.NoTruncate {
		offset = fi.Size() // broken on purpose: what follows the checkpoint stays, and is written again
	}
	// Whatever was written after the checkpoint is replayed by the engine: cut it.
	if err := f.Truncate(offset); err != nil {
		f.Close()
		return nil, fmt.Errorf("cut output back to its checkpoint: %w", err)
	}
	if faults.NoFence {
		if err := ready(); err != nil { // broken on purpose: after the output was cut
			f.Close()
			return nil, err
		}
	}
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		f.Close()
		return nil, fmt.Errorf("seek output: %w", err)
	}
	s.out, s.w, s.offset = f, bufio.NewWriterSize(f, 1<<16), offset
	if !exists {
		// A first checkpoint before any output: from now on the output always has one.
		if err := s.writeCheckpoint(nil); err != nil {
			f.Close()
			return nil, err
		}
	}
	return pos, nil
}

// readCheckpoint reads a checkpoint file: the position, the output's length at it, and the
// output's name it was written for. No file (or no path) is no checkpoint yet.
func readCheckpoint(path string) (*merge.Position, int64, string, error) {
	if path == "" {
		return nil, 0, "", nil
	}
	cp, err := readCheckpointFile(path, true)
	if errors.Is(err, os.ErrNotExist) {
		return nil, 0, "", nil
	}
	if err != nil {
		return nil, 0, "", err
	}
	return cp.Position, cp.Offset, cp.Output, nil
}

// ReadCheckpointFile reads a checkpoint file as Writer writes it. A missing file is an error
// that errors.Is os.ErrNotExist.
func ReadCheckpointFile(path string) (CheckpointFile, error) { return readCheckpointFile(path, false) }

// readCheckpointFile reads a checkpoint file; owned: one the sync resumes from, which must be
// this user's or root's.
func readCheckpointFile(path string, owned bool) (CheckpointFile, error) {
	f, err := openNoFollow(path, os.O_RDONLY)
	if err != nil {
		return CheckpointFile{}, fmt.Errorf("read checkpoint: %w", err)
	}
	defer f.Close()
	if owned {
		if err := checkOwner(f, path, "could make the sync resume from a position of their choosing"); err != nil {
			return CheckpointFile{}, err
		}
	}
	// A checkpoint is a position: kilobytes; one over this is not a file Tidemark wrote.
	b, err := io.ReadAll(io.LimitReader(f, maxCheckpointFile+1))
	if err != nil {
		return CheckpointFile{}, fmt.Errorf("read checkpoint: %w", err)
	}
	if len(b) > maxCheckpointFile {
		return CheckpointFile{}, fmt.Errorf("checkpoint %s is larger than %d MiB: not a checkpoint Tidemark wrote; start over with a new output file", path, maxCheckpointFile>>20)
	}
	var cp CheckpointFile
	if err := json.Unmarshal(b, &cp); err != nil {
		return CheckpointFile{}, fmt.Errorf("checkpoint %s is damaged (%w); start over with a new output file", path, err)
	}
	return cp, nil
}

// SetEncoders sets how many encoders encode a large batch's lines at once (NewPool: 0 is one
// per core past the first, at most 8; 1 encodes on the caller's goroutine).
func (s *Writer) SetEncoders(n int) { s.pool = NewPool(s.pool.types, n) }

// SetDebezium makes the writer write each event as Debezium's change-event envelope (one a line)
// instead of Tidemark's line. An output whose checkpoint says it holds the other format is
// refused: its consumers would meet both.
func (s *Writer) SetDebezium(enc *debezium.Encoder) error {
	if s.offset > 0 && s.format == "" {
		return fmt.Errorf("the output holds Tidemark's JSON lines (its checkpoint says so): a run with --format %s would mix two formats in it; write to another file, or drop --format", enc.Format())
	}
	if s.offset > 0 && s.format != enc.Format() {
		return fmt.Errorf("the output holds lines in the %s format (its checkpoint says so): a run with --format %s would mix two formats in it; give %s, or write to another file", s.format, enc.Format(), debezium.Continue(s.format))
	}
	s.dbz, s.format = enc, enc.Format()
	return nil
}

// CheckFormat refuses a Tidemark-format run on an output that holds Debezium's envelopes.
func (s *Writer) CheckFormat() error {
	if s.dbz == nil && s.format != "" && s.offset > 0 {
		return fmt.Errorf("the output holds Debezium's envelopes (its checkpoint says so): a run without --format debezium would mix two formats in it; give %s, or write to another file", debezium.Continue(s.format))
	}
	s.format = "" // an output with nothing in it yet takes this run's format
	return nil
}

// Emit writes one JSON line per event, in order.
func (s *Writer) Emit(ctx context.Context, evs []merge.Event) error {
	if s.dbz != nil {
		for i := range evs {
			b, err := s.dbz.AppendValue(ctx, s.buf[:0], &evs[i])
			if err != nil {
				return err
			}
			s.buf = append(b, '\n')
			n, err := s.w.Write(s.buf)
			s.offset += int64(n)
			if err != nil {
				return fmt.Errorf("write output: %w", err)
			}
		}
		return nil
	}
	return s.pool.Encode(ctx, evs, func(b []byte) error {
		n, err := s.w.Write(b)
		s.offset += int64(n)
		if err != nil {
			return fmt.Errorf("write output: %w", err)
		}
		return nil
	})
}

// Checkpoint makes the output durable, then the checkpoint file (written to a temporary file,
// synced, and renamed over the old one).
func (s *Writer) Checkpoint(_ context.Context, pos *merge.Position) error {
	if err := s.w.Flush(); err != nil {
		return fmt.Errorf("write output: %w", err)
	}
	if s.out != nil {
		if err := s.out.Sync(); err != nil {
			return fmt.Errorf("sync output: %w", err)
		}
	}
	return s.writeCheckpoint(pos)
}

func (s *Writer) writeCheckpoint(pos *merge.Position) error {
	if s.checkpoint == "" {
		return nil
	}
	name := ""
	if s.out != nil {
		name = filepath.Base(s.out.Name())
	}
	b, err := json.MarshalIndent(CheckpointFile{Version: 1, Position: pos, Offset: s.offset, Output: name, Format: s.format, Time: time.Now().UTC()}, "", "  ")
	if err != nil {
		return err
	}
	return writeAtomic(s.checkpoint, b)
}

// maxCheckpointFile bounds the checkpoint file read.
const maxCheckpointFile = 64 << 20

// The output, its lock and its checkpoint hold the source's rows and positions: they are created
// readable by their owner only (0600; a file that exists keeps its mode), and none is opened
// through a symbolic link. A sync may run as root in a directory other users can write, where a
// link planted in place of the output would have it truncate (cut back to its checkpoint) the
// file the link points at. The output may be a link to a device or a pipe the user named
// (/dev/stdout, which is a link), never to a file.

// openNoFollow opens path, creating it 0600 when flag says so, refusing a symbolic link.
func openNoFollow(path string, flag int) (*os.File, error) {
	// Non-blocking: a pipe planted there would otherwise keep the open waiting for a writer.
	f, err := os.OpenFile(path, flag|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0o600)
	if errors.Is(err, syscall.ELOOP) {
		return nil, symlinkError(path)
	}
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("%s is not a regular file (%s): Tidemark keeps its output, lock and checkpoint in regular files; remove it, or write elsewhere", path, fi.Mode().Type())
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Nlink > 1 {
		f.Close()
		return nil, fmt.Errorf("%s has %d hard links: another name for the same file could be someone else's way to make the sync cut or overwrite a file of yours; remove it, or write elsewhere", path, st.Nlink)
	}
	if err := syscall.SetNonblock(int(f.Fd()), false); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// openOutput opens the output file, created 0600, refusing a symbolic link.
func openOutput(path string) (*os.File, error) { return openNoFollow(path, os.O_RDWR|os.O_CREATE) }

// isStream reports whether path is a character device or a pipe, directly or through links: an
// output written as a stream, like standard output. In a directory other users can write
// (/tmp), any of them could have put there what the sync would follow or write to, so (as the
// kernel's protected_symlinks does in sticky directories) a link is followed only when it is this
// user's or root's, and the device or pipe must be this user's or root's too (a pipe of another
// user would hand them the rows), unless path names one of this process's own open files
// (/dev/stdout, /dev/stderr, /dev/fd/N, /proc/self/fd/N: what whoever started it gave it). A block
// device is never written.
func isStream(path string) (bool, error) {
	li, err := os.Lstat(path)
	if err != nil {
		return false, nil // a file to create
	}
	fi := li
	if li.Mode()&os.ModeSymlink != 0 {
		if fi, err = os.Stat(path); err != nil || fi.Mode()&(os.ModeDevice|os.ModeCharDevice|os.ModeNamedPipe) == 0 {
			return false, nil // a link to no device: refused as a link when opened
		}
		if err := trustedOwner(li, path, "a symbolic link", "could point it at a device or pipe of their choosing"); err != nil {
			return false, err
		}
	}
	switch m := fi.Mode(); {
	case m&os.ModeDevice != 0 && m&os.ModeCharDevice == 0:
		return false, fmt.Errorf("%s is a block device (a disk): Tidemark writes JSON lines to a file, standard output, a pipe or a character device only; write elsewhere", path)
	case m&(os.ModeCharDevice|os.ModeNamedPipe) == 0:
		return false, nil
	}
	if ownFile(path) {
		return true, nil
	}
	return true, trustedOwner(fi, path, "a device or pipe", "could read what the sync writes")
}

// openStream opens the device or pipe at path (isStream), and checks that what it opened is
// still one isStream accepts: the path could have been changed in between.
func openStream(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return nil, fmt.Errorf("open output: %w", err)
	}
	fi, err := f.Stat()
	if err == nil && fi.Mode()&(os.ModeCharDevice|os.ModeNamedPipe) == 0 {
		err = fmt.Errorf("%s changed while the sync opened it: it is no longer a character device or a pipe", path)
	}
	if err == nil && !ownFile(path) {
		err = trustedOwner(fi, path, "a device or pipe", "could read what the sync writes")
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// ownFile reports whether path names one of this process's own open files.
func ownFile(path string) bool {
	return path == "/dev/stdout" || path == "/dev/stderr" || strings.HasPrefix(path, "/dev/fd/") || strings.HasPrefix(path, "/proc/self/fd/")
}

// checkOwner refuses an open file that neither this user nor root owns: whoever owns it could
// do what risk says.
func checkOwner(f *os.File, path, risk string) error {
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return trustedOwner(fi, path, "a file", risk)
}

// trustedOwner refuses fi (of path, a what) unless this user or root owns it.
func trustedOwner(fi os.FileInfo, path, what, risk string) error {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return nil
	}
	if self := os.Geteuid(); int(st.Uid) != self && st.Uid != 0 {
		return fmt.Errorf("%s is %s owned by uid %d, not by this user (uid %d) or root: whoever made it %s; remove it, or write elsewhere", path, what, st.Uid, self, risk)
	}
	return nil
}

var errSymlink = errors.New("is a symbolic link")

func symlinkError(path string) error {
	return fmt.Errorf("%s %w: Tidemark does not follow one there (whoever made it could point it at a file of yours, which the sync would cut or overwrite); remove it, or write elsewhere", path, errSymlink)
}

// writeAtomic replaces path with b: a crash leaves either the old or the new content.
func writeAtomic(path string, b []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("sync %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("replace %s: %w", path, err)
	}
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}

// Close flushes and closes the output, and releases its lock. What no checkpoint covers is cut on
// the next Open.
func (s *Writer) Close(context.Context) error {
	err := s.w.Flush()
	for _, f := range []*os.File{s.out, s.stream} {
		if f != nil {
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
	}
	s.unlock()
	return err
}
