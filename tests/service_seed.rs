//! The seed suite (`shared/seed/service_test.go`) ported test by test; see tests/README.md.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::{id, message, title, turn, turn_end};
use serde_json::json;
use session_store::{
    Batch, CancelToken, CreateOptions, Error, Event, ImportOptions, Origin, Root, RuntimePhase,
    Service, SessionRef, replay_file,
};

fn service_at(host: &str, path: &Path) -> Service {
    Service::new(host, Root::open(path).unwrap()).unwrap()
}

fn service(host: &str) -> (tempfile::TempDir, Service) {
    let dir = tempfile::tempdir().unwrap();
    let s = service_at(host, &dir.path().join("sessions-v4"));
    (dir, s)
}

fn sref(host: &str, sid: &str) -> SessionRef {
    SessionRef::new(host, sid).unwrap()
}

fn opts(sid: &str) -> CreateOptions {
    CreateOptions::with_id(id(sid))
}

#[tokio::test]
async fn service_fork_and_rewind_use_persisted_turn_boundaries() {
    let (_dir, service) = service("local");
    let parent = service.create(opts("parent")).await.unwrap();
    parent
        .session()
        .append(turn("same-size-a", "turn-a", "message-a"))
        .unwrap();
    parent
        .session()
        .append(turn("same-size-b", "turn-b", "message-b"))
        .unwrap();

    let child = service
        .fork(parent.session_ref(), "turn-a", Some(id("child-after-a")))
        .await
        .unwrap();
    let messages = child.session().snapshot().projection.model_messages;
    assert_eq!(
        messages.iter().map(|m| m.id()).collect::<Vec<_>>(),
        ["message-a"]
    );
    assert_eq!(child.session().inherited_events(), 3);

    let rewound = service
        .rewind(parent.session_ref(), "turn-b", Some(id("child-before-b")))
        .await
        .unwrap();
    let messages = rewound.session().snapshot().projection.model_messages;
    assert_eq!(
        messages.iter().map(|m| m.id()).collect::<Vec<_>>(),
        ["message-a"]
    );

    for rt in [child, rewound, parent] {
        service.close(rt.session_ref()).await.unwrap();
    }
    service.close_all().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn service_concurrent_open_publishes_one_exact_runtime() {
    let dir = tempfile::tempdir().unwrap();
    let root = Root::open(dir.path().join("sessions-v4")).unwrap();
    root.create(opts("shared")).unwrap().close().unwrap();
    let service = Service::new("local", root).unwrap();
    let r = sref("local", "shared");
    let start = Arc::new(tokio::sync::Barrier::new(16));
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let (service, r, start) = (service.clone(), r.clone(), Arc::clone(&start));
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            service.open(&r).await.map(|b| b.runtime().clone())
        }));
    }
    let mut runtimes = Vec::new();
    for t in tasks {
        runtimes.push(t.await.unwrap().unwrap());
    }
    assert!(
        runtimes.iter().all(|rt| *rt == runtimes[0]),
        "concurrent open returned several instances"
    );
    let published = runtimes[0].clone();
    assert!(service.detach(&published), "exact runtime did not detach");
    assert!(!service.detach(&published), "stale callback detached twice");
    published.session().close().unwrap();
}

#[tokio::test]
async fn service_prepare_create_is_invisible_until_exact_publish() {
    let (_dir, service) = service("local");
    let prepared = service.prepare_create(opts("prepared")).await.unwrap();
    let r = prepared.runtime().session_ref().clone();
    assert!(
        service.runtime(&r).is_none(),
        "prepared runtime was visible before publish"
    );
    prepared
        .runtime()
        .session()
        .append(Batch::new(
            "seed",
            vec![Event::new("diagnostic").optional()],
        ))
        .unwrap();
    prepared.runtime().session().flush().unwrap();
    let published = service.publish(&prepared).unwrap();
    assert_eq!(service.runtime(&r), Some(published));
    assert!(
        service.discard(&prepared).await.is_err(),
        "published runtime was discarded"
    );
    service.close(&r).await.unwrap();
}

