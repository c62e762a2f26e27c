-- session-store schema version 3: the lean store.

-- checkpoint by reference
-- The checkpoint holds the model workset by reference (event sequences) and the transcript
-- index (16 bytes per message) in message_ids; never message bodies. Version-2 checkpoints
-- copied the transcript: they are dropped (derived data; the next writer writes a new one).
ALTER TABLE checkpoint ADD COLUMN message_ids BLOB;
DELETE FROM checkpoint;
