-- session-store schema version 7: a check on each event row. Readable by sqlite3 >= 3.38
-- like the versions before it. Nothing is rewritten: rows written before keep NULL.
--
-- events.payload_check: a 32-bit hash (a signed INTEGER) of the row's sequence, kind,
-- payload, payload_ref and payload_parts as stored (store/row_check.rs), written with
-- each row from this version on. A read by sequence (a transcript page, the search's
-- read-back, a payload) compares it with the row it read, so that a damaged payload is
-- refused there as a commit read refuses it (a commit read rehashes the whole commit
-- against its operation hash). NULL: a row written before this version, not checked.
ALTER TABLE events ADD COLUMN payload_check INTEGER;
