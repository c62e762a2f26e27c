//! The harness the model-based tests (`reliability_model.rs`, `reliability_model_lineage.rs`)
//! share: a session's writer slot (a writer opened by the root, or as a runtime of a `Service`
//! with its binding), flushes and closes that record the accepted state as durable, one commit
//! appended, the runtime the service's futures run on, and the run of the random sequences.

use std::path::{Path, PathBuf};

use proptest::strategy::Strategy;
use proptest::test_runner::{Config, RngSeed, TestCaseError, TestRunner};
use session_store::{
    Batch, ClientBinding, Event, ImportOptions, Projection, Root, Service, Session, SessionId,
    SessionReader, SessionRef,
};
use tokio::runtime::Runtime;

/// Rounds of sequences at most: more rounds run only while `covered` is false.
const MAX_ROUNDS: u64 = 5;

/// Runs `run` on the sequences of operations `sequences` makes (as `config` says); returns how
/// many steps they had and the sum of the five figures each run counted. When the sums do
/// not satisfy `covered` (a random draw left a kind of step out), another round of as many
/// sequences runs on the next seed, up to [`MAX_ROUNDS`] rounds, so that the caller's
/// assertion that every kind was exercised fails only when the operations rarely make it.
pub fn run_sequences<O: std::fmt::Debug>(
    config: Config,
    sequences: impl Strategy<Value = Vec<O>>,
    run: impl Fn(&[O]) -> Result<[usize; 5], TestCaseError>,
    covered: impl Fn(&[usize; 5]) -> bool,
) -> (usize, [usize; 5]) {
    let steps = std::cell::Cell::new(0usize);
    let figures = std::cell::Cell::new([0usize; 5]);
    for round in 0..MAX_ROUNDS {
        let mut config = config.clone();
        if let RngSeed::Fixed(seed) = config.rng_seed {
            config.rng_seed = RngSeed::Fixed(seed.wrapping_add(round));
        }
        let mut runner = TestRunner::new(config);
        runner
            .run(&sequences, |ops| {
                steps.set(steps.get() + ops.len());
                let made = run(&ops)?;
                let mut sum = figures.get();
                for (total, n) in sum.iter_mut().zip(made) {
                    *total += n;
                }
                figures.set(sum);
                Ok(())
            })
            .unwrap();
        if covered(&figures.get()) {
            break;
        }
        eprintln!("round {round}: not every kind of step was exercised; another round");
    }
    (steps.get(), figures.get())
}

/// A current-thread runtime for the service's futures.
pub fn runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio")
}

/// The store of a model test: its root, a service of `host` over it, the runtime the
/// service's futures run on, and a folder for exported files.
pub struct Served {
    pub root: Root,
    pub rt: Runtime,
    pub service: Service,
    pub host: &'static str,
    /// `exports` in the test's folder (`with_exports`); empty (no exports) from `new`.
    pub exports: PathBuf,
}

impl Served {
    /// A service of `host` over `root`, with a fresh runtime.
    pub fn new(host: &'static str, root: &Root) -> Served {
        let service = Service::new(host, root.clone()).expect("service");
        Served {
            root: root.clone(),
            rt: runtime(),
            service,
            host,
            exports: PathBuf::new(),
        }
    }

    /// A service of `host` over `root` (as `new`), with a new folder `exports` in `dir` for
    /// the files a test exports.
    pub fn with_exports(host: &'static str, root: &Root, dir: &Path) -> Served {
        let exports = dir.join("exports");
        std::fs::create_dir(&exports).expect("exports dir");
        Served {
            exports,
            ..Served::new(host, root)
        }
    }

    /// Imports the exported session `file` under the new id `name`.
    pub fn import_as(&self, file: &Path, name: &str) {
        let sid = SessionId::new(name).expect("session id");
        let options = ImportOptions::default().with_session_id(sid);
        let made = self.root.import(file, options).expect("import");
        assert_eq!(made.as_str(), name);
    }
}

/// Lets a model's session type (`$sess`, holding a `Handle<$state>` in field `h`) be used as
/// its handle: `sess.id`, `sess.writer`, `sess.flush()`.
#[allow(unused_macros)]
macro_rules! deref_to_handle {
    ($sess:ty, $state:ty) => {
        impl std::ops::Deref for $sess {
            type Target = $crate::reliability_support::harness::Handle<$state>;
            fn deref(&self) -> &Self::Target {
                &self.h
            }
        }

        impl std::ops::DerefMut for $sess {
            fn deref_mut(&mut self) -> &mut Self::Target {
                &mut self.h
            }
        }
    };
}
#[allow(unused_imports)]
pub(crate) use deref_to_handle;

