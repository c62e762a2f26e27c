-- session-store schema version 3: the lean store.

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

-- body: where the payload lives. inline | blob <digest> (a payload over 64 KiB) |
-- inline, N parts in blobs.
DROP VIEW event_log;
CREATE VIEW event_log AS
SELECT e.seq, c.turn_id, e.kind, e.optional,
       CASE WHEN e.payload_ref IS NOT NULL THEN 'blob ' || e.payload_ref
            WHEN e.payload_parts IS NOT NULL
            THEN 'inline, ' || json_array_length(e.payload_parts) || ' parts in blobs'
            ELSE 'inline' END AS body,
       CASE WHEN e.payload_ref IS NOT NULL THEN '<blob ' || e.payload_ref || '>'
            ELSE substr(e.payload, 1, 200) END AS payload_summary,
       c.operation_id, datetime(c.created_at / 1000, 'unixepoch') AS created
FROM events e JOIN commits c ON e.seq BETWEEN c.first_seq AND c.last_seq;

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
