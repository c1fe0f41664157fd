// Package verify compares a capture's output with its source: a PostgreSQL target table by
// table, or a JSON lines output replayed. It reads the source the way the backfill does
// (package chunker: keyset chunks in key order, each in one short REPEATABLE READ transaction,
// no lock beyond ACCESS SHARE, no long snapshot), so it may run against production while the
// capture keeps going.
//
// # What it compares
//
// Every column the capture carries (the table's columns that are not generated, within the
// publication's column list when the table is in it), in the form the output holds: for a
// PostgreSQL target the values' text forms under the same pinned session settings on both
// servers (internal/pgconf), for JSON lines each value's JSON form (internal/pgjson, the form
// sync writes) with the original text where that form is lossy. A row is identified by its key:
// for a PostgreSQL target encoded as chunker does; for JSON lines by the key columns' JSON forms,
// numbers in a canonical form (the key's = takes 1.0 and 1.00, 0 and -0 for one key, and an
// update may write the other form) and a lossy one (NaN, infinity: null) with its original text,
// which the writer gives on deletes too. A target column the capture does not carry is not
// compared; a source column the target lacks is a difference of the table's definition. A key on
// two rows of the source or of the target is a difference of its own, never re-checked (a read
// by key shows one row). Text that is not UTF-8 (a SQL_ASCII source) has no JSON form that keeps
// it: a JSON lines output holding it differs.
//
// # A PostgreSQL target: per chunk, in key order
//
// For each source chunk (after key A, up to its last key L), the target's rows with keys in
// (A, L] are read in pages of the chunk's size, and each is compared with the chunk's row of its
// key (a row digest, the first 16 bytes of a SHA-256 of its values) as it comes, then dropped (a
// difference keeps the key, the digests and the names of the differing columns). An order-free
// digest of each side (the XOR of its row digests) is the last check: sides that differ with no
// difference recorded still count as different. The rows past
// the source's last key are read at the end. Memory holds one source chunk, one target page and
// the differing keys kept (Options.Keep). The target table is read with the source's key, whatever
// its replica identity (chunker.DiscoverKeyed).
// The ranges are evaluated by each server with its own collation: a target whose key columns sort
// otherwise shows rows that moved between ranges as missing in one and extra in another, never as
// equal.
//
// # JSON lines: replayed
//
// The output is replayed per key in file order (insert, update and snapshot set the row, an
// update's "unchanged" columns keep their earlier values, delete removes it, truncate and refresh
// empty the table). Past Options.PartBytes of output, lines are first split by a hash of their key
// into partition files (truncate and refresh go to each), and the source's row digests into
// partition files of the same hash; each partition is then replayed and compared in memory, so
// memory holds one partition. A line that does not end in a newline is being written: it is left
// out. A replayed partition takes a few times its size in memory: the default, 64 MiB, keeps the
// replay to a few hundred MiB.
//
// # A live source
//
// A source that keeps changing cannot be read as of the output's position (a live server has no
// such snapshot), so a difference may only be the capture's lag. Each differing key is read again
// on both sides every Options.RecheckEvery for up to Options.RecheckFor: a key whose two sides
// become equal is dropped; a key whose source row and output row both stay the same for three
// reads in a row is a difference; a key still changing when the time is up is reported as
// changing, which is not equality either. A re-read of a JSON lines output applies only what was
// appended since the last read to the kept rows (the whole output again if it was cut back by a
// resumed sync); a key-list read that stops at the chunk byte bound is read again in halves, so
// that no row is taken for absent because it was not reached.
//
// On a live source the comparison is not a proof: rows written while it runs are compared or not
// depending on where the reads were (a row inserted past the source's last key as the comparison
// started is not read on the source). After `sync --stop-when-caught-up` with the writes stopped,
// it is exact.
//
// # Concurrency
//
// The connections are the caller's; verify uses them from one goroutine and holds no transaction
// between chunks.
package verify
