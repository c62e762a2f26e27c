//! The event kind vocabulary: the kind names the projection folds, and the sets of kinds
//! and of field values that its payload schemas allow (upstream §1.6).

/// `message/complete`: a new transcript message.
pub(crate) const MESSAGE_COMPLETE: &str = "message/complete";
/// `message/upsert`: a transcript message replaced by id, or added.
pub(crate) const MESSAGE_UPSERT: &str = "message/upsert";
/// `assistant/attempt`: an assistant attempt begins, is discarded or is committed.
pub(crate) const ASSISTANT_ATTEMPT: &str = "assistant/attempt";
/// `history/replace`: the transcript and the model workset are replaced.
pub(crate) const HISTORY_REPLACE: &str = "history/replace";
/// Whether an event of `kind` puts messages into the transcript, and so may be named by a
/// history index row: a message event (`item` false), or one replacing the whole
/// transcript by its `messages` array (`item` true, the row naming one of them).
pub(crate) fn puts_history(kind: &str, item: bool) -> bool {
    if item {
        kind == HISTORY_REPLACE || kind == LEGACY_IMPORT
    } else {
        kind == MESSAGE_COMPLETE || kind == MESSAGE_UPSERT
    }
}
/// `model/context-replace`: the model workset is replaced.
pub(crate) const MODEL_CONTEXT_REPLACE: &str = "model/context-replace";
/// `compaction`: the model workset is replaced by a compacted one.
pub(crate) const COMPACTION: &str = "compaction";
/// `legacy/import`: a whole legacy transcript.
pub(crate) const LEGACY_IMPORT: &str = "legacy/import";
/// `session/title`: the session's title.
pub(crate) const SESSION_TITLE: &str = "session/title";
/// `session/config`: the configured model.
pub(crate) const SESSION_CONFIG: &str = "session/config";
/// `turn/start`: a turn opens.
pub(crate) const TURN_START: &str = "turn/start";
/// `turn/end`: the open turn ends with a terminal status.
pub(crate) const TURN_END: &str = "turn/end";
/// `step/start`: a step of a turn begins.
pub(crate) const STEP_START: &str = "step/start";
/// `step/end`: a step of a turn ends.
pub(crate) const STEP_END: &str = "step/end";
/// `tool/call`: the model asked for a tool call.
pub(crate) const TOOL_CALL: &str = "tool/call";
/// `tool/start`: a tool call became active.
pub(crate) const TOOL_START: &str = "tool/start";
/// `tool/result`: an active tool call finished.
pub(crate) const TOOL_RESULT: &str = "tool/result";
/// `todo/write`: the current turn's todo list.
pub(crate) const TODO_WRITE: &str = "todo/write";
/// `interaction/created`: an interaction is pending.
pub(crate) const INTERACTION_CREATED: &str = "interaction/created";
/// `interaction/resolved`: a pending interaction was resolved.
pub(crate) const INTERACTION_RESOLVED: &str = "interaction/resolved";
/// `runtime/recovery`: the runtime's recovery status.
pub(crate) const RUNTIME_RECOVERY: &str = "runtime/recovery";
/// `plan/state`: the plan, a JSON object.
pub(crate) const PLAN_STATE: &str = "plan/state";
/// `goal/state`: the goal, a JSON object.
pub(crate) const GOAL_STATE: &str = "goal/state";
/// `usage`: one model call's token counts and cost, summed into the usage totals.
pub(crate) const USAGE: &str = "usage";
/// `diagnostic`: free-form diagnostics, not folded.
pub(crate) const DIAGNOSTIC: &str = "diagnostic";

