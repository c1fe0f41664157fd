package main

import (
	"flag"
	"fmt"
	"os"

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
