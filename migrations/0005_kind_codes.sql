-- session-store schema version 5: kinds as codes, messages stored bare. Readable by
-- sqlite3 >= 3.38 like the versions before it. Nothing is rewritten: rows written before
-- keep their text kinds and whole payloads, and readers take both forms.
--
-- events.kind: a kind the projection knows is a one-byte BLOB code (event_kinds below),
-- any other kind its text. A BLOB never equals a TEXT, so a code is never taken for a
-- caller's kind named '0'.
-- events.payload of a coded message/complete or message/upsert (event_kinds.bare = 1):
-- the message object alone, without the {"message":…} around it (readers put it back:
-- the payload read is the one written, byte for byte). A message payload of another form
-- or stored as a whole blob keeps its text kind and its payload as written.
-- For people: event_kinds lists the codes (a view, so that it takes no page of its own
-- in every file), event_log shows every kind as text and the whole payload's start, and
-- transcript finds messages in both forms.
CREATE VIEW event_kinds (code, kind, bare) AS VALUES
    (x'00', 'message/complete', 1),
    (x'01', 'tool/result', 0),
    (x'02', 'turn/start', 0),
    (x'03', 'turn/end', 0),
    (x'04', 'tool/start', 0),
    (x'05', 'tool/call', 0),
    (x'06', 'message/upsert', 1),
    (x'07', 'step/start', 0),
    (x'08', 'step/end', 0),
    (x'09', 'session/title', 0),
    (x'0a', 'usage', 0),
    (x'0b', 'assistant/attempt', 0),
    (x'0c', 'history/replace', 0),
    (x'0d', 'model/context-replace', 0),
    (x'0e', 'compaction', 0),
    (x'0f', 'legacy/import', 0),
    (x'10', 'session/config', 0),
    (x'11', 'todo/write', 0),
    (x'12', 'interaction/created', 0),
    (x'13', 'interaction/resolved', 0),
    (x'14', 'runtime/recovery', 0),
    (x'15', 'plan/state', 0),
    (x'16', 'goal/state', 0),
    (x'17', 'diagnostic', 0);

DROP VIEW event_log;
CREATE VIEW event_log AS
SELECT e.seq, coalesce(e.event_id, c.commit_id || '.' || (e.seq - c.first_seq)) AS event_id,
       c.turn_id, coalesce(k.kind, e.kind) AS kind, e.optional,
       CASE WHEN e.payload_ref IS NOT NULL THEN 'blob ' || e.payload_ref
            WHEN e.payload_parts IS NOT NULL
            THEN 'inline, ' || json_array_length(e.payload_parts) || ' parts in blobs'
            ELSE 'inline' END AS body,
       CASE WHEN e.payload_ref IS NOT NULL THEN '<blob ' || e.payload_ref || '>'
            WHEN k.bare = 1 THEN substr('{"message":' || e.payload || '}', 1, 200)
            ELSE substr(e.payload, 1, 200) END AS payload_summary,
       c.operation_id, c.created
FROM events e JOIN commit_log c ON e.seq BETWEEN c.first_seq AND c.last_seq
     LEFT JOIN event_kinds k ON k.code = e.kind;

DROP VIEW transcript;
CREATE VIEW transcript AS
SELECT m.seq,
       json_extract(m.message, '$.id')   AS message_id,
       json_extract(m.message, '$.role') AS role,
       CASE WHEN m.payload_ref IS NOT NULL THEN 'blob ' || m.payload_ref
            WHEN m.payload_parts IS NOT NULL
                 AND json_extract(m.message, '$.content') LIKE 'sse-blob:%'
            THEN 'part ' || substr(json_extract(m.message, '$.content'), 10)
            ELSE 'inline' END AS content_in,
       CASE WHEN m.payload_ref IS NOT NULL THEN '<blob ' || m.payload_ref || '>'
            ELSE substr(json_extract(m.message, '$.content'), 1, 200) END AS content_preview
FROM (SELECT e.seq, e.payload_ref, e.payload_parts,
             CASE WHEN typeof(e.kind) = 'blob' THEN e.payload
                  ELSE json_extract(e.payload, '$.message') END AS message
      FROM events e
      WHERE e.kind IN ('message/complete', 'message/upsert', x'00', x'06')) m;