#[tokio::test]
async fn query_list_projects_event_backed_title_and_completed_turns() {
    let (_dir, service) = service("host-a");
    let rt = service.create(opts("listed")).await.unwrap();
    rt.session()
        .append(Batch::new("title", vec![title("Event title")]))
        .unwrap();
    rt.session()
        .append(
            Batch::new(
                "turn",
                vec![Event::new("turn/start"), turn_end("completed")],
            )
            .in_turn("turn-1"),
        )
        .unwrap();
    rt.session().flush().unwrap();
    service.close(rt.session_ref()).await.unwrap();
    let page = service.query().list(None, 50).await.unwrap();
    assert_eq!(page.sessions.len(), 1);
    let got = &page.sessions[0];
    assert_eq!(got.session_ref, sref("host-a", "listed"));
    assert_eq!(got.codec, session_store::format::CODEC);
    assert_eq!(got.title, "Event title");
    assert_eq!(got.turns, 1);
}

#[tokio::test]
async fn service_discard_prepared_create_releases_writer() {
    let (dir, service) = service("local");
    let prepared = service.prepare_create(opts("discarded")).await.unwrap();
    service.discard(&prepared).await.unwrap();
    let fresh = Root::open(dir.path().join("sessions-v4")).unwrap();
    let handle = fresh
        .open_writer(&id("discarded"))
        .expect("writer lease remained held after discard");
    handle.close().unwrap();
}

#[tokio::test]
async fn runtime_cancellation_uses_owned_execution_without_turn_id() {
    let (_dir, service) = service("local");
    let rt = service.create(opts("cancel")).await.unwrap();
    let exec = rt.bind_execution("model").unwrap();
    let r = rt.session_ref().clone();
    let snapshot = service.cancel(&r).unwrap();
    assert_eq!(snapshot.phase, RuntimePhase::Cancelling);
    assert!(
        exec.cancel_token().is_cancelled(),
        "cancel signal was not delivered"
    );
    exec.finish();
    assert_eq!(rt.snapshot().phase, RuntimePhase::Idle);
    service.close(&r).await.unwrap();
    service.close(&r).await.expect("idempotent close");
}

#[tokio::test]
async fn service_observe_distinguishes_live_accepted_and_cold_durable_prefixes() {
    let dir = tempfile::tempdir().unwrap();
    let options = session_store::StoreOptions::default()
        .with_write_behind(std::time::Duration::from_secs(3600));
    let root = Root::with_options(dir.path().join("sessions-v4"), options).unwrap();
    let service = Service::new("local", root).unwrap();
    let rt = service.create(opts("observe")).await.unwrap();
    rt.session()
        .append(Batch::new(
            "accepted",
            vec![Event::new("diagnostic").optional()],
        ))
        .unwrap();
    let r = rt.session_ref().clone();
    let live = service.query().observe(&r, 0, 10).await.unwrap();
    let state = live.runtime.as_ref().expect("live runtime");
    assert_eq!(
        (state.session.event_sequence, state.session.durable_sequence),
        (1, 0)
    );
    assert_eq!(live.events.commits.len(), 1);
    assert!(service.detach(&rt));
    let cold = service.query().observe(&r, 0, 10).await.unwrap();
    assert!(cold.runtime.is_none());
    assert!(
        cold.events.commits.is_empty(),
        "cold observe exposed unflushed events"
    );
    rt.session().close().unwrap();
}

#[tokio::test]
async fn service_close_preserves_busy_runtime() {
    let (_dir, service) = service("local");
    let rt = service.create(opts("busy")).await.unwrap();
    let exec = rt.bind_execution("tool").unwrap();
    assert!(matches!(
        service.close(rt.session_ref()).await,
        Err(Error::RuntimeBusy(_))
    ));
    assert_eq!(
        service.runtime(rt.session_ref()),
        Some(rt.clone()),
        "busy close released the runtime"
    );
    exec.finish();
    service.close(rt.session_ref()).await.unwrap();
}