/// Event kinds the projection understands; any other kind must be `optional`.
///
/// Each kind's payload is a JSON object whose keys are checked strictly: a key not listed
/// here, a missing required key, a value of the wrong type, an array in place of an
/// object (the payload's or a todo's, even one of the right values in order) or an object
/// anywhere in the payload holding a key twice (its readers would disagree on the value)
/// refuses the whole batch ([`Error::InvalidPayload`](crate::Error::InvalidPayload),
/// nothing changed; a log written before the last two rules may hold either, and still
/// folds). Keys ending
/// in `?` are optional; keys the library only stores (it does not read them) take any
/// JSON value. An `optional` event of any kind is stored without being checked.
///
/// | kind | payload | checked |
/// |---|---|---|
/// | `message/complete` | `{message}` | `message` an object with a non-empty `id` not already in the transcript; its other keys (`role`, `content`, tool calls, …) are kept verbatim |
/// | `message/upsert` | `{message}` | as `message/complete`; replaces the message with that id, else appends it (in the model workset, the last one with that id: a `message/complete` may add an id a `compaction` already put there) |
/// | `assistant/attempt` | `{id, action, messageId?, attempt?, max?, reason?}` | `action` is `begin`, `discard` or `commit` |
/// | `history/replace`, `model/context-replace`, `compaction` | `{messages, reason?, trigger?, sourceSequences?}` | `messages` an array of messages (for `history/replace`, each with an id, each id once; for the others an id at most once, a message without one allowed); `sourceSequences` an array of sequences |
/// | `legacy/import` | `{messages, source?, goal?, modelRef?, modelIdentity?}` | `messages` an array of messages, each with an id, each id once |
/// | `session/title` | `{title}` | not blank |
/// | `session/config` | `{modelRef, modelIdentity?}` | `modelRef` not blank |
/// | `turn/start` | none (ignored) | no turn open; the turn id is the batch's ([`Batch::in_turn`](crate::Batch::in_turn), else derived from the operation id) |
/// | `turn/end` | `{status}` | one of [`TERMINAL_TURN_STATUSES`] |
/// | `step/start`, `step/end` | `{id, status?}` | `id` not empty |
/// | `tool/call` | `{id, name, args?, …}` | `id` and `name` not empty; the other keys the upstream format names (`runState`, `diagnostic`, `resolvedName`, `capabilityId`, `readOnly`, `truncated`, `durationMs`, `startedAt`, `endedAt`, `partial`, `argChars`, `refreshed`, `parentId`, `attemptId`, `subagentRef`, `subagentStatus`, `subagentErrorCode`, `subagentRetryable`, `diff`, `added`, `removed`, `profile`, `execution`, `presentedFiles`, `workspaceMutation`, `workspacePaths`, `workspaceAllPaths`) are optional |
/// | `tool/start` | `{id, name}` only | `id` and `name` not empty; the tool is active until its `tool/result` |
/// | `tool/result` | the `tool/call` keys and `error?, output?, state?, todos?, todoWritten?` | `id` and `name` not empty |
/// | `todo/write` | `{todos: [{content, status}]}` | each `content` non-blank, trimmed and unique; `status` `pending`, `in_progress` or `completed` ([`Todo`](crate::Todo)) |
/// | `interaction/created` | `{id, state?, toolCallId?, kind?, sessionId?, headId?, turnId?, runtimeEpoch?}` | `id` not empty; `state` empty or `pending`; pending until resolved |
/// | `interaction/resolved` | `{id, state}` | `state` `answered`, `rejected`, `cancelled` or `unavailable` |
/// | `runtime/recovery` | a [`RecoveryStatus`](crate::RecoveryStatus) (snake_case keys) | its keys only |
/// | `plan/state`, `goal/state` | any JSON object | an object |
/// | `usage` | `{model, input_tokens, output_tokens, cache_read_tokens?, cache_write_tokens?, cost?}` | `model` non-blank, at most 256 bytes; counts non-negative integers; `cost` an exact decimal string ([`Cost`](crate::Cost), e.g. `"0.0042"`) |
/// | `diagnostic` | any JSON, or none | — |
///
/// One batch with every kind, as the table gives them:
///
/// ```
/// use serde_json::json;
/// use session_store::{Batch, CreateOptions, Event, Root, SessionId, PROJECTION_KINDS};
/// # fn main() -> session_store::Result<()> {
/// # let dir = tempfile::tempdir().unwrap();
/// let root = Root::open(dir.path())?;
/// let session = root.create(CreateOptions::with_id(SessionId::new("kinds")?))?;
/// let m = |id: &str| json!({"id": id, "role": "user", "content": "hi"});
/// let e = |kind: &str, payload: serde_json::Value| Event::new(kind).with_payload(&payload);
/// let events = vec![
///     e("session/title", json!({"title": "All kinds"}))?,
///     e("session/config", json!({"modelRef": "provider/model"}))?,
///     Event::new("turn/start"),
///     e("message/complete", json!({"message": m("u1")}))?,
///     e("message/upsert", json!({"message": m("u1")}))?,
///     e("assistant/attempt", json!({"id": "a1", "action": "begin"}))?,
///     e("step/start", json!({"id": "s1"}))?,
///     e("tool/call", json!({"id": "c1", "name": "bash", "args": {"cmd": "ls"}}))?,
///     e("tool/start", json!({"id": "c1", "name": "bash"}))?,
///     e("tool/result", json!({"id": "c1", "name": "bash", "output": "a.txt"}))?,
///     e("step/end", json!({"id": "s1", "status": "done"}))?,
///     e("todo/write", json!({"todos": [{"content": "test", "status": "pending"}]}))?,
///     e("interaction/created", json!({"id": "i1", "toolCallId": "c1"}))?,
///     e("interaction/resolved", json!({"id": "i1", "state": "answered"}))?,
///     e("runtime/recovery", json!({"state": "recovery_required", "phase": "tool"}))?,
///     e("plan/state", json!({"steps": 2}))?,
///     e("goal/state", json!({"goal": "ship"}))?,
///     e("usage", json!({"model": "m", "input_tokens": 10, "output_tokens": 2, "cost": "0.0042"}))?,
///     e("diagnostic", json!({"note": "anything"}))?,
///     e("history/replace", json!({"messages": [m("u2")], "reason": "edit"}))?,
///     e("model/context-replace", json!({"messages": [m("u2")]}))?,
///     e("compaction", json!({"messages": [m("u2")], "trigger": "size"}))?,
///     e("legacy/import", json!({"messages": [m("u3")], "modelRef": "provider/model"}))?,
///     e("turn/end", json!({"status": "completed"}))?,
/// ];
/// let mut kinds: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
/// kinds.sort_unstable();
/// let mut all = PROJECTION_KINDS.to_vec();
/// all.sort_unstable();
/// assert_eq!(kinds, all);
/// session.append(Batch::new("every-kind", events).in_turn("t1"))?;
/// // A key the table does not list refuses the batch.
/// let extra = e("tool/start", json!({"id": "c2", "name": "bash", "args": {}}))?;
/// assert!(session.append(Batch::new("extra", vec![extra])).unwrap_err().is_caller_error());
/// # session.close() }
/// ```
pub const PROJECTION_KINDS: [&str; 24] = [
    MESSAGE_COMPLETE,
    MESSAGE_UPSERT,
    ASSISTANT_ATTEMPT,
    HISTORY_REPLACE,
    MODEL_CONTEXT_REPLACE,
    COMPACTION,
    LEGACY_IMPORT,
    SESSION_TITLE,
    SESSION_CONFIG,
    TURN_START,
    TURN_END,
    STEP_START,
    STEP_END,
    TOOL_CALL,
    TOOL_START,
    TOOL_RESULT,
    TODO_WRITE,
    INTERACTION_CREATED,
    INTERACTION_RESOLVED,
    RUNTIME_RECOVERY,
    PLAN_STATE,
    GOAL_STATE,
    USAGE,
    DIAGNOSTIC,
];

