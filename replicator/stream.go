package replicator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/rs/zerolog"

	"github.com/tidemark/tidemark/internal/pgconf"
	"github.com/tidemark/tidemark/internal/pgerr"
	"github.com/tidemark/tidemark/internal/sqlfix"
)

// SystemInfo is what IDENTIFY_SYSTEM and the server report about the source.
type SystemInfo struct {
	SystemID      string        // cluster system identifier; changes on restore from a logical dump or a new initdb
	Timeline      int32         // timeline; changes on failover and point-in-time recovery
	XLogPos       pglogrepl.LSN // the server's flushed WAL position when the stream was opened
	Database      string        // database of the replication connection
	ServerVersion int           // server_version_num, e.g. 150004
}

// SlotInfo is the replication slot as the stream found it when it was opened.
type SlotInfo struct {
	Name           string        // slot name
	Created        bool          // Open created the slot
	ConfirmedFlush pglogrepl.LSN // confirmed_flush_lsn: the stream never starts before it
	Restart        pglogrepl.LSN // restart_lsn: oldest WAL the slot retains
}

// Stream is one replication session on a logical slot.
type Stream struct {
	cfg  Config
	log  zerolog.Logger
	conn *pgconn.PgConn // the replication connection; owned by the goroutine running Run
	user string
	sys  SystemInfo
	slot SlotInfo
	// pubCreated: Open created the publication (Config.CreatePublication).
	pubCreated bool
	qcfg       *pgx.ConnConfig // the ordinary connection's configuration, for Undo
	acked      atomic.Uint64   // highest acknowledged LSN: the only flush position ever sent
	started    atomic.Bool
	// messages is Config.Messages, which KeepMessages may set before Run.
	messages atomic.Pointer[string]

	// Owned by the goroutine running Run.
	nextStatus time.Time // when the next standby status update is due
	lastRecv   time.Time // when the server last sent anything
}

// Open connects to the source, checks (and, as configured, creates) the slot and the publication,
// and identifies the system. It reports every problem with the fix a DBA should apply. Open
// starts nothing; Run streams.
func Open(ctx context.Context, cfg Config, log zerolog.Logger) (*Stream, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.ensureDefaults()
	log = log.With().Str("component", "replicator").Str("slot", cfg.Slot).Logger()

	qcfg, err := pgconf.Parse(cfg.DSN, cfg.ApplicationName)
	if err != nil {
		return nil, fmt.Errorf("source: %w", err)
	}
	if cfg.Configure != nil {
		cfg.Configure(&qcfg.Config)
	}
	rcfg := qcfg.Config.Copy()
	rcfg.RuntimeParams["replication"] = "database"

	s := &Stream{cfg: cfg, log: log, user: qcfg.User, qcfg: qcfg}
	s.messages.Store(&cfg.Messages)
	// Logical messages not asked for, or too large, are dropped as they come (messages.go).
	build := rcfg.BuildFrontend
	rcfg.BuildFrontend = func(r io.Reader, w io.Writer) *pgproto3.Frontend {
		f := newMessageFilter(r, s.keepMessage, s.droppedMessage)
		if build != nil {
			return build(f, w)
		}
		return pgproto3.NewFrontend(f, w)
	}
	// What Open created is dropped again when Open fails after creating it.
	fail := func(err error) (*Stream, error) {
		if s.conn != nil {
			_ = s.conn.Close(context.WithoutCancel(ctx))
			s.conn = nil
		}
		return nil, errors.Join(err, s.Undo(ctx))
	}
	if err := s.preflight(ctx, qcfg); err != nil {
		return fail(err)
	}

	s.conn, err = pgconf.DialReplication(ctx, rcfg)
	if err != nil {
		return fail(connectError("source "+pgconf.Describe(rcfg)+" for replication", qcfg.User, err))
	}
	id, err := pglogrepl.IdentifySystem(ctx, s.conn)
	if err != nil {
		return fail(fmt.Errorf("identify system: %w", err))
	}
	s.sys.SystemID, s.sys.Timeline, s.sys.XLogPos, s.sys.Database = id.SystemID, id.Timeline, id.XLogPos, id.DBName
	return s, nil
}

