//! The JSON API under `/api/`: the same data as the pages, from the same loaders;
//! failures answer `{"error": …, "status": …}`.

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use session_store::{CatalogTotals, SearchPage, SessionStats};

use super::App;
use super::data::{self, Params, SessionDetail, SessionList, Transcript};
use super::held;
use super::problem::{ApiError, Problem};
use super::tree::{self, ForkTree};

/// A request's query parameters as given, in order, to check against those its address
/// takes ([`only`]).
type Given = Query<Vec<(String, String)>>;

/// Refuses a query parameter this address does not take, naming it and those it takes
/// (status 400): a misspelt filter (`rol=tool`) or one of another address or of the CLI
/// (`sort`, `title`, `since` on `/api/sessions`) answered the unfiltered page as if it had
/// been applied (outside testing, session 43). `token`, the access token, goes anywhere.
fn only(given: &[(String, String)], takes: &[&str]) -> Result<(), Problem> {
    let Some((unknown, _)) = given
        .iter()
        .find(|(name, _)| name != "token" && !takes.contains(&name.as_str()))
    else {
        return Ok(());
    };
    let takes = match takes {
        [] => "takes none".to_owned(),
        _ => format!("takes {}", takes.join(", ")),
    };
    Err(Problem::bad_request(format!(
        "unknown query parameter {unknown:?}: this address {takes}"
    )))
}

/// `GET /api/sessions?cwd=&origin=&cursor=&limit=`: a page of sessions, newest first.
pub async fn sessions(
    State(app): State<App>,
    Query(given): Given,
    Query(params): Query<Params>,
) -> Result<Json<SessionList>, ApiError> {
    only(&given, &["cwd", "origin", "cursor", "limit"])?;
    Ok(Json(data::sessions(&app, &params).await?))
}

/// `GET /api/search?q=&cwd=&role=&since=&session=&cursor=&limit=`: a page of full-text
/// hits.
pub async fn search(
    State(app): State<App>,
    Query(given): Given,
    Query(params): Query<Params>,
) -> Result<Json<SearchPage>, ApiError> {
    // `origin` is refused by the search itself, saying what search takes instead.
    let given: Vec<(String, String)> = given.into_iter().filter(|(n, _)| n != "origin").collect();
    only(
        &given,
        &["q", "cwd", "role", "since", "session", "cursor", "limit"],
    )?;
    Ok(Json(data::search(&app, &params).await?))
}

/// `GET /api/sessions/{id}`: header, lineage, catalog entry, writer.
pub async fn session(
    State(app): State<App>,
    Path(id): Path<String>,
    Query(given): Given,
) -> Result<Json<SessionDetail>, ApiError> {
    only(&given, &[])?;
    Ok(Json(data::session(&app, data::session_id(&id)?).await?))
}

/// `GET /api/sessions/{id}/history?cursor=&at=&after=&limit=`: a page of the transcript
/// and its turns.
pub async fn history(
    State(app): State<App>,
    Path(id): Path<String>,
    Query(given): Given,
    Query(params): Query<Params>,
) -> Result<Json<Transcript>, ApiError> {
    only(&given, &["cursor", "at", "after", "limit"])?;
    Ok(Json(
        data::history(&app, data::session_id(&id)?, &params).await?,
    ))
}

/// `GET /api/sessions/{id}/tree`: ancestors, siblings and descendants.
pub async fn tree(
    State(app): State<App>,
    Path(id): Path<String>,
    Query(given): Given,
) -> Result<Json<ForkTree>, ApiError> {
    only(&given, &[])?;
    Ok(Json(tree::tree(&app, data::session_id(&id)?).await?))
}

/// `GET /api/stats`: totals over the root's catalog.
pub async fn root_stats(
    State(app): State<App>,
    Query(given): Given,
) -> Result<Json<CatalogTotals>, ApiError> {
    only(&given, &[])?;
    Ok(Json(data::root_stats(&app).await?))
}

/// `GET /api/sessions/{id}/stats`: bytes by kind, blobs, tables, usage.
pub async fn stats(
    State(app): State<App>,
    Path(id): Path<String>,
    Query(given): Given,
) -> Result<Json<SessionStats>, ApiError> {
    only(&given, &[])?;
    Ok(Json(data::stats(&app, data::session_id(&id)?).await?))
}

/// `GET /api/sessions/{id}/content/{digest}`: the bytes of blob `digest` of session `id`
/// (both validated first), as plain text (never rendered as a page: `nosniff` is set on
/// every answer).
pub async fn content(
    State(app): State<App>,
    Path((id, digest)): Path<(String, String)>,
    Query(given): Given,
) -> Result<Response, ApiError> {
    only(&given, &[])?;
    let id = data::session_id(&id)?;
    let digest = data::digest(&digest)?;
    let (bytes, place) = data::content(&app, id, digest).await?;
    Ok((
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        held::body(bytes, place),
    )
        .into_response())
}

/// Any other address under `/api/`.
pub async fn not_found() -> ApiError {
    ApiError(Problem::not_found("no API route at this address"))
}
