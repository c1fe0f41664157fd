package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/tidemark/tidemark/internal/pgconf"
	"github.com/tidemark/tidemark/internal/pgjson"
)

func runSchema(ctx context.Context, args []string, e *env) error {
	fs := newFlags("schema", "schema --source DSN --tables SCHEMA.TABLE[,...]", e)
	source := sourceFlag(fs)
	tables := fs.String("tables", "", "comma-separated tables, as schema.table")
	if err := parse(fs, args); err != nil {
		return err
	}
	tcs, err := parseTables(*tables)
	if *source == "" {
		err = fmt.Errorf("--source is required")
	}
	if err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	conn, err := pgconf.OpenDefaultSSL(ctx, *source, "tidemark")
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	reg := pgjson.NewRegistry(conn)
	out := map[string]any{}
	for _, t := range tcs {
		s, err := reg.TableSchema(ctx, t.Schema, t.Name)
		if err != nil {
			return err
		}
		if len(s["properties"].(map[string]any)) == 0 {
			return fmt.Errorf("table %s.%s has no columns or does not exist", t.Schema, t.Name)
		}
		out[t.Schema+"."+t.Name] = s
	}
	b, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(e.stdout, strings.TrimSpace(string(b)))
	return err
}
