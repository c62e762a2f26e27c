-- session-store schema version 8: the checkpoint's columns in the order an opener reads
-- them, the transcript index last. Readable by sqlite3 >= 3.38 like the versions before.
--
-- SQLite stores a row's columns one after the other, so a value behind a large one is
-- reached by walking that value's overflow pages. In versions 4-7 the operation filter
-- came after the transcript index (20 bytes per message): an opener of a 100,000-message
-- session read the index's 2 MB of pages twice, once for the index and again on the way
-- to the filter. Derived data, so the one row is copied as it is; its digest and the
-- filter's check do not depend on the column order.
CREATE TABLE checkpoint_v8 (
    singleton         INTEGER PRIMARY KEY CHECK (singleton = 1),
    through_seq       INTEGER NOT NULL,     -- the projection folds every event up to here
    digest            TEXT    NOT NULL,     -- XXH3-128 of through_seq, projection, message_ids
    projection        TEXT    NOT NULL,     -- JSON: small state, the workset by reference
    operation_filter  BLOB,                 -- the operation ids' filter and its check
    message_ids       BLOB                  -- the transcript index
);
INSERT INTO checkpoint_v8 (singleton, through_seq, digest, projection, operation_filter, message_ids)
    SELECT singleton, through_seq, digest, projection, operation_filter, message_ids FROM checkpoint;
DROP TABLE checkpoint;
ALTER TABLE checkpoint_v8 RENAME TO checkpoint;