#[tokio::test]
async fn service_open_closes_persisted_runtime_without_restoring_authority() {
    let dir = tempfile::tempdir().unwrap();
    let root = Root::open(dir.path().join("sessions-v4")).unwrap();
    let handle = root.create(opts("restart")).unwrap();
    handle
        .append(
            Batch::new(
                "interrupted",
                vec![
                    Event::new("turn/start"),
                    Event::new("tool/start")
                        .with_payload(&json!({"id": "call", "name": "bash"}))
                        .unwrap(),
                    Event::new("interaction/created")
                        .with_payload(&json!({"id": "approval", "state": "pending"}))
                        .unwrap(),
                ],
            )
            .in_turn("turn"),
        )
        .unwrap();
    handle.close().unwrap();
    let service = Service::new("local", root).unwrap();
    let binding = service.open(&sref("local", "restart")).await.unwrap();
    let snapshot = binding.runtime().snapshot();
    let p = &snapshot.session.projection;
    assert_eq!(snapshot.phase, RuntimePhase::Idle);
    assert_eq!(p.turn_id, None);
    assert!(
        p.active_tools.is_empty() && p.interactions.is_empty(),
        "restored stale authority"
    );
    assert_eq!(p.turn_status, "interrupted");
    assert_eq!(
        snapshot.session.durable_sequence, 6,
        "the recovery batch is durable"
    );
    binding.release().await.unwrap();
    service
        .close(binding.runtime().session_ref())
        .await
        .unwrap();
}

#[tokio::test]
async fn session_query_cold_read_does_not_acquire_writer() {
    let dir = tempfile::tempdir().unwrap();
    let root = Root::open(dir.path().join("sessions-v4")).unwrap();
    let handle = root.create(opts("cold")).unwrap();
    handle
        .append(Batch::new("message", vec![message("m", "user", "hello")]))
        .unwrap();
    handle.close().unwrap();
    let service = Service::new("local", root).unwrap();
    let r = sref("local", "cold");
    let history = service.query().history(&r).await.unwrap();
    assert_eq!(history.len(), 1);
    assert_eq!(history[0].id(), "m");
    let binding = service.open(&r).await.unwrap();
    binding.release().await.unwrap();
    service.close(&r).await.unwrap();
}

#[tokio::test]
async fn service_continue_legacy_publishes_new_identity_and_leaves_source_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let legacy = dir.path().join("sessions").join("old.jsonl");
    std::fs::create_dir_all(legacy.parent().unwrap()).unwrap();
    std::fs::write(
        &legacy,
        "{\"role\":\"system\",\"content\":\"system\"}\n{\"id\":\"user\",\"role\":\"user\",\"content\":\"hello\"}\n",
    )
    .unwrap();
    let before = std::fs::read(&legacy).unwrap();
    let service = service_at("local", &dir.path().join("sessions-v4"));
    let (rt, migration) = service.continue_legacy(&legacy, "").await.unwrap();
    assert_eq!(rt.session_ref().session_id, migration.target_id);
    assert_ne!(rt.session_ref().session_id.as_str(), "old");
    assert_eq!(
        std::fs::read(&legacy).unwrap(),
        before,
        "legacy source changed"
    );
    let got = rt.session().snapshot().projection.model_messages;
    assert_eq!(got.len(), 2);
    assert_eq!(got[1].id(), "user");
    service.close(rt.session_ref()).await.unwrap();
    let (again, second) = service.continue_legacy(&legacy, "").await.unwrap();
    assert!(second.reused);
    assert_eq!(second.target_id, migration.target_id);
    assert_eq!(
        again.session().snapshot().projection.transcript_len,
        2,
        "reuse appended nothing twice"
    );
    service.close_all().await.unwrap();
}

