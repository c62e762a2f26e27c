//! Blob encoding: zstd when it pays, verified on every read.

use crate::error::{Error, Result};
use crate::format::MAX_PAYLOAD_BYTES;
use crate::model::event::{INLINE_PAYLOAD_LIMIT, sha256_hex};

/// zstd level for blobs: level 1 saves most of what higher levels do on JSON, fast.
const ZSTD_LEVEL: i32 = 1;

/// What a blob row is read as, which bounds what it may hold: a reader decompresses no
/// more than that, whatever the row says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Holds {
    /// A whole payload, or a blob asked for by digest: up to [`MAX_PAYLOAD_BYTES`].
    Any,
    /// A content part: a string value of a payload stored inline, which is at most
    /// [`INLINE_PAYLOAD_LIMIT`] long (a longer payload is stored whole).
    Part,
}

impl Holds {
    /// The most such a blob holds, and what it is called in an error.
    fn limit(self) -> (u64, &'static str) {
        match self {
            Holds::Any => (MAX_PAYLOAD_BYTES, "a blob"),
            Holds::Part => (INLINE_PAYLOAD_LIMIT as u64, "a content part"),
        }
    }
}

/// A zstd blob declaring more bytes than this is checked against its digest as it is
/// decompressed, into nothing but the hash, before it is decompressed into memory: a
/// frame of a few kilobytes declaring 800 MB (within [`MAX_PAYLOAD_BYTES`]) planted in a
/// file made every read of it fill 800 MB before the digest refused it, four requests
/// to `serve` at once 3 GB (outside testing H1, session 41). A sound blob this large is
/// decompressed twice (and hashed once, as before).
const VERIFY_FIRST_BYTES: u64 = 8 << 20;

/// Large zstd blobs this process found damaged, by their digest and the XXH3-128 of their
/// stored frame (the last [`REFUSED_KEPT`]): a frame decompresses to the same bytes every
/// time, so the verdict is refused again at once. A planted frame of 25 KB declaring 800 MB
/// cost about 0.75 s of CPU at each check, several checks per command and per `serve` page
/// (7.3 s a page; outside testing H1, session 41).
static REFUSED: std::sync::Mutex<std::collections::VecDeque<((String, u128), Error)>> =
    std::sync::Mutex::new(std::collections::VecDeque::new());
/// How many refused large blobs [`REFUSED`] remembers.
const REFUSED_KEPT: usize = 64;

/// [`check_streamed`], its refusal remembered in [`REFUSED`] and given again at once.
fn check_streamed_once(digest: &str, bytes: u64, data: &[u8]) -> Result<()> {
    let key = (digest.to_owned(), xxhash_rust::xxh3::xxh3_128(data));
    let refused = || REFUSED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, e)) = refused().iter().find(|(k, _)| *k == key) {
        return Err(e.clone());
    }
    let checked = check_streamed(digest, bytes, data);
    if let Err(e) = &checked {
        let mut kept = refused();
        if kept.len() == REFUSED_KEPT {
            kept.pop_front();
        }
        kept.push_back((key, e.clone()));
    }
    checked
}

/// Decompresses the zstd frame `data` through SHA-256 in pieces of a fixed size and
/// checks that it holds exactly `bytes` bytes of `digest`.
fn check_streamed(digest: &str, bytes: u64, data: &[u8]) -> Result<()> {
    use sha2::Digest;
    use std::io::Read;
    let corrupt = |e| undecompressed(digest, bytes, e);
    let mut decoder = zstd::stream::read::Decoder::with_buffer(data).map_err(corrupt)?;
    let mut hasher = sha2::Sha256::new();
    let mut piece = vec![0u8; 1 << 16];
    let mut total = 0u64;
    loop {
        let n = decoder.read(&mut piece).map_err(corrupt)?;
        if n == 0 {
            break;
        }
        total += n as u64;
        if total > bytes {
            break;
        }
        hasher.update(&piece[..n]);
    }
    if total != bytes || crate::model::ids::lower_hex(&hasher.finalize()) != digest {
        return Err(mismatched(digest));
    }
    Ok(())
}

/// A blob whose data does not decompress into the `bytes` its row declares; or, when the
/// buffer for them could not be allocated, the process's want of memory, not the blob's
/// fault (outside testing, resource limits: under `ulimit -v` a sound session was called
/// corrupt by `verify`, `export` and `import`, exit 6).
fn undecompressed(digest: &str, bytes: u64, cause: std::io::Error) -> Error {
    if cause.kind() == std::io::ErrorKind::OutOfMemory {
        return Error::io(format!("decompress blob {digest} ({bytes} bytes)"), cause);
    }
    Error::corrupt_from(
        format!("blob {digest} does not decompress into the {bytes} bytes its row declares"),
        cause,
    )
}

/// A blob whose content is not what its digest names.
fn mismatched(digest: &str) -> Error {
    Error::corrupt(format!("blob {digest} does not match its digest"))
}

/// Compresses raw bytes when that saves at least an eighth: `(encoding, data)`.
pub(crate) fn encode(raw: &[u8]) -> (&'static str, Vec<u8>) {
    match zstd::bulk::compress(raw, ZSTD_LEVEL) {
        Ok(c) if c.len() < raw.len() - raw.len() / 8 => ("zstd", c),
        _ => ("identity", raw.to_vec()),
    }
}