// preflight checks the server, the slot and the publication over an ordinary connection, where
// values can be bound parameters, and creates what it is allowed to create.
func (s *Stream) preflight(ctx context.Context, qcfg *pgx.ConnConfig) error {
	conn, err := pgconf.Dial(ctx, qcfg)
	if err != nil {
		return connectError("source "+pgconf.Describe(&qcfg.Config), qcfg.User, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))

	var walLevel, db string
	if err := conn.QueryRow(ctx, `SELECT current_setting('server_version_num')::int, current_setting('wal_level'), current_database()`).
		Scan(&s.sys.ServerVersion, &walLevel, &db); err != nil {
		return fmt.Errorf("read server settings: %w", err)
	}
	var errs []error
	if s.sys.ServerVersion < 130000 {
		errs = append(errs, fmt.Errorf("%w: PostgreSQL %d; Tidemark needs PostgreSQL 13 or later", ErrServerVersion, s.sys.ServerVersion))
	}
	if walLevel != "logical" {
		errs = append(errs, fmt.Errorf("%w: wal_level is %q; logical replication needs wal_level = logical: "+
			"run ALTER SYSTEM SET wal_level = logical; and restart the server "+
			"(Amazon RDS and Aurora: set rds.logical_replication = 1 in the parameter group and reboot; "+
			"Google Cloud SQL: set the flag cloudsql.logical_decoding = on)", ErrWalLevel, walLevel))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	// A slot that could not be created stops the run before it creates its publication.
	if err := s.checkFreeSlot(ctx, conn); err != nil {
		return err
	}
	// The publication comes first: a slot decodes every change after its consistent point with
	// the catalog of that moment, so a slot created before its publication would meet the writes
	// committed in between with no publication to look up, and fail on every start.
	if err := s.checkPublication(ctx, conn, db); err != nil {
		return err
	}
	return s.checkSlot(ctx, conn, db)
}

func (s *Stream) checkSlot(ctx context.Context, conn *pgx.Conn, db string) error {
	name := s.cfg.Slot
	if err := waitSlotFree(ctx, conn, name, s.cfg.InUseWait); err != nil {
		return err
	}
	var plugin, typ, slotDB, walStatus, confirmed, restart string
	var active bool
	var pid int32
	query := func() error {
		return conn.QueryRow(ctx, `
		SELECT coalesce(plugin, ''), slot_type, coalesce(database, ''), active, coalesce(active_pid, 0),
		       coalesce(wal_status, ''), coalesce(confirmed_flush_lsn, '0/0')::text, coalesce(restart_lsn, '0/0')::text
		FROM pg_replication_slots WHERE slot_name = $1`, name).
			Scan(&plugin, &typ, &slotDB, &active, &pid, &walStatus, &confirmed, &restart)
	}
	err := query()
	if err == nil && walStatus == "lost" && s.cfg.ReplaceLostSlot && s.cfg.CreateSlot && typ == "logical" && plugin == "pgoutput" && slotDB == db && !active {
		// Asked for: the slot holds no WAL any more and can stream nothing; it is created again.
		if _, derr := conn.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, name); derr != nil {
			return fmt.Errorf("%w: replication slot %q lost WAL it needed, and dropping it to create it again failed: %w", ErrSlotLost, name, derr)
		}
		s.log.Warn().Msg("replication slot lost WAL it needed (wal_status = lost): dropped, to be created again (--on-slot-loss rebackfill)")
		err = query()
	}
	if errors.Is(err, pgx.ErrNoRows) {
		if !s.cfg.CreateSlot {
			return fmt.Errorf("%w: replication slot %q does not exist in database %q; create it with: %s",
				ErrSlotMissing, name, db, sqlfix.CreateSlot(name))
		}
		// Creation waits for the transactions running now to end; it exports no snapshot.
		if err := conn.QueryRow(ctx, `SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput')`, name).Scan(&confirmed); err != nil {
			if pgerr.Is(err, pgerrcode.ConfigurationLimitExceeded) { // taken since checkFreeSlot
				return slotsFull(ctx, conn, name, err)
			}
			return fmt.Errorf("create replication slot %q: %w", name, err)
		}
		restart = confirmed
		s.slot.Created = true
		s.log.Info().Str("lsn", confirmed).Msg("replication slot created")
	} else if err != nil {
		return fmt.Errorf("read replication slot %q: %w", name, err)
	} else {
		switch {
		case typ != "logical":
			return fmt.Errorf("%w: replication slot %q is a %s slot; use a logical slot with the pgoutput plugin (another slot name)", ErrSlotMismatch, name, typ)
		case plugin != "pgoutput":
			return fmt.Errorf("%w: replication slot %q uses the plugin %q; Tidemark needs pgoutput: use another slot name", ErrSlotMismatch, name, plugin)
		case slotDB != db:
			return fmt.Errorf("%w: replication slot %q belongs to database %q, not %q; slots are per database: use another slot name", ErrSlotMismatch, name, slotDB, db)
		case walStatus == "lost":
			return fmt.Errorf("%w: replication slot %q lost WAL it needed (wal_status = lost, see max_slot_wal_keep_size); "+
				"changes were missed: drop it with %s and start over with a full backfill", ErrSlotLost, name, sqlfix.DropSlot(name))
		case active:
			return fmt.Errorf("%w: replication slot %q is used by server process %d (still after %s); stop the other consumer "+
				"(or end a leftover session with SELECT pg_terminate_backend(%d);)", ErrSlotInUse, name, pid, max(s.cfg.InUseWait, 0), pid)
		}
	}
	s.slot.Name = name
	var perr error
	if s.slot.ConfirmedFlush, perr = pglogrepl.ParseLSN(confirmed); perr != nil {
		return fmt.Errorf("parse confirmed_flush_lsn %q of slot %q: %w", confirmed, name, perr)
	}
	if s.slot.Restart, perr = pglogrepl.ParseLSN(restart); perr != nil {
		return fmt.Errorf("parse restart_lsn %q of slot %q: %w", restart, name, perr)
	}
	return nil
}