/// A model's state of a session, as far as the harness needs it.
pub trait Accepted: Clone {
    /// The sequence of its last event.
    fn events(&self) -> u64;
}

/// A session of a model: its id, its state as the writer accepted it and as it is on disk
/// (`S`, the model's), and its writer when one is open (with the service's binding when the
/// writer is a runtime of the service: its queries then answer from the accepted state).
pub struct Handle<S> {
    pub id: String,
    /// What the writer accepted (equal to `durable` without a writer).
    pub accepted: S,
    /// What is on disk.
    pub durable: S,
    pub writer: Option<Session>,
    pub binding: Option<ClientBinding>,
}

impl<S: Accepted> Handle<S> {
    /// A session made on disk holding `state`, not open.
    pub fn cold(id: String, state: S) -> Handle<S> {
        Handle {
            id,
            accepted: state.clone(),
            durable: state,
            writer: None,
            binding: None,
        }
    }

    /// The writer, opened when there is none: every other time (by `counter`, which it
    /// advances) as a runtime of the service, else by the root.
    pub fn writer(&mut self, served: &Served, counter: &mut u64) -> Session {
        *counter += 1;
        if self.writer.is_none() {
            if counter.is_multiple_of(2) {
                let r = SessionRef::new(served.host, self.id.as_str()).expect("ref");
                let binding = served
                    .rt
                    .block_on(served.service.open(&r))
                    .unwrap_or_else(|e| panic!("open {} in the service: {e}", self.id));
                self.writer = Some(binding.runtime().session().clone());
                self.binding = Some(binding);
            } else {
                let sid = SessionId::new(self.id.as_str()).expect("session id");
                self.writer = Some(
                    served
                        .root
                        .open_writer(&sid)
                        .unwrap_or_else(|e| panic!("reopen {}: {e}", self.id)),
                );
            }
        }
        self.writer.clone().expect("writer")
    }

    /// Flushes the writer (if any), which answers the accepted sequence; everything accepted
    /// is durable then.
    pub fn flush(&mut self) {
        if let Some(w) = &self.writer {
            assert_eq!(w.flush().expect("flush"), self.accepted.events());
        }
        self.durable = self.accepted.clone();
    }

    /// Closes the writer (if any; a runtime of the service released and closed there);
    /// everything accepted is durable then.
    pub fn close(&mut self, served: &Served) {
        match (self.writer.take(), self.binding.take()) {
            (Some(_), Some(binding)) => {
                let r = SessionRef::new(served.host, self.id.as_str()).expect("ref");
                served.rt.block_on(binding.release()).expect("release");
                served.rt.block_on(served.service.close(&r)).expect("close");
            }
            (Some(w), None) => w.close().expect("close"),
            _ => {}
        }
        self.durable = self.accepted.clone();
    }
}

impl<S: Accepted> Handle<S> {
    /// Appends `events` as one commit (in turn `turn` when given; its writer as `writer`
    /// gives it, its op id the next of `counter`), which must start right after the accepted
    /// sequence; returns that sequence and how many events the commit holds.
    pub fn append(
        &mut self,
        served: &Served,
        counter: &mut u64,
        events: Vec<Event>,
        turn: Option<&str>,
    ) -> (u64, u64) {
        let w = self.writer(served, counter);
        *counter += 1;
        let op = format!("op{counter}");
        let before = self.accepted.events();
        (before, commit(&w, op, events, turn, before))
    }
}

/// Appends `events` to `w` as one commit `op` (in turn `turn` when given), which must start
/// right after the accepted sequence `before`; returns how many events it holds.
fn commit(w: &Session, op: String, events: Vec<Event>, turn: Option<&str>, before: u64) -> u64 {
    let n = events.len() as u64;
    let mut batch = Batch::new(op, events);
    if let Some(t) = turn {
        batch = batch.in_turn(t.to_owned());
    }
    let commit = w.append(batch).expect("append");
    assert_eq!(commit.first_seq, before + 1);
    n
}

/// The ids of the turns `reader` finds ended, oldest first.
pub fn turn_ids(reader: &SessionReader) -> Vec<String> {
    let turns = reader.turns().expect("turns");
    turns.into_iter().map(|t| t.turn_id).collect()
}

/// The ids of the messages of `projection`'s model workset, in order.
pub fn workset_ids(projection: &Projection) -> Vec<String> {
    let messages = projection.model_messages.iter();
    messages.map(|m| m.id().to_owned()).collect()
}
