//! Reliability promise 2 beyond delete: a process SIGKILLed in the middle of a fork, an
//! export, an import, a legacy continuation or a catalog rebuild leaves either the
//! operation's complete result or nothing of it visible, never changes another session,
//! and never keeps a retry from succeeding. And one item of promise 5: a copy of a live
//! writer's session whose `-wal` is deleted is refused or reads as an earlier state (an
//! exact prefix), never as a different history.
//!
//! Each operation test builds a template root once (sessions with several turns, blobs
//! over 64 KiB, a fork and a fork of that fork), plans a list of steps and runs them once
//! in this process (the dry run: the expected results, checked for what each operation
//! means, and the time a step takes). Then, per kill, a fresh copy of the template gets a
//! child (this binary re-run as `operation_role`) that runs the steps one after another
//! from a random one, printing `step-start <i>` / `step-done <i>`, and is SIGKILLed after
//! a random delay of up to three steps' time. `RELIABILITY_OP_KILLS` sets the kills per
//! operation (default 12), `RELIABILITY_WAL_COPIES` the copies of the `-wal` test.

mod common;
mod reliability_support;

use std::collections::{BTreeMap, BTreeSet};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;
use reliability_support::*;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use session_store::format::INLINE_PAYLOAD_LIMIT;
use session_store::{
    Batch, CatalogEntry, Commit, CreateOptions, Event, ForkPoint, ImportOptions, MigrationRecord,
    Origin, Root, Service, Session, SessionId, StoreOptions, replay_file,
};
use sha2::{Digest, Sha256};

/// Steps planned per operation (the child runs them in order, from a random one).
const STEPS: usize = 12;
/// Kills per operation in the default run and in the soak run.
const DEFAULT_KILLS: usize = 12;
const SOAK_KILLS: usize = 300;
const KILLS_VAR: &str = "RELIABILITY_OP_KILLS";
/// Copies of the `-wal` test in the default run and in the soak run.
const DEFAULT_COPIES: usize = 8;
const SOAK_COPIES: usize = 200;
const COPIES_VAR: &str = "RELIABILITY_WAL_COPIES";
/// Sessions a fork step may fork from (all three have a lineage of a different depth).
const FORK_PARENTS: [&str; 3] = ["alpha", "beta", "gamma"];
/// Sessions exported as the import steps' inputs.
const BUNDLED: [&str; 4] = ["alpha", "beta", "gamma", "small-0"];

// ---------------------------------------------------------------------------------------
// Content

/// A payload over the inline limit (a blob): compressible or random hex.
fn big_text(rng: &mut fastrand::Rng) -> String {
    let len = rng.usize(INLINE_PAYLOAD_LIMIT + 1..INLINE_PAYLOAD_LIMIT * 5 / 2);
    let text: String = if rng.bool() {
        std::iter::repeat_with(|| char::from(b"0123456789abcdef"[rng.usize(..16)]))
            .take(len)
            .collect()
    } else {
        "tool output line\n".chars().cycle().take(len).collect()
    };
    text
}

/// Appends the completed turn `turn-<tag>` in one, two or three commits; the answer is a
/// blob in about half the turns.
fn append_turn(s: &Session, rng: &mut fastrand::Rng, tag: &str) {
    let reply = if rng.bool() {
        big_text(rng)
    } else {
        "answer ".repeat(rng.usize(1..50))
    };
    let opening = vec![
        Event::new("turn/start"),
        message(&format!("u-{tag}"), "user", &format!("question {tag}")),
    ];
    let answer = message(&format!("a-{tag}"), "assistant", &reply);
    let end = turn_end("completed");
    let commits = match rng.u8(..3) {
        0 => vec![opening.into_iter().chain([answer, end]).collect()],
        1 => vec![opening, vec![answer, end]],
        _ => vec![opening, vec![answer], vec![end]],
    };
    for (n, events) in commits.into_iter().enumerate() {
        s.append(Batch::new(format!("op-{tag}-{n}"), events).in_turn(format!("turn-{tag}")))
            .unwrap();
    }
}

/// Forks `parent` after `turn` as `child` and gives the child `turns` turns of its own.
fn fork_and_extend(root: &Root, rng: &mut fastrand::Rng, parent: &str, turn: &str, child: &str) {
    root.fork(
        &id(parent),
        ForkPoint::AfterTurn(turn.to_owned()),
        Some(id(child)),
    )
    .unwrap();
    let s = root.open_writer(&id(child)).unwrap();
    for t in 0..rng.usize(2..4) {
        append_turn(&s, rng, &format!("{child}-{t}"));
    }
    s.close().unwrap();
}

/// The template: `alpha` (a title and six turns), `beta` (a fork of alpha with turns of
/// its own), `gamma` (a fork of beta, so it inherits from both) and eight small sessions.
fn build_template(root: &Root, rng: &mut fastrand::Rng) {
    let alpha = create(root, "alpha");
    alpha
        .append(Batch::new("title", vec![title("alpha")]))
        .unwrap();
    for t in 0..6 {
        append_turn(&alpha, rng, &format!("alpha-{t}"));
    }
    alpha.close().unwrap();
    fork_and_extend(root, rng, "alpha", "turn-alpha-2", "beta");
    fork_and_extend(root, rng, "beta", "turn-beta-0", "gamma");
    for n in 0..8 {
        let s = create(root, &format!("small-{n}"));
        append_turn(&s, rng, &format!("small-{n}"));
        s.close().unwrap();
    }
}

