-- session-store schema version 3: the lean store. Readable by sqlite3 >= 3.38 (no STRICT,
-- no JSONB, no function newer than 3.38 in any table, index or view). New files are
-- created with auto_vacuum=INCREMENTAL by the code before this runs.

-- checkpoint by reference
-- The checkpoint holds the model workset by reference (event sequences) and the transcript
-- index (16 bytes per message) in message_ids; never message bodies. Version-2 checkpoints
-- copied the transcript: they are dropped (derived data; the next writer writes a new one).
ALTER TABLE checkpoint ADD COLUMN message_ids BLOB;
DELETE FROM checkpoint;

-- content parts
-- String values of a payload longer than the store's inline threshold live in blobs, once
-- per file: the payload keeps the placeholder string "sse-blob:<sha-256 hex>" in their
-- place (json_extract shows it) and payload_parts lists the byte offsets of the
-- placeholders' opening quotes, a JSON array in ascending order. NULL: no parts.
ALTER TABLE events ADD COLUMN payload_parts TEXT;

-- content_in: where the message content lives. inline | blob <digest> (the whole
-- payload, over 64 KiB) | part <digest> (the content string alone).
DROP VIEW transcript;
CREATE VIEW transcript AS
SELECT e.seq,
       json_extract(e.payload, '$.message.id')   AS message_id,
       json_extract(e.payload, '$.message.role') AS role,
       CASE WHEN e.payload_ref IS NOT NULL THEN 'blob ' || e.payload_ref
            WHEN e.payload_parts IS NOT NULL
                 AND json_extract(e.payload, '$.message.content') LIKE 'sse-blob:%'
            THEN 'part ' || substr(json_extract(e.payload, '$.message.content'), 10)
            ELSE 'inline' END AS content_in,
       CASE WHEN e.payload_ref IS NOT NULL THEN '<blob ' || e.payload_ref || '>'
            ELSE substr(json_extract(e.payload, '$.message.content'), 1, 200) END AS content_preview
FROM events e
WHERE e.kind IN ('message/complete', 'message/upsert');

-- compact commits
-- Commit rows in binary form. A digest is a BLOB; an id is a 16-byte BLOB when it is
-- lowercase hex (an id of another form stays TEXT). What can be derived is not stored:
--   commit_id  NULL when the commit id is derived: it is then the hex of row_hash (every
--              commit this version accepts); stored for rows that carry another id (older
--              random ids, commits inherited from an ancestor).
--   turn_id    '' when the turn id is the one derived from the operation id.
--   row_hash   the damage check of the row: 16 bytes (SHA-256 truncated, this version's
--              rows), 32 bytes (a version-2 row, converted), NULL (a version-1 row).
-- The UNIQUE text index on operation_id gives way to an index on operation_key, the first
-- 8 bytes of SHA-256(operation_id) as a signed big-endian integer (not unique: a lookup
-- confirms the text). The code fills operation_key and compacts derived turn ids of the
-- converted rows right after this runs.
DROP VIEW event_log;
CREATE TABLE commits_v3 (
    first_seq          INTEGER PRIMARY KEY,
    last_seq           INTEGER NOT NULL,
    commit_id          BLOB,
    operation_id       TEXT    NOT NULL,
    operation_key      INTEGER NOT NULL,
    operation_hash     BLOB    NOT NULL,
    turn_id            TEXT,
    writer_generation  INTEGER NOT NULL,
    created_at         INTEGER NOT NULL,
    row_hash           BLOB
);
INSERT INTO commits_v3 (first_seq, last_seq, commit_id, operation_id, operation_key,
                        operation_hash, turn_id, writer_generation, created_at, row_hash)
SELECT first_seq, last_seq,
       CASE WHEN typeof(commit_id) = 'text' AND length(commit_id) % 2 = 0
                 AND commit_id <> '' AND commit_id NOT GLOB '*[^0-9a-f]*'
            THEN unhex(commit_id) ELSE commit_id END,
       operation_id, 0,
       CASE WHEN typeof(operation_hash) = 'text' AND length(operation_hash) % 2 = 0
                 AND operation_hash <> '' AND operation_hash NOT GLOB '*[^0-9a-f]*'
            THEN unhex(operation_hash) ELSE operation_hash END,
       turn_id, writer_generation, created_at,
       CASE WHEN typeof(row_hash) = 'text' AND length(row_hash) % 2 = 0
                 AND row_hash <> '' AND row_hash NOT GLOB '*[^0-9a-f]*'
            THEN unhex(row_hash) ELSE row_hash END
FROM commits;
DROP TABLE commits;
ALTER TABLE commits_v3 RENAME TO commits;
CREATE INDEX commits_by_operation ON commits (operation_key);

-- For people with the sqlite3 shell: the commits with ids and digests in hex.
CREATE VIEW commit_log AS
SELECT first_seq, last_seq,
       CASE WHEN commit_id IS NULL THEN lower(hex(row_hash))
            WHEN typeof(commit_id) = 'blob' THEN lower(hex(commit_id))
            ELSE commit_id END AS commit_id,
       operation_id,
       CASE WHEN typeof(operation_hash) = 'blob' THEN lower(hex(operation_hash))
            ELSE operation_hash END AS operation_hash,
       CASE WHEN turn_id = '' THEN '<derived from the operation id>' ELSE turn_id END AS turn_id,
       writer_generation, datetime(created_at / 1000, 'unixepoch') AS created,
       lower(hex(row_hash)) AS row_hash
FROM commits;

-- body: where the payload lives. inline | blob <digest> (a payload over 64 KiB) |
-- inline, N parts in blobs.
CREATE VIEW event_log AS
SELECT e.seq, coalesce(e.event_id, c.commit_id || '.' || (e.seq - c.first_seq)) AS event_id,
       c.turn_id, e.kind, e.optional,
       CASE WHEN e.payload_ref IS NOT NULL THEN 'blob ' || e.payload_ref
            WHEN e.payload_parts IS NOT NULL
            THEN 'inline, ' || json_array_length(e.payload_parts) || ' parts in blobs'
            ELSE 'inline' END AS body,
       CASE WHEN e.payload_ref IS NOT NULL THEN '<blob ' || e.payload_ref || '>'
            ELSE substr(e.payload, 1, 200) END AS payload_summary,
       c.operation_id, c.created
FROM events e JOIN commit_log c ON e.seq BETWEEN c.first_seq AND c.last_seq;