// System reports what the server said about itself when the stream was opened.
func (s *Stream) System() SystemInfo { return s.sys }

// Slot reports the slot as Open found or created it.
func (s *Stream) Slot() SlotInfo { return s.slot }

// Ack records that everything up to lsn is durable downstream. The next standby status update
// confirms it to the server as the flush position, which lets the server discard older WAL. Ack
// never moves the position backwards and is safe to call from any goroutine.
func (s *Stream) Ack(lsn pglogrepl.LSN) {
	for {
		cur := s.acked.Load()
		if uint64(lsn) <= cur || s.acked.CompareAndSwap(cur, uint64(lsn)) {
			return
		}
	}
}

// KeepMessages makes Run ask for the logical messages of prefix ("*": all of them, none when
// empty), the others being dropped unread. Call it before Run.
func (s *Stream) KeepMessages(prefix string) { s.messages.Store(&prefix) }

func (s *Stream) keepMessage(prefix string) bool {
	want := *s.messages.Load()
	return want == "*" || (want != "" && prefix == want)
}

// droppedMessage logs a logical message dropped unread: a large one, which someone wrote to a
// database this capture reads, as a warning.
func (s *Stream) droppedMessage(prefix string, size int64) {
	ev := s.log.Debug()
	if size > 1<<20 {
		ev = s.log.Warn()
	}
	ev.Str("prefix", prefix).Int64("bytes", size).Msg("a logical message not Tidemark's (or too large) dropped unread")
}

// Acked returns the highest acknowledged LSN.
func (s *Stream) Acked() pglogrepl.LSN { return pglogrepl.LSN(s.acked.Load()) }