/// A legacy transcript (one message JSON per line, some without an id, a few over 64
/// KiB, sometimes a torn last line) and the number of messages it holds.
fn legacy_transcript(rng: &mut fastrand::Rng) -> (String, usize) {
    let count = rng.usize(1..=300);
    let mut text = String::new();
    for k in 0..count {
        let content = if rng.u8(..40) == 0 {
            big_text(rng)
        } else {
            "legacy words ".repeat(rng.usize(1..20))
        };
        let role = ["user", "assistant"][k % 2];
        let line = if rng.bool() {
            json!({"id": format!("legacy-{k}"), "role": role, "content": content})
        } else {
            json!({"role": role, "content": content})
        };
        text.push_str(&line.to_string());
        text.push('\n');
    }
    if rng.u8(..4) == 0 {
        text.push_str(r#"{"role":"user","content":"cut off by a cra"#);
    }
    (text, count)
}

// ---------------------------------------------------------------------------------------
// Fingerprints

/// `value` as JSON without the field `key` (a time stamp that differs between copies).
fn json_without(value: &impl Serialize, key: &str) -> Value {
    let mut v = serde_json::to_value(value).unwrap();
    v.as_object_mut().unwrap().remove(key);
    v
}

/// How much of a history a print keeps.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Lines {
    /// Everything, ids included ([`history_lines`]): for copies of existing commits.
    Exact,
    /// Sequences, operation ids and hashes and the content digest, not the commit and
    /// event ids a writer draws afresh: for a log built again (a legacy continuation).
    Content,
}

/// What identifies a session's content: its header (creation time aside: results made
/// in a round are stamped when made) and its history.
#[derive(Clone, Debug, PartialEq)]
struct Print {
    lines: Lines,
    header: Value,
    history: Vec<String>,
}

/// Replays a session folder or an export file: its print and its payload bytes.
fn print_of(path: &Path, lines: Lines) -> session_store::Result<(Print, u64)> {
    let replayed = replay_file(path)?;
    let history = match lines {
        Lines::Exact => history_lines(&replayed.commits),
        Lines::Content => replayed
            .commits
            .iter()
            .map(|c| {
                let (first, last) = (c.first_seq, c.last_seq());
                let digest = commit_digest(c);
                format!(
                    "{first}..{last} {} {} {digest}",
                    c.operation_id, c.operation_hash
                )
            })
            .collect(),
    };
    let print = Print {
        lines,
        header: json_without(&replayed.header, "created_at_ms"),
        history,
    };
    Ok((print, replayed.commits.iter().map(payload_bytes).sum()))
}

/// Where two prints part.
fn difference(got: &Print, want: &Print) -> String {
    if got.header != want.header {
        return format!("header {} instead of {}", got.header, want.header);
    }
    let first = got
        .history
        .iter()
        .zip(&want.history)
        .position(|(a, b)| a != b)
        .unwrap_or(got.history.len().min(want.history.len()));
    format!(
        "{} commits instead of {}, first difference at commit {first}",
        got.history.len(),
        want.history.len()
    )
}

/// The catalog as compared: every entry without its update time.
fn catalog_view(entries: &[CatalogEntry]) -> Vec<Value> {
    entries
        .iter()
        .map(|e| json_without(e, "updated_at_ms"))
        .collect()
}

/// The history a fork of `parent` cut at `cut` must have: the parent's commits up to the
/// cut, each under `inherit:<parent>:<commit id>` unless it was inherited already.
fn fork_prefix(parent: &str, commits: &[Commit], cut: u64) -> Vec<String> {
    let kept: Vec<Commit> = commits
        .iter()
        .take_while(|c| c.last_seq() <= cut)
        .map(|c| {
            let mut c = c.clone();
            if !c.operation_id.starts_with("inherit:") {
                c.operation_id = format!("inherit:{parent}:{}", c.commit_id);
            }
            c
        })
        .collect();
    history_lines(&kept)
}

/// SHA-256 of every file in `folder` (the inputs the operations read and must not write).
fn digests(folder: &Path) -> BTreeMap<String, String> {
    let Ok(entries) = std::fs::read_dir(folder) else {
        return BTreeMap::new();
    };
    entries
        .map(|e| {
            let e = e.unwrap();
            let bytes = std::fs::read(e.path()).unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                hex::encode(Sha256::digest(&bytes)),
            )
        })
        .collect()
}

/// Copies a folder tree, keeping modification times (so the catalog's stamps stay valid).
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
            let mtime = entry.metadata().unwrap().modified().unwrap();
            std::fs::File::options()
                .write(true)
                .open(&target)
                .unwrap()
                .set_modified(mtime)
                .unwrap();
        }
    }
}

// ---------------------------------------------------------------------------------------
// Steps

/// One operation a child (or the parent, in the dry run and the retry) performs.
#[derive(Clone, Debug, Serialize, Deserialize)]
enum Step {
    /// `Root::fork` of `parent` after (or before) `turn`, as `child`.
    Fork {
        parent: String,
        turn: String,
        after: bool,
        child: String,
    },
    /// `Root::export` of `source` to `<out>/<file>`.
    Export { source: String, file: String },
    /// `Root::import` of `bundle` as `target`.
    Import { bundle: PathBuf, target: String },
    /// `Service::continue_legacy` of `source` (holding `messages` messages), then close.
    Legacy { source: PathBuf, messages: usize },
    /// `Root::rebuild_catalog`; the child repeats it forever.
    Rebuild,
}

/// What a finished step made.
#[derive(Debug)]
enum Made {
    Session(SessionId),
    File(PathBuf),
    Legacy(MigrationRecord),
    Catalog(usize),
}

/// Where a step's result shows, and what it must be.
#[derive(Clone, Debug)]
enum Want {
    Session(SessionId, Print),
    File(String, Print),
    Catalog(Vec<Value>),
}

impl Want {
    fn present(&self, ids: &BTreeSet<SessionId>, out: &Path) -> bool {
        match self {
            Want::Session(name, _) => ids.contains(name),
            Want::File(file, _) => out.join(file).exists(),
            Want::Catalog(_) => true,
        }
    }
}

/// Folders under `<root>/.staging/` (builds in progress or abandoned).
fn staging_folders(root: &Path) -> usize {
    std::fs::read_dir(root.join(".staging")).map_or(0, |d| {
        d.flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .count()
    })
}

/// Every name under `<root>/.staging/`: folders and their guards.
fn staging_entries(root: &Path) -> Vec<String> {
    std::fs::read_dir(root.join(".staging")).map_or(Vec::new(), |d| {
        d.flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect()
    })
}

