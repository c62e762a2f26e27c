//! The HTML routes: each validates its path and query, loads through [`data`] and renders
//! a template; failures answer with a small HTML error page.

use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{Html, IntoResponse, Response};

use super::App;
use super::data::{self, Params};
use super::problem::{PageError, Problem};
use super::{held, templates, transcript, tree};

/// `GET /`: the sessions list, or the hits of `q`.
pub async fn sessions(
    State(app): State<App>,
    Query(params): Query<Params>,
) -> Result<Response, PageError> {
    if params.query().is_some() {
        return Ok(match data::search(&app, &params).await {
            Ok(page) => templates::search_page(&page, &params).into_response(),
            // A malformed query, or a `session` filter naming no session: the reason, above
            // the search box holding it.
            Err(p) if p.status == StatusCode::BAD_REQUEST || p.status == StatusCode::NOT_FOUND => {
                (p.status, templates::search_refused(&p.message, &params)).into_response()
            }
            Err(p) => return Err(p.into()),
        });
    }
    let list = data::sessions(&app, &params).await?;
    Ok(templates::sessions_page(&list, &params).into_response())
}

/// `GET /sessions/{id}`: header, lineage and a page of the transcript.
pub async fn session(
    State(app): State<App>,
    Path(id): Path<String>,
    Query(params): Query<Params>,
) -> Result<Html<String>, PageError> {
    let id = data::session_id(&id)?;
    let detail = data::session(&app, id.clone()).await?;
    let transcript = data::history(&app, id, &params).await?;
    Ok(transcript::session_page(&detail, &transcript, &params))
}

/// `GET /sessions/{id}/tree`: the fork tree.
pub async fn tree(
    State(app): State<App>,
    Path(id): Path<String>,
) -> Result<Html<String>, PageError> {
    let tree = tree::tree(&app, data::session_id(&id)?).await?;
    Ok(templates::tree_page(&tree))
}

/// `GET /sessions/{id}/stats`: storage statistics as charts.
pub async fn stats(
    State(app): State<App>,
    Path(id): Path<String>,
) -> Result<Html<String>, PageError> {
    let stats = data::stats(&app, data::session_id(&id)?).await?;
    Ok(templates::stats_page(&stats))
}

/// `GET /stats`: totals over the root's catalog as charts.
pub async fn root_stats(State(app): State<App>) -> Result<Html<String>, PageError> {
    Ok(templates::root_stats_page(&data::root_stats(&app).await?))
}

/// `GET /sessions/{id}/content/{digest}`: a large message stored as a blob, followed from
/// a session page, shown as that page shows a message (its bytes are the API's
/// `/api/sessions/{id}/content/{digest}`).
pub async fn content(
    State(app): State<App>,
    Path((id, digest)): Path<(String, String)>,
) -> Result<Response, PageError> {
    let id = data::session_id(&id)?;
    let digest = data::digest(&digest)?;
    let (bytes, place) = data::content(&app, id.clone(), digest.clone()).await?;
    let Html(page) = transcript::content_page(&id, &digest, &bytes);
    drop(bytes);
    Ok((
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        held::body(page, place),
    )
        .into_response())
}

/// Any other address.
pub async fn not_found() -> PageError {
    PageError(Problem::not_found("no page at this address"))
}
