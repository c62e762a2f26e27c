//! `serve`: a read-only HTTP browser over a root, on axum and tokio. It uses only the
//! public library API (`Root`, `SessionQuery`, `SessionReader`): it never takes a writer
//! lock and shows the durable prefix of sessions that writers are appending to.
//!
//! Modules: [`data`] loads what a page shows (validating ids first) and [`tree`] a fork
//! tree, [`templates`],
//! [`transcript`] and [`svg`] render it, [`pages`] and [`api`] are the HTML and JSON
//! routes, [`guard`] checks the host and token and sets the security headers,
//! [`assets`] serves the stylesheet, [`problem`] renders errors, [`links`] builds URLs,
//! [`held`] bounds and sends the answers that hold a large blob.

mod api;
mod assets;
mod data;
mod guard;
mod held;
mod links;
mod listen;
mod pages;
mod problem;
mod svg;
mod templates;
mod transcript;
mod tree;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::Router;
use axum::http::Uri;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use session_store::{Root, SessionQuery};

use super::{CliResult, Context, EXIT_OTHER, Failure, print_json};

/// Where `serve` listens unless `--addr` says otherwise.
pub const DEFAULT_ADDR: &str = "127.0.0.1:8765";

/// Worker threads of the server's runtime (storage work runs on its blocking pool).
const WORKERS: usize = 2;