/// The library a step runs on: a root, the folder exports go to, and a service.
struct Env {
    root: Root,
    out: PathBuf,
    service: Service,
    tokio: tokio::runtime::Runtime,
}

impl Env {
    fn new(root: Root, out: &Path) -> Env {
        Env {
            service: Service::new("local", root.clone()).unwrap(),
            root,
            out: out.to_path_buf(),
            tokio: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap(),
        }
    }

    fn perform(&self, step: &Step) -> session_store::Result<Made> {
        match step {
            Step::Fork {
                parent,
                turn,
                after,
                child,
            } => {
                let point = if *after {
                    ForkPoint::AfterTurn(turn.clone())
                } else {
                    ForkPoint::BeforeTurn(turn.clone())
                };
                self.root
                    .fork(&id(parent), point, Some(id(child)))
                    .map(Made::Session)
            }
            Step::Export { source, file } => {
                let dest = self.out.join(file);
                self.root.export(&id(source), &dest)?;
                Ok(Made::File(dest))
            }
            Step::Import { bundle, target } => {
                let options = ImportOptions::default().with_session_id(id(target));
                self.root.import(bundle, options).map(Made::Session)
            }
            Step::Legacy { source, .. } => self.tokio.block_on(async {
                let (runtime, record) = self.service.continue_legacy(source, "").await?;
                self.service.close(runtime.session_ref()).await?;
                Ok(Made::Legacy(record))
            }),
            Step::Rebuild => self
                .root
                .rebuild_catalog()
                .map(|r| Made::Catalog(r.sessions)),
        }
    }
}

/// Child role: runs the steps of `SS_PLAN` on the root `SS_ROOT` (exports to `SS_OUT`)
/// from step `SS_START` on, wrapping around; idles once every step ran (a rebuild repeats
/// forever).
#[test]
#[ignore = "child process role, run by the crash_during_* tests"]
fn operation_role() {
    let Ok(plan) = std::env::var("SS_PLAN") else {
        return; // run by hand without a parent: nothing to do
    };
    let steps: Vec<Step> = serde_json::from_str(&std::fs::read_to_string(plan).unwrap()).unwrap();
    let var = |name: &str| std::env::var(name).unwrap();
    let env = Env::new(
        Root::open(var("SS_ROOT")).unwrap(),
        Path::new(&var("SS_OUT")),
    );
    let start: usize = var("SS_START").parse().unwrap();
    println!("ready");
    for k in 0.. {
        if k == steps.len() && !matches!(steps[0], Step::Rebuild) {
            println!("idle");
            loop {
                std::thread::sleep(Duration::from_secs(1));
            }
        }
        let i = (start + k) % steps.len();
        println!("step-start {i}");
        env.perform(&steps[i]).unwrap();
        println!("step-done {i}");
    }
}

/// What a child reported before its kill: the steps it started and finished, in order.
struct Progress {
    started: Vec<usize>,
    done: Vec<usize>,
}

impl Progress {
    fn parse(lines: &[String]) -> Progress {
        let step = |line: &str, marker: &str| {
            let at = line.find(marker)?;
            line[at + marker.len()..].trim().parse().ok()
        };
        Progress {
            started: lines
                .iter()
                .filter_map(|l| step(l, "step-start "))
                .collect(),
            done: lines.iter().filter_map(|l| step(l, "step-done ")).collect(),
        }
    }

    /// The step that was running when the kill came.
    fn in_flight(&self) -> Option<usize> {
        (self.started.len() > self.done.len())
            .then(|| self.started.last().copied())
            .flatten()
    }
}

// ---------------------------------------------------------------------------------------
// The crash loop

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Fork,
    Export,
    Import,
    Legacy,
    Rebuild,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Fork => "fork",
            Op::Export => "export",
            Op::Import => "import",
            Op::Legacy => "continue_legacy",
            Op::Rebuild => "catalog_rebuild",
        }
    }
}

#[derive(Default)]
struct Figures {
    kills: usize,
    /// Kills that landed while a step ran.
    in_flight: usize,
    /// Of those, the step's result was complete.
    completed: usize,
    /// Of those, nothing of the step was visible.
    nothing: usize,
    /// Steps that finished before their kill.
    done_before: usize,
    retries: usize,
    /// Sessions and export files replayed and compared.
    verified: usize,
    bytes: u64,
    /// Temporary export files the kills left (outside the root, never at a final path).
    leftovers: usize,
    /// Of those, left after the retry's export into the same folder (only an empty one
    /// with no sidecar, of an export killed before SQLite wrote to it, may stay a minute:
    /// the retry removes the others).
    leftovers_after_retry: usize,
    /// Staging folders the kills left, removed by the next `Root::open`.
    staging_removed: usize,
}

impl Figures {
    /// Replays `path` and compares it with `want`.
    fn verify(&mut self, path: &Path, want: &Print, what: &str) {
        let (got, bytes) =
            print_of(path, want.lines).unwrap_or_else(|e| panic!("{what} does not replay: {e}"));
        assert!(got == *want, "{what} differs: {}", difference(&got, want));
        self.verified += 1;
        self.bytes += bytes;
    }
}

/// One operation's template root, plan and expected results.
struct Fixture {
    op: Op,
    seed: u64,
    work: tempfile::TempDir,
    template: PathBuf,
    plan: PathBuf,
    steps: Vec<Step>,
    wants: Vec<Want>,
    /// Every session of the template.
    prints: BTreeMap<SessionId, Print>,
    /// Files the steps read (bundles, legacy transcripts): folder → digests.
    inputs: Vec<(PathBuf, BTreeMap<String, String>)>,
    /// Kill delays are drawn from `0..window`.
    window: Duration,
}

