//! `demo`: writes a scripted, realistic agent workload into a root and summarises it.
//!
//! Each scripted conversation becomes one session: a model config, then turns of
//! `turn/start`, the user's message, an assistant message with tool calls, `tool/call`,
//! `tool/start`, `tool/result` and tool messages, the final answer and `turn/end`. Some tool
//! outputs exceed 64 KiB, so they are stored as blobs. Every turn is flushed when it ends.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use serde_json::{Value, json};
use session_store::{Batch, CreateOptions, Error, Event, Root, Session, SessionId};

use super::{CliResult, human_bytes, shell_quote};

/// The model recorded in every demo session's config.
const MODEL: &str = "demo/assistant-large";

/// How many numbered suffixes are tried for a session id that is already taken.
const MAX_SUFFIX: u32 = 10_000;

/// What a tool printed.
enum Output {
    /// A short output, verbatim.
    Text(&'static str),
    /// `count` numbered copies of `line`: a large output (a log, a test run).
    Lines { line: &'static str, count: usize },
}

impl Output {
    /// The output text.
    fn render(&self) -> String {
        match self {
            Output::Text(text) => (*text).to_owned(),
            Output::Lines { line, count } => {
                (1..=*count).map(|i| format!("{i:05} {line}\n")).collect()
            }
        }
    }
}

/// One tool call the assistant makes.
struct Tool {
    name: &'static str,
    args: &'static str,
    output: Output,
}

/// One exchange: a user request, the tools used, the answer.
struct Turn {
    user: &'static str,
    plan: &'static str,
    tools: &'static [Tool],
    answer: &'static str,
}

/// One conversation, written as one session.
struct Script {
    slug: &'static str,
    title: &'static str,
    cwd: &'static str,
    turns: &'static [Turn],
}

/// The scripted conversations.
const SCRIPTS: &[Script] = &[
    Script {
        slug: "demo-flaky-test",
        title: "Fix the flaky parser test",
        cwd: "/home/dev/parser",
        turns: &[
            Turn {
                user: "The CI keeps failing on tokens::nested_quotes about one run in ten. Can you find out why?",
                plan: "I'll run the test suite a few times and look at the failing test.",
                tools: &[
                    Tool {
                        name: "bash",
                        args: r#"{"cmd": "cargo test -- --test-threads=8 2>&1"}"#,
                        output: Output::Lines {
                            line: "test tokens::cases::quoted_string_roundtrip ... ok",
                            count: 1800,
                        },
                    },
                    Tool {
                        name: "read_file",
                        args: r#"{"path": "src/tokens.rs", "range": [120, 160]}"#,
                        output: Output::Text(
                            "fn nested_quotes() {\n    let dir = std::env::temp_dir().join(\"tokens\");\n    std::fs::write(dir.join(\"in.txt\"), SAMPLE).unwrap();\n    ...\n}",
                        ),
                    },
                ],
                answer: "The test writes to a fixed path in the temp dir, so parallel runs overwrite each other's input. Using a per-test tempdir fixes it.",
            },
            Turn {
                user: "Please apply the fix.",
                plan: "Switching the test to tempfile::tempdir() and re-running it 50 times.",
                tools: &[
                    Tool {
                        name: "apply_patch",
                        args: r#"{"path": "src/tokens.rs", "hunks": 1}"#,
                        output: Output::Text("patched src/tokens.rs (+3 -2)"),
                    },
                    Tool {
                        name: "bash",
                        args: r#"{"cmd": "for i in $(seq 50); do cargo test -q nested_quotes || break; done"}"#,
                        output: Output::Text("50 runs, 0 failures"),
                    },
                ],
                answer: "Done: the test now uses its own temp dir and passed 50 runs in a row.",
            },
        ],
    },
    Script {
        slug: "demo-log-triage",
        title: "Triage the 502s in last night's logs",
        cwd: "/srv/gateway",
        turns: &[
            Turn {
                user: "We had a spike of 502s around 02:10 UTC. What happened?",
                plan: "Let me pull the gateway log for that window.",
                tools: &[Tool {
                    name: "read_file",
                    args: r#"{"path": "/var/log/gateway/access.log", "since": "02:00", "until": "02:20"}"#,
                    output: Output::Lines {
                        line: "2024-05-03T02:10:07Z upstream=api-3 status=502 latency_ms=30001 path=/v1/orders",
                        count: 1400,
                    },
                }],
                answer: "All 502s come from upstream api-3 and hit the 30 s timeout: api-3 stopped answering at 02:09:58.",
            },
            Turn {
                user: "Was api-3 restarted?",
                plan: "Checking the deploy history and the host's journal.",
                tools: &[
                    Tool {
                        name: "bash",
                        args: r#"{"cmd": "deployctl history api --since 01:00"}"#,
                        output: Output::Text(
                            "02:09:55 api-3 rollout v2.14.1 (canary)\n02:31:40 api-3 rollback v2.14.0",
                        ),
                    },
                    Tool {
                        name: "bash",
                        args: r#"{"cmd": "ssh api-3 journalctl -u api --since 02:09 --until 02:12"}"#,
                        output: Output::Text(
                            "api[811]: migration lock wait exceeded 30s\napi[811]: readiness probe failed",
                        ),
                    },
                ],
                answer: "Yes: a canary rollout of v2.14.1 at 02:09:55 blocked on a migration lock, so the instance never became ready; it was rolled back at 02:31.",
            },
            Turn {
                user: "Write a two-line incident summary.",
                plan: "Summarising.",
                tools: &[],
                answer: "02:09–02:31 UTC: api-3 canary v2.14.1 hung on a migration lock and returned 502s via the gateway.\nMitigated by rollback; follow-up: run migrations before the canary step.",
            },
        ],
    },
    Script {
        slug: "demo-cli-flag",
        title: "Add a --dry-run flag",
        cwd: "/home/dev/syncer",
        turns: &[
            Turn {
                user: "Add a --dry-run flag to `syncer push` that prints what would be uploaded.",
                plan: "Reading the CLI definition and the push command.",
                tools: &[
                    Tool {
                        name: "grep",
                        args: r#"{"pattern": "struct PushArgs", "path": "src"}"#,
                        output: Output::Text("src/cli.rs:42:pub struct PushArgs {"),
                    },
                    Tool {
                        name: "read_file",
                        args: r#"{"path": "src/cli.rs", "range": [40, 70]}"#,
                        output: Output::Text(
                            "pub struct PushArgs {\n    /// Remote to push to.\n    pub remote: String,\n    /// Files to push.\n    pub paths: Vec<PathBuf>,\n}",
                        ),
                    },
                    Tool {
                        name: "apply_patch",
                        args: r#"{"path": "src/cli.rs", "hunks": 2}"#,
                        output: Output::Text("patched src/cli.rs (+9 -1)"),
                    },
                ],
                answer: "Added `--dry-run` to PushArgs; push now lists each file and its size and returns before uploading.",
            },
            Turn {
                user: "Run the tests.",
                plan: "Running the whole suite.",
                tools: &[Tool {
                    name: "bash",
                    args: r#"{"cmd": "cargo test 2>&1"}"#,
                    output: Output::Lines {
                        line: "test push::dry_run_lists_files_without_uploading ... ok",
                        count: 1500,
                    },
                }],
                answer: "All tests pass, including the new dry_run test.",
            },
        ],
    },
    Script {
        slug: "demo-query-plan",
        title: "Why is the orders query slow?",
        cwd: "/home/dev/shop",
        turns: &[Turn {
            user: "SELECT * FROM orders WHERE customer_id = ? ORDER BY created_at DESC LIMIT 20 takes 800 ms. Why?",
            plan: "Let me look at the query plan and the indexes.",
            tools: &[
                Tool {
                    name: "sql",
                    args: r#"{"query": "EXPLAIN QUERY PLAN SELECT * FROM orders WHERE customer_id = 42 ORDER BY created_at DESC LIMIT 20"}"#,
                    output: Output::Text("SCAN orders\nUSE TEMP B-TREE FOR ORDER BY"),
                },
                Tool {
                    name: "sql",
                    args: r#"{"query": "SELECT name, sql FROM sqlite_master WHERE tbl_name = 'orders' AND type = 'index'"}"#,
                    output: Output::Text(
                        "orders_by_created|CREATE INDEX orders_by_created ON orders (created_at)",
                    ),
                },
            ],
            answer: "There is no index on customer_id, so it scans the table and sorts. CREATE INDEX orders_by_customer ON orders (customer_id, created_at) turns it into an index range read with no sort.",
        }],
    },
    Script {
        slug: "demo-release-notes",
        title: "Draft release notes for 3.2",
        cwd: "/home/dev/widget",
        turns: &[
            Turn {
                user: "Draft release notes for 3.2 from the git history since v3.1.0.",
                plan: "Collecting the commits since the last tag.",
                tools: &[Tool {
                    name: "bash",
                    args: r#"{"cmd": "git log --oneline v3.1.0..HEAD"}"#,
                    output: Output::Lines {
                        line: "a1b2c3d fix(render): clamp negative widths in the flex layout pass",
                        count: 1200,
                    },
                }],
                answer: "## 3.2\n- Layout: negative widths are clamped in flex layout.\n- Rendering is 20% faster on large trees.\n- 14 smaller fixes.",
            },
            Turn {
                user: "Add a section on breaking changes, if any.",
                plan: "Searching the history for breaking-change markers.",
                tools: &[Tool {
                    name: "bash",
                    args: r#"{"cmd": "git log v3.1.0..HEAD --grep 'BREAKING' --format='%h %s'"}"#,
                    output: Output::Text(
                        "9f8e7d6 feat(api)!: Widget::measure now returns a Result",
                    ),
                }],
                answer: "### Breaking changes\n- `Widget::measure` now returns `Result<Size, MeasureError>`; call `.unwrap_or_default()` to keep the old behaviour.",
            },
        ],
    },
];

/// What one demo run wrote.
#[derive(Debug, Default, Serialize)]
struct Summary {
    /// The root folder.
    root: PathBuf,
    /// The sessions written, in order.
    sessions: Vec<String>,
    /// Events written (durable).
    events: u64,
    /// Ended turns.
    turns: u64,
    /// Distinct blobs referenced by the written events.
    blobs: usize,
    /// Raw bytes of those blobs.
    blob_bytes: u64,
    /// Bytes on disk of the written session folders.
    bytes_on_disk: u64,
    /// The model calls recorded, over every session.
    usage: Usage,
    /// Wall-clock time of the run, milliseconds.
    elapsed_ms: u128,
    /// A `sqlite3` command that prints the first session's transcript.
    transcript_command: String,
}

/// Runs the demo: writes every script as a new session under `root`, then prints a summary
/// (as JSON with `json`).
///
/// # Errors
/// Any I/O or storage error. Sessions appear atomically; one that fails mid-script keeps
/// the turns flushed before the failure.
pub fn run(root: &Path, json: bool) -> CliResult<()> {
    let started = Instant::now();
    let root = Root::open(root)?;
    let progress = if std::io::stderr().is_terminal() && !json {
        ProgressBar::new(SCRIPTS.len() as u64)
            .with_style(ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}")?)
    } else {
        ProgressBar::hidden()
    };
    let mut summary = Summary {
        root: std::path::absolute(root.path())?,
        ..Summary::default()
    };
    let mut dirs = Vec::new();
    let mut first_file = None;
    for script in SCRIPTS {
        let session = create_fresh(&root, script)?;
        progress.set_message(session.id().to_string());
        let written = write_script(&session, script)?;
        summary.sessions.push(session.id().to_string());
        summary.events += written.events;
        summary.turns += written.turns;
        summary.blobs += written.blobs.len();
        summary.blob_bytes += written.blobs.values().sum::<u64>();
        summary.usage.add(written.usage);
        dirs.push(session.dir().to_path_buf());
        first_file.get_or_insert_with(|| session.reader().file().to_path_buf());
        // Dropping the last handle also closes its read connections, so sizes are final.
        drop(session);
        progress.inc(1);
    }
    progress.finish_and_clear();
    for dir in &dirs {
        summary.bytes_on_disk += dir_bytes(dir)?;
    }
    if let Some(file) = first_file {
        summary.transcript_command = format!(
            "sqlite3 {} \"SELECT seq, role, content_preview FROM transcript\"",
            shell_quote(&std::path::absolute(file)?)
        );
    }
    summary.elapsed_ms = started.elapsed().as_millis();
    print_summary(&summary, json)
}

/// Creates the script's session under its slug, or the first free `slug-N`.
fn create_fresh(root: &Root, script: &Script) -> CliResult<Session> {
    for n in 1..=MAX_SUFFIX {
        let name = match n {
            1 => script.slug.to_owned(),
            n => format!("{}-{n}", script.slug),
        };
        let options = CreateOptions::with_id(SessionId::new(name)?).with_cwd(script.cwd);
        match root.create(options) {
            Ok(session) => return Ok(session),
            Err(Error::SessionExists(_)) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(format!(
        "no free session id for {} under {MAX_SUFFIX} suffixes",
        script.slug
    )
    .into())
}

/// What writing one script produced.
struct Written {
    events: u64,
    turns: u64,
    /// Blob digest → raw bytes.
    blobs: BTreeMap<String, u64>,
    /// The model calls recorded (`usage` events).
    usage: Usage,
}

/// The model calls a script records: one `usage` event per assistant message, with token
/// counts of about a token per 4 characters of the conversation so far (the part before the
/// last call read from the provider's cache) and a cost at $3 / $15 per million input /
/// output tokens ($0.30 per million read from the cache).
#[derive(Clone, Copy, Debug, Default, Serialize)]
struct Usage {
    /// Model calls.
    calls: u64,
    /// Input tokens, those read from the cache included.
    input_tokens: u64,
    /// Output tokens.
    output_tokens: u64,
    /// Input tokens read from the cache.
    cache_read_tokens: u64,
    /// The cost, in billionths of a dollar (printed as a decimal string, as the event holds it).
    cost_nanos: u64,
}

impl Usage {
    /// Records a call that read `context` characters (`cached` of them as the last call
    /// left them) and wrote `written`; returns its `usage` event.
    fn call(
        &mut self,
        context: usize,
        cached: usize,
        written: usize,
    ) -> session_store::Result<Event> {
        let input = (context / 4) as u64 + 1;
        let cache_read = (cached / 4) as u64;
        let output = (written / 4) as u64 + 1;
        let cost = (input - cache_read) * 3_000 + cache_read * 300 + output * 15_000;
        self.calls += 1;
        self.input_tokens += input;
        self.output_tokens += output;
        self.cache_read_tokens += cache_read;
        self.cost_nanos += cost;
        event(
            "usage",
            json!({"model": MODEL, "input_tokens": input, "output_tokens": output,
                   "cache_read_tokens": cache_read, "cost": dollars(cost)}),
        )
    }

    /// Adds another script's calls.
    fn add(&mut self, other: Usage) {
        self.calls += other.calls;
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        self.cache_read_tokens += other.cache_read_tokens;
        self.cost_nanos += other.cost_nanos;
    }
}

/// Billionths of a dollar as a decimal string (`123456` → `"0.000123456"`).
fn dollars(nanos: u64) -> String {
    format!("{}.{:09}", nanos / 1_000_000_000, nanos % 1_000_000_000)
}

/// An event with a JSON payload.
fn event(kind: &str, payload: Value) -> session_store::Result<Event> {
    Event::new(kind).with_payload(&payload)
}

/// A `message/complete` event.
fn message(message: Value) -> session_store::Result<Event> {
    event("message/complete", json!({ "message": message }))
}

/// Writes a script into its session, flushing at every turn end, and closes it.
fn write_script(session: &Session, script: &Script) -> CliResult<Written> {
    session.append(Batch::new(
        "config",
        vec![event("session/config", json!({ "modelRef": MODEL }))?],
    ))?;
    let mut usage = Usage::default();
    // Characters of the conversation so far, and as the last model call left it.
    let (mut context, mut cached) = (0, 0);
    for (t, turn) in script.turns.iter().enumerate() {
        let turn_id = format!("turn-{}", t + 1);
        context += turn.user.len();
        let op = |step: &str| format!("{turn_id}/{step}");
        session.append(
            Batch::new(
                op("user"),
                vec![
                    Event::new("turn/start"),
                    message(json!({"id": op("user"), "role": "user", "content": turn.user}))?,
                ],
            )
            .in_turn(&turn_id),
        )?;
        if !turn.tools.is_empty() {
            let calls: Vec<(String, &Tool, Value)> = turn
                .tools
                .iter()
                .enumerate()
                .map(|(i, tool)| {
                    let args = serde_json::from_str(tool.args)?;
                    Ok((format!("call-{}-{}", t + 1, i + 1), tool, args))
                })
                .collect::<Result<_, serde_json::Error>>()?;
            let tool_calls: Vec<Value> = calls
                .iter()
                .map(|(id, tool, args)| {
                    json!({"id": id, "type": "function",
                           "function": {"name": tool.name, "arguments": args.to_string()}})
                })
                .collect();
            let mut plan = vec![message(json!({
                "id": op("plan"), "role": "assistant",
                "content": turn.plan, "tool_calls": tool_calls,
            }))?];
            plan.push(usage.call(context, cached, turn.plan.len())?);
            context += turn.plan.len();
            cached = context;
            for (id, tool, args) in &calls {
                plan.push(event(
                    "tool/call",
                    json!({"id": id, "name": tool.name, "args": args}),
                )?);
                plan.push(event("tool/start", json!({"id": id, "name": tool.name}))?);
            }
            session.append(Batch::new(op("plan"), plan).in_turn(&turn_id))?;
            for (id, tool, _) in &calls {
                let output = tool.output.render();
                context += output.len();
                session.append(
                    Batch::new(
                        op(id),
                        vec![
                            event(
                                "tool/result",
                                json!({"id": id, "name": tool.name, "output": output,
                                       "durationMs": 40 + output.len() / 1000}),
                            )?,
                            message(json!({"id": op(id), "role": "tool",
                                           "tool_call_id": id, "content": output}))?,
                        ],
                    )
                    .in_turn(&turn_id),
                )?;
            }
        }
        let mut end = vec![
            message(json!({"id": op("answer"), "role": "assistant", "content": turn.answer}))?,
            usage.call(context, cached, turn.answer.len())?,
        ];
        context += turn.answer.len();
        cached = context;
        if t == 0 {
            end.push(event("session/title", json!({ "title": script.title }))?);
        }
        end.push(event("turn/end", json!({"status": "completed"}))?);
        session.append(Batch::new(op("answer"), end).in_turn(&turn_id))?;
        session.flush()?;
    }
    let events = session.flush()?;
    let turns = session.with_projection(|p| p.ended_turns);
    let mut blobs = BTreeMap::new();
    for commit in session.reader().all_commits()? {
        for e in commit.events {
            if let Some(content) = e.content_ref {
                blobs.insert(content.digest, content.bytes);
            }
        }
    }
    session.close()?;
    Ok(Written {
        events,
        turns,
        blobs,
        usage,
    })
}

/// Total size of the regular files directly in `dir`.
fn dir_bytes(dir: &Path) -> CliResult<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir)? {
        let meta = entry?.metadata()?;
        if meta.is_file() {
            total += meta.len();
        }
    }
    Ok(total)
}

/// Prints the summary as text or JSON on stdout.
fn print_summary(summary: &Summary, json: bool) -> CliResult<()> {
    if json {
        outln!("{}", serde_json::to_string(summary)?);
        return Ok(());
    }
    outln!(
        "wrote {} sessions to {} in {:.2} s",
        summary.sessions.len(),
        summary.root.display(),
        summary.elapsed_ms as f64 / 1000.0
    );
    outln!(
        "  {} events, {} turns, {} blobs ({} raw), {} on disk",
        summary.events,
        summary.turns,
        summary.blobs,
        human_bytes(summary.blob_bytes),
        human_bytes(summary.bytes_on_disk)
    );
    let usage = &summary.usage;
    outln!(
        "  {} model calls: {} input tokens ({} from the cache), {} output, ${}",
        usage.calls,
        usage.input_tokens,
        usage.cache_read_tokens,
        usage.output_tokens,
        {
            let cost = dollars(usage.cost_nanos);
            let cost = cost.trim_end_matches('0');
            cost.strip_suffix('.').unwrap_or(cost).to_owned()
        }
    );
    outln!("  sessions: {}", summary.sessions.join(", "));
    if let Some(first) = summary.sessions.first() {
        outln!("transcript of {first}:");
        outln!("  {}", summary.transcript_command);
    }
    Ok(())
}
