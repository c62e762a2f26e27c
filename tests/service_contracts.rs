//! The `Service` as a host uses it, against what its doc comments promise: concurrent
//! opens and closes on a multi-threaded runtime, a service dropped without `shutdown`,
//! restart recovery after a writer process is SIGKILLed mid-turn, the projection read
//! cold, live and after a reopen, idempotent retries across a crash, and the classifiers
//! of the errors the service returns.

mod common;

use std::io::BufReader;
use std::time::Duration;

use common::{event, id, message, read_until, spawn_role, title, turn, turn_end};
use serde_json::json;
use session_store::{
    Batch, CancelToken, CreateOptions, Error, Event, Root, RuntimePhase, Service, SessionRef,
};

const HOST: &str = "contracts";

/// Fails the test instead of hanging when `f` does not end within 20 s.
async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), f)
        .await
        .unwrap_or_else(|_| panic!("{what} did not end within 20 s (deadlock?)"))
}

fn service_in(dir: &std::path::Path) -> Service {
    Service::new(HOST, Root::open(dir.join("sessions")).expect("root")).expect("service")
}

/// A service over a new root in `dir` and the ref of the session `name` it created (its
/// runtime published, no binding held).
async fn service_with_session(dir: &std::path::Path, name: &str) -> (Service, SessionRef) {
    with_session(service_in(dir), name).await
}

/// `service` and the ref of the session `name` it created (its runtime published, no
/// binding held).
async fn with_session(service: Service, name: &str) -> (Service, SessionRef) {
    let rt = service
        .create(CreateOptions::with_id(id(name)))
        .await
        .expect("create");
    let r = rt.session_ref().clone();
    (service, r)
}

/// As [`service_with_session`], over a [`manual_root`] (timed drains never fire).
async fn manual_service_with_session(dir: &std::path::Path, name: &str) -> (Service, SessionRef) {
    with_session(Service::new(HOST, manual_root(dir)).expect("service"), name).await
}

/// Publishes the session's runtime (opened and released) when the service has none, then
/// closes it on a task of its own: the close each `…_racing_a_close_…` test races.
async fn start_closing(
    service: &Service,
    r: &SessionRef,
) -> tokio::task::JoinHandle<session_store::Result<()>> {
    if service.runtime(r).is_none() {
        let binding = service.open(r).await.expect("open");
        binding.release().await.expect("release");
    }
    let (service, r) = (service.clone(), r.clone());
    tokio::spawn(async move { service.close(&r).await })
}

/// Many tasks open, append through and release bindings of one session while others
/// close it, on a multi-threaded runtime: every binding an open returns is a runtime that
/// accepts appends, and once every binding is released the session closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn opens_and_closes_from_many_tasks_never_bind_a_closed_runtime() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (service, r) = service_with_session(dir.path(), "busy").await;
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    let mut tasks = Vec::new();
    let closed = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    for t in 0..2 {
        let (service, r) = (service.clone(), r.clone());
        tasks.push(tokio::spawn(async move {
            let mut n = 0;
            while std::time::Instant::now() < deadline {
                let binding = service.open(&r).await.expect("open");
                let op = format!("op-{t}-{n}");
                let appended = binding
                    .runtime()
                    .session()
                    .append_events(&op, vec![title(&op)]);
                assert!(
                    appended.is_ok(),
                    "task {t} round {n}: an open bound a runtime that refuses appends: {appended:?}"
                );
                binding.release().await.expect("release");
                n += 1;
            }
            n
        }));
    }
    for _ in 0..2 {
        let (service, r, closed) = (service.clone(), r.clone(), closed.clone());
        tasks.push(tokio::spawn(async move {
            let mut n = 0;
            while std::time::Instant::now() < deadline {
                match service.close(&r).await {
                    Ok(()) => {
                        closed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    Err(Error::RuntimeBound(_)) => {}
                    Err(e) => panic!("close: {e}"),
                }
                n += 1;
                tokio::task::yield_now().await;
            }
            n
        }));
    }
    for task in tasks {
        within("a task", task).await.expect("task");
    }
    assert!(
        closed.load(std::sync::atomic::Ordering::Relaxed) > 0,
        "some closes won"
    );
    within("the last close", service.close(&r))
        .await
        .expect("every binding released: the session closes");
    assert!(service.runtime(&r).is_none());
    // The writer is free, and a new runtime is not held by counts left behind.
    let binding = service.open(&r).await.expect("open again");
    binding.release().await.expect("release");
    service.close(&r).await.expect("close again");
}

/// The session the crash tests work on.
const CRASHED: &str = "crashed";

/// A root whose timed drains never fire (1 hour write-behind): only `flush` and `close`
/// make commits durable.
fn manual_root(dir: &std::path::Path) -> Root {
    let options =
        session_store::StoreOptions::default().with_write_behind(Duration::from_secs(3600));
    Root::with_options(dir.join("sessions"), options).expect("root")
}

/// Child process: opens `CRASHED` through a service, appends half a turn (two running
/// tools, a pending interaction) plus a pending interaction outside the turn, makes them
/// durable, accepts one more batch that it never flushes, says `durable` and waits to be
/// killed.
#[test]
#[ignore = "child role of service_contracts::a_writer_killed_mid_turn_recovers_on_reopen"]
fn crashing_writer_role() {
    let dir = std::path::PathBuf::from(std::env::var("SSC_DIR").expect("SSC_DIR"));
    let rt = tokio::runtime::Runtime::new().expect("tokio");
    rt.block_on(async {
        let service = Service::new(HOST, manual_root(&dir)).expect("service");
        let binding = service
            .open(&SessionRef::new(HOST, CRASHED).expect("ref"))
            .await
            .expect("open");
        let runtime = binding.runtime();
        runtime
            .session()
            .append_events(
                "op-outside",
                vec![event(
                    "interaction/created",
                    json!({"id": "outside", "state": "pending"}),
                )],
            )
            .expect("outside");
        let execution = runtime.bind_execution("agent").expect("bind");
        execution
            .append(
                Batch::new(
                    "op-open-turn",
                    vec![
                        Event::new("turn/start"),
                        message("user-t2", "user", "deploy"),
                        event("tool/start", json!({"id": "call-a", "name": "bash"})),
                        event("tool/start", json!({"id": "call-b", "name": "grep"})),
                        event(
                            "interaction/created",
                            json!({"id": "approve", "state": "pending"}),
                        ),
                    ],
                )
                .in_turn("t2"),
            )
            .expect("open turn");
        service.flush(runtime.session_ref()).await.expect("flush");
        execution
            .append(
                Batch::new(
                    "op-lost",
                    vec![message("lost", "assistant", "never durable")],
                )
                .in_turn("t2"),
            )
            .expect("accepted");
        println!("durable");
        std::future::pending::<()>().await;
    });
}