/// Whether `count` threads can run at once now, each started and ended again. tokio's
/// runtime panics when it cannot start a worker, and the server then hung without a word,
/// serving nothing (outside testing, resource limits: `ulimit -u` of a few threads). The
/// storage threads are started as requests need them, and one that cannot start is an
/// error of that request.
fn threads_can_start(count: usize) -> std::io::Result<()> {
    let mut started = Vec::with_capacity(count);
    let mut failed = None;
    for _ in 0..count {
        let (stop, wait) = std::sync::mpsc::channel::<()>();
        match std::thread::Builder::new().spawn(move || {
            let _ = wait.recv();
        }) {
            Ok(thread) => started.push((stop, thread)),
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    for (stop, thread) in started {
        drop(stop);
        let _ = thread.join();
    }
    failed.map_or(Ok(()), Err)
}

/// Threads of the runtime's blocking pool, where every request's storage work runs (tokio's
/// default is 512): concurrent requests beyond it queue for a thread, so the server's
/// threads and the memory its reads hold stay bounded however many clients ask at once.
const STORAGE_THREADS: usize = 8;

/// Bytes of randomness in the token of a remote server.
const TOKEN_BYTES: usize = 16;

/// What `serve` is asked to do.
#[derive(Clone, Debug)]
pub struct Options {
    /// The address to listen on (port 0: any free port).
    pub addr: SocketAddr,
    /// Open the browser on the printed URL.
    pub open: bool,
    /// Allow a non-loopback address; every request then needs the printed token.
    pub allow_remote: bool,
}

/// What every handler shares.
#[derive(Clone)]
pub struct App {
    /// The root served.
    pub root: Root,
    /// Its query side.
    pub query: SessionQuery,
    /// The host id of session refs.
    pub host: String,
    /// The token every request must present (with `--allow-remote`).
    pub token: Option<Arc<str>>,
    /// When a sessions page last refreshed the catalog (`None`: not yet).
    pub catalog_refreshed: Arc<Mutex<Option<Instant>>>,
    /// The root folder's device and inode when the server started ([`folder_identity`]).
    pub root_identity: Option<(u64, u64)>,
    /// The places of content answers ([`held`]).
    pub content_places: Arc<tokio::sync::Semaphore>,
}

/// The device and inode of `folder`, `None` when it cannot be looked at: a root removed
/// while served, or removed and made again, is told apart from the one served.
pub fn folder_identity(folder: &std::path::Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(folder).ok().map(|m| (m.dev(), m.ino()))
}

/// A random token: 16 bytes of the OS's randomness, in hex.
fn random_token() -> CliResult<String> {
    let mut bytes = [0u8; TOKEN_BYTES];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| Failure::with_code(EXIT_OTHER, format!("no randomness for a token: {e}")))?;
    Ok(hex::encode(bytes))
}

/// The routes.
fn router(app: App) -> Router {
    Router::new()
        .route("/", get(pages::sessions))
        .route("/stats", get(pages::root_stats))
        .route("/sessions/{id}", get(pages::session))
        .route("/sessions/{id}/tree", get(pages::tree))
        .route("/sessions/{id}/stats", get(pages::stats))
        .route("/sessions/{id}/content/{digest}", get(pages::content))
        .route("/assets/style.css", get(assets::style))
        .route("/assets/icon.svg", get(assets::icon))
        .route("/api/sessions", get(api::sessions))
        .route("/api/search", get(api::search))
        .route("/api/stats", get(api::root_stats))
        .route("/api/sessions/{id}", get(api::session))
        .route("/api/sessions/{id}/history", get(api::history))
        .route("/api/sessions/{id}/tree", get(api::tree))
        .route("/api/sessions/{id}/stats", get(api::stats))
        .route("/api/sessions/{id}/content/{digest}", get(api::content))
        .fallback(fallback)
        .layer(axum::middleware::from_fn_with_state(
            app.clone(),
            guard::check,
        ))
        .with_state(app)
}

/// Any address without a route: a JSON 404 under `/api/`, else an HTML one.
async fn fallback(uri: Uri) -> Response {
    if uri.path().starts_with("/api/") {
        api::not_found().await.into_response()
    } else {
        pages::not_found().await.into_response()
    }
}

/// Starts the system's browser on `url` (`xdg-open`, `open` on macOS); a failure is a
/// warning: one that cannot start, and one that ends unsuccessfully (`xdg-open` with no
/// browser to run exits 3, which went unsaid). A thread waits for it, so it is reaped.
fn open_browser(url: &str) {
    let opener = if cfg!(target_os = "macos") {
        "open"
    } else {
        "xdg-open"
    };
    let started = std::process::Command::new(opener)
        .arg(url)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
    let mut child = match started {
        Ok(child) => child,
        Err(e) => {
            errln!("session-store: warning: cannot start {opener}: {e}; open {url} yourself");
            return;
        }
    };
    let url = url.to_owned();
    std::thread::spawn(move || match child.wait() {
        Ok(status) if !status.success() => errln!(
            "session-store: warning: {opener} could not open a browser ({status}); open {url} \
             yourself"
        ),
        Ok(_) => {}
        Err(e) => errln!("session-store: warning: {opener}: {e}; open {url} yourself"),
    });
}

/// Refuses a clock that reads a time outside years 1970-9999 (`now`): hyper dates every
/// answer and panics on such a time, so each request's connection was reset and nothing
/// answered while the server seemed to run (outside testing, clocks).
fn check_clock(now: std::time::SystemTime) -> CliResult<()> {
    /// 10000-01-01T00:00:00Z, the first second an HTTP date cannot say.
    const YEAR_10000: u64 = 253_402_300_800;
    match now.duration_since(std::time::UNIX_EPOCH) {
        Ok(since) if since.as_secs() < YEAR_10000 => Ok(()),
        Ok(_) => Err(Failure::with_code(
            EXIT_OTHER,
            "this system's clock reads a time past year 9999, which HTTP dates cannot say: \
             set the clock right to serve",
        )),
        Err(_) => Err(Failure::with_code(
            EXIT_OTHER,
            "this system's clock reads a time before 1970, which HTTP dates cannot say: set \
             the clock right to serve",
        )),
    }
}

/// `serve [--addr IP:PORT] [--open] [--allow-remote]`: prints the URL (with the token, if
/// any) as the first line on stdout (with `--json`, a JSON line: `url`, `address`,
/// `token`), then serves until stopped.
pub fn run(cx: &Context, options: &Options) -> CliResult<()> {
    let addr = options.addr;
    if !addr.ip().is_loopback() && !options.allow_remote {
        return Err(Failure::usage(format!(
            "{addr} is not a loopback address: pass --allow-remote to serve other machines \
             (every request then needs the token printed at start)"
        )));
    }
    check_clock(std::time::SystemTime::now())?;
    let root = cx.open_root()?;
    let service = cx.service_on(root.clone())?;
    let token = match options.allow_remote {
        true => Some(Arc::<str>::from(random_token()?)),
        false => None,
    };
    let root_identity = folder_identity(root.path());
    let app = App {
        root,
        query: service.query(),
        host: cx.host.clone(),
        token: token.clone(),
        catalog_refreshed: Arc::default(),
        root_identity,
        content_places: held::places(),
    };
    threads_can_start(WORKERS + 1).map_err(|e| {
        Failure::with_code(
            EXIT_OTHER,
            format!(
                "serve needs {} threads and could not start them: {e}",
                WORKERS + 1
            ),
        )
    })?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(WORKERS)
        .max_blocking_threads(STORAGE_THREADS)
        .enable_all()
        .build()?;
    let served = runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| Failure::with_code(EXIT_OTHER, format!("cannot listen on {addr}: {e}")))?;
        let bound = listener.local_addr()?;
        let url = match &token {
            Some(token) => format!("http://{bound}/?token={token}"),
            None => format!("http://{bound}/"),
        };
        if cx.json {
            print_json(&serde_json::json!({
                "url": url,
                "address": bound.to_string(),
                "token": token.as_deref(),
            }))?;
        } else {
            let mut out = std::io::stdout().lock();
            writeln!(out, "{url}").map_err(super::OutputError)?;
            out.flush().map_err(super::OutputError)?;
        }
        errln!(
            "session-store: serving {} read-only at {url} (Ctrl-C stops)",
            cx.root.display()
        );
        if options.open {
            open_browser(&url);
        }
        if listen::serve(listener, router(app), shutdown_requested()).await {
            errln!("session-store: stopped");
        } else {
            errln!(
                "session-store: stopped (the connections still answering after {} s were cut)",
                listen::DRAIN_LIMIT.as_secs()
            );
        }
        Ok(())
    });
    // Not waited for: a request cut at the drain limit may still run a blocking part (a
    // search filling the index of a large root), which kept the process for seconds after
    // "stopped" (outside testing, signals: 8.5 s). What it wrote is derived, and SQLite
    // rolls an unfinished transaction back.
    runtime.shutdown_background();
    served
}

/// Resolves on SIGINT (Ctrl-C), SIGTERM or SIGHUP (the terminal closed: it ended the
/// process at once, exit 129, requests in flight cut and a private search index left in
/// the temporary folder: outside testing I3). The server then takes no new connection,
/// finishes the requests in flight (for at most `listen::DRAIN_LIMIT`) and returns, and the root is dropped as usual (a
/// private search index, built for a root this process may only read, is removed with it).
/// A signal that cannot be listened for is never awaited.
async fn shutdown_requested() {
    use tokio::signal::unix::{SignalKind, signal};
    let interrupt = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    let received = |kind: SignalKind| async move {
        match signal(kind) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        () = interrupt => {}
        () = received(SignalKind::terminate()) => {}
        () = received(SignalKind::hangup()) => {}
    }
}
