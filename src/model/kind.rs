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