/// A writer process SIGKILLed mid-turn: the cold projection shows the open turn, its
/// running tools and pending interactions; a reopen through the service closes the turn
/// with one durable recovery batch; a retry of the durable batch returns the original
/// commit, one of the batch that was never durable is appended anew; the projection then
/// reads the same live, cold and after a further reopen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_killed_mid_turn_recovers_on_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    let service = Service::new(HOST, manual_root(dir.path())).expect("service");
    let rt = service
        .create(CreateOptions::with_id(id(CRASHED)))
        .await
        .expect("create");
    let r = rt.session_ref().clone();
    rt.session()
        .append_events("op-title", vec![title("Crash test")])
        .expect("title");
    rt.session()
        .append(turn("op-t1", "t1", "m1"))
        .expect("turn 1");
    drop(rt);
    service.close(&r).await.expect("close");

    let mut child = spawn_role(
        "crashing_writer_role",
        &[("SSC_DIR", dir.path().to_str().expect("utf-8"))],
    );
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    read_until(&mut out, "durable");

    // Cold, while the other process holds the writer.
    let err = service.open(&r).await.expect_err("owned by the child");
    assert!(err.is_writer_owned(), "{err:?}");
    assert_eq!(err.writer_owner().expect("owner").pid, child.id());
    let cold = service.query().snapshot(&r).await.expect("cold snapshot");
    let p = &cold.projection;
    assert_eq!(p.turn_id.as_deref(), Some("t2"));
    assert_eq!(
        p.active_tools.keys().collect::<Vec<_>>(),
        ["call-a", "call-b"]
    );
    assert_eq!(
        p.interactions.keys().collect::<Vec<_>>(),
        ["approve", "outside"]
    );
    assert_eq!(p.title, "Crash test");
    let durable_before = cold.durable_sequence;

    child.kill().expect("kill");
    child.wait().expect("wait");

    let binding = within("reopen", service.open(&r)).await.expect("reopen");
    let runtime = binding.runtime().clone();
    let live = runtime.snapshot();
    assert_eq!(live.phase, RuntimePhase::Idle);
    let p = &live.session.projection;
    assert_eq!(p.turn_id, None);
    assert_eq!(p.turn_status, "interrupted");
    assert!(p.active_tools.is_empty(), "{:?}", p.active_tools);
    assert_eq!(p.title, "Crash test");
    assert_eq!(
        live.session.durable_sequence, live.session.event_sequence,
        "the recovery batch is durable"
    );
    assert!(
        p.interactions.is_empty(),
        "every pending interaction resolved: {:?}",
        p.interactions
    );
    assert!(live.session.durable_sequence > durable_before);

    // Retries: the durable batch returns its commit; the lost one is appended anew.
    let history = service.query().history(&r).await.expect("history");
    assert!(history.iter().all(|m| m.id() != "lost"));
    let original = runtime
        .session()
        .reader()
        .all_commits()
        .expect("commits")
        .into_iter()
        .find(|c| c.operation_id == "op-open-turn")
        .expect("durable commit");
    let again = runtime
        .session()
        .append(common::retry_of(&original))
        .expect("retry");
    assert_eq!(common::identity(&again), common::identity(&original));
    let conflict = runtime
        .session()
        .append_events("op-open-turn", vec![title("other")])
        .expect_err("conflict");
    assert!(conflict.is_caller_error(), "{conflict:?}");
    let lost = runtime
        .session()
        .append(
            Batch::new(
                "op-lost",
                vec![message("lost", "assistant", "never durable")],
            )
            .in_turn("t2"),
        )
        .expect("the batch never made durable is appended anew");
    assert!(lost.first_seq > live.session.durable_sequence);

    let live = runtime.snapshot().session.projection;
    binding.release().await.expect("release");
    within("close", service.close(&r)).await.expect("close");
    let cold = service.query().snapshot(&r).await.expect("cold").projection;
    assert_eq!(
        serde_json::to_value(&cold).expect("json"),
        serde_json::to_value(&live).expect("json"),
        "cold projection after close equals the live one"
    );
    let binding = service.open(&r).await.expect("reopen");
    let reopened = binding.runtime().snapshot().session.projection;
    assert_eq!(
        serde_json::to_value(&reopened).expect("json"),
        serde_json::to_value(&live).expect("json"),
        "reopened projection equals the live one"
    );
    binding.release().await.expect("release");
    service.shutdown().await.expect("shutdown");
}

/// A service dropped without `shutdown` (a host that returns early) lets its writers go:
/// a new service in the same process opens the session, and what was accepted is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_dropped_without_shutdown_releases_its_writers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let r = {
        let service = service_in(dir.path());
        let rt = service
            .create(CreateOptions::with_id(id("dropped")))
            .await
            .expect("create");
        rt.session()
            .append(turn("op-1", "t1", "m1"))
            .expect("append");
        let binding = service.open(rt.session_ref()).await.expect("bind");
        let r = rt.session_ref().clone();
        drop(binding);
        r
    };
    let service = service_in(dir.path());
    let binding = within("open after drop", async {
        loop {
            match service.open(&r).await {
                Ok(b) => break b,
                Err(e) if e.is_writer_owned() => {
                    tokio::time::sleep(Duration::from_millis(50)).await
                }
                Err(e) => panic!("open: {e}"),
            }
        }
    })
    .await;
    let history = service.query().history(&r).await.expect("history");
    assert_eq!(history.len(), 1);
    binding.release().await.expect("release");
    service.shutdown().await.expect("shutdown");
}

/// Every part of the projection a host reads (title, config, usage, plan and goal, todos,
/// recovery status, running tools and pending interactions outside a turn, the workset
/// after a context replace and an upsert): the same live, cold (from the file, with and
/// without a checkpoint) and after a reopen; and `list` reports the same summary live and
/// cold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_projection_reads_the_same_live_cold_and_reopened() {
    for filler in [0usize, 120] {
        let dir = tempfile::tempdir().expect("tempdir");
        let service = service_in(dir.path());
        let rt = service
            .create(CreateOptions::with_id(id("rich")))
            .await
            .expect("create");
        let r = rt.session_ref().clone();
        let s = rt.session().clone();
        s.append_events(
            "op-config",
            vec![
                event(
                    "session/config",
                    json!({"modelRef": "model-x", "modelIdentity": {"v": 1}}),
                ),
                title("Rich"),
                event("plan/state", json!({"steps": [1, 2]})),
                event("goal/state", json!({"goal": "ship"})),
            ],
        )
        .expect("config");
        s.append(
            Batch::new(
                "op-t1",
                vec![
                    Event::new("turn/start"),
                    message("u1", "user", "  first question  "),
                    event(
                        "todo/write",
                        json!({"todos": [{"content": "a", "status": "pending"}]}),
                    ),
                    event(
                        "runtime/recovery",
                        json!({"state": "recovery_required", "reason": "test"}),
                    ),
                    event("tool/start", json!({"id": "c1", "name": "bash"})),
                    event(
                        "tool/result",
                        json!({"id": "c1", "name": "bash", "output": "ok"}),
                    ),
                    message("a1", "assistant", "answer"),
                    event(
                        "usage",
                        json!({"model": "model-x", "input_tokens": 10, "output_tokens": 5,
                            "cost": "0.25"}),
                    ),
                    turn_end("completed"),
                ],
            )
            .in_turn("t1"),
        )
        .expect("t1");
        for i in 0..filler {
            let events = (0..10)
                .map(|j| message(&format!("f{i}-{j}"), "assistant", "filler"))
                .collect();
            s.append_events(&format!("op-fill-{i}"), events)
                .expect("filler");
        }
        s.append_events(
            "op-outside",
            vec![
                event("tool/start", json!({"id": "bg", "name": "watch"})),
                event(
                    "interaction/created",
                    json!({"id": "later", "state": "pending"}),
                ),
                event(
                    "model/context-replace",
                    json!({"messages": [{"id": "sum", "role": "system", "content": "summary"}]}),
                ),
                event(
                    "message/upsert",
                    json!({"message": {"id": "a1", "role": "assistant", "content": "edited"}}),
                ),
            ],
        )
        .expect("outside");
        drop(rt);
        s.flush().expect("flush");
        let live = s.snapshot().projection;
        let live_json = serde_json::to_value(&live).expect("json");
        let live_list = service.query().list(None, 10).await.expect("list");
        let live_summary = serde_json::to_value(&live_list.sessions[0]).expect("json");
        service.close(&r).await.expect("close");

        let cold = service.query().snapshot(&r).await.expect("cold");
        assert_eq!(
            serde_json::to_value(&cold.projection).expect("json"),
            live_json,
            "filler {filler}: cold projection"
        );
        let cold_list = service.query().list(None, 10).await.expect("list");
        let mut cold_summary = serde_json::to_value(&cold_list.sessions[0]).expect("json");
        assert_eq!(cold_summary["live"], json!(false));
        cold_summary["live"] = json!(true);
        // The close's checkpoint and WAL truncation touch the files after.
        cold_summary["updated_at_ms"] = live_summary["updated_at_ms"].clone();
        assert_eq!(cold_summary, live_summary, "filler {filler}: list summary");

        let binding = service.open(&r).await.expect("reopen");
        let reopened = binding.runtime().snapshot().session.projection;
        assert_eq!(
            serde_json::to_value(&reopened).expect("json"),
            live_json,
            "filler {filler}: reopened projection"
        );
        binding.release().await.expect("release");
        service.shutdown().await.expect("shutdown");
    }
}

