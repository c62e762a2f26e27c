-- session-store schema version 6: the operation keys in sorted chunks instead of an index.
-- Readable by sqlite3 >= 3.38 like the versions before it.
--
-- commits_by_operation indexed every commit's operation key, a hash: each durable commit
-- wrote a leaf of it at a random place, one WAL frame of the four or five a one-event
-- commit writes. Only the writer's idempotency check read it. The keys are now written
-- together, once per 1,024 commits: a chunk holds the operation key and first sequence of
-- each commit with first_seq in (the previous chunk's through_seq, its own through_seq],
-- 16 bytes each (the key as a signed and the sequence as an unsigned 64-bit integer, both
-- little-endian), sorted by key then sequence. A writer looks an operation id up in the
-- chunks and in the commits after the last one (a range of the primary key), then reads
-- its commit by first sequence and compares the text. Derived data: a chunk that does not
-- read as one is ignored (its commits are searched as the ones after the last chunk), and
-- a file without chunks (upgraded, imported, forked) gets its first at its next drain.
-- Commits a delete copies into a fork below the last chunk carry reserved operation ids,
-- which no append looks up.
CREATE TABLE operation_key_chunks (
    through_seq  INTEGER PRIMARY KEY,
    keys         BLOB NOT NULL
);
DROP INDEX commits_by_operation;
