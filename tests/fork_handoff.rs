//! A fork, and a legacy continuation, is published with its writer lock held and opened
//! under that same lock (as a create is): no other opener can take the new session
//! between its publication and the service's writer.

mod common;

use std::fs::{File, OpenOptions};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use common::{id, turn};
use session_store::{CreateOptions, Error, ForkPoint, Root, Runtime, Service};

/// Forks this many children, each raced by a competitor.
const FORKS: usize = 40;

/// Continues this many legacy transcripts, each raced by a competitor.
const LEGACY: usize = 40;

/// Spins on the child's `writer.lock` with a raw OS lock (`flock`, the same lock the
/// store takes; per open file description, so it contends like another process),
/// without pausing, from before the fork until `stop`. Returns the lock file when it ever
/// got the lock (held until then), `None` otherwise.
fn race_for_lock(path: std::path::PathBuf, stop: Arc<AtomicBool>) -> Option<File> {
    while !stop.load(Ordering::Relaxed) {
        // Not created here: only a published child's lock file is raced for.
        if let Ok(file) = OpenOptions::new().read(true).write(true).open(&path)
            && file.try_lock().is_ok()
        {
            return Some(file);
        }
        std::hint::spin_loop();
    }
    None
}

/// A service over a new root in `dir` holding the runtime of `parent`, one ended turn
/// (`turn-1`, 3 events) accepted.
async fn service_with_parent(dir: &std::path::Path) -> (Root, Service, Runtime) {
    let root = Root::open(dir.join("sessions")).expect("root");
    let service = Service::new("local", root.clone()).expect("service");
    let parent = service
        .create(CreateOptions::with_id(id("parent")))
        .await
        .expect("create parent");
    parent
        .session()
        .append(turn("op-1", "turn-1", "m1"))
        .expect("append");
    (root, service, parent)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_other_opener_takes_a_forked_child_before_its_writer() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (root, service, parent) = service_with_parent(dir.path()).await;
    let r = parent.session_ref().clone();
    let mut children = Vec::new();
    for i in 0..FORKS {
        let child = id(&format!("child-{i:02}"));
        let stop = Arc::new(AtomicBool::new(false));
        let racer = {
            let path = root.session_dir(&child).join("writer.lock");
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || race_for_lock(path, stop))
        };
        let forked = service.fork(&r, "turn-1", Some(child.clone())).await;
        stop.store(true, Ordering::Relaxed);
        let taken = racer.join().expect("racer");
        assert!(
            taken.is_none(),
            "fork {i}: another opener took the child's writer lock before the fork's writer ({forked:?})"
        );
        let forked = forked.unwrap_or_else(|e| panic!("fork {i}: {e}"));
        assert_eq!(forked.session().id(), &child);
        children.push(forked);
    }
    // Each child stays owned by its fork's writer.
    for child in &children {
        match root.open_writer(child.session().id()) {
            Err(Error::WriterOwned { owner, .. }) => {
                assert_eq!(owner.owner_id, child.session().owner().owner_id)
            }
            other => panic!("expected WriterOwned, got {other:?}"),
        }
    }
}

