//! The server's accept loop: each connection is served by hyper's HTTP/1 with a time limit
//! on a request's head ([`HEAD_TIMEOUT`]), so a client that sends part of a request and
//! then waits (or connects and sends nothing) is disconnected instead of holding a
//! descriptor for as long as it likes. `axum::serve` sets no timer, so it never timed a
//! head out: enough such clients used up the server's descriptors, after which no one was
//! answered.

use std::future::Future;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;

/// How long a client has to send a request's head, from its first byte (or, between
/// requests on a kept-alive connection, from the end of the previous answer).
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a stop waits for the answers in flight: a client that stopped reading a large
/// answer (`curl URL | less`) kept the server from exiting on SIGINT or SIGTERM for as
/// long as it stayed connected (outside testing C2, session 41); its connection is cut.
pub const DRAIN_LIMIT: Duration = Duration::from_secs(5);

/// How long the loop pauses after an accept error that is not the client's (such as no
/// descriptor left), as `axum::serve` does, instead of spinning.
const ACCEPT_PAUSE: Duration = Duration::from_secs(1);

/// Serves `app` on `listener` until `shutdown` resolves, then takes no new connection and
/// waits for the requests in flight (idle connections are closed), at most
/// [`DRAIN_LIMIT`]: those still going then are cut when the runtime ends. Returns whether
/// every connection ended within it.
pub async fn serve(listener: TcpListener, app: Router, shutdown: impl Future<Output = ()>) -> bool {
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    if !client_error(&e) {
                        tokio::time::sleep(ACCEPT_PAUSE).await;
                    }
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let connection = http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(HEAD_TIMEOUT)
            .serve_connection(TokioIo::new(stream), TowerToHyperService::new(app.clone()));
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            // A connection's failure (a reset, a head too slow) concerns that client only.
            let _ = connection.await;
        });
    }
    tokio::time::timeout(DRAIN_LIMIT, graceful.shutdown())
        .await
        .is_ok()
}

/// Whether an accept error came from one client's connection (gone before it was taken).
fn client_error(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    matches!(
        e.kind(),
        ConnectionAborted | ConnectionRefused | ConnectionReset
    )
}
