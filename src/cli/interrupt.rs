//! Ctrl-C (SIGINT), SIGTERM and SIGHUP (the terminal closed, an ssh session dropped: it
//! left an export's temporary file, an import's staging copy and a bench's scratch folder
//! behind; outside testing, signals) for the commands that leave something behind when a
//! signal ends them at once: `export` (a temporary file beside its destination) and `import` (a
//! staging copy in the root, removed at once rather than by the next command) watch a token
//! the first signal cancels, remove what they wrote and fail with status 128 + the
//! signal's number (130, 143), as a shell reports a process the signal ended; `bench`
//! (its scratch folder in the root) removes it on the signal's thread and exits with that
//! status. A second signal ends the process at once. Every other command keeps the
//! signals' default action (the root is crash-safe).
//!
//! SIGXFSZ (a write past the process's file size limit, `ulimit -f`) is caught by every
//! command from its start ([`survive_file_size_limit`]): its default action ended the
//! process at once, leaving an export's or import's temporary file behind; caught, the
//! write fails with `EFBIG` and the command fails as for any write error, removing what
//! it wrote.

use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};

use session_store::CancelToken;
use tokio::signal::unix::{SignalKind, signal};

use super::{CliError, CliResult, Failure};

/// SIGINT's number.
const SIGINT: i32 = 2;
/// SIGTERM's number.
const SIGTERM: i32 = 15;
/// SIGHUP's number.
const SIGHUP: i32 = 1;

/// The signals a command listens for, from [`Interrupt::watch`] to the end of the process.
pub struct Interrupt {
    /// Cancelled by the first signal.
    token: CancelToken,
    /// The first signal's number, 0 before one came.
    signal: Arc<AtomicI32>,
}

impl Interrupt {
    /// Starts listening for SIGINT, SIGTERM and SIGHUP on a thread of its own. From then on
    /// the signals no longer end the process by themselves: the command watches
    /// [`Interrupt::token`].
    ///
    /// # Errors
    /// The signals cannot be listened for, or the thread cannot be started.
    pub fn watch() -> CliResult<Interrupt> {
        let token = CancelToken::new();
        let first = Arc::new(AtomicI32::new(0));
        let (cancel, seen) = (token.clone(), Arc::clone(&first));
        listen(move |number| {
            seen.store(number, Ordering::SeqCst);
            cancel.cancel();
        })?;
        Ok(Interrupt {
            token,
            signal: first,
        })
    }

    /// Starts listening for SIGINT, SIGTERM and SIGHUP on a thread of its own, for a command
    /// whose work can simply stop (`bench`): the first signal runs `clean_up` on that thread
    /// and ends the process with 128 + its number.
    ///
    /// # Errors
    /// The signals cannot be listened for, or the thread cannot be started.
    pub fn exit_after(clean_up: impl FnOnce() + Send + 'static) -> CliResult<()> {
        let mut clean_up = Some(clean_up);
        listen(move |number| {
            if let Some(clean_up) = clean_up.take() {
                clean_up();
            }
            std::process::exit(status(number).into());
        })
    }

    /// The token the first signal cancels.
    pub fn token(&self) -> &CancelToken {
        &self.token
    }

    /// `error` as the command's failure: when a signal stopped the command, a failure with
    /// status 128 + its number saying `what` (`"nothing was written"`), else `error`.
    pub fn failure(&self, error: CliError, what: &str) -> CliError {
        self.stopped(what).unwrap_or(error)
    }

    /// When a signal came, the command's failure with status 128 + its number saying
    /// `what`; `None` otherwise.
    pub fn stopped(&self, what: &str) -> Option<CliError> {
        self.seen().map(|(number, name)| {
            Failure::with_code(status(number), format!("interrupted by {name}; {what}"))
        })
    }

    /// The first signal that came, with its name, if one did.
    pub fn seen(&self) -> Option<(i32, &'static str)> {
        match self.signal.load(Ordering::SeqCst) {
            0 => None,
            SIGINT => Some((SIGINT, "SIGINT")),
            SIGHUP => Some((SIGHUP, "SIGHUP")),
            number => Some((number, "SIGTERM")),
        }
    }
}

/// Catches SIGXFSZ for the rest of the process, so that a write past the file size limit
/// (`ulimit -f`, `prlimit --fsize`) fails with `EFBIG` instead of ending the process.
/// Caught rather than ignored: a program the command starts gets the default action back.
///
/// # Errors
/// The signal's handler cannot be installed.
pub fn survive_file_size_limit() -> CliResult<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()?;
    let _context = runtime.enter();
    // The handler stays installed once registered; the listener is not needed.
    drop(signal(SignalKind::from_raw(
        rustix::process::Signal::XFSZ.as_raw(),
    ))?);
    Ok(())
}

/// The exit status of a process a signal stopped: 128 + its number.
fn status(signal: i32) -> u8 {
    u8::try_from(128 + signal).unwrap_or(super::EXIT_OTHER)
}

/// Listens for SIGINT, SIGTERM and SIGHUP on a thread of its own (registered before this
/// returns, so a signal right after it is caught): the first one calls `first` with its number, a
/// second one ends the process at once with 128 + its number (the user insists).
fn listen(mut first: impl FnMut(i32) + Send + 'static) -> CliResult<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()?;
    let (mut interrupt, mut terminate, mut hangup) = {
        let _context = runtime.enter();
        (
            signal(SignalKind::interrupt())?,
            signal(SignalKind::terminate())?,
            signal(SignalKind::hangup())?,
        )
    };
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            runtime.block_on(async move {
                let mut seen = false;
                loop {
                    let number = tokio::select! {
                        Some(()) = interrupt.recv() => SIGINT,
                        Some(()) = terminate.recv() => SIGTERM,
                        Some(()) = hangup.recv() => SIGHUP,
                        else => return,
                    };
                    if std::mem::replace(&mut seen, true) {
                        std::process::exit(status(number).into());
                    }
                    first(number);
                }
            });
        })
        .map_err(|e| {
            // A user out of threads got only "Resource temporarily unavailable" from
            // `export` and `import` (outside testing R9).
            let why = match e.kind() {
                std::io::ErrorKind::WouldBlock => {
                    " (the process or its user is out of threads or memory)"
                }
                _ => "",
            };
            std::io::Error::new(
                e.kind(),
                format!("start a thread to listen for signals: {e}{why}"),
            )
        })?;
    Ok(())
}
