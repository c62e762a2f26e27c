//! Fork and rewind: branch a conversation after a completed turn, or drop its last turns,
//! without copying anything. The child sessions read the parent's rows through their
//! lineage and continue on their own.
//!
//! ```sh
//! cargo run --release --example fork_and_rewind
//! ```
//!
//! Uses the synchronous library API ([`Root`], [`session_store::Session`],
//! [`session_store::SessionReader`]) in a temporary folder that is removed at the end.

mod common;

use common::{chat_turn, transcript};
use session_store::{CreateOptions, ForkPoint, Root, SessionId};

type AnyResult<T> = Result<T, Box<dyn std::error::Error>>;

fn main() -> AnyResult<()> {
    let dir = tempfile::tempdir()?;
    let root = Root::open(dir.path().join("sessions"))?;

    // A parent with three turns.
    let parent = SessionId::new("trip-planning")?;
    let session = root.create(CreateOptions::with_id(parent.clone()))?;
    session.append(chat_turn("turn-1", "Where should I go in May?", "Lisbon.")?)?;
    session.append(chat_turn("turn-2", "For how long?", "Five days.")?)?;
    session.append(chat_turn("turn-3", "By train?", "Yes, via Madrid.")?)?;
    session.close()?; // drains and fsyncs; only durable events can be forked
    println!("parent: {}", transcript(&root, &parent)?.join(", "));

    // Fork after turn-1: the child keeps turn-1 and continues differently.
    let fork = root.fork(
        &parent,
        ForkPoint::AfterTurn("turn-1".into()),
        Some(SessionId::new("trip-planning-porto")?),
    )?;
    let child = root.open_writer(&fork)?;
    child.append(chat_turn(
        "turn-2b",
        "What about Porto?",
        "Porto works too.",
    )?)?;
    child.close()?;
    println!(
        "fork after turn-1: {}",
        transcript(&root, &fork)?.join(", ")
    );

    // Rewind to before turn-3: a new session with turns 1 and 2, as if turn-3 never happened.
    let rewound = root.fork(&parent, ForkPoint::BeforeTurn("turn-3".into()), None)?;
    println!(
        "rewind before turn-3 ({}): {}",
        rewound.as_str(),
        transcript(&root, &rewound)?.join(", ")
    );

    // Nothing was copied: the children point at the parent's rows (their lineage), and the
    // parent records who depends on it. The parent itself is unchanged.
    let reader = root.open_reader(&fork)?;
    for entry in reader.lineage() {
        println!(
            "{} inherits events {}..={} of {}",
            fork.as_str(),
            entry.after_seq + 1,
            entry.through_seq,
            entry.ancestor_id.as_str()
        );
    }
    println!("inherited events: {}", reader.inherited_events());
    let dependents = root.open_reader(&parent)?.dependents()?;
    println!("parent has {} dependents", dependents.len());
    assert_eq!(transcript(&root, &parent)?.len(), 6);
    assert_eq!(
        transcript(&root, &fork)?,
        ["q-turn-1", "a-turn-1", "q-turn-2b", "a-turn-2b"]
    );
    assert_eq!(transcript(&root, &rewound)?.len(), 4);

    // A fork point must be a completed turn: an unknown turn is refused.
    let refused = root.fork(&parent, ForkPoint::AfterTurn("no-such-turn".into()), None);
    println!(
        "fork after an unknown turn: {}",
        refused.map_or_else(|e| e.to_string(), |id| id.to_string())
    );

    println!("fork_and_rewind: ok");
    Ok(())
}
