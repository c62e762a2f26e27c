-- session-store schema version 1. Readable by sqlite3 >= 3.38 (JSON as TEXT, no STRICT,
-- no JSONB). The application_id pragma is set by the code before this runs.

-- One row: who this session is.
CREATE TABLE header (
    singleton   INTEGER PRIMARY KEY CHECK (singleton = 1),
    session_id  TEXT    NOT NULL,
    codec       TEXT    NOT NULL,
    created_at  INTEGER NOT NULL,          -- ms since the Unix epoch
    cwd         TEXT,
    parent_id   TEXT,
    origin      TEXT    NOT NULL,          -- new | fork | rewind | canonical-import | legacy-import
    provenance  TEXT,                      -- JSON, e.g. the legacy source of a migration
    inherited_events INTEGER NOT NULL DEFAULT 0  -- the fork cut, kept after materialisation
);

-- The inherited prefix of a fork, flattened: ancestor files and the range each supplies,
-- events with seq in (after_seq, through_seq]. Sequences no row covers are in this file.
-- Empty for roots and exports.
CREATE TABLE lineage (
    depth        INTEGER PRIMARY KEY,      -- 0 = the oldest ancestor
    ancestor_id  TEXT    NOT NULL,
    after_seq    INTEGER NOT NULL,
    through_seq  INTEGER NOT NULL,
    CHECK (after_seq < through_seq)
);

-- Forks that inherit from this file, recorded before the child is published.
CREATE TABLE dependents (
    child_id     TEXT PRIMARY KEY,
    through_seq  INTEGER NOT NULL
);

-- One row per accepted batch (this session's own commits only).
CREATE TABLE commits (
    first_seq          INTEGER PRIMARY KEY,
    last_seq           INTEGER NOT NULL,
    commit_id          TEXT    NOT NULL,
    operation_id       TEXT    NOT NULL UNIQUE,
    operation_hash     TEXT    NOT NULL,
    turn_id            TEXT,
    writer_generation  INTEGER NOT NULL,
    created_at         INTEGER NOT NULL
);

-- Content-addressed payloads over 64 KiB, stored once per file.
CREATE TABLE blobs (
    digest    TEXT    PRIMARY KEY,         -- SHA-256 of the raw bytes, hex
    bytes     INTEGER NOT NULL,            -- size of the raw bytes
    encoding  TEXT    NOT NULL,            -- identity | zstd
    data      BLOB    NOT NULL
) WITHOUT ROWID;

-- The log. payload is JSON text (json_extract works on it); large payloads live in blobs.
-- event_id is NULL for ids derived from the commit (`<commit_id>.<index>`); the commit of
-- an event is the one whose [first_seq, last_seq] holds its seq.
CREATE TABLE events (
    seq          INTEGER PRIMARY KEY,
    event_id     TEXT,
    kind         TEXT    NOT NULL,
    optional     INTEGER NOT NULL DEFAULT 0,
    payload      TEXT,
    payload_ref  TEXT REFERENCES blobs (digest),
    CHECK (payload IS NULL OR payload_ref IS NULL)
);

-- Ended turns, written in the same transaction as the events that close them.
CREATE TABLE turns (
    start_seq     INTEGER PRIMARY KEY,
    turn_id       TEXT    NOT NULL,
    end_seq       INTEGER NOT NULL,
    boundary_seq  INTEGER NOT NULL,       -- last seq of the commit holding turn/end
    status        TEXT    NOT NULL,
    fork_safe     INTEGER NOT NULL,       -- no open turn / pending interaction at boundary_seq
    rewind_safe   INTEGER NOT NULL        -- none either at start_seq - 1, a commit boundary
);
CREATE INDEX turns_by_id ON turns (turn_id);

-- History index (filled by the query layer's migration; room reserved here).
CREATE TABLE messages (
    position        INTEGER NOT NULL,
    version         INTEGER NOT NULL,
    message_id      TEXT    NOT NULL,
    role            TEXT,
    preview         TEXT,
    event_seq       INTEGER NOT NULL,
    valid_to        INTEGER,
    inline          TEXT,
    content_digest  TEXT,
    PRIMARY KEY (message_id, version)
);

-- The single writer's lease. generation is the fencing token.
CREATE TABLE lease (
    singleton    INTEGER PRIMARY KEY CHECK (singleton = 1),
    owner_id     TEXT    NOT NULL,
    host_id      TEXT    NOT NULL,
    pid          INTEGER NOT NULL,
    generation   INTEGER NOT NULL,
    acquired_at  INTEGER NOT NULL
);

-- For people with the sqlite3 shell.
CREATE VIEW event_log AS
SELECT e.seq, c.turn_id, e.kind, e.optional,
       CASE WHEN e.payload_ref IS NOT NULL THEN '<blob ' || e.payload_ref || '>'
            ELSE substr(e.payload, 1, 200) END AS payload_summary,
       c.operation_id, datetime(c.created_at / 1000, 'unixepoch') AS created
FROM events e JOIN commits c ON e.seq BETWEEN c.first_seq AND c.last_seq;

-- Messages stored as blobs (over 64 KiB) show their digest instead of a preview.
CREATE VIEW transcript AS
SELECT e.seq,
       json_extract(e.payload, '$.message.id')   AS message_id,
       json_extract(e.payload, '$.message.role') AS role,
       CASE WHEN e.payload_ref IS NOT NULL THEN '<blob ' || e.payload_ref || '>'
            ELSE substr(json_extract(e.payload, '$.message.content'), 1, 200) END AS content_preview
FROM events e
WHERE e.kind IN ('message/complete', 'message/upsert');
