package main

import "github.com/tidemark/tidemark/sink"

// The record writer is an output like sink/jsonl and sink/postgres: events become RECORD lines,
// positions STATE messages (records.go). Its checkpoints are durable once the destination has
// committed them and the platform passes the state back to the next read (doc.go).
var _ sink.Sink = (*recordSink)(nil)