impl Fixture {
    fn new(op: Op, seed: u64) -> Fixture {
        let mut rng = fastrand::Rng::with_seed(seed);
        let work = tempfile::tempdir().unwrap();
        let template = work.path().join("template");
        let root = Root::open(&template).unwrap();
        build_template(&root, &mut rng);
        let steps = plan_steps(op, &root, work.path(), &mut rng);
        let prints = root
            .list_ids()
            .unwrap()
            .into_iter()
            .map(|name| {
                let print = print_of(&root.session_dir(&name), Lines::Exact).unwrap().0;
                (name, print)
            })
            .collect();
        root.list(None, 1000).unwrap(); // the catalog the copies start with
        drop(root);
        let plan = work.path().join("plan.json");
        std::fs::write(&plan, serde_json::to_string(&steps).unwrap()).unwrap();
        let inputs = ["bundles", "legacy"]
            .map(|f| work.path().join(f))
            .into_iter()
            .map(|folder| {
                let d = digests(&folder);
                (folder, d)
            })
            .collect();
        let mut fx = Fixture {
            op,
            seed,
            work,
            template,
            plan,
            steps,
            wants: Vec::new(),
            prints,
            inputs,
            window: Duration::ZERO,
        };
        fx.dry_run();
        fx
    }

    /// Runs every step once on a copy of the template: the expected results (checked
    /// against what the operation means) and the time a step takes.
    fn dry_run(&mut self) {
        let dir = self.work.path().join("dry");
        let env = self.fresh_env(&dir);
        let started = Instant::now();
        for step in &self.steps {
            let made = env
                .perform(step)
                .unwrap_or_else(|e| panic!("dry run of {step:?}: {e}"));
            self.wants.push(self.expect(&env, step, made));
        }
        let per_step = started.elapsed() / self.steps.len() as u32;
        self.window = (per_step * 3).max(Duration::from_millis(2));
        drop(env);
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A copy of the template under `dir` (`root/`, with `out/` for exports).
    fn fresh_env(&self, dir: &Path) -> Env {
        copy_tree(&self.template, &dir.join("root"));
        std::fs::create_dir_all(dir.join("out")).unwrap();
        Env::new(Root::open(dir.join("root")).unwrap(), &dir.join("out"))
    }

    /// Checks what a step made in the dry run and keeps it as the expected result.
    fn expect(&self, env: &Env, step: &Step, made: Made) -> Want {
        let print = |path: &Path| print_of(path, Lines::Exact).unwrap().0;
        match (step, made) {
            (
                Step::Fork {
                    parent,
                    turn,
                    after,
                    ..
                },
                Made::Session(child),
            ) => {
                let got = print(&env.root.session_dir(&child));
                let boundary = env.root.open_reader(&id(parent)).unwrap().turn(turn);
                let boundary = boundary.unwrap().unwrap();
                let cut = if *after {
                    boundary.boundary_sequence
                } else {
                    boundary.start_sequence - 1
                };
                let commits = replay_file(self.template.join(parent)).unwrap().commits;
                assert_eq!(
                    got.history,
                    fork_prefix(parent, &commits, cut),
                    "{child} is not {parent}'s prefix up to {cut}"
                );
                let origin = if *after { Origin::Fork } else { Origin::Rewind };
                assert_eq!(got.header["origin"], json!(origin), "{child}");
                assert_eq!(got.header["parent_id"], json!(parent), "{child}");
                assert_eq!(got.header["inherited_events"], json!(cut), "{child}");
                Want::Session(child, got)
            }
            (Step::Export { source, file }, Made::File(path)) => {
                let got = print(&path);
                assert!(
                    got == self.prints[&id(source)],
                    "the export of {source} differs from it"
                );
                Want::File(file.clone(), got)
            }
            (Step::Import { bundle, target }, Made::Session(name)) => {
                assert_eq!(name.as_str(), target);
                let got = print(&env.root.session_dir(&name));
                assert_eq!(got.history, print(bundle).history, "{target} vs its file");
                assert_eq!(got.header["origin"], json!(Origin::CanonicalImport));
                Want::Session(name, got)
            }
            (Step::Legacy { messages, .. }, Made::Legacy(record)) => {
                assert!(!record.reused, "{record:?}");
                assert_eq!(record.message_count, *messages, "{record:?}");
                let dir = env.root.session_dir(&record.target_id);
                assert_eq!(
                    replay_file(&dir).unwrap().projection.transcript_len as usize,
                    *messages
                );
                let got = print_of(&dir, Lines::Content).unwrap().0;
                Want::Session(record.target_id, got)
            }
            (Step::Rebuild, Made::Catalog(count)) => {
                assert_eq!(count, self.prints.len());
                let listed = env.root.list(None, 1000).unwrap().entries;
                assert_eq!(listed.len(), count);
                Want::Catalog(catalog_view(&listed))
            }
            (step, made) => panic!("{step:?} made {made:?}"),
        }
    }

    /// The step whose result `is_it` picks, and the print that result must have.
    fn step_of(&self, is_it: &dyn Fn(&Want) -> bool) -> Option<(usize, &Print)> {
        let (i, want) = self.wants.iter().enumerate().find(|(_, w)| is_it(w))?;
        match want {
            Want::Session(_, print) | Want::File(_, print) => Some((i, print)),
            Want::Catalog(_) => None,
        }
    }
}

/// The steps of one operation's plan (making the files they read).
fn plan_steps(op: Op, template: &Root, work: &Path, rng: &mut fastrand::Rng) -> Vec<Step> {
    let names: Vec<String> = template
        .list_ids()
        .unwrap()
        .iter()
        .map(|n| n.to_string())
        .collect();
    match op {
        Op::Fork => (0..STEPS)
            .map(|i| {
                let parent = FORK_PARENTS[rng.usize(..FORK_PARENTS.len())];
                let after = rng.bool();
                let turns = template.open_reader(&id(parent)).unwrap().turns();
                let usable: Vec<String> = turns
                    .unwrap()
                    .into_iter()
                    .filter(|t| if after { t.fork_safe } else { t.rewind_safe })
                    .map(|t| t.turn_id)
                    .collect();
                Step::Fork {
                    parent: parent.to_owned(),
                    turn: usable[rng.usize(..usable.len())].clone(),
                    after,
                    child: format!("fork-{i:02}"),
                }
            })
            .collect(),
        Op::Export => (0..STEPS)
            .map(|i| Step::Export {
                source: names[rng.usize(..names.len())].clone(),
                file: format!("export-{i:02}.sqlite"),
            })
            .collect(),
        Op::Import => {
            let bundles = BUNDLED.map(|name| {
                let file = work.join("bundles").join(format!("{name}.sqlite"));
                std::fs::create_dir_all(file.parent().unwrap()).unwrap();
                template.export(&id(name), &file).unwrap();
                file
            });
            (0..STEPS)
                .map(|i| Step::Import {
                    bundle: bundles[rng.usize(..bundles.len())].clone(),
                    target: format!("imp-{i:02}"),
                })
                .collect()
        }
        Op::Legacy => {
            std::fs::create_dir_all(work.join("legacy")).unwrap();
            (0..STEPS)
                .map(|i| {
                    let (text, messages) = legacy_transcript(rng);
                    let source = work.join("legacy").join(format!("transcript-{i:02}.jsonl"));
                    std::fs::write(&source, text).unwrap();
                    Step::Legacy { source, messages }
                })
                .collect()
        }
        Op::Rebuild => vec![Step::Rebuild],
    }
}

/// One kill: a fresh copy of the template, a child running steps, a SIGKILL, the checks,
/// a retry.
fn crash_round(fx: &Fixture, rng: &mut fastrand::Rng, kill: usize, figures: &mut Figures) {
    let dir = fx.work.path().join(format!("round-{kill}"));
    let env = fx.fresh_env(&dir);
    // A process that lives through the kill, its catalog connection open since before.
    let survivor = Root::open(env.root.path()).unwrap();
    survivor.list(None, 1000).unwrap();
    drop(env);
    let start = rng.usize(..fx.steps.len());
    let path = |p: &Path| p.to_str().unwrap().to_owned();
    let mut child = ChildLines::spawn(
        "operation_role",
        &[
            ("SS_PLAN", path(&fx.plan)),
            ("SS_ROOT", path(&dir.join("root"))),
            ("SS_OUT", path(&dir.join("out"))),
            ("SS_START", start.to_string()),
        ],
    );
    child.expect("ready");
    let window = fx.window.as_micros() as u64;
    std::thread::sleep(Duration::from_micros(rng.u64(0..=window)));
    let was_running = child.kill();
    let lines = child.drain().to_vec();
    let ctx = format!("{} kill {kill} (seed {})", fx.op.name(), fx.seed);
    assert!(
        was_running,
        "{ctx}: the child exited by itself; its output: {:?}",
        &lines[lines.len().saturating_sub(10)..]
    );
    let progress = Progress::parse(&lines);
    figures.kills += 1;
    figures.done_before += progress.done.len();

    // As after a restart: a fresh root on what the kill left. Opening it removes the
    // staging folders of the dead child (and only those: nothing else is building).
    figures.staging_removed += staging_folders(&dir.join("root"));
    let env = Env::new(Root::open(dir.join("root")).unwrap(), &dir.join("out"));
    assert_eq!(
        staging_entries(env.root.path()),
        Vec::<String>::new(),
        "{ctx}: opening the root left the dead child's staging folders or guards"
    );
    let ids = check_after_kill(fx, &env, &survivor, &progress, &ctx, figures);
    let step = progress
        .in_flight()
        .unwrap_or((start + progress.started.len()) % fx.steps.len());
    if progress.in_flight().is_some() {
        figures.in_flight += 1;
        match (fx.op, fx.wants[step].present(&ids, &env.out)) {
            (Op::Rebuild, _) => {} // the catalog is always there: whole, as checked
            (_, true) => figures.completed += 1,
            (_, false) => figures.nothing += 1,
        }
    }
    retry(fx, &env, &survivor, step, &ids, &ctx, figures);
    if fx.op == Op::Fork {
        delete_after_forks(fx, &env, &ctx, figures);
    }
    drop((env, survivor));
    std::fs::remove_dir_all(dir).unwrap();
}

/// After a kill: every template session unchanged; every other session (and export file)
/// the complete result of a step that started; finished steps' results there, unstarted
/// ones' not; the catalog listing exactly the sessions on disk; the inputs unchanged.
fn check_after_kill(
    fx: &Fixture,
    env: &Env,
    survivor: &Root,
    progress: &Progress,
    ctx: &str,
    figures: &mut Figures,
) -> BTreeSet<SessionId> {
    let root = &env.root;
    let ids: BTreeSet<SessionId> = root.list_ids().unwrap().into_iter().collect();
    for (name, print) in &fx.prints {
        assert!(ids.contains(name), "{ctx}: {name} vanished");
        figures.verify(&root.session_dir(name), print, &format!("{ctx}: {name}"));
    }
    // The step whose result this is: one that started.
    let made_by = |what: &str, is_it: &dyn Fn(&Want) -> bool| {
        let (i, want) = fx
            .step_of(is_it)
            .unwrap_or_else(|| panic!("{ctx}: unexpected {what}"));
        assert!(
            progress.started.contains(&i),
            "{ctx}: {what}, of step {i}, which never started"
        );
        let what = format!(
            "{ctx}: {what}, of step {i} (in flight: {:?})",
            progress.in_flight()
        );
        (want, what)
    };
    for name in ids.iter().filter(|n| !fx.prints.contains_key(*n)) {
        let is_it = |w: &Want| matches!(w, Want::Session(n, _) if n == name);
        let (want, what) = made_by(&format!("session {name}"), &is_it);
        figures.verify(&root.session_dir(name), want, &what);
    }
    for entry in std::fs::read_dir(&env.out).unwrap() {
        let file = entry.unwrap().file_name().to_string_lossy().into_owned();
        if file.starts_with('.') {
            figures.leftovers += 1; // an export's temporary file, never at the final path
            continue;
        }
        let is_it = |w: &Want| matches!(w, Want::File(f, _) if *f == file);
        let (want, what) = made_by(&format!("export file {file}"), &is_it);
        figures.verify(&env.out.join(&file), want, &what);
    }
    for (i, want) in fx.wants.iter().enumerate() {
        let present = want.present(&ids, &env.out);
        assert!(
            present || !progress.done.contains(&i),
            "{ctx}: step {i} finished but its result is missing"
        );
        assert!(
            !present || progress.started.contains(&i),
            "{ctx}: step {i} never started but its result is there"
        );
    }

    // The catalog, first in the process that lived through the kill (a fresh process
    // indexes every folder on its first use, for both): never a session that is not on
    // disk; exactly the sessions on disk in a fresh process, and in both after a rebuild.
    for (who, r, exact) in [
        ("the surviving process", survivor, fx.op == Op::Rebuild),
        ("a fresh process", root, true),
    ] {
        let entries = r
            .list(None, 1000)
            .unwrap_or_else(|e| panic!("{ctx}: {who}: list: {e}"))
            .entries;
        let listed: Vec<&SessionId> = entries.iter().map(|e| &e.session_id).collect();
        assert!(
            listed.iter().all(|n| ids.contains(*n)),
            "{ctx}: {who} lists a session that is not on disk: {listed:?}"
        );
        assert!(
            !exact || listed.len() == ids.len(),
            "{ctx}: {who} lists {} sessions of the {} on disk: {listed:?}",
            listed.len(),
            ids.len()
        );
        if let Some(Want::Catalog(want)) = fx.wants.first() {
            assert!(
                catalog_view(&entries) == *want,
                "{ctx}: {who}: catalog entries"
            );
        }
    }
    for (folder, digests_then) in &fx.inputs {
        assert_eq!(
            &digests(folder),
            digests_then,
            "{ctx}: the operation wrote to its inputs in {}",
            folder.display()
        );
    }
    ids
}

/// Runs `step` again in this process: it must finish (or, when its result is already
/// there, say so), and its result must then be complete.
fn retry(
    fx: &Fixture,
    env: &Env,
    survivor: &Root,
    step: usize,
    ids: &BTreeSet<SessionId>,
    ctx: &str,
    figures: &mut Figures,
) {
    let ctx = format!("{ctx}: retry of step {step}");
    let present = fx.wants[step].present(ids, &env.out);
    let result = env.perform(&fx.steps[step]);
    match (&result, present) {
        (Ok(Made::Legacy(record)), _) => assert_eq!(record.reused, present, "{ctx}"),
        (Ok(_), false) | (Ok(Made::Catalog(_)), true) => {}
        // A session id taken, or an export's destination file there.
        (Err(e), true) if e.is_already_exists() => {}
        (other, _) => panic!("{ctx} (result present before: {present}): {other:?}"),
    }
    figures.retries += 1;
    match &fx.wants[step] {
        Want::Session(name, want) => {
            figures.verify(&env.root.session_dir(name), want, &ctx);
            if let Step::Legacy { .. } = fx.steps[step] {
                // Once more: the same target, reused, nothing appended twice.
                let Ok(Made::Legacy(again)) = env.perform(&fx.steps[step]) else {
                    panic!("{ctx}: a second continuation failed");
                };
                assert!(again.reused && &again.target_id == name, "{ctx}: {again:?}");
                figures.verify(&env.root.session_dir(name), want, &ctx);
            }
        }
        Want::File(file, want) => {
            if result.is_ok() {
                // The retry's export removed what the killed one left beside it, but for
                // an empty temporary file with no sidecar (the kill came before SQLite
                // wrote to it: maybe before its lock), left for a minute.
                for entry in std::fs::read_dir(&env.out).unwrap() {
                    let entry = entry.unwrap();
                    let name = entry.file_name().to_string_lossy().into_owned();
                    if name.starts_with(".sse-") {
                        let bytes = entry.metadata().unwrap().len();
                        assert!(
                            name.ends_with(".tmp") && bytes == 0,
                            "{ctx}: {name} ({bytes} bytes) outlived the retry's export"
                        );
                        figures.leftovers_after_retry += 1;
                    }
                }
            }
            let path = env.out.join(file);
            figures.verify(&path, want, &ctx);
            // Importable: into a root of its own, the same history.
            let scratch = Root::open(env.out.join(".import-check")).unwrap();
            let name = scratch.import(&path, ImportOptions::default()).unwrap();
            let got = print_of(&scratch.session_dir(&name), Lines::Exact)
                .unwrap()
                .0;
            assert_eq!(got.history, want.history, "{ctx}: imported export");
            drop(scratch);
            std::fs::remove_dir_all(env.out.join(".import-check")).unwrap();
        }
        Want::Catalog(want) => {
            for r in [&env.root, survivor] {
                assert!(
                    catalog_view(&r.list(None, 1000).unwrap().entries) == *want,
                    "{ctx}: catalog after the rebuild"
                );
            }
        }
    }
}

/// After a killed fork and its retry: deleting the root ancestor (whose dependents rows the
/// killed fork may have left pointing at nothing) keeps every other session whole.
fn delete_after_forks(fx: &Fixture, env: &Env, ctx: &str, figures: &mut Figures) {
    let root = &env.root;
    root.delete(&id("alpha"), &session_store::CancelToken::new())
        .unwrap_or_else(|e| panic!("{ctx}: delete alpha after the forks: {e}"));
    for name in root.list_ids().unwrap() {
        let want = fx
            .step_of(&|w| matches!(w, Want::Session(n, _) if *n == name))
            .map_or_else(|| &fx.prints[&name], |(_, print)| print);
        figures.verify(
            &root.session_dir(&name),
            want,
            &format!("{ctx}: {name} after deleting alpha"),
        );
    }
}

fn crash_loop(op: Op, kills: usize) -> Figures {
    let seed = seed(&format!("crash_during_{}", op.name()));
    let started = Instant::now();
    let fx = Fixture::new(op, seed);
    let mut rng = fastrand::Rng::with_seed(seed ^ 0x5eed);
    let mut figures = Figures::default();
    for kill in 0..kills {
        crash_round(&fx, &mut rng, kill, &mut figures);
    }
    let outcomes = if op == Op::Rebuild {
        "the catalog whole in both processes after every one".to_owned()
    } else {
        format!(
            "{} complete, {} left nothing visible",
            figures.completed, figures.nothing
        )
    };
    eprintln!(
        "crash_during_{}: {} kills in {:.1?} (kill window {:.1?}); {} inside a step: {outcomes}; \
         {} steps finished before their kill; {} retries succeeded; {} sessions/files \
         re-verified, {} payload bytes checked; {} staging folders of the dead child removed \
         by the next Root::open; {} temporary export files left beside their destination, \
         {} of them after the retry's export",
        op.name(),
        figures.kills,
        started.elapsed(),
        fx.window,
        figures.in_flight,
        figures.done_before,
        figures.retries,
        figures.verified,
        figures.bytes,
        figures.staging_removed,
        figures.leftovers,
        figures.leftovers_after_retry,
    );
    assert_eq!(figures.kills, kills);
    figures
}

macro_rules! crash_tests {
    ($($op:ident: $test:ident, $soak:ident;)*) => {$(
        #[test]
        fn $test() {
            crash_loop(Op::$op, env_count(KILLS_VAR, DEFAULT_KILLS));
        }

        /// The long variant for `scripts/soak.sh`.
        #[test]
        #[ignore = "soak: long crash loop, run by scripts/soak.sh"]
        fn $soak() {
            crash_loop(Op::$op, env_count(KILLS_VAR, SOAK_KILLS));
        }
    )*};
}

crash_tests! {
    Fork: crash_during_fork_leaves_all_or_nothing, soak_crash_during_fork;
    Export: crash_during_export_leaves_all_or_nothing, soak_crash_during_export;
    Import: crash_during_import_leaves_all_or_nothing, soak_crash_during_import;
    Legacy: crash_during_continue_legacy_leaves_all_or_nothing, soak_crash_during_continue_legacy;
    Rebuild: crash_during_catalog_rebuild_leaves_the_list_whole, soak_crash_during_catalog_rebuild;
}

// ---------------------------------------------------------------------------------------
// A live writer's copy without its -wal

/// Child role: creates `live` under `SS_ROOT` and appends forever (turns, and every third
/// batch a large random blob so SQLite checkpoints now and then), with write-behind drains
/// between explicit flushes; prints `durable <seq>` after each flush.
#[test]
#[ignore = "child process role, run by the deleted -wal tests"]
fn wal_writer_role() {
    let Ok(root_path) = std::env::var("SS_ROOT") else {
        return; // run by hand without a parent: nothing to do
    };
    let mut rng = fastrand::Rng::with_seed(std::env::var("SS_SEED").unwrap().parse().unwrap());
    let options = StoreOptions::default().with_write_behind(Duration::from_millis(rng.u64(1..10)));
    let root = Root::with_options(root_path, options).unwrap();
    let s = create(&root, "live");
    println!("ready");
    for n in 0u64.. {
        let batch = if n % 3 == 2 {
            let words = rng.usize(8_000..16_000);
            let noise: String = std::iter::repeat_with(|| format!("{:016x}", rng.u64(..)))
                .take(words)
                .collect();
            Batch::new(
                format!("blob-{n}"),
                vec![message(&format!("b{n}"), "tool", &noise)],
            )
        } else {
            turn(&format!("op-{n}"), &format!("turn-{n}"), &format!("m-{n}"))
        };
        s.append(batch).unwrap();
        if rng.u8(..5) == 0 {
            println!("durable {}", s.flush().unwrap());
        } else {
            std::thread::sleep(Duration::from_millis(rng.u64(0..3)));
        }
    }
}

/// The histories `replay`, `Root::open_reader` (with a full read) and `Root::open_writer`
/// hand out for `name` in `root`, each caught if it panics.
fn entry_point_histories(
    root: &Root,
    name: &SessionId,
) -> Vec<(
    &'static str,
    std::thread::Result<session_store::Result<Vec<String>>>,
)> {
    type Read<'a> = &'a dyn Fn() -> session_store::Result<Vec<String>>;
    let by_replay: Read = &|| Ok(history_lines(&replay_file(root.session_dir(name))?.commits));
    let by_reader: Read = &|| {
        let reader = root.open_reader(name)?;
        reader.projection()?;
        Ok(history_lines(&reader.all_commits()?))
    };
    let by_writer: Read = &|| {
        let writer = root.open_writer(name)?;
        let history = history_lines(&writer.accepted_commits(0, usize::MAX)?);
        writer.close()?;
        Ok(history)
    };
    [
        ("replay", by_replay),
        ("open_reader", by_reader),
        ("open_writer", by_writer),
    ]
    .into_iter()
    .map(|(entry, read)| (entry, catch_unwind(AssertUnwindSafe(read))))
    .collect()
}

#[derive(Default)]
struct WalFigures {
    copies: usize,
    live: usize,
    wal_bytes: u64,
    refused: usize,
    prefixes: usize,
    shorter: usize,
    empty: usize,
    originals: usize,
    bytes: u64,
}

/// Copies the named files of session folder `from` that exist into `to`.
fn copy_files(from: &Path, to: &Path, files: &[&str]) {
    std::fs::create_dir_all(to).unwrap();
    for file in files {
        match std::fs::copy(from.join(file), to.join(file)) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => panic!("copy {file}: {e}"),
        }
    }
}