/// A classifier of [`Error`] and its name.
type Classifier = (&'static str, fn(&Error) -> bool);

/// Every classifier of [`Error`], by name.
const CLASSIFIERS: [Classifier; 9] = [
    ("retryable", Error::is_retryable),
    ("not_found", Error::is_not_found),
    ("already_exists", Error::is_already_exists),
    ("writer_owned", Error::is_writer_owned),
    ("corrupt", Error::is_corrupt),
    ("unsupported", Error::is_unsupported),
    ("caller_error", Error::is_caller_error),
    ("needs_reopen", Error::needs_reopen),
    ("internal", Error::is_internal),
];

/// What each classifier says about an error, in one line.
fn classes(e: &Error) -> String {
    let names: Vec<&str> = CLASSIFIERS
        .iter()
        .filter(|(_, says)| says(e))
        .map(|(name, _)| *name)
        .collect();
    names.join(",")
}

/// Records in `$wrong` when `$call` succeeds or fails with other classifiers than `$want`.
macro_rules! expect_classes {
    ($wrong:ident, $what:expr, $call:expr, $want:expr) => {
        match $call {
            Ok(_) => $wrong.push(format!("{}: succeeded, expected [{}]", $what, $want)),
            Err(e) if classes(&e) != $want => $wrong.push(format!(
                "{}: {e:?} is [{}], expected [{}]",
                $what,
                classes(&e),
                $want
            )),
            Err(_) => {}
        }
    };
}

/// The errors the service and its queries return, each with the classifiers its doc
/// comments and ARCHITECTURE's error table give it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_errors_carry_their_documented_classifiers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let service = service_in(dir.path());
    let rt = service
        .create(CreateOptions::with_id(id("one")))
        .await
        .expect("create");
    let r = rt.session_ref().clone();
    rt.session().append(turn("op-1", "t1", "m1")).expect("t1");
    let other = SessionRef::new("elsewhere", "one").expect("ref");
    let missing = SessionRef::new(HOST, "missing").expect("ref");
    let (q, nowhere) = (service.query(), dir.path().join("nope"));
    let mut wrong = Vec::new();
    expect_classes!(
        wrong,
        "open other host",
        service.open(&other).await,
        "caller_error"
    );
    expect_classes!(
        wrong,
        "open missing",
        service.open(&missing).await,
        "not_found"
    );
    expect_classes!(
        wrong,
        "snapshot missing",
        q.snapshot(&missing).await,
        "not_found"
    );
    expect_classes!(
        wrong,
        "history missing",
        q.history(&missing).await,
        "not_found"
    );
    let page = q.history_page(&missing, None, 10).await;
    expect_classes!(wrong, "history_page missing", page, "not_found");
    expect_classes!(
        wrong,
        "observe missing",
        q.observe(&missing, 0, 10).await,
        "not_found"
    );
    let page = q.history_page(&r, Some("h1.x"), 10).await;
    expect_classes!(wrong, "history_page bad cursor", page, "caller_error");
    let page = q.history_page(&r, Some("h1.999999.2"), 10).await;
    expect_classes!(wrong, "history_page newer cursor", page, "caller_error");
    let page = q.history_page_ending_at(&r, 0, 10).await;
    expect_classes!(wrong, "history_page_ending_at 0", page, "caller_error");
    expect_classes!(
        wrong,
        "list limit 101",
        q.list(None, 101).await,
        "caller_error"
    );
    let forked = service.fork(&r, "no-such-turn", Some(id("child-x"))).await;
    expect_classes!(wrong, "fork unknown turn", forked, "caller_error");
    let forked = service.fork(&r, "t1", Some(id("one"))).await;
    expect_classes!(wrong, "fork onto an existing id", forked, "already_exists");
    expect_classes!(
        wrong,
        "rename blank",
        service.rename(&r, "  ").await,
        "caller_error"
    );
    expect_classes!(
        wrong,
        "rename missing",
        service.rename(&missing, "t").await,
        "not_found"
    );
    let continued = service.continue_legacy(&nowhere, "").await;
    expect_classes!(
        wrong,
        "continue_legacy missing file",
        continued,
        "not_found"
    );
    expect_classes!(
        wrong,
        "import missing file",
        service.import(&nowhere).await,
        "not_found"
    );
    let export = dir.path().join("one.db");
    service.export(&r, &export).await.expect("export");
    let exported = service.export(&r, &export).await;
    expect_classes!(
        wrong,
        "export onto an existing file",
        exported,
        "already_exists"
    );
    let imported = service.import(&export).await;
    expect_classes!(
        wrong,
        "import under an existing id",
        imported,
        "already_exists"
    );
    expect_classes!(
        wrong,
        "flush other host",
        service.flush(&other).await,
        "caller_error"
    );
    // A second service in this process over the same root: the writer is owned.
    let second = service_in(dir.path());
    expect_classes!(
        wrong,
        "open owned elsewhere",
        second.open(&r).await,
        "writer_owned"
    );
    let cancel = session_store::CancelToken::new();
    cancel.cancel();
    let deleted = second.delete(&r, &cancel).await;
    expect_classes!(
        wrong,
        "delete owned elsewhere (cancelled wait)",
        deleted,
        ""
    );
    // Closed runtime: appends and executions need a reopen.
    drop(rt);
    let rt = service.runtime(&r).expect("runtime");
    service.close(&r).await.expect("close");
    let late = rt.session().append_events("late", vec![title("late")]);
    expect_classes!(wrong, "append after close", late, "needs_reopen");
    expect_classes!(
        wrong,
        "bind after close",
        rt.bind_execution("x"),
        "needs_reopen"
    );
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// A runtime whose session was closed through `Runtime::session` binds no execution:
/// `Closed` (outside testing, session 39: it bound one, `Running`, whose every append
/// answered "session is closed").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_whose_session_was_closed_binds_no_execution() {
    let dir = tempfile::tempdir().expect("tempdir");
    let service = service_in(dir.path());
    let rt = service
        .create(CreateOptions::with_id(id("closed-below")))
        .await
        .expect("create");
    rt.session().close().expect("close the session");
    assert!(matches!(rt.bind_execution("agent"), Err(Error::Closed)));
    assert_ne!(rt.phase(), RuntimePhase::Running);
}

/// An execution dropped without `finish` (its task panicked, or returned early on an
/// error) ends as `finish` ends it: the runtime goes back to `idle`, so the next execution
/// binds and the session closes; a cancelled one too. Dropping an execution that was
/// replaced or whose authority was revoked changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_execution_dropped_without_finish_ends_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let service = service_in(dir.path());
    let rt = service
        .create(CreateOptions::with_id(id("dropped-exec")))
        .await
        .expect("create");
    let r = rt.session_ref().clone();
    // A task that panics while it holds the execution.
    let task = {
        let rt = rt.clone();
        tokio::spawn(async move {
            let exec = rt.bind_execution("agent").expect("bind");
            exec.append(
                Batch::new(
                    "op-open",
                    vec![Event::new("turn/start"), message("u", "user", "q")],
                )
                .in_turn("t1"),
            )
            .expect("open turn");
            panic!("the agent loop failed");
        })
    };
    assert!(task.await.expect_err("panicked").is_panic());
    assert_eq!(
        rt.phase(),
        RuntimePhase::Idle,
        "the dropped execution ended"
    );
    // An early return while cancelling.
    let exec = rt
        .bind_execution("agent")
        .expect("the next execution binds");
    service.cancel_session(&r).expect("cancel");
    assert_eq!(rt.phase(), RuntimePhase::Cancelling);
    drop(exec);
    assert_eq!(
        rt.phase(),
        RuntimePhase::Idle,
        "the cancelled execution ended"
    );
    // Revoked authority stays revoked until the host resolves it.
    let exec = rt.bind_execution("tool").expect("bind");
    rt.require_recovery("tool");
    drop(exec);
    assert_eq!(rt.phase(), RuntimePhase::RecoveryRequired);
    rt.resolve_recovery();
    let exec = rt.bind_execution("agent").expect("bind");
    exec.append(Batch::new("op-close", vec![turn_end("interrupted")]).in_turn("t1"))
        .expect("close the turn");
    exec.finish();
    assert_eq!(rt.phase(), RuntimePhase::Idle);
    drop(rt);
    within("close", service.close(&r))
        .await
        .expect("the session closes");
}

