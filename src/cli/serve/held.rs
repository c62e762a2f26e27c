//! Answers that hold a content blob: at most [`CONTENT_ANSWERS`] at once, each sent in
//! pieces that hold the answer's place until the server has written them, so the blob and
//! its place are let go only once the client took the last piece (or the connection is
//! gone). Each request for a blob held the whole of it until its client read the answer,
//! without limit: twelve clients that asked for a 100 MB blob and stopped reading held
//! 1.2 GB (outside testing C3, session 41); and a place let go when the body had handed
//! over its last piece left 150 clients of a 3 MB blob holding 2.7 MB each (its pieces
//! waiting in the server's write buffers; the re-test, session 42).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use axum::http::StatusCode;
use http_body::{Frame, SizeHint};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::problem::Problem;

/// Content answers (a blob's page or its bytes) read or sent at once.
pub const CONTENT_ANSWERS: usize = 4;
/// How long a content request waits for a place before it is answered 503.
pub const CONTENT_WAIT: Duration = Duration::from_secs(10);
/// The piece of a held answer the server writes at a time.
const PIECE: usize = 64 << 10;

/// The places of content answers ([`CONTENT_ANSWERS`]).
pub fn places() -> Arc<Semaphore> {
    Arc::new(Semaphore::new(CONTENT_ANSWERS))
}

/// A place for one content answer, waited for [`CONTENT_WAIT`] at most.
///
/// # Errors
/// A 503 [`Problem`] when every place stayed taken (clients that do not read their large
/// answers).
pub async fn take_place(places: &Arc<Semaphore>) -> Result<OwnedSemaphorePermit, Problem> {
    match tokio::time::timeout(CONTENT_WAIT, places.clone().acquire_owned()).await {
        Ok(Ok(permit)) => Ok(permit),
        _ => Err(Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "{CONTENT_ANSWERS} large answers are being sent to clients that have not read \
                 them yet; try again later"
            ),
        )),
    }
}

/// A body of `data` in pieces of [`PIECE`], each holding `place` until it is written (or
/// dropped with the connection).
pub fn body(data: impl Into<Bytes>, place: OwnedSemaphorePermit) -> Body {
    Body::new(Held {
        data: data.into(),
        place: Arc::new(place),
    })
}

/// What [`body`] sends.
struct Held {
    data: Bytes,
    place: Arc<OwnedSemaphorePermit>,
}

/// One piece of a [`Held`] body: its bytes, and the answer's place.
struct Piece {
    bytes: Bytes,
    _place: Arc<OwnedSemaphorePermit>,
}

impl AsRef<[u8]> for Piece {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

impl HttpBody for Held {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if this.data.is_empty() {
            return Poll::Ready(None);
        }
        let bytes = this.data.split_to(PIECE.min(this.data.len()));
        let piece = Bytes::from_owner(Piece {
            bytes,
            _place: this.place.clone(),
        });
        Poll::Ready(Some(Ok(Frame::data(piece))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.data.len() as u64)
    }
}
