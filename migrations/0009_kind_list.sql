-- session-store schema version 9: the event_kinds view as one JSON list. Readable by
-- sqlite3 >= 3.38 like the versions before it. Nothing is rewritten.
--
-- SQLite parses a file's whole schema, views included, before a connection's first
-- statement, and the store opens connections to files it has not met often (a search
-- reads a page of hits back from up to ten of them). The VALUES list of version 5 is 24
-- SELECTs to SQLite's parser: an open plus one read of a file took about 19 us more with
-- it than without it. One SELECT over one string literal takes about 4 us more.
-- Same columns and rows as before: code (a one-byte BLOB, the kind's index in the list:
-- char() of a number below 128 is that one byte), kind, bare.
DROP VIEW event_kinds;
CREATE VIEW event_kinds (code, kind, bare) AS
SELECT CAST(char(key) AS BLOB), value ->> 0, value ->> 1
FROM json_each('[
    ["message/complete", 1],
    ["tool/result", 0],
    ["turn/start", 0],
    ["turn/end", 0],
    ["tool/start", 0],
    ["tool/call", 0],
    ["message/upsert", 1],
    ["step/start", 0],
    ["step/end", 0],
    ["session/title", 0],
    ["usage", 0],
    ["assistant/attempt", 0],
    ["history/replace", 0],
    ["model/context-replace", 0],
    ["compaction", 0],
    ["legacy/import", 0],
    ["session/config", 0],
    ["todo/write", 0],
    ["interaction/created", 0],
    ["interaction/resolved", 0],
    ["runtime/recovery", 0],
    ["plan/state", 0],
    ["goal/state", 0],
    ["diagnostic", 0]
]');