/// Decodes a stored blob read as `holds` and checks its size and digest.
///
/// # Errors
/// [`Error::Corrupt`] when the row declares more bytes than such a blob holds, the
/// encoding is unknown, a zstd frame does not declare its size or declares another one
/// than `bytes`, the data does not decompress within it, or the digest does not match.
pub(crate) fn decode(
    digest: &str,
    bytes: u64,
    encoding: &str,
    data: Vec<u8>,
    holds: Holds,
) -> Result<Vec<u8>> {
    let (limit, what) = holds.limit();
    if bytes > limit {
        return Err(Error::corrupt(format!(
            "blob {digest} claims {bytes} bytes, more than the {limit} {what} may hold"
        )));
    }
    // Whether the digest was checked while decompressing (the same frame decompresses
    // to the same bytes again).
    let mut hashed = false;
    let raw = match encoding {
        "identity" => data,
        "zstd" => {
            // The frame's header says how much it holds (`encode` always writes it): a row
            // declaring another size, or a frame that does not say, is refused before a
            // buffer of the declared size is made and filled (zstd said "Destination
            // buffer is too small" before, or the digest did not match after up to
            // 900 MB were decompressed from a few kilobytes).
            match zstd::zstd_safe::get_frame_content_size(&data) {
                Ok(Some(size)) if size == bytes => {}
                Ok(Some(size)) => {
                    return Err(Error::corrupt(format!(
                        "blob {digest} decompresses to {size} bytes, not the {bytes} its row \
                         declares"
                    )));
                }
                Ok(None) | Err(_) => {
                    return Err(Error::corrupt(format!(
                        "blob {digest} is no zstd frame that declares its size (this store \
                         writes only such frames)"
                    )));
                }
            }
            if bytes > VERIFY_FIRST_BYTES {
                check_streamed_once(digest, bytes, &data)?;
                hashed = true;
            }
            zstd::bulk::decompress(&data, bytes as usize)
                .map_err(|e| undecompressed(digest, bytes, e))?
        }
        other => {
            return Err(Error::corrupt(format!(
                "blob {digest} has encoding {}",
                crate::error::quoted(other)
            )));
        }
    };
    if raw.len() as u64 != bytes || (!hashed && sha256_hex(&raw) != digest) {
        return Err(mismatched(digest));
    }
    Ok(raw)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A buffer that could not be allocated (zstd's `OutOfMemory`, under `ulimit -v`) is the
    /// process's want of memory, not a corrupt blob: `verify` called a sound session
    /// corrupt, exit 6 (outside testing, resource limits).
    #[test]
    fn a_buffer_that_cannot_be_allocated_is_no_corrupt_blob() {
        let want = std::io::Error::new(
            std::io::ErrorKind::OutOfMemory,
            "could not allocate a buffer of 30000095 bytes",
        );
        let e = undecompressed("ab", 30_000_095, want);
        assert!(!e.is_corrupt(), "{e}");
        assert!(e.is_exhaustion(), "{e}");
        let damaged = undecompressed("ab", 3, std::io::Error::other("Unknown frame descriptor"));
        assert!(damaged.is_corrupt(), "{damaged}");
    }

    #[test]
    fn round_trip_and_tamper() {
        let raw = "abc".repeat(30_000).into_bytes();
        let digest = sha256_hex(&raw);
        let (encoding, data) = encode(&raw);
        assert_eq!(encoding, "zstd");
        assert!(data.len() < raw.len() / 10);
        assert_eq!(
            decode(&digest, raw.len() as u64, encoding, data, Holds::Any).unwrap(),
            raw
        );
        let mut bad = raw.clone();
        bad[7] ^= 1;
        assert!(decode(&digest, raw.len() as u64, "identity", bad, Holds::Any).is_err());
        // A row declaring fewer or more bytes than the frame holds: refused naming both
        // sizes, not with zstd's "Destination buffer is too small".
        let (_, data) = encode(&raw);
        for declared in [1_000, raw.len() as u64 + 1, 800_000_000] {
            let e = decode(&digest, declared, "zstd", data.clone(), Holds::Any).unwrap_err();
            assert!(e.is_corrupt(), "{e:?}");
            assert_eq!(
                e.to_string(),
                format!(
                    "corrupt session store: blob {digest} decompresses to {} bytes, not the \
                     {declared} its row declares",
                    raw.len()
                )
            );
        }
        let random: Vec<u8> = (0..100_000).map(|_| fastrand::u8(..)).collect();
        assert_eq!(encode(&random).0, "identity");
    }

    /// A large frame that does not hold its digest's bytes is refused again from memory,
    /// with the same error, without decompressing it again; a sound one is decoded each
    /// time and not remembered.
    #[test]
    fn a_refused_large_blob_is_remembered_and_a_sound_one_is_not() {
        let raw = vec![0u8; (VERIFY_FIRST_BYTES + 1_000) as usize];
        let (encoding, data) = encode(&raw);
        assert_eq!(encoding, "zstd");
        let key = xxhash_rust::xxh3::xxh3_128(&data);
        let known = |digest: &str| {
            REFUSED
                .lock()
                .unwrap()
                .iter()
                .any(|((d, k), _)| d == digest && *k == key)
        };
        let wrong = sha256_hex(b"something else");
        let first = decode(&wrong, raw.len() as u64, "zstd", data.clone(), Holds::Any).unwrap_err();
        assert!(known(&wrong));
        let again = decode(&wrong, raw.len() as u64, "zstd", data.clone(), Holds::Any).unwrap_err();
        assert_eq!(again.to_string(), first.to_string());
        assert!(again.is_corrupt(), "{again:?}");
        let right = sha256_hex(&raw);
        for _ in 0..2 {
            let decoded = decode(&right, raw.len() as u64, "zstd", data.clone(), Holds::Any);
            assert_eq!(decoded.unwrap().len(), raw.len());
        }
        assert!(!known(&right));
    }
}