// Run starts replication at from (the server starts at the later of from and the slot's
// confirmed flush LSN) and calls fn for every event, in stream order, on the calling goroutine.
// It sends standby status updates every StatusInterval and whenever the server asks. Run returns
// when ctx is done (with context.Cause(ctx)), when fn returns an error, or when the connection
// fails. A Stream runs once: after Run returns, Close it and Open another.
func (s *Stream) Run(ctx context.Context, from pglogrepl.LSN, fn func(context.Context, Event) error) error {
	if !s.started.CompareAndSwap(false, true) {
		return errors.New("replication stream already ran; open a new one")
	}
	// The replication command's own grammar reads '' as a quote and a backslash as itself.
	args := []string{"proto_version '1'", "publication_names '" + strings.ReplaceAll(sqlfix.Ident(s.cfg.Publication), "'", "''") + "'"}
	// Messages are asked for only when read: any role can write them, of any size.
	if s.sys.ServerVersion >= 140000 && *s.messages.Load() != "" {
		args = append(args, "messages 'true'")
	}
	s.log.Info().Stringer("lsn", from).Str("publication", s.cfg.Publication).Msg("start replication")
	if err := pglogrepl.StartReplication(ctx, s.conn, s.cfg.Slot, from, pglogrepl.StartReplicationOptions{PluginArgs: args}); err != nil {
		return fmt.Errorf("start replication on slot %q at %s: %w", s.cfg.Slot, from, err)
	}

	// The loop blocks in reads with a deadline (the next status update); cancellation moves the
	// deadline into the past, so a blocked read returns at once. The loop checks ctx after
	// setting each deadline, so a cancellation is never overwritten unnoticed.
	nc := s.conn.Conn()
	watchDone := make(chan struct{})
	stopWatch := context.AfterFunc(ctx, func() {
		defer close(watchDone)
		_ = nc.SetDeadline(time.Unix(1, 0))
	})
	defer func() {
		if !stopWatch() {
			<-watchDone
		}
	}()

	dec := newDecoder()
	now := time.Now()
	s.nextStatus, s.lastRecv = now.Add(s.cfg.StatusInterval), now
	for {
		if !time.Now().Before(s.nextStatus) {
			if err := s.sendStatus(true); err != nil {
				return s.fail(ctx, err)
			}
		}
		deadline := s.nextStatus
		if d := s.lastRecv.Add(s.cfg.ReceiveTimeout); d.Before(deadline) {
			deadline = d
		}
		if err := nc.SetReadDeadline(deadline); err != nil {
			return s.fail(ctx, fmt.Errorf("set read deadline: %w", err))
		}
		if ctx.Err() != nil {
			return s.shutdown(ctx)
		}
		msg, err := s.conn.ReceiveMessage(context.Background())
		if err != nil {
			var ne net.Error
			if pgconn.Timeout(err) || (errors.As(err, &ne) && ne.Timeout()) {
				if ctx.Err() != nil {
					return s.shutdown(ctx)
				}
				if silent := time.Since(s.lastRecv); silent >= s.cfg.ReceiveTimeout {
					return fmt.Errorf("%w: no message from the server in %s", ErrTimeout, silent.Round(time.Second))
				}
				continue
			}
			return s.fail(ctx, fmt.Errorf("receive replication message: %w", err))
		}
		s.lastRecv = time.Now()
		switch m := msg.(type) {
		case *pgproto3.CopyData:
			if err := s.handle(ctx, dec, m.Data, fn); err != nil {
				return s.fail(ctx, err)
			}
		case *pgproto3.ErrorResponse:
			return s.fail(ctx, fmt.Errorf("replication stream: %w", pgconn.ErrorResponseToPgError(m)))
		case *pgproto3.CopyDone:
			return s.fail(ctx, errors.New("the server ended the replication stream"))
		}
	}
}

func (s *Stream) handle(ctx context.Context, dec *decoder, data []byte, fn func(context.Context, Event) error) error {
	if len(data) == 0 {
		return fmt.Errorf("%w: empty CopyData", ErrProtocol)
	}
	switch data[0] {
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
		if err != nil {
			return fmt.Errorf("%w: %w", ErrProtocol, err)
		}
		if ka.ReplyRequested {
			if err := s.sendStatus(false); err != nil {
				return err
			}
		}
		if dec.inTxn {
			return nil
		}
		return fn(ctx, &Keepalive{WALEnd: ka.ServerWALEnd, Time: ka.ServerTime})
	case pglogrepl.XLogDataByteID:
		xld, err := pglogrepl.ParseXLogData(data[1:])
		if err != nil {
			return fmt.Errorf("%w: %w", ErrProtocol, err)
		}
		wal := xld.WALData
		if len(wal) > 0 && strings.IndexByte("IUDM", wal[0]) >= 0 {
			// Tuples and message contents point into the message; the receive buffer is reused.
			wal = append([]byte(nil), wal...)
		}
		ev, err := dec.decode(xld.WALStart, wal)
		if err != nil {
			return fmt.Errorf("decode message at %s: %w", xld.WALStart, err)
		}
		if s.log.GetLevel() <= zerolog.TraceLevel {
			s.log.Trace().Stringer("lsn", xld.WALStart).Type("event", ev).Msg("event")
		}
		return fn(ctx, ev)
	default:
		return fmt.Errorf("%w: unexpected CopyData type %q", ErrProtocol, data[0])
	}
}

