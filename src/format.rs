//! The on-disk layout of a root, for tools that work beside the library (a replicator's
//! configuration, a backup script, `du`): the names of the files and folders the store
//! keeps. Read and write their content only through the library.
//!
//! ```text
//! <root>/<id>/session.sqlite        SESSION_FILE (and WAL_FILE beside it)
//! <root>/.catalog/catalog.sqlite    CATALOG_DIR / CATALOG_FILE
//! ```

pub use crate::persistence::{CATALOG_DIR, CATALOG_FILE};
pub use crate::store::schema::{SESSION_FILE, WAL_FILE};
