//! Reliability promise 3: processes racing to open one session for writing. Each round
//! exactly one wins; every other gets `WriterOwned` naming the winner's pid and lease
//! generation; a reader in another process reads the whole time without an error.
//!
//! The contenders are real child processes (this binary re-run as `contender_role`), told
//! over stdin when to race: `go <round> <start_ms>` makes each of them sleep until the same
//! wall-clock instant and call `Root::open_writer` once; the winner holds the session until
//! `release <round>`, appends one commit and closes. `RELIABILITY_CONTENDERS` (2..=8,
//! default 3) and `RELIABILITY_ROUNDS` (default 200) size the race.

mod common;
mod reliability_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::*;
use reliability_support::*;
use session_store::{Batch, Error, Root};

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Child role: races for the writer of `SS_ID` under `SS_ROOT` when told to on stdin.
#[test]
#[ignore = "child process role, run by contention_*"]
fn contender_role() {
    let Ok(root_path) = std::env::var("SS_ROOT") else {
        return; // run by hand without a parent: nothing to do
    };
    let root = Root::open(root_path).unwrap();
    let name = id(&std::env::var("SS_ID").unwrap());
    println!("ready {}", std::process::id());
    let mut held = None;
    for line in std::io::stdin().lines() {
        let line = line.unwrap();
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["go", round, start] => {
                let start: u64 = start.parse().unwrap();
                if let Some(wait) = start.checked_sub(now_ms()) {
                    std::thread::sleep(Duration::from_millis(wait));
                }
                match root.open_writer(&name) {
                    Ok(s) => {
                        println!("won {round} {}", s.owner().generation);
                        held = Some(s);
                    }
                    Err(Error::WriterOwned { owner, .. }) => {
                        println!("lost {round} {} {}", owner.pid, owner.generation);
                    }
                    Err(e) => println!("error {round} {e}"),
                }
            }
            ["release", round] => {
                let s: session_store::Session = held.take().expect("release without a win");
                s.append(Batch::new(
                    format!("round-{round}"),
                    vec![message(&format!("m-{round}"), "user", round)],
                ))
                .unwrap();
                s.close().unwrap();
                println!("released {round}");
            }
            ["quit"] => break,
            other => panic!("unknown command {other:?}"),
        }
    }
}

struct ReaderFigures {
    reads: u64,
    commits_read: u64,
    errors: Vec<String>,
}

/// Reads the session over and over (fresh `open_reader`, durable sequence, every commit)
/// until `stop`; the durable sequence must never go back and the log must stay whole.
fn reader_loop(root: Root, name: session_store::SessionId, stop: Arc<AtomicBool>) -> ReaderFigures {
    let mut f = ReaderFigures {
        reads: 0,
        commits_read: 0,
        errors: Vec::new(),
    };
    let mut last_durable = 0;
    while !stop.load(Ordering::Relaxed) {
        let result = (|| -> session_store::Result<u64> {
            let reader = root.open_reader(&name)?;
            let durable = reader.durable_sequence()?;
            let commits = reader.all_commits()?;
            let mut next = 1;
            for c in &commits {
                if c.first_seq != next {
                    return Err(Error::Corrupt {
                        what: format!("gap at {next}"),
                        source: None,
                    });
                }
                next = c.last_seq() + 1;
            }
            if next - 1 < durable {
                return Err(Error::Corrupt {
                    what: format!(
                        "read {} events but the durable sequence was {durable}",
                        next - 1
                    ),
                    source: None,
                });
            }
            f.commits_read += commits.len() as u64;
            Ok(next - 1)
        })();
        match result {
            Ok(seen) if seen < last_durable => f.errors.push(format!(
                "durable sequence went back: {seen} < {last_durable}"
            )),
            Ok(seen) => last_durable = seen,
            Err(e) => f.errors.push(e.to_string()),
        }
        f.reads += 1;
    }
    f
}

