//! Reads of a session that another process may delete meanwhile.
//!
//! A delete moves the session's folder into `.trash` and removes it, and first moves each
//! of its ranges into the files of its forks (ARCHITECTURE §8). A read that started before
//! then meets missing files: SQLite answers "disk I/O error" or "unable to open", a range
//! read from an ancestor finds no file. Those are neither the caller's fault nor
//! corruption: [`Root::read_settled`] tells them apart.

use crate::error::{Error, Result};
use crate::model::SessionId;
use crate::persistence::{Root, session_file_gone};
use crate::store::folder_swap::file_identity as identity;
use crate::store::reader::SessionReader;
use crate::store::schema::SESSION_FILE;

/// How many times a read is run when the layout under it changed each time.
const ATTEMPTS: usize = 5;

impl Root {
    /// Runs `read` on a fresh reader of `id`. When it fails and the session's file is gone
    /// meanwhile, the answer is [`Error::SessionNotFound`]; when the file was replaced (an
    /// import under the same id) or the session's lineage changed (an ancestor's delete
    /// moved its range into the session's own file), the read runs again on the new
    /// layout, up to 5 times. Any other failure is returned as it is.
    pub(crate) fn read_settled<T>(
        &self,
        id: &SessionId,
        read: impl Fn(&SessionReader) -> Result<T>,
    ) -> Result<T> {
        let dir = self.session_dir(id);
        let file = dir.join(SESSION_FILE);
        let mut attempt = 1;
        loop {
            let file_before = identity(&file);
            let mut lineage_before = None;
            let failure = match self.open_reader(id).and_then(|reader| {
                lineage_before = Some(reader.lineage());
                read(&reader)
            }) {
                Ok(value) => return Ok(value),
                // One of the files the read met (named by its path) was gone: the session
                // is what is not found when its own file went or changed meanwhile.
                Err(Error::SessionNotFound(what)) => {
                    let gone = file_before.is_none() || identity(&file) != file_before;
                    return Err(Error::SessionNotFound(if gone {
                        id.to_string()
                    } else {
                        what
                    }));
                }
                Err(e) => e,
            };
            let Some(file_now) = identity(&file) else {
                // Gone, or in a folder this process may not look into (the failure says so).
                return Err(if session_file_gone(&dir) {
                    Error::SessionNotFound(id.to_string())
                } else {
                    failure
                });
            };
            if attempt == ATTEMPTS {
                return Err(failure);
            }
            attempt += 1;
            if file_before == Some(file_now) {
                let lineage_now = match self.open_reader(id) {
                    Ok(reader) => reader.lineage(),
                    Err(Error::SessionNotFound(_)) => {
                        return Err(Error::SessionNotFound(id.to_string()));
                    }
                    // The second open failing too: a file that went or changed meanwhile
                    // is the race again, anything else is the read's own failure.
                    Err(_) => match identity(&file) {
                        None => return Err(Error::SessionNotFound(id.to_string())),
                        Some(again) if again != file_now => continue,
                        Some(_) => return Err(failure),
                    },
                };
                // An open that failed (an ancestor it names went away as it opened) and
                // now succeeds saw a lineage that has changed since.
                if lineage_before.is_some_and(|before| before == lineage_now) {
                    return Err(failure);
                }
            }
        }
    }
}