/// One copy: a writer runs for a while; its folder is copied while it runs or after its
/// kill; the copy loses its `-wal` and is opened three ways.
fn wal_trial(rng: &mut fastrand::Rng, trial: usize, seed: u64, figures: &mut WalFigures) {
    let ctx = format!("copy {trial} (seed {seed})");
    let (dir, root) = temp_root();
    let mut writer = ChildLines::spawn(
        "wal_writer_role",
        &[
            ("SS_ROOT", root.path().to_str().unwrap().to_owned()),
            ("SS_SEED", rng.u64(..).to_string()),
        ],
    );
    writer.expect("ready");
    for _ in 0..rng.usize(3..30) {
        writer.expect("durable ");
    }
    let live = rng.bool();
    if !live {
        assert!(writer.kill(), "{ctx}: the writer exited by itself");
    }
    let original = root.session_dir(&id("live"));
    let copies = Root::open(dir.path().join("copy")).unwrap();
    let copy = copies.session_dir(&id("live"));
    let shm = ["session.sqlite-shm"];
    let files: &[&str] = &["session.sqlite", "session.sqlite-wal"];
    copy_files(&original, &copy, files);
    if rng.bool() {
        copy_files(&original, &copy, &shm); // a stale wal-index, too
    }
    let wal = copy.join("session.sqlite-wal");
    figures.wal_bytes += std::fs::metadata(&wal).map_or(0, |m| m.len());
    std::fs::remove_file(&wal).unwrap();
    let outcomes = entry_point_histories(&copies, &id("live"));

    // The original: the writer went on undisturbed, and its file holds all it reported.
    if live {
        writer.expect("durable ");
        assert!(writer.kill(), "{ctx}: the writer died while it was copied");
        figures.live += 1;
    }
    let durable = writer
        .drain()
        .iter()
        .filter_map(|l| l.split("durable ").nth(1)?.trim().parse::<u64>().ok())
        .max()
        .unwrap_or(0);
    let replayed = replay_file(&original).unwrap_or_else(|e| panic!("{ctx}: the original: {e}"));
    let full = history_lines(&replayed.commits);
    let on_disk = replayed.commits.last().map_or(0, Commit::last_seq);
    assert!(
        on_disk >= durable,
        "{ctx}: durable {durable}, on disk {on_disk}"
    );
    figures.originals += 1;
    figures.bytes += replayed.commits.iter().map(payload_bytes).sum::<u64>();
    if !live {
        // Control: the same copy with its -wal reads exactly as the original.
        let control = Root::open(dir.path().join("control")).unwrap();
        copy_files(&original, &control.session_dir(&id("live")), files);
        for (entry, outcome) in entry_point_histories(&control, &id("live")) {
            let history = outcome.unwrap().unwrap();
            assert!(history == full, "{ctx}: {entry} of the intact copy");
        }
    }

    for (entry, outcome) in outcomes {
        match outcome {
            Err(panic) => panic!("{ctx}: {entry} panicked: {panic:?}"),
            Ok(Err(e)) if is_damage(&e) => figures.refused += 1,
            Ok(Err(e)) => panic!("{ctx}: {entry}: {e:?} is neither damage nor a history"),
            Ok(Ok(history)) => {
                assert!(
                    history.len() <= full.len() && full[..history.len()] == history[..],
                    "{ctx}: {entry} of the copy without its -wal handed out {} commits that \
                     are not a prefix of the original's {}",
                    history.len(),
                    full.len()
                );
                figures.prefixes += 1;
                figures.shorter += usize::from(history.len() < full.len());
                figures.empty += usize::from(history.is_empty());
            }
        }
    }
    figures.copies += 1;
}