fn run_contention(contenders: usize, rounds: usize) {
    assert!(
        (2..=8).contains(&contenders),
        "RELIABILITY_CONTENDERS must be 2..=8"
    );
    let (_dir, root) = temp_root();
    let name = id("contended");
    create(&root, "contended").close().unwrap();
    let env = [
        ("SS_ROOT", root.path().to_str().unwrap().to_owned()),
        ("SS_ID", name.to_string()),
    ];
    let mut children: Vec<ChildLines> = (0..contenders)
        .map(|_| ChildLines::spawn("contender_role", &env))
        .collect();
    let pids: Vec<u32> = children
        .iter_mut()
        .map(|c| c.expect("ready ").parse().unwrap())
        .collect();
    for (c, pid) in children.iter().zip(&pids) {
        assert_eq!(c.child.id(), *pid);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (root, name, stop) = (root.clone(), name.clone(), Arc::clone(&stop));
        std::thread::spawn(move || reader_loop(root, name, stop))
    };
    let started = Instant::now();
    let mut wins = vec![0usize; contenders];
    let mut last_generation = root.stat(&name).unwrap().last_writer.generation;
    // (pid, generation) of every winner so far, and refusals that named another writer.
    let mut history: Vec<(u32, u64)> = vec![(std::process::id(), last_generation)];
    let mut stale: Vec<String> = Vec::new();
    for round in 0..rounds {
        let start = now_ms() + 5;
        for c in &mut children {
            c.send(&format!("go {round} {start}"));
        }
        let mut winner = None;
        let mut losers = Vec::new();
        for (i, c) in children.iter_mut().enumerate() {
            let answer = c.expect("");
            let words: Vec<&str> = answer.split_whitespace().collect();
            match words.as_slice() {
                ["won", r, generation] if *r == round.to_string() => {
                    assert!(
                        winner.is_none(),
                        "round {round}: two winners ({winner:?} and child {i})"
                    );
                    winner = Some((i, generation.parse::<u64>().unwrap()));
                }
                ["lost", r, pid, generation] if *r == round.to_string() => {
                    losers.push((
                        i,
                        pid.parse::<u32>().unwrap(),
                        generation.parse::<u64>().unwrap(),
                    ));
                }
                other => panic!("round {round}: child {i} answered {other:?}"),
            }
        }
        let (w, generation) = winner.unwrap_or_else(|| panic!("round {round}: nobody won"));
        assert_eq!(
            generation,
            last_generation + 1,
            "round {round}: each win takes the lease exactly once"
        );
        last_generation = generation;
        for (i, pid, owner_generation) in losers {
            if (pid, owner_generation) == (pids[w], generation) {
                continue;
            }
            // A loser must name the current holder. Regression guard: the winner used to
            // record itself only after opening the file and committing its lease, so a
            // loser refused inside that window named the previous writer (from the lease
            // row). The holder now writes a provisional record right after taking the lock
            // and a refused opener waits for the final one (store/lock.rs).
            let previous = history.iter().find(|(_, g)| *g == owner_generation);
            assert!(
                previous.is_some_and(|(p, _)| *p == pid),
                "round {round}: child {i} was told pid {pid} generation {owner_generation}, \
                 which never won"
            );
            stale.push(format!(
                "round {round}: child {i} was told pid {pid} generation {owner_generation}, \
                 but child {w} (pid {}) won generation {generation}",
                pids[w]
            ));
        }
        history.push((pids[w], generation));
        wins[w] += 1;
        children[w].send(&format!("release {round}"));
        assert_eq!(children[w].expect("released "), round.to_string());
    }
    let raced = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    let figures = reader.join().unwrap();
    for c in &mut children {
        c.send("quit");
    }
    for c in &mut children {
        assert!(c.child.wait().unwrap().success());
    }
    let replayed = session_store::replay_file(root.session_dir(&name)).unwrap();
    eprintln!(
        "contention: {contenders} processes raced {rounds} rounds in {raced:.1?}, wins per process \
         {wins:?}; reader: {} reads, {} commits read, {} errors; {} of {} refusals named a stale owner",
        figures.reads,
        figures.commits_read,
        figures.errors.len(),
        stale.len(),
        rounds * (contenders - 1)
    );
    assert!(
        figures.errors.is_empty(),
        "the reader failed {} of {} reads, first: {}",
        figures.errors.len(),
        figures.reads,
        figures.errors[0]
    );
    assert!(figures.reads > 0);
    assert_eq!(replayed.commits.len(), rounds, "one commit per round");
    assert!(
        stale.is_empty(),
        "{} refusals named a stale owner, first: {}",
        stale.len(),
        stale[0]
    );
}

#[test]
fn contention_one_writer_wins_each_round_and_readers_never_fail() {
    let contenders = env_count("RELIABILITY_CONTENDERS", 3);
    run_contention(contenders, env_count("RELIABILITY_ROUNDS", 200));
}