/// A query during a `Service::close` never goes back on what the service accepted: the
/// close unpublishes the runtime while it drains, and `history`, `snapshot` and `observe`
/// then read the file cold, without the accepted tail (300 accepted messages, never
/// flushed: the history answered 0 messages, the snapshot and `observe` sequence 0, while
/// the close ran). They now wait for the close; `list` summarises the runtime being
/// closed (its catalog entry said sequence 0). 20 rounds.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn queries_during_a_close_keep_every_accepted_commit() {
    const ACCEPTED: usize = 300;
    for round in 0..20 {
        let dir = tempfile::tempdir().expect("tempdir");
        let service = Service::new(HOST, manual_root(dir.path())).expect("service");
        let rt = service
            .create(CreateOptions::with_id(id("closing")))
            .await
            .expect("create");
        let r = rt.session_ref().clone();
        for i in 0..ACCEPTED {
            let text = "x".repeat(2_000);
            rt.session()
                .append(Batch::new(
                    format!("op-{i}"),
                    vec![message(&format!("m{i}"), "user", &text)],
                ))
                .expect("append");
        }
        drop(rt);
        let closer = {
            let (service, r) = (service.clone(), r.clone());
            tokio::spawn(async move { service.close(&r).await })
        };
        let q = service.query();
        for _ in 0..50 {
            // First: `history` below waits for the close.
            let page = within("list", q.list(None, 10)).await.expect("list");
            assert_eq!(
                page.sessions[0].event_sequence, ACCEPTED as u64,
                "round {round}: list"
            );
            let history = within("history", q.history(&r)).await.expect("history");
            assert_eq!(history.len(), ACCEPTED, "round {round}: history");
            let snapshot = within("snapshot", q.snapshot(&r)).await.expect("snapshot");
            assert_eq!(
                snapshot.event_sequence, ACCEPTED as u64,
                "round {round}: snapshot"
            );
            let observed = within("observe", q.observe(&r, 0, 1000))
                .await
                .expect("observe");
            assert_eq!(
                observed.events.next, ACCEPTED as u64,
                "round {round}: observe"
            );
            if closer.is_finished() {
                break;
            }
        }
        within("close", closer).await.expect("task").expect("close");
    }
}

/// Queries (history, history pages, snapshots, observe, list) running while the session
/// is closed and opened again, over and over: each answers (live or cold), never an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn queries_answer_while_the_session_closes_and_reopens() {
    let dir = tempfile::tempdir().expect("tempdir");
    let service = service_in(dir.path());
    let rt = service
        .create(CreateOptions::with_id(id("queried")))
        .await
        .expect("create");
    let r = rt.session_ref().clone();
    for i in 0..20 {
        rt.session()
            .append(turn(&format!("op-{i}"), &format!("t{i}"), &format!("m{i}")))
            .expect("turn");
    }
    drop(rt);
    service.flush(&r).await.expect("flush");
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    let mut tasks = Vec::new();
    for t in 0..3 {
        let (service, r) = (service.clone(), r.clone());
        tasks.push(tokio::spawn(async move {
            let q = service.query();
            let mut n = 0u64;
            while std::time::Instant::now() < deadline {
                let what = (n + t) % 5;
                let result = match what {
                    0 => q.history(&r).await.map(|h| h.len() as u64),
                    1 => q
                        .history_page(&r, None, 7)
                        .await
                        .map(|p| p.messages.len() as u64),
                    2 => q.snapshot(&r).await.map(|s| s.projection.transcript_len),
                    3 => q
                        .observe(&r, 0, 100)
                        .await
                        .map(|o| o.events.commits.len() as u64),
                    _ => q.list(None, 10).await.map(|p| p.sessions.len() as u64),
                };
                match result {
                    Ok(count) => assert!(count >= 1, "query {what}: empty answer"),
                    Err(e) => panic!("query {what} round {n}: {e:?}"),
                }
                n += 1;
            }
            n
        }));
    }
    let mut cycles = 0;
    while std::time::Instant::now() < deadline {
        let binding = service.open(&r).await.expect("open");
        binding.release().await.expect("release");
        within("close", service.close(&r)).await.expect("close");
        cycles += 1;
    }
    for task in tasks {
        within("queries", task).await.expect("query task");
    }
    assert!(cycles > 0);
}

/// A thread appending business batches through an execution as fast as it can while the
/// session is cancelled (300 rounds): once `cancel_session` has returned, no business
/// batch of the execution is accepted (each append either landed before it returned or
/// is `StaleExecution`), and the turn still closes with a closure batch.
#[test]
fn no_business_batch_is_accepted_after_a_cancel_returns() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tokio = tokio::runtime::Runtime::new().expect("tokio");
    let service = service_in(dir.path());
    let runtime = tokio
        .block_on(service.create(CreateOptions::with_id(id("race"))))
        .expect("create");
    let r = runtime.session_ref().clone();
    let mut late = Vec::new();
    for round in 0..300 {
        let exec = std::sync::Arc::new(runtime.bind_execution("agent").expect("bind"));
        let appender = {
            let exec = exec.clone();
            std::thread::spawn(move || {
                let mut last = 0;
                for n in 0.. {
                    match exec.append(Batch::new(
                        format!("op-{round}-{n}"),
                        vec![title(&format!("title {round}-{n}"))],
                    )) {
                        Ok(c) => last = c.last_seq(),
                        Err(Error::StaleExecution(_)) => break,
                        Err(e) => panic!("round {round}: {e}"),
                    }
                }
                last
            })
        };
        std::thread::sleep(Duration::from_micros(200));
        service.cancel_session(&r).expect("cancel");
        let at_cancel = runtime.session().sequences().0;
        let last = appender.join().expect("appender");
        if last > at_cancel {
            late.push((round, at_cancel, last));
        }
        let exec = std::sync::Arc::try_unwrap(exec).expect("one owner");
        exec.append(Batch::new(
            format!("end-{round}"),
            vec![turn_end("interrupted")],
        ))
        .expect("a closure batch after the cancel");
        exec.finish();
    }
    assert!(
        late.is_empty(),
        "business batches accepted after cancel_session returned (round, sequence at the \
         cancel, last accepted): {late:?}"
    );
    drop(runtime);
    tokio.block_on(service.shutdown()).expect("shutdown");
}