#[tokio::test]
async fn service_export_and_delete_are_session_directory_atomic() {
    let (dir, service) = service("local");
    let root_path = service.root().path().to_path_buf();
    let rt = service.create(opts("managed")).await.unwrap();
    rt.session()
        .append(Batch::new(
            "message",
            vec![message("m", "user", &"exported".repeat(20_000))],
        ))
        .unwrap();
    let exported = dir.path().join("exported-session");
    service.export(rt.session_ref(), &exported).await.unwrap();
    replay_file(&exported).expect("export is self-contained");
    assert!(
        !exported.join("writer.lock").exists() && exported.is_file(),
        "export is one file, no lock"
    );
    let r = rt.session_ref().clone();
    service.delete(&r, &CancelToken::new()).await.unwrap();
    assert!(
        !root_path.join("managed").exists(),
        "deleted session remains visible"
    );
    assert!(matches!(
        service.query().snapshot(&r).await,
        Err(Error::SessionNotFound(_))
    ));
    std::fs::remove_dir_all(&root_path).unwrap();
    replay_file(&exported).expect("export depended on the source root");
}

#[tokio::test]
async fn service_import_validates_self_contained_content_and_publishes_atomically() {
    let work = tempfile::tempdir().unwrap();
    let source_root = work.path().join("source").join("sessions-v4");
    let source = service_at("source", &source_root);
    let rt = source.create(opts("portable")).await.unwrap();
    rt.session()
        .append(Batch::new(
            "large",
            vec![message("large", "user", &"portable".repeat(20_000))],
        ))
        .unwrap();
    let bundle = work.path().join("bundle");
    source.export(rt.session_ref(), &bundle).await.unwrap();
    source.close(rt.session_ref()).await.unwrap();
    source.shutdown().await.unwrap();
    std::fs::remove_dir_all(work.path().join("source")).unwrap();

    let target_root = work.path().join("target").join("sessions-v4");
    let target = service_at("target", &target_root);
    let r = target.import(&bundle).await.unwrap();
    let page = target.query().history_page(&r, None, 10).await.unwrap();
    assert_eq!(page.messages.len(), 1);
    let content = page.messages[0]
        .content_ref
        .clone()
        .expect("large message as a content ref");
    let bytes = target.query().read_content(&r, &content).await.unwrap();
    assert_eq!(bytes.len() as u64, content.bytes);
    assert!(matches!(
        target.import(&bundle).await,
        Err(Error::SessionExists(_))
    ));
    for entry in std::fs::read_dir(&target_root).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        assert!(
            !name.contains("import-"),
            "failed import left staging {name}"
        );
    }
    assert!(
        std::fs::read_dir(target_root.join(".staging")).map_or(true, |mut d| d.next().is_none())
    );

    let desktop = service_at(
        "desktop",
        &work.path().join("desktop-sessions-v5").join("by-id"),
    );
    let header_options = |sid: &str| {
        ImportOptions::default()
            .with_session_id(id(sid))
            .with_cwd("/workspace")
            .with_origin(Origin::CanonicalImport)
    };
    let header_ref = desktop
        .import_with_header(&bundle, header_options("portable"))
        .await
        .unwrap();
    let info = desktop.root().stat(&header_ref.session_id).unwrap();
    assert_eq!(info.header.cwd.as_deref(), Some("/workspace"));
    assert_eq!(info.header.origin, Origin::CanonicalImport);
    let remapped = desktop
        .import_with_header(&bundle, header_options("migr-conflict"))
        .await
        .unwrap();
    assert_eq!(remapped.session_id.as_str(), "migr-conflict");
    let page = desktop
        .query()
        .history_page(&remapped, None, 10)
        .await
        .unwrap();
    assert_eq!(page.messages.len(), 1);
    assert!(page.messages[0].content_ref.is_some());
    target.shutdown().await.unwrap();
    desktop.shutdown().await.unwrap();
}

#[tokio::test]
async fn delete_refuses_an_owned_session() {
    let dir = tempfile::tempdir().unwrap();
    let root = Root::open(dir.path().join("sessions-v4")).unwrap();
    let handle = root.create(opts("owned")).unwrap();
    let cancel = CancelToken::new();
    cancel.cancel();
    assert!(matches!(
        root.delete(&id("owned"), &cancel),
        Err(Error::Cancelled)
    ));
    assert!(root.session_dir(&id("owned")).exists());
    handle.close().unwrap();
}

