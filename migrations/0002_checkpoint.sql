-- session-store schema version 2: a projection checkpoint, so opening a session folds
-- only the commits after it. Derived data: a missing or unreadable checkpoint only makes
-- the next open replay the whole log.
CREATE TABLE checkpoint (
    singleton    INTEGER PRIMARY KEY CHECK (singleton = 1),
    through_seq  INTEGER NOT NULL,          -- the projection folds every event up to here
    projection   TEXT    NOT NULL,          -- JSON
    digest       TEXT    NOT NULL           -- SHA-256 of through_seq and projection
);

-- SHA-256 over a commit row's identity (commit id, operation id and hash, sequences, turn,
-- generation, time): an edited row is refused on read. NULL for rows of version-1 files.
ALTER TABLE commits ADD COLUMN row_hash TEXT;

-- The history index: one row per transcript change, written with the events, so a page
-- of history is a keyset read (O(page)). A row names the event that put the message at
-- its position; the message itself is read from that event's payload (`item` indexes
-- the payload's `messages` array for a replacement). Resets obsolete earlier rows.
CREATE TABLE history (
    position    INTEGER NOT NULL,
    event_seq   INTEGER NOT NULL,
    item        INTEGER,
    message_id  TEXT    NOT NULL,
    role        TEXT,
    bytes       INTEGER NOT NULL,           -- size of the message JSON
    PRIMARY KEY (position, event_seq)
) WITHOUT ROWID;

CREATE TABLE history_resets (
    seq  INTEGER PRIMARY KEY
);

-- The unused first draft of the history index.
DROP TABLE messages;