/// Executions bound by one task while another closes the session (3 s, multi-threaded):
/// a close either finds the execution running (`RuntimeBusy`) or makes the bind fail
/// (`Closed`); an execution that was bound is never closed under it (its appends never
/// answer `Closed`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_close_never_closes_a_runtime_under_a_running_execution() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (service, r) = service_with_session(dir.path(), "exec-close").await;
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    let executor = {
        let (service, r) = (service.clone(), r.clone());
        tokio::spawn(async move {
            let mut bound = 0;
            let mut n = 0;
            while std::time::Instant::now() < deadline {
                n += 1;
                // The runtime as a host task holds it (a clone of the registered one).
                let Some(runtime) = service.runtime(&r) else {
                    tokio::task::yield_now().await;
                    continue;
                };
                let exec = match runtime.bind_execution("agent") {
                    Ok(exec) => exec,
                    Err(Error::Closed) => continue,
                    Err(e) => panic!("bind: {e}"),
                };
                bound += 1;
                let op = format!("op-{n}");
                let appended = exec.append(Batch::new(op.clone(), vec![title(&op)]));
                assert!(
                    appended.is_ok(),
                    "round {n}: the runtime was closed under a running execution: {appended:?}"
                );
                exec.finish();
            }
            bound
        })
    };
    let mut closes = 0;
    while std::time::Instant::now() < deadline {
        match service.close(&r).await {
            Ok(()) => closes += 1,
            Err(Error::RuntimeBusy(_)) => {}
            Err(e) => panic!("close: {e}"),
        }
        service
            .open(&r)
            .await
            .expect("open")
            .release()
            .await
            .expect("release");
    }
    let bound = within("executor", executor).await.expect("executor");
    assert!(bound > 0 && closes > 0, "bound {bound}, closes {closes}");
    service.shutdown().await.expect("shutdown");
}

/// `publish` is idempotent while the prepared runtime is published: once that runtime
/// was closed through the service it is not published any more, and `publish` says
/// `Closed` rather than handing back the closed, unregistered runtime as published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_after_the_published_runtime_closed_answers_closed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let service = service_in(dir.path());
    let prepared = service
        .prepare_create(CreateOptions::with_id(id("prepared")))
        .await
        .expect("prepare");
    let first = service.publish(&prepared).expect("publish");
    let again = service.publish(&prepared).expect("publish again");
    assert_eq!(first, again, "the same instance");
    let r = first.session_ref().clone();
    drop((first, again));
    service.close(&r).await.expect("close");
    let after = service.publish(&prepared);
    assert!(
        matches!(after, Err(Error::Closed)),
        "publish after close: {after:?} (registered: {:?})",
        service.runtime(&r)
    );
    // The session opens again as usual.
    let binding = service.open(&r).await.expect("open");
    binding.release().await.expect("release");
    service.shutdown().await.expect("shutdown");
}

/// `publish` of a prepared runtime published and then detached registers it again: the
/// runtime it returns is the registered one (it was handed back as published while the
/// registry knew nothing of it: `runtime(ref)` answered `None` and an open of the session
/// `WriterOwned`, naming this process).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_after_a_detach_registers_the_runtime_again() {
    let dir = tempfile::tempdir().expect("tempdir");
    let service = service_in(dir.path());
    let prepared = service
        .prepare_create(CreateOptions::with_id(id("detached")))
        .await
        .expect("prepare");
    let first = service.publish(&prepared).expect("publish");
    let r = first.session_ref().clone();
    assert!(service.detach(&first));
    assert_eq!(service.runtime(&r), None);
    let again = service.publish(&prepared).expect("publish after detach");
    assert_eq!(again, first, "the same instance");
    assert_eq!(service.runtime(&r).as_ref(), Some(&again), "registered");
    let binding = within("open", service.open(&r)).await.expect("open");
    assert_eq!(binding.runtime(), &again);
    binding.release().await.expect("release");
    // Detached and closed by its own session: `Closed`, nothing registered.
    assert!(service.detach(&again));
    again.session().close().expect("close the detached session");
    let closed = service.publish(&prepared);
    assert!(matches!(closed, Err(Error::Closed)), "{closed:?}");
    assert_eq!(service.runtime(&r), None);
    service.shutdown().await.expect("shutdown");
}

/// A prepared session is in the root at once (listed, its id taken: upstream's
/// `PrepareCreate` creates it; only its runtime is hidden), an open of it meanwhile is
/// refused naming this process as the writer (it read as some other program's, outside
/// testing of the library, session 42), and a discard leaves the session, which a delete
/// removes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prepared_session_is_listed_its_open_names_this_process_and_discard_leaves_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let service = service_in(dir.path());
    let prepared = within(
        "prepare",
        service.prepare_create(CreateOptions::with_id(id("prep"))),
    )
    .await
    .expect("prepare");
    let r = prepared.runtime().session_ref().clone();
    let listed = |service: &Service| {
        let service = service.clone();
        async move {
            let page = service.query().list(None, 50).await.expect("list");
            page.sessions
                .iter()
                .any(|s| s.session_ref.session_id.as_str() == "prep")
        }
    };
    assert!(listed(&service).await, "the prepared session is not listed");
    let err = within("open", service.open(&r)).await.unwrap_err();
    assert!(err.is_writer_owned(), "{err}");
    assert!(
        err.to_string().contains(&format!(
            "pid {} (this process) on host",
            std::process::id()
        )),
        "{err}"
    );
    within("discard", service.discard(&prepared))
        .await
        .expect("discard");
    assert!(listed(&service).await, "the discarded session is gone");
    let err = within("create", service.create(CreateOptions::with_id(id("prep"))))
        .await
        .unwrap_err();
    assert!(err.is_already_exists(), "{err}");
    within("delete", service.delete(&r, &CancelToken::new()))
        .await
        .expect("delete");
    assert!(!listed(&service).await);
}

/// A prepared runtime is published or discarded only by the service that prepared it (or
/// a clone), as upstream's `Publish` requires: another service (another host, another
/// root) published it before, registering a session of the first root under its own
/// registry (`runtime(b/x)` answered the runtime of `a/x`, whose close then kept the first
/// service from ever publishing it). Its `discard` is a no-op (upstream: "foreign ⇒ no-op").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prepared_runtime_is_published_only_by_its_own_service() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = service_in(dir.path());
    let b = Service::new(
        "other-host",
        Root::open(dir.path().join("other")).expect("root"),
    )
    .expect("service");
    let prepared = a
        .prepare_create(CreateOptions::with_id(id("x")))
        .await
        .expect("prepare");
    prepared
        .runtime()
        .session()
        .append(Batch::new("t", vec![title("from a")]))
        .expect("append before publish");
    let foreign = b
        .publish(&prepared)
        .expect_err("another service's prepared runtime");
    assert!(foreign.is_caller_error(), "{foreign:?}");
    assert!(foreign.to_string().contains("another service"), "{foreign}");
    assert!(b.runtime(&b.session_ref(id("x"))).is_none());
    b.discard(&prepared)
        .await
        .expect("a foreign discard is a no-op");
    // Still the first service's, usable and publishable there (a clone of it too).
    let published = a
        .clone()
        .publish(&prepared)
        .expect("publish by its own service");
    assert_eq!(published.session_ref(), &a.session_ref(id("x")));
    assert_eq!(
        a.runtime(&a.session_ref(id("x"))).expect("registered"),
        published
    );
    assert_eq!(published.session().snapshot().projection.title, "from a");
    drop(published);
    a.shutdown().await.expect("shutdown");
    b.shutdown().await.expect("shutdown");
}

/// An open of a session that another task of the service is creating (200 rounds, the
/// open retried while the session is not found): it gets the created runtime, never
/// `WriterOwned` naming this very process.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_open_racing_a_create_gets_the_created_runtime() {
    let dir = tempfile::tempdir().expect("tempdir");
    let service = service_in(dir.path());
    for i in 0..200 {
        let sid = id(&format!("s{i}"));
        let r = service.session_ref(sid.clone());
        let create = {
            let service = service.clone();
            tokio::spawn(async move { service.create(CreateOptions::with_id(sid)).await })
        };
        let open = {
            let service = service.clone();
            tokio::spawn(async move {
                loop {
                    match service.open(&r).await {
                        Err(e) if e.is_not_found() => tokio::task::yield_now().await,
                        other => return other,
                    }
                }
            })
        };
        let created = within("create", create)
            .await
            .expect("join")
            .expect("create");
        let binding = within("open", open)
            .await
            .expect("join")
            .unwrap_or_else(|e| panic!("round {i}: open racing the create: {e:?}"));
        assert_eq!(
            binding.runtime(),
            &created,
            "round {i}: the created runtime"
        );
        binding.release().await.expect("release");
    }
    // A create of an id this service has open answers that it exists.
    let taken = service
        .create(CreateOptions::with_id(id("s0")))
        .await
        .expect_err("exists");
    assert!(taken.is_already_exists(), "{taken:?}");
    service.shutdown().await.expect("shutdown");
}

