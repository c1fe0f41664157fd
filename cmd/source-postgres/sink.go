package main

import "github.com/tidemark/tidemark/sink"

// The record writer is an output like sink/jsonl and sink/postgres: events become RECORD lines,
// positions STATE messages (records.go). Its checkpoints are durable once the destination has
// committed them and the platform passes the state back to the next read (doc.go). It differs
// from the other outputs in two ways, both Airbyte's: it takes no lock of its own (the slot in
// use refuses a second read), and with lsn_commit_behaviour "While reading Data" a position is
// confirmed to the slot as its state goes out, before the destination committed it (the
// operator's choice; by default only the state a read was given, which the platform passes once
// the destination committed it, is confirmed).
var _ sink.Sink = (*recordSink)(nil)