// Keepalive sends a standby status update if one is due. Call it only from inside fn, on the
// goroutine running Run, when fn waits for a slow consumer: without status updates the server
// ends the connection after wal_sender_timeout.
func (s *Stream) Keepalive() error {
	if time.Now().Before(s.nextStatus) {
		return nil
	}
	return s.sendStatus(true)
}

// sendStatus sends a standby status update whose write, flush and apply positions are all the
// acknowledged LSN. pglogrepl replaces a zero flush position with the write position; with all
// three equal, a zero acknowledgement stays zero, which the server ignores.
func (s *Stream) sendStatus(replyRequested bool) error {
	acked := pglogrepl.LSN(s.acked.Load())
	nc := s.conn.Conn()
	_ = nc.SetWriteDeadline(time.Now().Add(s.cfg.ReceiveTimeout))
	err := pglogrepl.SendStandbyStatusUpdate(context.Background(), s.conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: acked, WALFlushPosition: acked, WALApplyPosition: acked,
		ClientTime: time.Now(), ReplyRequested: replyRequested,
	})
	if err != nil {
		return fmt.Errorf("send standby status update: %w", err)
	}
	s.nextStatus = time.Now().Add(s.cfg.StatusInterval)
	s.log.Debug().Stringer("lsn", acked).Msg("standby status sent")
	return nil
}

// shutdown ends the stream cleanly: a last status update with the acknowledged position, then
// CopyDone, with a bounded wait for the server's answer.
func (s *Stream) shutdown(ctx context.Context) error {
	nc := s.conn.Conn()
	_ = nc.SetDeadline(time.Now().Add(5 * time.Second))
	if err := s.sendStatus(false); err != nil {
		s.log.Warn().Err(err).Msg("final status update not sent")
	} else if _, err := pglogrepl.SendStandbyCopyDone(context.Background(), s.conn); err != nil {
		s.log.Debug().Err(err).Msg("copy done not confirmed")
	}
	s.log.Info().Stringer("lsn", s.Acked()).Msg("replication stopped")
	return context.Cause(ctx)
}

// fail returns err, unless the failure was caused by ctx ending, which is then the cause reported.
func (s *Stream) fail(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	return err
}

// Close closes the replication connection. Call it after Run has returned, or instead of Run.
func (s *Stream) Close(ctx context.Context) error {
	if s.conn == nil {
		return nil
	}
	return s.conn.Close(ctx)
}

// Created reports what Open created: the slot, the publication.
func (s *Stream) Created() (slot, publication bool) { return s.slot.Created, s.pubCreated }

// undoWait bounds Undo's wait for the slot's server process to end after Close.
const undoWait = 10 * time.Second