/// `Service::rename` racing a `Service::close` of the same session (200 rounds): the
/// rename lands, through the runtime or on the closed session, never `Closed` (the runtime
/// closed under it) nor `WriterOwned` naming this process (the close still holding the
/// writer); the last title is the one listed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rename_racing_a_close_lands() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (service, r) = service_with_session(dir.path(), "renamed").await;
    for i in 0..200 {
        let close = start_closing(&service, &r).await;
        let rename = {
            let (service, r) = (service.clone(), r.clone());
            tokio::spawn(async move { service.rename(&r, &format!("title {i}")).await })
        };
        within("close", close).await.expect("join").expect("close");
        within("rename", rename)
            .await
            .expect("join")
            .unwrap_or_else(|e| panic!("round {i}: rename racing a close: {e:?}"));
    }
    if service.runtime(&r).is_some() {
        service.close(&r).await.expect("close");
    }
    let page = service.query().list(None, 10).await.expect("list");
    assert_eq!(page.sessions[0].title, "title 199");
    service.shutdown().await.expect("shutdown");
}

/// `Service::delete` racing a `Service::open` of the same closed session (50 rounds, both
/// in one `tokio::join!`): the delete either comes first (the open finds no session) or is
/// refused `RuntimeBound` by the open's binding, as its doc says. It used to wait for the
/// writer lock of the runtime this very service had just opened, until its cancel token
/// fired (here after 5 s: `Cancelled`; forever with a token never cancelled).
async fn delete_racing_open(service: Service) {
    for i in 0..50 {
        let (service, r) = with_session(service.clone(), &format!("d{i}")).await;
        service.close(&r).await.expect("close");
        let cancel = CancelToken::new();
        let timer = {
            let cancel = cancel.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs(5)).await;
                cancel.cancel();
            })
        };
        let (opened, deleted) = within("open and delete", async {
            tokio::join!(service.open(&r), service.delete(&r, &cancel))
        })
        .await;
        timer.abort();
        match (&opened, &deleted) {
            (Err(Error::SessionNotFound(_)), Ok(())) => {
                assert!(
                    service.root().stat(&r.session_id).is_err(),
                    "round {i}: kept"
                );
            }
            (Ok(_), Err(Error::RuntimeBound(_))) => {}
            other => panic!("round {i}: open and delete: {other:?}"),
        }
    }
    service.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_delete_racing_an_open_never_waits_for_its_own_services_writer() {
    let dir = tempfile::tempdir().expect("tempdir");
    delete_racing_open(service_in(dir.path())).await;
}

/// The same on a current-thread runtime with one blocking thread: a delete that closed the
/// runtime an open had just installed, before the open's binding counted, let the open
/// reopen the session, closed that runtime again, and so on for good.
#[test]
fn a_delete_racing_an_open_ends_on_a_current_thread_runtime() {
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .max_blocking_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(delete_racing_open(service_in(dir.path())));
}

/// While `Service::delete` waits for the writer another handle holds (a
/// `Root::open_writer` session outside the registry), `history` and `snapshot` of the
/// session answer at once, an open of it waits for the delete and finds no session once
/// the other writer lets go, and `shutdown` does not wait for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queries_answer_while_a_delete_waits_for_the_writer() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (service, r) = service_with_session(dir.path(), "held").await;
    let rt = service.runtime(&r).expect("runtime");
    rt.session()
        .append(turn("op-1", "t1", "m1"))
        .expect("append");
    drop(rt);
    service.close(&r).await.expect("close");
    let other = service.root().open_writer(&r.session_id).expect("writer");
    let cancel = CancelToken::new();
    let delete = {
        let (service, r, cancel) = (service.clone(), r.clone(), cancel.clone());
        tokio::spawn(async move { service.delete(&r, &cancel).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let history = within("history during the delete", service.query().history(&r)).await;
    assert_eq!(history.expect("history").len(), 1);
    let snapshot = within("snapshot during the delete", service.query().snapshot(&r)).await;
    assert_eq!(snapshot.expect("snapshot").durable_sequence, 3);
    let open = {
        let (service, r) = (service.clone(), r.clone());
        tokio::spawn(async move { service.open(&r).await.map(drop) })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!open.is_finished(), "the open did not wait for the delete");
    other.close().expect("close the other writer");
    within("delete", delete)
        .await
        .expect("join")
        .expect("delete");
    let opened = within("open", open).await.expect("join");
    assert!(
        matches!(opened, Err(Error::SessionNotFound(_))),
        "{opened:?}"
    );
    within("shutdown", service.shutdown())
        .await
        .expect("shutdown");
}

/// A fork and an export of a session racing its `Service::close` (100 rounds, a turn
/// accepted and not yet durable each time: write-behind of an hour): the fork after that
/// turn succeeds and the export holds it, as when no close runs (the close used to hide
/// the runtime, so neither flushed it: "completed turn not found in parent", an export
/// without the turn).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fork_or_export_racing_a_close_sees_what_was_accepted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (service, r) = manual_service_with_session(dir.path(), "parent").await;
    let mut wrong = Vec::new();
    for i in 0..100 {
        let binding = service.open(&r).await.expect("open");
        let accepted = binding
            .runtime()
            .session()
            .append(turn(&format!("op-{i}"), &format!("t{i}"), &format!("m{i}")))
            .expect("turn")
            .last_seq();
        binding.release().await.expect("release");
        let close = start_closing(&service, &r).await;
        let fork = {
            let (service, r) = (service.clone(), r.clone());
            tokio::spawn(async move {
                service
                    .fork(&r, &format!("t{i}"), Some(id(&format!("child-{i}"))))
                    .await
            })
        };
        let export_to = dir.path().join(format!("export-{i}.db"));
        let export = {
            let (service, r) = (service.clone(), r.clone());
            tokio::spawn(async move { service.export(&r, &export_to).await })
        };
        within("close", close).await.expect("join").expect("close");
        match within("fork", fork).await.expect("join") {
            Ok(child) => {
                let cr = child.session_ref().clone();
                drop(child);
                service.close(&cr).await.expect("close child");
            }
            Err(e) => wrong.push(format!("round {i}: fork: {e}")),
        }
        match within("export", export).await.expect("join") {
            Ok(report) if report.events == accepted => {}
            Ok(report) => wrong.push(format!(
                "round {i}: export holds {} events of {accepted}",
                report.events
            )),
            Err(e) => wrong.push(format!("round {i}: export: {e}")),
        }
    }
    assert!(wrong.is_empty(), "{} failures: {:#?}", wrong.len(), wrong);
    service.shutdown().await.expect("shutdown");
}

/// A second `continue_legacy` of a transcript racing a `close` of the session the first
/// one made (200 rounds): it continues that session (reused), never `Closed` because the
/// runtime it found was closed under it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_legacy_continuation_racing_a_close_continues() {
    let dir = tempfile::tempdir().expect("tempdir");
    let service = service_in(dir.path());
    let source = dir.path().join("old.jsonl");
    std::fs::write(
        &source,
        "{\"id\":\"u\",\"role\":\"user\",\"content\":\"hello\"}\n",
    )
    .expect("write");
    let (rt, _) = service
        .continue_legacy(&source, "")
        .await
        .expect("continue");
    let r = rt.session_ref().clone();
    drop(rt);
    for i in 0..200 {
        let close = start_closing(&service, &r).await;
        let continued = {
            let (service, source) = (service.clone(), source.clone());
            tokio::spawn(async move { service.continue_legacy(&source, "").await })
        };
        within("close", close).await.expect("join").expect("close");
        let (rt, record) = within("continue", continued)
            .await
            .expect("join")
            .unwrap_or_else(|e| panic!("round {i}: continuation racing a close: {e:?}"));
        assert!(
            record.reused && rt.session_ref() == &r,
            "round {i}: {record:?}"
        );
    }
    let history = service.query().history(&r).await.expect("history");
    assert_eq!(history.len(), 1, "the message once");
    service.shutdown().await.expect("shutdown");
}

