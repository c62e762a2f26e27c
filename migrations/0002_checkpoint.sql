-- session-store schema version 2: a projection checkpoint, so opening a session folds
-- only the commits after it. Derived data: a missing or unreadable checkpoint only makes
-- the next open replay the whole log.
CREATE TABLE checkpoint (
    singleton    INTEGER PRIMARY KEY CHECK (singleton = 1),
    through_seq  INTEGER NOT NULL,          -- the projection folds every event up to here
    projection   TEXT    NOT NULL           -- JSON
);