// Undo drops what Open created, the slot and the publication, for a run that ends before anything
// read from them was made durable downstream (its first checkpoint): the source is left as it
// was. What existed before Open is never touched, nor a publication whose comment is no longer
// the one Open gave it. Call it after Close (the slot is in use until its server process ends).
// An error says what is left and the statement that drops it.
func (s *Stream) Undo(ctx context.Context) error {
	if !s.slot.Created && !s.pubCreated {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), undoWait+10*time.Second)
	defer cancel()
	conn, err := pgconf.Dial(ctx, s.qcfg)
	if err != nil {
		return s.undoFailed(err)
	}
	defer conn.Close(ctx)
	if s.slot.Created {
		if err := waitSlotFree(ctx, conn, s.cfg.Slot, undoWait); err != nil {
			return s.undoFailed(err)
		}
		var pid int32
		err := conn.QueryRow(ctx, `SELECT coalesce(active_pid, 0) FROM pg_catalog.pg_replication_slots WHERE slot_name = $1`, s.cfg.Slot).Scan(&pid)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
		case err != nil:
			return s.undoFailed(err)
		case pid != 0:
			// Still streamed (a server process that has not noticed the closed connection, or
			// another run that took it up): not dropped, and nothing after it either.
			return fmt.Errorf("%w: this run created replication slot %q, and server process %d still streams from it, so it was not dropped (it retains WAL while it stays): once that process is gone (SELECT pg_terminate_backend(%d); if it is a leftover), and if nothing resumes from the slot, drop it with %s",
				ErrLeftBehind, s.cfg.Slot, pid, pid, sqlfix.DropSlot(s.cfg.Slot))
		default:
			if _, err := conn.Exec(ctx, `SELECT pg_catalog.pg_drop_replication_slot($1)`, s.cfg.Slot); err != nil {
				if pgerr.Is(err, pgerrcode.ObjectInUse) {
					return fmt.Errorf("%w: this run created replication slot %q, and another process took it up before it could be dropped (%w): it stays; find out who streams from it (pg_replication_slots.active_pid)",
						ErrLeftBehind, s.cfg.Slot, err)
				}
				return s.undoFailed(err)
			}
		}
		s.slot.Created = false
		s.log.Info().Msg("replication slot dropped: this run created it and ends before its first checkpoint")
	}
	if s.pubCreated {
		s.pubCreated = false
		var ours bool
		err := conn.QueryRow(ctx, `SELECT coalesce(pg_catalog.obj_description(p.oid, 'pg_publication') = $2, false)
			FROM pg_catalog.pg_publication p WHERE p.pubname = $1`, s.cfg.Publication, PublicationComment(s.cfg.Slot)).Scan(&ours)
		var others []string
		if err == nil || errors.Is(err, pgx.ErrNoRows) {
			others, err = OtherSlots(ctx, conn, s.cfg.Slot)
		}
		if err != nil {
			s.pubCreated = true
			return s.undoFailed(err)
		}
		switch {
		case !ours:
			s.log.Info().Str("publication", s.cfg.Publication).Msg("publication kept: this run created it, but its comment has changed since (someone else took it up)")
		case len(others) > 0:
			// Another capture may have taken it up meanwhile: its slot would fail without it.
			s.log.Warn().Str("publication", s.cfg.Publication).Strs("other_slots", others).
				Msgf("publication kept: this run created it, but other pgoutput slots of the database may stream it; once none does, drop it with %s", sqlfix.DropPublication(s.cfg.Publication))
		default:
			if _, err := conn.Exec(ctx, "DROP PUBLICATION "+quoteIdent(s.cfg.Publication)); err != nil {
				s.pubCreated = true
				return s.undoFailed(err)
			}
			s.log.Info().Str("publication", s.cfg.Publication).Msg("publication dropped: this run created it and ends before its first checkpoint")
		}
	}
	return nil
}

// undoFailed is Undo's error: what this run created and leaves on the source, and how to drop it.
func (s *Stream) undoFailed(err error) error {
	var left, fix []string
	if s.slot.Created {
		left = append(left, fmt.Sprintf("replication slot %q (it retains WAL until dropped)", s.cfg.Slot))
		fix = append(fix, sqlfix.DropSlot(s.cfg.Slot))
	}
	if s.pubCreated {
		left = append(left, fmt.Sprintf("publication %q", s.cfg.Publication))
		fix = append(fix, sqlfix.DropPublication(s.cfg.Publication))
	}
	return fmt.Errorf("%w: this run created %s and could not drop it (%w); drop it with: %s",
		ErrLeftBehind, strings.Join(left, " and "), err, strings.Join(fix, " "))
}