/// A `Service::close` whose final drain fails (another connection holds the file's write
/// lock: `SQLITE_BUSY`) leaves the runtime published, accepting nothing. The next
/// `Service::open` retries that close, which writes the kept turn, and binds a fresh
/// runtime that accepts appends (it used to bind the failed one: every append `Closed`,
/// and every reopen the same runtime).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_after_a_failed_close_binds_a_runtime_that_appends() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (service, r) = manual_service_with_session(dir.path(), "stuck").await;
    let binding = service.open(&r).await.expect("open");
    binding
        .runtime()
        .session()
        .append(turn("op-kept", "t-kept", "m-kept"))
        .expect("accepted in memory");
    binding.release().await.expect("release");

    let file = dir.path().join("sessions/stuck/session.sqlite");
    let other = rusqlite::Connection::open(&file).expect("sqlite");
    other.execute_batch("BEGIN IMMEDIATE").expect("write lock");
    let e = within("close", service.close(&r))
        .await
        .expect_err("the drain meets the lock");
    assert!(e.is_retryable(), "{e:?}");
    other.execute_batch("ROLLBACK").expect("let go");

    let binding = within("open", service.open(&r)).await.expect("open");
    let session = binding.runtime().session().clone();
    session
        .append(turn("op-new", "t-new", "m-new"))
        .unwrap_or_else(|e| panic!("an append after the reopen: {e:?}"));
    session.flush().expect("flush");
    let ids: Vec<String> = session
        .transcript()
        .expect("transcript")
        .iter()
        .map(|m| m.id().to_owned())
        .collect();
    assert_eq!(ids, ["m-kept", "m-new"]);
    binding.release().await.expect("release");
    service.shutdown().await.expect("shutdown");
}

/// `shutdown` stops the service, as its doc says: `create`, `prepare_create`, `open`, `fork`
/// and `rename` then answer `ServiceShutDown` (they answered `Closed`, "session runtime is
/// closed", naming nothing) and create nothing (a `create` after it used to make
/// and publish a session that held its writer lock until the service was dropped), and a
/// `create` racing it (50 rounds) ends before it returns: no writer lock is held after.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shutdown_stops_the_service_and_leaves_no_writer() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (service, r) = service_with_session(dir.path(), "kept").await;
    let rt = service.runtime(&r).expect("published");
    rt.session()
        .append(turn("op-1", "t1", "m1"))
        .expect("append");
    service.close(&r).await.expect("close");
    within("shutdown", service.shutdown())
        .await
        .expect("shutdown");
    let clone = service.clone();
    let created = clone.create(CreateOptions::with_id(id("late"))).await;
    let stopped = |what: &str, e: Option<Error>| {
        let e = e.unwrap_or_else(|| panic!("{what} succeeded after shutdown"));
        assert!(matches!(e, Error::ServiceShutDown), "{what}: {e:?}");
        assert_eq!(
            e.to_string(),
            "the service is shut down: it opens, creates and publishes nothing more",
            "{what}"
        );
        assert_eq!(classes(&e), "", "{what}");
    };
    stopped("create", created.err());
    let prepared = service
        .prepare_create(CreateOptions::with_id(id("late")))
        .await;
    stopped("prepare_create", prepared.err());
    stopped("open", service.open(&r).await.err());
    stopped("fork", service.fork(&r, "t1", None).await.err());
    stopped("rename", service.rename(&r, "new title").await.err());
    let root = service.root().clone();
    assert_eq!(root.list_ids().expect("ids"), vec![id("kept")]);
    // Queries still answer.
    let history = service.query().history(&r).await.expect("history");
    assert_eq!(history.len(), 1);

    for round in 0..50 {
        let service = service_in(&dir.path().join(format!("race-{round}")));
        let opener = {
            let service = service.clone();
            tokio::spawn(async move {
                service
                    .create(CreateOptions::with_id(id("raced")))
                    .await
                    .map(drop)
            })
        };
        tokio::task::yield_now().await;
        within("racing shutdown", service.shutdown())
            .await
            .expect("shutdown");
        let _ = opener.await.expect("opener task");
        assert!(service.runtime(&service.session_ref(id("raced"))).is_none());
        if service
            .root()
            .list_ids()
            .expect("ids")
            .contains(&id("raced"))
        {
            let writer = service.root().open_writer(&id("raced"));
            assert!(writer.is_ok(), "round {round}: {:?}", writer.err());
        }
    }
}

/// The runtime errors name their session (a host serving many sessions logs them without
/// the call's context): `RuntimeBusy`, `RuntimeBound`, `SessionNotRunning` and
/// `StaleExecution` said "session runtime is busy", "… still has client bindings",
/// "session is not running" and "execution no longer owns commit authority" of none.
#[tokio::test]
async fn runtime_errors_name_their_session() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (service, r) = service_with_session(dir.path(), "chat-7").await;
    let named = |e: &Error, variant: &str| {
        let text = e.to_string();
        assert!(text.starts_with("session chat-7"), "{variant}: {text}");
        assert!(format!("{e:?}").starts_with(variant), "{e:?}");
    };
    let rt = service.runtime(&r).expect("runtime");
    let exec = rt.bind_execution("model").expect("bind");
    named(
        &rt.bind_execution("tool").unwrap_err(),
        "RuntimeBusy(\"chat-7\")",
    );
    named(
        &service.close(&r).await.unwrap_err(),
        "RuntimeBusy(\"chat-7\")",
    );
    service.cancel(&r).expect("cancel");
    named(
        &exec.append(turn("late", "t1", "m1")).unwrap_err(),
        "StaleExecution(\"chat-7\")",
    );
    exec.finish();
    let binding = service.open(&r).await.expect("open");
    named(
        &service.close(&r).await.unwrap_err(),
        "RuntimeBound(\"chat-7\")",
    );
    binding.release().await.expect("release");
    service.close(&r).await.expect("close");
    let never = SessionRef::new(HOST, "chat-7-never").expect("ref");
    let err = service.flush(&never).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "session chat-7-never is not running (no runtime attached)"
    );
    assert!(
        matches!(err, Error::SessionNotRunning(ref id) if id == "chat-7-never"),
        "{err:?}"
    );
}

/// `shutdown` (and `close_all`) return the first error only, naming one session: a host
/// learns every runtime left open from `open_sessions`. With one session bound and another
/// running an execution, shutdown answered `RuntimeBound` and nothing said the busy one was
/// left open too (its writer lock held, still accepting appends).
#[tokio::test]
async fn shutdown_leaves_bound_and_busy_runtimes_listed_in_open_sessions() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (service, bound) = service_with_session(dir.path(), "sd0").await;
    let (service, busy) = with_session(service, "sd1").await;
    let (service, idle) = with_session(service, "sd2").await;
    assert_eq!(
        service.open_sessions(),
        vec![bound.clone(), busy.clone(), idle.clone()]
    );
    let binding = service.open(&bound).await.expect("open");
    let exec = service
        .runtime(&busy)
        .expect("runtime")
        .bind_execution("model")
        .expect("bind");
    let err = within("shutdown", service.shutdown()).await.unwrap_err();
    assert!(
        matches!(err, Error::RuntimeBound(_) | Error::RuntimeBusy(_)),
        "{err:?}"
    );
    assert_eq!(service.open_sessions(), vec![bound.clone(), busy.clone()]);
    // Once let go, the runtimes left close after the shutdown.
    binding.release().await.expect("release");
    exec.finish();
    within("close_all", service.close_all())
        .await
        .expect("close_all");
    assert_eq!(service.open_sessions(), Vec::<SessionRef>::new());
    assert!(service.root().open_writer(&id("sd1")).is_ok());
}