/// The long variant for `scripts/soak.sh`: 8 processes, 2000 rounds unless the
/// environment says otherwise.
#[test]
#[ignore = "soak: long contention run, run by scripts/soak.sh"]
fn soak_contention() {
    run_contention(
        env_count("RELIABILITY_CONTENDERS", 8),
        env_count("RELIABILITY_ROUNDS", 2000),
    );
}

/// How long the in-process races below run (`RELIABILITY_RACE_SECS`, default 8).
fn race_time() -> Duration {
    Duration::from_secs(env_count("RELIABILITY_RACE_SECS", 8) as u64)
}

/// Readers opening a session while it is deleted and made again, in this process, never
/// break the new file's writer, and no read calls the session corrupt. A reader that
/// opened the old file and made its first read once the new folder had taken the name
/// paired the old file with the new `-shm`, took itself for its only user and emptied it
/// under the new writer, whose close then failed ("stale writer generation 1: the lease is
/// now at 0"). Three roots race at once, each with five readers: the window is short, and
/// one root alone rarely hit it.
#[test]
fn reads_racing_deletes_and_remakes_never_break_the_new_writer() {
    let arenas: Vec<_> = (0..3)
        .map(|_| std::thread::spawn(race_deletes_and_remakes))
        .collect();
    for arena in arenas {
        arena.join().unwrap();
    }
}

/// One root of [`reads_racing_deletes_and_remakes_never_break_the_new_writer`].
fn race_deletes_and_remakes() {
    let (_dir, root) = temp_root();
    let name = id("r");
    let make = |root: &Root| -> session_store::Result<()> {
        let s = root.create(session_store::CreateOptions::with_id(name.clone()))?;
        s.append(turn("o", "t", "m1"))?;
        s.close()
    };
    make(&root).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..5)
        .map(|kind| {
            let (root, stop, name) = (root.clone(), stop.clone(), name.clone());
            std::thread::spawn(move || {
                let mut corrupt = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let read = root.open_reader(&name).and_then(|r| match kind {
                        0 => r.transcript(r.durable_sequence()?).map(drop),
                        1 => r.all_commits().map(drop),
                        2 => r.turns().map(drop),
                        3 => r.projection().map(drop),
                        _ => root.verify(&name).map(drop),
                    });
                    // A read of a file deleted under it may fail (an I/O error, no such
                    // table): the library's reads are not retried. None says corrupt.
                    if let Err(e @ Error::Corrupt { .. }) = read {
                        corrupt.push(e.to_string());
                    }
                }
                corrupt
            })
        })
        .collect();
    // At least the race time and at least 20 rounds: on a loaded machine 8 s made as few
    // as 10 rounds (it asserted more than 10).
    let started = Instant::now();
    let mut rounds = 0;
    let failed = loop {
        if started.elapsed() >= race_time() && rounds >= 20 {
            break None;
        }
        if let Err(e) = root
            .delete(&name, &session_store::CancelToken::new())
            .and_then(|()| make(&root))
        {
            break Some(e.to_string());
        }
        rounds += 1;
    };
    stop.store(true, Ordering::Relaxed);
    let corrupt: Vec<String> = readers
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    assert_eq!(failed, None, "round {rounds}");
    assert!(corrupt.is_empty(), "{corrupt:?}");
    root.verify(&name).unwrap();
}

/// `verify` of a session whose writer is appending finds it sound: it read the log to its
/// end and then the durable sequence (and the turn index), so a commit in between made a
/// sound session "corrupt" ("the log ends at sequence 0 but the session reports 3 as
/// durable", "turn "t" ending at 3 is not in the log").
#[test]
fn verify_while_a_writer_appends_finds_the_session_sound() {
    let (_dir, root) = temp_root();
    let name = id("v");
    let writer = create(&root, "v");
    let stop = Arc::new(AtomicBool::new(false));
    let verifier = {
        let (root, stop, name) = (root.clone(), stop.clone(), name.clone());
        std::thread::spawn(move || {
            let mut checks = 0u64;
            while !stop.load(Ordering::Relaxed) {
                root.verify(&name).unwrap();
                checks += 1;
            }
            checks
        })
    };
    let deadline = Instant::now() + race_time() / 2;
    let mut n = 0;
    while Instant::now() < deadline && !verifier.is_finished() {
        n += 1;
        writer
            .append(turn(&format!("o{n}"), &format!("t{n}"), &format!("m{n}")))
            .unwrap();
        writer.flush().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    let checks = verifier.join().expect("verify never fails");
    writer.close().unwrap();
    assert!(checks > 10 && n > 10, "{checks} checks during {n} commits");
}
