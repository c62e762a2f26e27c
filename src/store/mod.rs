//! One session file: schema, lock, blobs, the writer (drain, checkpoints, close policy),
//! every SQL statement on a session file, and cold reads. Blocking code
//! on `rusqlite`.

pub(crate) mod blob;
pub(crate) mod checkpoint;
pub(crate) mod chunked;
pub(crate) mod content;
pub(crate) mod event_row;
pub(crate) mod folder_swap;
pub(crate) mod hit_files;
pub(crate) mod lineage;
pub(crate) mod lock;
pub(crate) mod operation_keys;
pub(crate) mod read;
pub(crate) mod read_pool;
pub(crate) mod reader;
pub(crate) mod row_check;
pub(crate) mod schema;
pub(crate) mod search;
pub(crate) mod stats;
pub(crate) mod write;
pub(crate) mod writer;