/// Waits (20 s at most) until the root holds exactly the sessions `known` and the
/// service has no runtime open but theirs: what callers that stopped waiting left behind
/// is removed in the background. Work abandoned by its caller is given 3 s first to reach
/// the point where it published (a session still being copied is not listed yet).
async fn settles_to(service: &Service, known: &[SessionRef]) {
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut ids: Vec<String> = known.iter().map(|r| r.session_id.to_string()).collect();
    ids.sort();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let mut listed: Vec<String> = service
            .root()
            .list_ids()
            .expect("list ids")
            .iter()
            .map(ToString::to_string)
            .collect();
        listed.sort();
        let open: Vec<String> = service
            .open_sessions()
            .iter()
            .map(|r| r.session_id.to_string())
            .filter(|id| !ids.contains(id))
            .collect();
        if listed == ids && open.is_empty() {
            return;
        }
        let unknown: Vec<&String> = listed.iter().filter(|id| !ids.contains(id)).collect();
        assert!(
            std::time::Instant::now() < deadline,
            "{} sessions no caller learnt of, {} of them open, e.g. {:?}",
            unknown.len(),
            open.len(),
            unknown.first()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A `create` without an id, a `prepare_create` and a `fork` without a child id whose
/// callers stop waiting (a timeout of 0 to 3 ms, an aborted task; 60 rounds) leave no
/// session behind: each session in the root is one a caller got (they ran on and
/// published sessions under ids their callers never learnt, holding their writers).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_create_whose_caller_stops_waiting_leaves_no_session() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (service, parent) = service_with_session(dir.path(), "parent").await;
    let rt = service.runtime(&parent).expect("runtime");
    rt.session().append(turn("op", "t1", "m1")).expect("turn");
    let mut known = vec![parent.clone()];
    for round in 0..60u64 {
        let wait = Duration::from_micros(round % 4 * 1000);
        let created = tokio::time::timeout(wait, service.create(CreateOptions::default())).await;
        if let Ok(rt) = created {
            known.push(rt.expect("create").session_ref().clone());
        }
        let prepared =
            tokio::time::timeout(wait, service.prepare_create(CreateOptions::default())).await;
        if let Ok(prepared) = prepared {
            let prepared = prepared.expect("prepare");
            known.push(
                service
                    .publish(&prepared)
                    .expect("publish")
                    .session_ref()
                    .clone(),
            );
        }
        let forked = tokio::time::timeout(wait, service.fork(&parent, "t1", None)).await;
        if let Ok(child) = forked {
            known.push(child.expect("fork").session_ref().clone());
        }
        let task = {
            let service = service.clone();
            tokio::spawn(async move { service.create(CreateOptions::default()).await })
        };
        tokio::time::sleep(wait).await;
        task.abort();
        if let Ok(Ok(rt)) = task.await {
            known.push(rt.session_ref().clone());
        }
    }
    settles_to(&service, &known).await;
    within("shutdown", service.shutdown())
        .await
        .expect("shutdown");
}

/// An `export` whose caller stops waiting (a timeout of 1 to 5 ms) stops at its next
/// commit: no file appears at the destination, nothing is left beside it (the copy ran on
/// to the end and wrote the file nobody waited for). An `import` whose caller stops
/// waiting leaves no session behind (it published one nobody learnt of).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_export_or_import_whose_caller_stops_waiting_leaves_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let service = service_in(dir.path());
    let s = service
        .root()
        .create(CreateOptions::with_id(id("big")))
        .expect("create");
    for i in 0..3000 {
        let m = format!("m{i}");
        s.append(Batch::new(
            m.clone(),
            vec![message(&m, "user", &"x".repeat(200))],
        ))
        .expect("append");
    }
    s.close().expect("close");
    let r = service.session_ref(id("big"));
    let out = dir.path().join("out");
    std::fs::create_dir(&out).expect("out");
    let mut stopped = 0;
    for round in 0..5u64 {
        let dest = out.join(format!("export-{round}.db"));
        let wait = Duration::from_millis(1 + round);
        if tokio::time::timeout(wait, service.export(&r, &dest))
            .await
            .is_err()
        {
            stopped += 1;
            tokio::time::sleep(Duration::from_millis(1500)).await;
            assert!(
                !dest.exists(),
                "round {round}: the export ran on to the end"
            );
        }
    }
    assert!(stopped > 0, "every export ended within its timeout");
    let left: Vec<_> = std::fs::read_dir(&out)
        .expect("read out")
        .map(|e| e.expect("entry").file_name())
        .filter(|n| !n.to_string_lossy().starts_with("export-"))
        .collect();
    assert!(left.is_empty(), "left beside the exports: {left:?}");
    // A whole export to import from.
    let file = out.join("whole.db");
    service.export(&r, &file).await.expect("export");
    let mut known = vec![r.clone()];
    for round in 0..6u64 {
        let options = session_store::ImportOptions::default()
            .with_session_id(id(&format!("imported-{round}")));
        let wait = Duration::from_millis(round * 2);
        let imported = tokio::time::timeout(wait, service.import_with_header(&file, options)).await;
        if let Ok(imported) = imported {
            known.push(imported.expect("import"));
        }
    }
    assert!(known.len() < 7, "every import ended within its timeout");
    settles_to(&service, &known).await;
    within("shutdown", service.shutdown())
        .await
        .expect("shutdown");
}

/// A tokio runtime dropped while calls of a `Service` it ran were under way (the end of a
/// `#[tokio::test]` sharing a service, a host replacing its runtime): the service's own
/// tasks (`Service::to_completion`) ran on the caller's runtime and were dropped with it,
/// halfway through an open, a close or a create, leaving the session id reserved for good:
/// every later open of it and `shutdown` waited forever, and creates given no id left
/// sessions whose id nobody was given (outside testing, session 45). Each round drops a
/// runtime at a different moment of an open, a close and two creates.
#[test]
fn a_runtime_dropped_during_service_calls_leaves_the_service_usable() {
    let dir = tempfile::tempdir().expect("tempdir");
    let service = service_in(dir.path());
    let r = service.session_ref(id("kept"));
    service
        .root()
        .create(CreateOptions::with_id(id("kept")))
        .and_then(|s| s.close())
        .expect("create");
    let given = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    for round in 0..24u64 {
        let dropped = tokio::runtime::Runtime::new().expect("runtime");
        let (s, rr) = (service.clone(), r.clone());
        dropped.spawn(async move {
            if let Ok(binding) = s.open(&rr).await {
                drop(binding);
                let _ = s.close(&rr).await;
            }
        });
        for _ in 0..2 {
            let (s, given) = (service.clone(), std::sync::Arc::clone(&given));
            dropped.spawn(async move {
                if let Ok(rt) = s.create(CreateOptions::default()).await {
                    let id = rt.session_ref().session_id.clone();
                    given.lock().expect("lock").push(id);
                }
            });
        }
        std::thread::sleep(Duration::from_micros(300 * round));
        drop(dropped);
    }
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let binding = within("open after the dropped runtimes", service.open(&r))
            .await
            .expect("open");
        binding.release().await.expect("release");
        within("history", service.query().history(&r))
            .await
            .expect("history");
        within("shutdown", service.shutdown())
            .await
            .expect("shutdown");
    });
    // Creates whose caller went away are deleted on the service's runtime, soon after.
    let mut given: Vec<String> = given
        .lock()
        .expect("lock")
        .iter()
        .map(|id| id.to_string())
        .collect();
    given.push("kept".into());
    given.sort();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let mut left: Vec<String> = std::fs::read_dir(dir.path().join("sessions"))
            .expect("root")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|name| !name.starts_with('.'))
            .collect();
        left.sort();
        if left == given {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "sessions no caller was given are left: {left:?}, given {given:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
