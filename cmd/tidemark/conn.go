package main

import (
	"flag"
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
	return fs.String("source", os.Getenv("TIDEMARK_SOURCE"), "source connection string (URL or key=value); default $TIDEMARK_SOURCE")
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

// envTarget is $TIDEMARK_TARGET when it is a PostgreSQL connection string: the default target
// of the commands that read a sync's PostgreSQL target, so that its password need not be in the
// process's arguments.
func envTarget() string {
	if t := os.Getenv("TIDEMARK_TARGET"); isDSN(t) {
		return t
	}
	return ""
}