fn deleted_wal_loop(copies: usize) {
    let seed = seed("deleted_wal_of_a_live_copy");
    let mut rng = fastrand::Rng::with_seed(seed);
    let started = Instant::now();
    let mut figures = WalFigures::default();
    for trial in 0..copies {
        wal_trial(&mut rng, trial, seed, &mut figures);
    }
    eprintln!(
        "deleted_wal_of_a_live_copy: {} copies ({} taken while the writer ran, the others after \
         its kill) in {:.1?}, {} WAL bytes deleted; {} entry-point runs: {} refused as damage, \
         {} exact prefixes ({} shorter than the original, {} of them empty); {} originals \
         re-verified, {} payload bytes checked",
        figures.copies,
        figures.live,
        started.elapsed(),
        figures.wal_bytes,
        figures.refused + figures.prefixes,
        figures.refused,
        figures.prefixes,
        figures.shorter,
        figures.empty,
        figures.originals,
        figures.bytes,
    );
    assert_eq!(figures.copies, copies);
}

#[test]
fn a_live_copy_without_its_wal_is_refused_or_an_earlier_state() {
    deleted_wal_loop(env_count(COPIES_VAR, DEFAULT_COPIES));
}

/// The long variant for `scripts/soak.sh`.
#[test]
#[ignore = "soak: many copies, run by scripts/soak.sh"]
fn soak_deleted_wal_of_a_live_copy() {
    deleted_wal_loop(env_count(COPIES_VAR, SOAK_COPIES));
}