#[tokio::test]
async fn cancelled_execution_cannot_commit_late_business_result() {
    let (_dir, service) = service("local");
    let rt = service.create(opts("fenced")).await.unwrap();
    let exec = rt.bind_execution("tool").unwrap();
    let receipt = service.cancel_session(rt.session_ref()).unwrap();
    assert!(receipt.accepted);
    assert_eq!(receipt.phase, RuntimePhase::Cancelling);
    assert!(exec.cancel_token().is_cancelled());
    // A late business result through the cancelled execution is refused, and uses no sequence.
    let late = Batch::new("late", vec![message("late", "assistant", "too late")]);
    assert!(matches!(exec.append(late), Err(Error::StaleExecution(_))));
    assert_eq!(rt.session().sequences().0, 0);
    // The terminal truth that closes the turn always goes through.
    let terminal = Batch::new("turn-end", vec![turn_end("interrupted")]).in_turn("turn-1");
    exec.append(terminal).expect("terminal truth during cancel");
    exec.finish();
    service.close(rt.session_ref()).await.unwrap();
}

#[tokio::test]
async fn recovery_owner_can_commit_only_terminal_recovery_facts() {
    let (_dir, service) = service("local");
    let rt = service.create(opts("recovery-terminal")).await.unwrap();
    let exec = rt.bind_execution("tool").unwrap();
    rt.require_recovery("tool");
    assert!(matches!(
        service.close(rt.session_ref()).await,
        Err(Error::RuntimeBusy(_))
    ));
    let late = Batch::new(
        "late-tool",
        vec![
            Event::new("tool/result")
                .with_payload(&json!({"id": "c", "name": "bash"}))
                .unwrap(),
        ],
    );
    assert!(matches!(exec.append(late), Err(Error::StaleExecution(_))));
    let terminal = Batch::new(
        "recovery-terminal",
        vec![
            Event::new("runtime/recovery")
                .with_payload(&json!({"state": "recovery_required", "phase": "tool", "reason": "cancellation_grace_expired", "requires_user_decision": true}))
                .unwrap(),
            turn_end("recovery_required"),
        ],
    )
    .in_turn("turn-1");
    exec.append(terminal).expect("record recovery");
    let p = rt.session().snapshot().projection;
    assert_eq!(
        p.recovery.as_ref().map(|r| r.state.as_str()),
        Some("recovery_required")
    );
    assert_eq!(p.turn_status, "recovery_required");
    assert!(matches!(
        rt.bind_execution("model"),
        Err(Error::RecoveryRequired(_))
    ));
    rt.resolve_recovery();
    service.close(rt.session_ref()).await.unwrap();
}

#[tokio::test]
async fn cancel_session_is_idempotent_without_attached_runtime() {
    let (_dir, service) = service("local");
    let receipt = service
        .cancel_session(&sref("local", "not-attached"))
        .unwrap();
    assert!(receipt.accepted);
    assert_eq!(receipt.phase, RuntimePhase::Idle);
}

/// Upstream era-B `TestServiceCloseAllPreservesBindingAndReleasesIdleLease`.
#[tokio::test]
async fn close_all_preserves_binding_and_releases_idle_lease() {
    let (dir, service) = service("local");
    let rt = service.create(opts("bound")).await.unwrap();
    let binding = service.open(rt.session_ref()).await.unwrap();
    assert!(matches!(
        service.close_all().await,
        Err(Error::RuntimeBound(_))
    ));
    assert!(
        service.runtime(rt.session_ref()).is_some(),
        "bound runtime was released"
    );
    binding.release().await.unwrap();
    service.close_all().await.unwrap();
    let other = service_at("local", &dir.path().join("sessions-v4"));
    let b = other.open(rt.session_ref()).await.unwrap();
    b.release().await.unwrap();
    other.shutdown().await.unwrap();
}
