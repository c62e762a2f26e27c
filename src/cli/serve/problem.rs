//! Error answers: a status and a one-line reason, rendered as a small HTML page for the
//! browser routes and as `{"error": …}` for the JSON API.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use session_store::{Error, SessionId};

use super::templates;

/// Why a request failed, and the status it answers with.
#[derive(Debug)]
pub struct Problem {
    /// The HTTP status.
    pub status: StatusCode,
    /// What went wrong, in one line.
    pub message: String,
    /// True when what failed is a stored file found damaged ([`Error::is_corrupt`]): the
    /// page says "Session damaged" and the JSON `"damaged": true`.
    pub damaged: bool,
    /// True when what failed is a stored file of a newer format than this build reads
    /// ([`Error::is_unsupported`]): the page says "Session of a newer version".
    pub newer: bool,
}

impl Problem {
    /// A problem answered with `status`.
    pub fn new(status: StatusCode, message: impl Into<String>) -> Problem {
        Problem {
            status,
            message: message.into(),
            damaged: false,
            newer: false,
        }
    }

    /// A request that cannot be served as asked (status 400).
    pub fn bad_request(message: impl Into<String>) -> Problem {
        Problem::new(StatusCode::BAD_REQUEST, message)
    }

    /// Nothing at this address (status 404).
    pub fn not_found(message: impl Into<String>) -> Problem {
        Problem::new(StatusCode::NOT_FOUND, message)
    }

    /// A library error, by its classifiers: not found 404, the caller's mistake 400, a
    /// retryable one (a file another process holds, a full disk) 503, anything else 500 (a
    /// damaged file too: the server cannot serve what it holds, and no other request would
    /// fare better). A search meeting the index another process fills said 500 for an
    /// error that says "try again" (the re-test of outside testing W1).
    pub fn library(error: &Error) -> Problem {
        let status = if error.is_not_found() {
            StatusCode::NOT_FOUND
        } else if error.is_caller_error() {
            StatusCode::BAD_REQUEST
        } else if error.is_retryable() {
            StatusCode::SERVICE_UNAVAILABLE
        } else {
            StatusCode::INTERNAL_SERVER_ERROR
        };
        Problem {
            damaged: error.is_corrupt(),
            newer: error.is_unsupported(),
            ..Problem::new(status, crate::cli::one_line(error))
        }
    }

    /// This problem, when it is a damage found reading session `id`, saying so: the
    /// session's name, that it is damaged, what the library found and how to check it; when
    /// it is a file of a newer format, the session's name and that a newer build reads it
    /// (it was "Internal Server Error" naming no session).
    pub fn of_damaged_session(self, id: &SessionId) -> Problem {
        let message = if self.damaged {
            format!(
                "session {id} is damaged and cannot be shown ({}); `session-store verify {id}` \
                 checks it",
                self.message
            )
        } else if self.newer {
            // The library's message says that a newer session-store reads it.
            format!(
                "session {id} cannot be shown by this build ({})",
                self.message
            )
        } else {
            return self;
        };
        Problem { message, ..self }
    }

    /// The title of the answer: the status's reason, "Session damaged" or "Session of a
    /// newer version".
    pub fn title(&self) -> &'static str {
        if self.damaged {
            "Session damaged"
        } else if self.newer {
            "Session of a newer version"
        } else {
            self.status.canonical_reason().unwrap_or("Error")
        }
    }
}

impl From<Error> for Problem {
    fn from(error: Error) -> Problem {
        Problem::library(&error)
    }
}

/// A [`Problem`] answered as an HTML page.
#[derive(Debug)]
pub struct PageError(pub Problem);

impl From<Problem> for PageError {
    fn from(problem: Problem) -> PageError {
        PageError(problem)
    }
}

impl From<Error> for PageError {
    fn from(error: Error) -> PageError {
        PageError(Problem::library(&error))
    }
}

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        let page = templates::error_page(&self.0);
        (self.0.status, page).into_response()
    }
}

/// A [`Problem`] answered as JSON: `{"error": "…", "status": 404}`, with `"damaged": true`
/// for a damaged session.
#[derive(Debug)]
pub struct ApiError(pub Problem);

impl From<Problem> for ApiError {
    fn from(problem: Problem) -> ApiError {
        ApiError(problem)
    }
}

impl From<Error> for ApiError {
    fn from(error: Error) -> ApiError {
        ApiError(Problem::library(&error))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = serde_json::json!({
            "error": self.0.message,
            "status": self.0.status.as_u16(),
        });
        if self.0.damaged {
            body["damaged"] = true.into();
        }
        (self.0.status, axum::Json(body)).into_response()
    }
}