/// A builder SIGKILLed after it published its folder (or after it locked a fresh guard,
/// before it made the folder) leaves `.staging/<purpose>-<hex>.lock` with no folder beside
/// it. Such guards were never removed: one more file in `.staging/` for every such kill.
/// The next open removes it, and leaves alone a guard a living builder holds (here this
/// process, through a descriptor of its own) and a file that is no guard.
#[test]
fn a_staging_guard_left_without_its_folder_is_removed_by_the_next_open() {
    let dir = tempfile::tempdir().unwrap();
    drop(Root::open(dir.path()).unwrap());
    let staging = dir.path().join(".staging");
    std::fs::create_dir_all(&staging).unwrap();
    let orphan = staging.join("fork-0123456789abcdef0123456789abcdef.lock");
    std::fs::write(&orphan, b"").unwrap();
    let held_path = staging.join("import-fedcba9876543210fedcba9876543210.lock");
    let held = std::fs::File::create(&held_path).unwrap();
    held.try_lock().unwrap();
    let other = staging.join("notes.txt");
    std::fs::write(&other, b"not ours").unwrap();

    let root = Root::open(dir.path()).unwrap();
    assert!(!orphan.exists(), "an abandoned guard is removed");
    assert!(held_path.exists(), "a guard a living builder holds stays");
    assert!(other.exists(), "a file that is no guard stays");
    // Staging goes on working beside them.
    let made = root
        .create(CreateOptions::with_id(
            SessionId::new("after-orphans").unwrap(),
        ))
        .unwrap();
    made.close().unwrap();
    drop(root);

    drop(held);
    drop(Root::open(dir.path()).unwrap());
    assert!(
        !held_path.exists(),
        "released, it is removed by the next open"
    );
    let mut left = staging_entries(dir.path());
    left.sort();
    assert_eq!(left, vec!["notes.txt".to_owned()]);
}
