//! Error answers: a status and a one-line reason, rendered as a small HTML page for the
//! browser routes and as `{"error": …}` for the JSON API.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use session_store::Error;

use super::templates;

/// Why a request failed, and the status it answers with.
#[derive(Debug)]
pub struct Problem {
    /// The HTTP status.
    pub status: StatusCode,
    /// What went wrong, in one line.
    pub message: String,
}

impl Problem {
    /// A request that cannot be served as asked (status 400).
    pub fn bad_request(message: impl Into<String>) -> Problem {
        Problem {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
        }
    }

    /// Nothing at this address (status 404).
    pub fn not_found(message: impl Into<String>) -> Problem {
        Problem {
            status: StatusCode::NOT_FOUND,
            message: message.into(),
        }
    }

    /// A library error, by its classifiers: not found 404, the caller's mistake 400,
    /// anything else 500.
    pub fn library(error: &Error) -> Problem {
        let status = if error.is_not_found() {
            StatusCode::NOT_FOUND
        } else if error.is_caller_error() {
            StatusCode::BAD_REQUEST
        } else {
            StatusCode::INTERNAL_SERVER_ERROR
        };
        Problem {
            status,
            message: crate::cli::one_line(error),
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
        let page = templates::error_page(self.0.status, &self.0.message);
        (self.0.status, page).into_response()
    }
}

/// A [`Problem`] answered as JSON: `{"error": "…", "status": 404}`.
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
        let body = serde_json::json!({
            "error": self.0.message,
            "status": self.0.status.as_u16(),
        });
        (self.0.status, axum::Json(body)).into_response()
    }
}
