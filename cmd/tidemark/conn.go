package main

import (
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/tidemark/tidemark/merge"
	"github.com/tidemark/tidemark/watermark"
)

// The defaults the commands share.
const (
	defaultSlot        = "tidemark"
	defaultPublication = "tidemark"
)

// sourceFlag defines --source, the source connection string, defaulting to $TIDEMARK_SOURCE so
// that its password need not be in the process's arguments.
func sourceFlag(fs *flag.FlagSet) *string {
	return envFlag(fs, "source", "TIDEMARK_SOURCE", nil, "source connection string, a `DSN` (URL or key=value)")
}

// envValue is a string flag whose default is an environment variable's value, taken after the
// arguments are parsed (applyEnvDefaults): -h and usage errors print the flag's default, and a
// connection string's password must not be in it. They say whether the variable is set.
type envValue struct {
	p      *string
	env    string
	accept func(string) bool // which values of the variable serve as the default; nil: any
}

func (v *envValue) String() string {
	if v == nil || v.p == nil {
		return ""
	}
	return *v.p
}

func (v *envValue) Set(s string) error { *v.p = s; return nil }

// envFlag defines a string flag that defaults to $env (when accept takes its value).
func envFlag(fs *flag.FlagSet, name, env string, accept func(string) bool, usage string) *string {
	state := "not set"
	if _, ok := os.LookupEnv(env); ok {
		state = "set"
	}
	p := new(string)
	fs.Var(&envValue{p: p, env: env, accept: accept}, name, fmt.Sprintf("%s; default $%s (%s)", usage, env, state))
	return p
}

// applyEnvDefaults gives each flag of envFlag not on the command line its variable's value.
func applyEnvDefaults(fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		v, ok := f.Value.(*envValue)
		if !ok || flagGiven(fs, f.Name) {
			return
		}
		if val := os.Getenv(v.env); v.accept == nil || v.accept(val) {
			*v.p = val
		}
	})
}

// slotFlag defines --slot, the capture's replication slot.
func slotFlag(fs *flag.FlagSet, usage string) *string { return fs.String("slot", defaultSlot, usage) }

// publicationFlag defines --publication.
func publicationFlag(fs *flag.FlagSet, usage string) *string {
	return fs.String("publication", defaultPublication, usage)
}

// signalTableFlag defines --signal-table, the signal table of the table watermark transport.
func signalTableFlag(fs *flag.FlagSet, usage string) *string {
	return fs.String("signal-table", watermark.DefaultTable[0]+"."+watermark.DefaultTable[1], usage)
}

// targetFlag defines --target, a sync's PostgreSQL target for the commands that read it,
// defaulting to $TIDEMARK_TARGET when that is a PostgreSQL connection string.
func targetFlag(fs *flag.FlagSet, usage string) *string {
	return envFlag(fs, "target", "TIDEMARK_TARGET", isDSN, usage)
}

// keyFlag defines --key schema.table=col1,col2 (repeatable): a key override, for a table
// without a primary key whose columns identify its rows (NOT NULL, under a unique index).
func keyFlag(fs *flag.FlagSet) *[]string {
	var keys []string
	fs.Func("key", "key override, as schema.table=col1,col2 (repeat for more tables): NOT NULL columns under a unique index, for a table without a primary key; its replica identity must be that index (doctor prints the statement)", func(v string) error {
		keys = append(keys, v)
		return nil
	})
	return &keys
}

// applyKeys sets the key overrides of --key on tables, each of which must be among them.
func applyKeys(keys []string, tables []merge.TableConfig) error {
	for _, k := range keys {
		table, cols, ok := strings.Cut(k, "=")
		schema, name, tok := strings.Cut(strings.TrimSpace(table), ".")
		if !ok || !tok || schema == "" || name == "" || strings.TrimSpace(cols) == "" {
			return fmt.Errorf("--key %q: write it as schema.table=col1,col2", k)
		}
		i := slices.IndexFunc(tables, func(t merge.TableConfig) bool { return t.Schema == schema && t.Name == name })
		if i < 0 {
			return fmt.Errorf("--key %q: %s.%s is not among --tables", k, schema, name)
		}
		if tables[i].Key != nil {
			return fmt.Errorf("--key %q: %s.%s has a key override already", k, schema, name)
		}
		for _, c := range strings.Split(cols, ",") {
			if c = strings.TrimSpace(c); c == "" {
				return fmt.Errorf("--key %q: an empty column name", k)
			}
			tables[i].Key = append(tables[i].Key, c)
		}
	}
	return nil
}
