//! Helpers of the `serve` tests (`tests/serve.rs`, `tests/browser.rs`): a demo root made by
//! the real binary, and the real `session-store serve` process on an ephemeral loopback
//! port, killed when dropped.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_session-store");

/// How long one command or request of a test may take before it fails the test: a hang
/// becomes a failure naming what hung, not a CI run that never ends.
const TEST_LIMIT: std::time::Duration = std::time::Duration::from_secs(300);

/// Runs `session-store --root ROOT ARGS…` to completion (killed after [`TEST_LIMIT`], exit
/// status 124, through coreutils' `timeout`).
pub fn cli(root: &Path, args: &[&str]) -> Output {
    Command::new("timeout")
        .arg(TEST_LIMIT.as_secs().to_string())
        .arg(BIN)
        .arg("--root")
        .arg(root)
        .args(args)
        .output()
        .expect("run session-store")
}

/// Runs a command that must succeed; returns its stdout.
pub fn cli_ok(root: &Path, args: &[&str]) -> String {
    let out = cli(root, args);
    assert!(
        out.status.success(),
        "session-store {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 stdout")
}

/// The demo's sessions and titles (`src/cli/demo.rs`).
pub const DEMO: [(&str, &str); 5] = [
    ("demo-flaky-test", "Fix the flaky parser test"),
    ("demo-log-triage", "Triage the 502s in last night's logs"),
    ("demo-cli-flag", "Add a --dry-run flag"),
    ("demo-query-plan", "Why is the orders query slow?"),
    ("demo-release-notes", "Draft release notes for 3.2"),
];

/// A demo root (`session-store demo`) with a lineage around `demo-flaky-test`:
/// `flaky-fork` (after turn-1), `flaky-rewind` (before turn-2) and `flaky-fork-2` (a fork
/// of `flaky-fork` after turn-1).
pub fn demo_root() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("demo");
    cli_ok(&root, &["demo"]);
    cli_ok(
        &root,
        &[
            "fork",
            "demo-flaky-test",
            "--after-turn",
            "turn-1",
            "--id",
            "flaky-fork",
        ],
    );
    cli_ok(
        &root,
        &[
            "rewind",
            "demo-flaky-test",
            "--before-turn",
            "turn-2",
            "--id",
            "flaky-rewind",
        ],
    );
    cli_ok(
        &root,
        &[
            "fork",
            "flaky-fork",
            "--after-turn",
            "turn-1",
            "--id",
            "flaky-fork-2",
        ],
    );
    (dir, root)
}

/// The six pages every check of a session's rendering goes through: the sessions page,
/// the hits of `query`, session `id`'s transcript, fork tree and storage, and the root's
/// storage.
pub fn pages(id: &str, query: &str) -> [String; 6] {
    [
        "/".to_owned(),
        format!("/?q={query}"),
        format!("/sessions/{id}"),
        format!("/sessions/{id}/tree"),
        format!("/sessions/{id}/stats"),
        "/stats".to_owned(),
    ]
}

/// A running `session-store serve`.
pub struct Server {
    child: Child,
    /// The URL it printed on its first line (with `?token=` under `--allow-remote`).
    pub printed: String,
    /// `http://127.0.0.1:PORT`, no trailing slash.
    pub base: String,
}

/// An answer.
pub struct Reply {
    /// HTTP status.
    pub status: u16,
    /// Headers, names lowercase.
    pub headers: Vec<(String, String)>,
    /// The body as text.
    pub body: String,
}

impl Reply {
    /// The value of header `name` (lowercase), if present.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The body as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

impl Server {
    /// Starts `session-store --root ROOT serve --addr 127.0.0.1:0 EXTRA…` and reads the
    /// URL from its first line.
    pub fn start(root: &Path, extra: &[&str]) -> Server {
        Self::start_at(root, "127.0.0.1:0", extra)
    }

    /// As [`Server::start`] on `addr`.
    pub fn start_at(root: &Path, addr: &str, extra: &[&str]) -> Server {
        Self::spawn(Self::command(&[], root, addr, extra))
    }

    /// `PREFIX… session-store --root ROOT serve --addr ADDR EXTRA…` (a prefix such as
    /// `setpriv --reuid=…` runs it as another user), not started yet: set its environment
    /// or stderr, then [`Server::spawn`] it.
    pub fn command(prefix: &[&str], root: &Path, addr: &str, extra: &[&str]) -> Command {
        let mut command = match prefix.split_first() {
            Some((tool, rest)) => {
                let mut c = Command::new(tool);
                c.args(rest).arg(BIN);
                c
            }
            None => Command::new(BIN),
        };
        command
            .arg("--root")
            .arg(root)
            .args(["serve", "--addr", addr])
            .args(extra)
            .stderr(Stdio::inherit());
        command
    }

    /// Starts `command` (a `serve`) and reads the URL from its first line.
    pub fn spawn(mut command: Command) -> Server {
        let mut child = command.stdout(Stdio::piped()).spawn().expect("spawn serve");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("read the URL");
        let printed = line.trim().to_owned();
        assert!(printed.starts_with("http://"), "first line: {printed:?}");
        let port = printed
            .trim_start_matches("http://")
            .split('/')
            .next()
            .and_then(|hostport| hostport.rsplit(':').next())
            .expect("port")
            .to_owned();
        Server {
            child,
            printed,
            base: format!("http://127.0.0.1:{port}"),
        }
    }

    /// Sends the server SIGTERM and waits (at most 10 s) for it to exit; its exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        self.signal("TERM")
    }

    /// Sends the server the signal `name` (`TERM`, `INT`, `HUP`) and waits (at most 10 s)
    /// for it to exit; its exit status.
    pub fn signal(&mut self, name: &str) -> std::process::ExitStatus {
        let sent = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(sent.success(), "kill -{name} failed");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "serve ignored SIG{name}"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A field of the server's `/proc/PID/status` as a number (`Threads`, `VmRSS` in kB).
    pub fn status_field(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .expect("read the server's /proc status");
        status
            .lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| panic!("no {field} in {status}"))
    }

    /// How many file descriptors the server has open.
    pub fn open_fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .expect("list the server's descriptors")
            .count()
    }

    /// `GET base+path` with extra headers.
    pub fn get_with(&self, path: &str, headers: &[(&str, &str)]) -> Reply {
        self.request("GET", path, headers)
    }

    /// `METHOD base+path` (no body) with extra headers.
    pub fn request(&self, method: &str, path: &str, headers: &[(&str, &str)]) -> Reply {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .max_redirects(0)
            .timeout_global(Some(TEST_LIMIT))
            .build()
            .into();
        let mut request = ureq::http::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request.body(()).expect("a request");
        let mut response = agent
            .run(request)
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let status = response.status().as_u16();
        let headers = response
            .headers()
            .iter()
            .map(|(n, v)| {
                (
                    n.as_str().to_ascii_lowercase(),
                    v.to_str().unwrap_or("").to_owned(),
                )
            })
            .collect();
        let body = response
            .body_mut()
            .with_config()
            .limit(64 << 20)
            .read_to_string()
            .unwrap_or_else(|e| panic!("{method} {path}: body: {e}"));
        Reply {
            status,
            headers,
            body,
        }
    }

    /// `GET base+path`.
    pub fn get(&self, path: &str) -> Reply {
        self.get_with(path, &[])
    }

    /// `GET` that must answer 200; returns the body.
    pub fn ok(&self, path: &str) -> Reply {
        let reply = self.get(path);
        assert_eq!(reply.status, 200, "GET {path}: {}", reply.body);
        reply
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