#[test]
fn root_fork_writer_returns_the_child_opened_under_its_staged_lock() {
    let (_dir, root) = common::temp_root();
    let parent = common::create(&root, "p");
    parent.append(turn("op-1", "turn-1", "m1")).expect("append");
    parent.flush().expect("flush");
    let child = root
        .fork_writer(
            &id("p"),
            ForkPoint::AfterTurn("turn-1".into()),
            Some(id("c")),
        )
        .expect("fork_writer");
    assert_eq!(child.id(), &id("c"));
    assert_eq!(child.inherited_events(), 3);
    assert_eq!(child.owner().generation, 1, "the first lease of the child");
    match root.open_writer(&id("c")) {
        Err(Error::WriterOwned { owner, .. }) => assert_eq!(owner.owner_id, child.owner().owner_id),
        other => panic!("expected WriterOwned, got {other:?}"),
    }
    child
        .append(turn("op-2", "turn-2", "m2"))
        .expect("append to the child");
    assert_eq!(child.flush().expect("flush"), 6);
    child.close().expect("close");
    assert_eq!(
        root.open_reader(&id("c"))
            .expect("reader")
            .durable_sequence()
            .expect("durable"),
        6
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_other_opener_takes_a_migrated_legacy_session_before_its_writer() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sources: Vec<_> = (0..LEGACY)
        .map(|i| {
            let path = dir.path().join(format!("old-{i:02}.jsonl"));
            std::fs::write(
                &path,
                format!("{{\"role\":\"user\",\"content\":\"hello {i}\"}}\n"),
            )
            .expect("write source");
            path
        })
        .collect();
    // The target id depends on the source only (path, digest, head), not on the root:
    // learn each one from a migration into a scratch root.
    let scratch = Service::new(
        "local",
        Root::open(dir.path().join("scratch")).expect("root"),
    )
    .expect("scratch service");
    let mut targets = Vec::new();
    for source in &sources {
        let (_, record) = scratch
            .continue_legacy(source, "")
            .await
            .expect("scratch migration");
        targets.push(record.target_id);
    }
    scratch.close_all().await.expect("close scratch");
    let root = Root::open(dir.path().join("sessions")).expect("root");
    let service = Service::new("local", root.clone()).expect("service");
    let mut runtimes = Vec::new();
    for (i, (source, target)) in sources.iter().zip(&targets).enumerate() {
        let stop = Arc::new(AtomicBool::new(false));
        let racer = {
            let path = root.session_dir(target).join("writer.lock");
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || race_for_lock(path, stop))
        };
        let continued = service.continue_legacy(source, "").await;
        stop.store(true, Ordering::Relaxed);
        let taken = racer.join().expect("racer");
        assert!(
            taken.is_none(),
            "legacy {i}: another opener took the migrated session's writer lock before the \
             service's writer ({continued:?})"
        );
        let (runtime, record) = continued.unwrap_or_else(|e| panic!("legacy {i}: {e}"));
        assert_eq!(&record.target_id, target);
        assert!(!record.reused);
        assert_eq!(runtime.session().id(), target);
        runtimes.push(runtime);
    }
    // Each migrated session stays owned by the service's writer; continuing it again in
    // the same service reuses that runtime.
    for (source, runtime) in sources.iter().zip(&runtimes) {
        let id = runtime.session().id();
        match root.open_writer(id) {
            Err(Error::WriterOwned { owner, .. }) => {
                assert_eq!(owner.owner_id, runtime.session().owner().owner_id)
            }
            other => panic!("expected WriterOwned, got {other:?}"),
        }
        let (again, record) = service
            .continue_legacy(source, "")
            .await
            .expect("continue again");
        assert!(record.reused);
        assert!(again.session().same_instance(runtime.session()));
        assert_eq!(again.session().snapshot().projection.transcript_len, 1);
    }
    service.close_all().await.expect("close all");
}

/// Gives `f` so little time that the caller stops waiting for it mid-way (as a host's
/// `tokio::time::timeout` or `select!` does); asserts it did not finish.
async fn give_up_on<T: std::fmt::Debug>(what: &str, f: impl std::future::Future<Output = T>) {
    let given_up = tokio::time::timeout(std::time::Duration::from_micros(1), f).await;
    assert!(given_up.is_err(), "{what} finished at once: {given_up:?}");
}

