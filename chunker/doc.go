// Package chunker implements the backfill's reads: key discovery, keyset chunk queries, the
// chunk's snapshot capture, and the canonical key encoding shared with the change stream.
//
// # Keys
//
// Discover chooses the columns that identify a row in both paths: the replica identity's (the
// primary key under REPLICA IDENTITY DEFAULT or FULL, the chosen index under USING INDEX),
// because those are the only columns an UPDATE or DELETE carries in the stream; or a key
// override that is NOT NULL, unique, and carried by the replica identity. Tables without such a
// key, or keyed by a nondeterministic collation, are refused with what to do.
//
// Discover looks the table's name up once, to its OID, and reads everything else (its
// membership of the publication, columns, key) by that OID: a rename between two of its
// statements then finds the table as it was looked up, or not at all (ErrNoTable), never "not in
// the publication", which would name the wrong cause and the wrong fix; a table dropped (or
// dropped and created again) meanwhile is ErrNoTable, not a table without a key. DiscoverOID
// reads a captured table by its OID alone, under whatever name it has (the engine's rediscovery
// after a rename).
//
// Table.AppendKey encodes a key as a FoundationDB tuple (package tuple) from the text values of
// its columns. Both paths read values in text form under the same pinned session settings
// (internal/pgconf), so the same stored key has the same text in a chunk row and in a pgoutput
// tuple; typed elements then make keys that are equal under the key type's = operator encode
// equally (numeric scale, float -0) for the types read as values: integers, oid, floats,
// numeric, bool, uuid, bytea. Other types are elements of their text, so two spellings of one
// value (interval '1 day' and '24 hours', jsonb, numeric[], citext) are two keys: the stream
// carries a key's old spelling when an update changes it (the identity's columns changed, to
// the server), so the output follows, but nothing downstream may take the encoding as the
// value's identity for those types. Keys are compared for equality only: ordering is
// PostgreSQL's (ORDER BY and row comparison, with the columns' collations), never Go's.
//
// # Chunks
//
// A chunk is the keyset page after an exclusive lower bound and up to the inclusive upper bound
// captured once when the table's backfill starts (so inserts during the backfill cannot stretch
// it). ChunkSQL, MaxKeySQL and KeysSQL are pure functions, golden-tested: identifiers quoted,
// values bound parameters in text form with no declared type, which the server parses with the
// input function of the column each is compared with.
//
// Reader.Next reads one chunk in one short REPEATABLE READ READ ONLY transaction with a
// statement timeout, a lock timeout and enable_sort off (a chunk comes from the key's index in
// key order, even when missing statistics make the planner guess otherwise). It takes the
// table's ACCESS SHARE lock before anything takes the transaction's snapshot; its first query
// captures pg_current_snapshot() (the transaction's snapshot, which the merge's visibility guard
// checks) and compares the table's columns with the discovered ones (ErrSchemaChanged when they
// differ). Everything up to the first fetch of rows goes in one round trip; the server still
// runs the statements in order, and none after one that failed. No transaction stays
// open across chunks, so the backfill never holds back the xmin horizon.
//
// # Concurrency
//
// A Reader uses a connection it does not own and is not safe for concurrent use.
package chunker
