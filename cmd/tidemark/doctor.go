package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark/tidemark/cmd/internal/preflight"
	"github.com/tidemark/tidemark/internal/pgconf"
	"github.com/tidemark/tidemark/watermark"
)

// errProblems makes doctor exit with 1 when it found problems.
var errProblems = errors.New("prerequisites missing")

func runDoctor(ctx context.Context, args []string, e *env) error {
	fs := newFlags("doctor", "doctor --source DSN [--tables SCHEMA.TABLE,...] [flags]", e)
	source := sourceFlag(fs)
	tables := fs.String("tables", "", "comma-separated tables to capture, as schema.table")
	keys := keyFlag(fs)
	slot := slotFlag(fs, "logical replication slot")
	pub := publicationFlag(fs, "publication")
	watermarks := fs.String("watermarks", "auto", "the watermark transport the capture will use: auto, message or table (as tidemark sync)")
	signalTable := signalTableFlag(fs, "the signal table of the table transport, as schema.table")
	if err := parse(fs, args); err != nil {
		return err
	}
	transport, err := watermark.ParseTransport(*watermarks)
	if err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	if transport == watermark.Auto && flagGiven(fs, "signal-table") {
		transport = watermark.Table
	}
	sigSchema, sigTable, ok := strings.Cut(*signalTable, ".")
	if !ok || sigSchema == "" || sigTable == "" {
		return fmt.Errorf("%w: --signal-table must be schema.table", errUsage)
	}
	if *source == "" {
		return fmt.Errorf("%w: --source is required", errUsage)
	}
	opts := preflight.Options{Slot: *slot, Publication: *pub, CreateSlot: true, CreatePublication: true,
		Watermarks: transport, SignalTable: pgx.Identifier{sigSchema, sigTable}}
	if *tables != "" {
		parsed, err := parseTables(*tables)
		if err != nil {
			return fmt.Errorf("%w: %w", errUsage, err)
		}
		if err := applyKeys(*keys, parsed); err != nil {
			return fmt.Errorf("%w: %w", errUsage, err)
		}
		opts.Keys = map[string][]string{}
		for _, t := range parsed {
			opts.Tables = append(opts.Tables, pgx.Identifier{t.Schema, t.Name})
			if t.Key != nil {
				opts.Keys[t.Schema+"."+t.Name] = t.Key
			}
		}
	}
	dsn, rule, err := pgconf.DefaultSSLMode(*source)
	if err != nil {
		return fmt.Errorf("%w: --source: %w", errUsage, err)
	}
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return fmt.Errorf("%w: --source: %w", errUsage, pgconf.ParseError(err))
	}
	if rule == pgconf.SSLRemote {
		// The checks below report a refused connection without knowing why sslmode is what it is.
		fmt.Fprintln(e.stdout, "The connection string sets no sslmode and the server is not on this machine: connecting with sslmode=verify-full. "+
			"If the server has no certificate for its name signed by a CA this machine trusts, choose sslmode explicitly: "+
			"sslmode=verify-ca sslrootcert=FILE, or sslmode=require (encrypted, but whoever answers is trusted).")
	}
	if problems := preflight.Print(e.stdout, preflight.Check(ctx, cfg, opts)); problems > 0 {
		return fmt.Errorf("%w: %d problems", errProblems, problems)
	}
	return nil
}