/// Waits at most 10 s for `f` (a hang is a failure, not a stuck test).
async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(std::time::Duration::from_secs(10), f)
        .await
        .unwrap_or_else(|_| panic!("{what} hung (still waiting after 10 s)"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_fork_or_migration_whose_caller_gives_up_still_ends() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_root, service, parent) = service_with_parent(dir.path()).await;
    let r = parent.session_ref().clone();
    service.close(&r).await.expect("close parent");

    // An open given up on: the next open of the session gets its runtime, and only one.
    give_up_on("open", service.open(&r)).await;
    let binding = within("open after a given-up open", service.open(&r))
        .await
        .expect("open after a given-up open");
    let again = within("second open", service.open(&r))
        .await
        .expect("second open");
    assert!(
        again
            .runtime()
            .session()
            .same_instance(binding.runtime().session())
    );
    binding.release().await.expect("release");
    again.release().await.expect("release");

    // A fork given up on: the child is opened by the next open, in this service. The
    // parent is closed first, so that the fork reserves the child at its first poll: with
    // the parent open, the fork first flushes it on a blocking thread, and a caller giving
    // up while that flush runs (a loaded machine) stops the fork before it began, leaving
    // no child to open.
    service.close(&r).await.expect("close parent");
    let child = service.session_ref(id("child"));
    give_up_on("fork", service.fork(&r, "turn-1", Some(id("child")))).await;
    let opened = within(
        "open of a child whose fork was given up on",
        service.open(&child),
    )
    .await
    .expect("open the child");
    assert_eq!(opened.runtime().session().inherited_events(), 3);
    opened.release().await.expect("release");

    // A legacy continuation given up on: continuing it again ends, with the same target.
    let source = dir.path().join("old.jsonl");
    std::fs::write(&source, "{\"role\":\"user\",\"content\":\"hello\"}\n").expect("source");
    give_up_on("continue_legacy", service.continue_legacy(&source, "")).await;
    let (migrated, _) = within(
        "continue_legacy again",
        service.continue_legacy(&source, ""),
    )
    .await
    .expect("continue again");
    assert_eq!(migrated.session().snapshot().projection.transcript_len, 1);
    within("close all", service.close_all())
        .await
        .expect("close all");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_racing_a_close_gets_a_live_registered_runtime() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_root, service, parent) = service_with_parent(dir.path()).await;
    let r = parent.session_ref().clone();
    drop(parent);
    for i in 0..50 {
        let (closed, opened) = tokio::join!(service.close(&r), service.open(&r));
        // The close may win (the open then opens the session again) or find the binding
        // (RuntimeBound); either way the open's runtime is the registered, writable one.
        assert!(
            matches!(closed, Ok(()) | Err(Error::RuntimeBound(_))),
            "round {i}: {closed:?}"
        );
        let binding = opened.unwrap_or_else(|e| panic!("round {i}: open: {e}"));
        let registered = service.runtime(&r).expect("a registered runtime");
        assert!(
            registered
                .session()
                .same_instance(binding.runtime().session()),
            "round {i}: the open returned a runtime that is not the registered one"
        );
        let op = format!("after-close-{i}");
        let appended = binding.runtime().session().append(turn(
            &op,
            &format!("turn-{op}"),
            &format!("m-{op}"),
        ));
        assert!(appended.is_ok(), "round {i}: {appended:?}");
        binding.release().await.expect("release");
    }
    // Two closes at once: both succeed (close is idempotent), the session is closed once.
    let (first, second) = tokio::join!(service.close(&r), service.close(&r));
    assert!(first.is_ok() && second.is_ok(), "{first:?} {second:?}");
    assert!(service.runtime(&r).is_none());
    service.close_all().await.expect("close all");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_binding_no_longer_holds_its_runtime_open() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (root, service, parent) = service_with_parent(dir.path()).await;
    let r = parent.session_ref().clone();
    drop(parent);
    let binding = service.open(&r).await.expect("open");
    let kept = service.open(&r).await.expect("open again");
    assert!(matches!(
        service.close(&r).await,
        Err(Error::RuntimeBound(_))
    ));
    // Dropped without `release` (an early return, a panic unwinding a task): it lets go.
    drop(binding);
    assert!(
        matches!(service.close(&r).await, Err(Error::RuntimeBound(_))),
        "one still bound"
    );
    kept.release().await.expect("release");
    drop(kept); // released already: dropping it changes nothing
    service
        .close(&r)
        .await
        .expect("close once every binding is gone");
    root.open_writer(&r.session_id)
        .expect("the writer is free")
        .close()
        .expect("close");
}

/// Bindings count per runtime: releasing a binding of a runtime that was detached (and
/// replaced by a new one) does not take a binding of the new runtime off its count, so the
/// new runtime is not closed under a client still bound to it.
#[tokio::test(flavor = "multi_thread")]
async fn releasing_a_binding_of_a_detached_runtime_leaves_the_new_ones_count() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_root, service, parent) = service_with_parent(dir.path()).await;
    let r = parent.session_ref().clone();
    drop(parent);
    let old = service.open(&r).await.expect("open");
    assert!(service.detach(old.runtime()), "detached");
    let session = old.runtime().session().clone();
    tokio::task::spawn_blocking(move || session.close())
        .await
        .expect("join")
        .expect("close the detached runtime's session");
    let new = service.open(&r).await.expect("open a new runtime");
    assert_ne!(new.runtime(), old.runtime());
    old.release().await.expect("release the old binding");
    assert!(
        matches!(service.close(&r).await, Err(Error::RuntimeBound(_))),
        "the new runtime is still bound"
    );
    new.release().await.expect("release");
    service.close(&r).await.expect("close once unbound");
}