// waitSlotFree waits up to wait for slot, when some process streams from it, to be released:
// the server process of a consumer that just died ends once the server notices. A slot still in
// use after that is left to checkSlot to refuse.
func waitSlotFree(ctx context.Context, conn *pgx.Conn, slot string, wait time.Duration) error {
	err := UntilFree(ctx, wait, func() (bool, error) {
		var active bool
		err := conn.QueryRow(ctx, `SELECT active FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&active)
		if errors.Is(err, pgx.ErrNoRows) {
			return true, nil
		}
		return !active, err
	})
	if err != nil && ctx.Err() == nil {
		return fmt.Errorf("read replication slot %q: %w", slot, err)
	}
	return err
}

// UntilFree calls try every 100 ms until it reports the resource free or fails, for up to wait
// (DefaultInUseWait for a capture's own resources): a capture killed a moment ago holds its slot,
// and a sync its target's locks, through server processes that end only when the server notices
// the closed connection, and a restart right after (a supervisor's, or an operator's) must not
// fail on them. A live holder is still there after the wait; the caller refuses it.
func UntilFree(ctx context.Context, wait time.Duration, try func() (free bool, err error)) error {
	deadline := time.Now().Add(wait)
	for {
		free, err := try()
		if free || err != nil || !time.Now().Before(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func quoteIdent(s string) string { return sqlfix.Ident(s) }

// checkFreeSlot refuses a run that would create its slot on a server whose replication slots are
// all taken (max_replication_slots), before anything is created.
func (s *Stream) checkFreeSlot(ctx context.Context, conn *pgx.Conn) error {
	if !s.cfg.CreateSlot {
		return nil
	}
	var limit, used int
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT current_setting('max_replication_slots')::int, (SELECT count(*) FROM pg_catalog.pg_replication_slots),
			EXISTS (SELECT FROM pg_catalog.pg_replication_slots WHERE slot_name = $1)`, s.cfg.Slot).Scan(&limit, &used, &exists); err != nil {
		return fmt.Errorf("read replication slots: %w", err)
	}
	if exists || used < limit {
		return nil
	}
	return slotsFull(ctx, conn, s.cfg.Slot, nil)
}

// slotsFull is the error of a slot that cannot be created because every replication slot of the
// server is taken: the slots nobody streams from (the likely orphans, most WAL retained first),
// each with how to drop it, and the setting to raise. cause is the server's error, if any.
func slotsFull(ctx context.Context, conn *pgx.Conn, slot string, cause error) error {
	var b strings.Builder
	var limit int
	_ = conn.QueryRow(ctx, `SELECT current_setting('max_replication_slots')::int`).Scan(&limit)
	fmt.Fprintf(&b, "all %d replication slots of the server are taken (max_replication_slots), so slot %q cannot be created", limit, slot)
	rows, err := conn.Query(ctx, `SELECT slot_name::text, slot_type, coalesce(database::text, ''),
			pg_catalog.pg_size_pretty(coalesce(pg_catalog.pg_wal_lsn_diff(pg_catalog.pg_current_wal_lsn(), restart_lsn), 0))
		FROM pg_catalog.pg_replication_slots WHERE NOT active
		ORDER BY coalesce(pg_catalog.pg_wal_lsn_diff(pg_catalog.pg_current_wal_lsn(), restart_lsn), 0) DESC, 1 LIMIT 10`)
	if err == nil {
		for rows.Next() {
			var name, typ, db, retained string
			if rows.Scan(&name, &typ, &db, &retained) != nil {
				break
			}
			if typ == "logical" {
				fmt.Fprintf(&b, "\n  slot %s (logical, database %s) is not in use and retains %s of WAL; if nothing resumes from it: tidemark cleanup --slot %s (connected to database %s), or %s",
					name, db, retained, name, db, sqlfix.DropSlot(name))
			} else {
				fmt.Fprintf(&b, "\n  slot %s (%s) is not in use and retains %s of WAL; if nothing resumes from it: %s", name, typ, retained, sqlfix.DropSlot(name))
			}
		}
		rows.Close()
	}
	fmt.Fprintf(&b, "\nfree one, or raise the limit: ALTER SYSTEM SET max_replication_slots = %d; then restart PostgreSQL", limit+5)
	if cause != nil {
		return fmt.Errorf("%w: %s (%w)", ErrSlotsFull, b.String(), cause)
	}
	return fmt.Errorf("%w: %s", ErrSlotsFull, b.String())
}