/// Event kinds that close a turn; a cancelled execution may still commit these.
pub const CLOSURE_KINDS: [&str; 5] = [
    TURN_END,
    INTERACTION_RESOLVED,
    RUNTIME_RECOVERY,
    DIAGNOSTIC,
    ASSISTANT_ATTEMPT,
];

/// Turn statuses allowed in `turn/end`.
pub const TERMINAL_TURN_STATUSES: [&str; 6] = [
    "completed",
    TURN_INTERRUPTED,
    "recovery_required",
    "unknown",
    "failed",
    "protocol_failed",
];

/// `turn/end` status of a turn closed by restart recovery.
pub(crate) const TURN_INTERRUPTED: &str = "interrupted";

/// Status of the open turn.
pub const TURN_IN_PROGRESS: &str = "in_progress";

/// `assistant/attempt` actions.
pub(crate) const ATTEMPT_ACTIONS: [&str; 3] = ["begin", "discard", "commit"];

/// Todo statuses allowed in `todo/write`.
pub(crate) const TODO_STATUSES: [&str; 3] = ["pending", "in_progress", "completed"];

/// State of a pending interaction (`interaction/created` may also leave it empty).
pub(crate) const INTERACTION_PENDING: &str = "pending";

/// `interaction/resolved` states.
pub(crate) const INTERACTION_RESOLVED_STATES: [&str; 4] =
    ["answered", "rejected", "cancelled", INTERACTION_UNAVAILABLE];

/// `interaction/resolved` state of an interaction closed by restart recovery.
pub(crate) const INTERACTION_UNAVAILABLE: &str = "unavailable";

/// `tool/result` state of a tool whose result was never recorded (restart recovery).
pub(crate) const TOOL_RESULT_UNKNOWN: &str = "result_unknown";
