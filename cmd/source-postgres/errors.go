package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"sort"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tidemark/tidemark/chunker"
	"github.com/tidemark/tidemark/internal/pgerr"
	"github.com/tidemark/tidemark/merge"
	"github.com/tidemark/tidemark/replicator"
	"github.com/tidemark/tidemark/watermark"
)

// The failure types of the protocol: a config_error is never retried by the platform (the user
// must act); a transient_error is retried; a system_error is a bug or the unexpected.
const (
	configFailure    = "config_error"
	transientFailure = "transient_error"
	systemFailure    = "system_error"
)

// classify returns the failure type of err.
func classify(err error) string {
	var ce *configError
	var te *tunnelError
	switch {
	case errors.As(err, &ce):
		return configFailure
	case errors.As(err, &te), errors.Is(err, errInterrupted):
		return transientFailure
	}
	for _, target := range []error{
		replicator.ErrSlotMissing, replicator.ErrSlotLost, replicator.ErrSlotMismatch,
		replicator.ErrPublicationMissing, replicator.ErrPublication, replicator.ErrWalLevel,
		replicator.ErrServerVersion, merge.ErrSystemChanged, merge.ErrPositionBehindSlot,
		merge.ErrNoTables, chunker.ErrNoKey, chunker.ErrNoTable, chunker.ErrGone, chunker.ErrNotPublished,
		chunker.ErrRowFilter, chunker.ErrNotViaRoot, merge.ErrNoPrivilege, replicator.ErrLeftBehind, watermark.ErrSetup,
	} {
		if errors.Is(err, target) {
			return configFailure
		}
	}
	if needsReset(err) {
		// The user must act (restore, then reset the stream); a retry would stop the same way.
		return configFailure
	}
	if errors.Is(err, replicator.ErrSlotInUse) || errors.Is(err, replicator.ErrTimeout) {
		// The slot is held by an earlier attempt that has not ended yet, or the server went
		// silent: the next attempt may well succeed.
		return transientFailure
	}
	if pgerr.Code(err) != "" {
		switch {
		case pgerr.UserMustAct(err):
			// Authentication, authorization, missing database or object: the user must act.
			return configFailure
		case pgerr.Transient(err):
			// Connection problems, shutdowns, resources, serialization and lock timeouts.
			return transientFailure
		}
		return systemFailure
	}
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) && dnsErr.IsNotFound {
		return configFailure
	}
	var netErr net.Error
	if errors.As(err, &netErr) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, context.DeadlineExceeded) || isConnectFailure(err) || errors.Is(err, pgconn.ErrConnClosed) {
		return transientFailure
	}
	return systemFailure
}

// isConnectFailure reports a failure to connect that carries no PostgreSQL error: the server is
// down, restarting or out of reach.
func isConnectFailure(err error) bool {
	var ce *pgconn.ConnectError
	return errors.As(err, &ce)
}

// needsReset reports a stop whose way on is a new backfill of a stream: the engine cannot place
// its changes, or the table changed in a way the stream does not carry (its key, identity,
// publication membership, partitions, or values rewritten by a type change).
func needsReset(err error) bool {
	for _, target := range []error{merge.ErrUnplaceable, merge.ErrKeyChanged, merge.ErrTableReplaced, merge.ErrPublicationChanged,
		merge.ErrPartitionsChanged, merge.ErrValuesRewritten, merge.ErrUnlogged, merge.ErrStorageReplaced} {
		if errors.Is(err, target) {
			return true
		}
	}
	return false
}

// userMessage is the short message the platform shows: what went wrong and what to do.
func userMessage(err error) string {
	switch classify(err) {
	case transientFailure:
		if errors.Is(err, errInterrupted) {
			return "The read was interrupted; the next attempt resumes from the last state."
		}
		return "The source could not be reached or dropped the connection; the next attempt resumes from the last state: " + err.Error()
	case configFailure:
		if needsReset(err) {
			return err.Error() + ". Once the table is as it should be, clear the stream's data and sync it again (Airbyte: Refresh the stream, or Reset its data): its output starts over from a new backfill"
		}
		return err.Error()
	}
	return "Unexpected error in Tidemark's source-postgres (please report it): " + err.Error()
}

// logWriter receives the connector's log lines (zerolog JSON): it writes them to stderr with
// secrets scrubbed, and also sends warnings and errors as LOG messages, where the platform shows
// them to the user.
type logWriter struct {
	mu  sync.Mutex
	w   io.Writer
	out *output
}

func (l *logWriter) Write(p []byte) (int, error) {
	line := l.out.scrub.Scrub(string(p))
	l.mu.Lock()
	_, err := io.WriteString(l.w, line)
	l.mu.Unlock()
	var rec map[string]any
	if json.Unmarshal([]byte(line), &rec) == nil {
		level, _ := rec["level"].(string)
		if level == "warn" || level == "error" {
			l.out.log(strings.ToUpper(level), formatLog(rec))
		}
	}
	if err != nil {
		return 0, err
	}
	return len(p), nil
}

// formatLog renders a log record as "message (key=value, ...)".
func formatLog(rec map[string]any) string {
	msg, _ := rec["message"].(string)
	var keys []string
	for k := range rec {
		switch k {
		case "message", "level", "time", "command":
		default:
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var b strings.Builder
	b.WriteString(msg)
	for i, k := range keys {
		if i == 0 {
			b.WriteString(" (")
		} else {
			b.WriteString(", ")
		}
		v, _ := json.Marshal(rec[k])
		b.WriteString(k + "=" + strings.Trim(string(v), `"`))
	}
	if len(keys) > 0 {
		b.WriteString(")")
	}
	return b.String()
}
