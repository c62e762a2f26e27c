//! The projection: session state folded from events (upstream §1.6–§1.8).
//!
//! Folding is two-phase: [`Projection::prepare`] parses and checks a whole batch against
//! the current state without changing it (every error is found here), then
//! [`Projection::apply_prepared`] applies it and cannot fail. This gives the semantics of
//! "fold on a clone, then swap" without cloning the projection on every append.

use std::collections::BTreeMap;
use std::sync::Arc;

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{Error, Result};
use crate::model::event::{Commit, Event};
use crate::model::kind::{self, TERMINAL_TURN_STATUSES, TURN_IN_PROGRESS};
use crate::model::message::Message;
use crate::model::payload::{
    AttemptPayload, ConfigPayload, InteractionCreatedPayload, InteractionResolvedPayload,
    LegacyImport, MessagePayload, MessagesPayload, RecoveryStatus, StepPayload, TitlePayload, Todo,
    TodoPayload, ToolCallPayload, ToolResultPayload, ToolStartPayload, TurnEndPayload,
    UsagePayload, bad, decode, json_object, one_of, required_id, title_problem,
};
use crate::model::transcript_index::{MessageKey, TranscriptIndex, message_key};
use crate::model::usage::{MAX_CALL_COST_WHOLE_DIGITS, Usage, UsageRecord};

/// A completed turn: where it started and ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct TurnBoundary {
    /// The turn id.
    pub turn_id: String,
    /// Sequence of the `turn/start` event.
    pub start_sequence: u64,
    /// Sequence of the `turn/end` event.
    pub end_sequence: u64,
    /// Last sequence of the commit that holds the `turn/end`: where a fork may cut.
    pub boundary_sequence: u64,
    /// The terminal status.
    pub status: String,
    /// A fork after this turn is allowed: after the commit holding the `turn/end` no turn
    /// is open and no interaction is pending.
    pub fork_safe: bool,
    /// A rewind before this turn is allowed: the `turn/start` opens its commit and before
    /// it no turn was open and no interaction was pending.
    pub rewind_safe: bool,
}

/// Session state folded from its events.
///
/// The projection holds small state and the model workset; the UI transcript is not kept
/// here (it lives in the log and the history index, read with
/// `SessionReader::transcript` and history pages), only its length, where each message id
/// sits (for duplicate ids and upserts) and the preview. So its memory does not grow with
/// the transcript's bodies.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Projection {
    /// Sequence of the last folded event.
    pub committed_sequence: u64,
    /// The open turn, if any.
    pub turn_id: Option<String>,
    /// Status of the open turn, or the terminal status of the last one (empty before any turn).
    pub turn_status: String,
    /// Sequence of the open turn's `turn/start` (0 without an open turn).
    pub current_turn_start: u64,
    /// Whether a rewind to before the open turn would be allowed.
    pub current_turn_rewind_safe: bool,
    /// How many turns ended (the turns themselves are in the turn index:
    /// `SessionReader::turns`).
    pub ended_turns: u64,
    /// How many messages the UI transcript holds.
    pub transcript_len: u64,
    /// The first user message's text, trimmed, cut to 240 characters. An upsert that
    /// empties that message clears it; a later user message does not take its place.
    pub preview: Option<String>,
    /// 1-based transcript position of the preview's message (0: none yet). An upsert that
    /// empties that message keeps it, so no later message takes the preview's place.
    #[serde(default)]
    preview_position: u64,
    /// The exact provider workset.
    pub model_messages: Vec<Arc<Message>>,
    /// The current turn's todo list.
    pub todos: Vec<Todo>,
    /// Whether the current turn wrote todos.
    pub todo_written: bool,
    /// Pending interactions: id → `pending`.
    pub interactions: BTreeMap<String, String>,
    /// Active tools: call id → tool name.
    pub active_tools: BTreeMap<String, String>,
    /// The last recovery status (cleared by `turn/start`).
    pub recovery: Option<RecoveryStatus>,
    /// The last `plan/state` object.
    pub plan_state: Option<Value>,
    /// The last `goal/state` object.
    pub goal_state: Option<Value>,
    /// The last `session/title`.
    pub title: String,
    /// One-based sequence of the last title event (0 = never titled).
    pub title_sequence: u64,
    /// The configured model.
    pub model_ref: String,
    /// The configured model identity.
    pub model_identity: Option<Value>,
    /// Token and cost totals of the `usage` events folded (a fork's include its inherited
    /// prefix).
    #[serde(default, skip_serializing_if = "Usage::is_empty")]
    pub usage: Usage,
    /// Transcript message ids → 0-based position.
    #[serde(skip)]
    transcript_ids: TranscriptIndex,
    /// Where each model-workset message was read from, parallel to `model_messages`.
    #[serde(skip)]
    model_refs: Vec<ModelRef>,
    /// Id key → position in `model_messages`; built on the first upsert, kept up to date
    /// from then on (a session that never upserts never builds it).
    #[serde(skip)]
    model_index: Option<HashMap<MessageKey, usize>>,
}

/// Where a model-workset message is read from: the event at `seq` (its `message`, or item
/// `item` of its `messages` array), taken as its provider view when `provider_view`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ModelRef {
    /// The event.
    pub seq: u64,
    /// Index in the payload's `messages` array (bulk replacements only).
    pub item: Option<u32>,
    /// Whether the workset holds the message's provider view ([`Message::for_model`]).
    pub provider_view: bool,
}

impl ModelRef {
    /// The provider view of the message of the message event at `seq`.
    fn message(seq: u64) -> ModelRef {
        ModelRef {
            seq,
            item: None,
            provider_view: true,
        }
    }
}

/// What a fold changed besides the projection: the turns it ended (for the turn index) and
/// the transcript changes (for the history index).
#[derive(Debug, Default)]
pub(crate) struct FoldEffects {
    /// Turns ended, in order.
    pub turns: Vec<TurnBoundary>,
    /// Transcript changes, in order.
    pub history: Vec<HistoryChange>,
}

/// A change to the UI transcript, as the history index records it.
#[derive(Clone, Debug)]
pub(crate) enum HistoryChange {
    /// The transcript was replaced by event `seq`: earlier entries are obsolete.
    Reset {
        /// The replacing event.
        seq: u64,
    },
    /// From event `seq` on, `message` is at `position` (1-based); `item` is its index in
    /// the event's `messages` array for a replacement.
    Put {
        /// The event.
        seq: u64,
        /// 1-based transcript position.
        position: u64,
        /// Index in the payload's `messages` array (replacements only).
        item: Option<u64>,
        /// The message.
        message: Arc<Message>,
    },
}

/// Applies transcript changes to a transcript held whole (oldest first).
pub(crate) fn apply_history(transcript: &mut Vec<Arc<Message>>, changes: &[HistoryChange]) {
    for change in changes {
        match change {
            HistoryChange::Reset { .. } => transcript.clear(),
            HistoryChange::Put {
                position, message, ..
            } => {
                let at = usize::try_from(position.saturating_sub(1)).unwrap_or(usize::MAX);
                match transcript.get_mut(at) {
                    Some(slot) => *slot = Arc::clone(message),
                    None => transcript.push(Arc::clone(message)),
                }
            }
        }
    }
}

/// A batch that passed [`Projection::prepare`], ready to apply.
#[derive(Debug)]
pub struct PreparedFold {
    events: Vec<Parsed>,
    /// The usage totals after the batch, when it holds `usage` events (summed, and checked
    /// for overflow, in `prepare`).
    usage: Option<Usage>,
}

#[derive(Debug)]
enum Parsed {
    Skip,
    MessageComplete(Arc<Message>),
    MessageUpsert(Arc<Message>),
    HistoryReplace(Vec<Arc<Message>>),
    /// `model/context-replace` or `compaction` (the kind), and its messages.
    ModelReplace(&'static str, Vec<Arc<Message>>),
    LegacyImport(LegacyImport),
    Title(String),
    Config(ConfigPayload),
    TurnStart,
    TurnEnd(String),
    ToolStart(String, String),
    ToolResult(String),
    Todos(Vec<Todo>),
    InteractionCreated(String),
    InteractionResolved(String),
    Recovery(RecoveryStatus),
    PlanState(Value),
    GoalState(Value),
    Usage(UsageRecord),
}

/// The rules of an append that need no session state, for [`Batch::validate`]: each
/// payload against its kind's schema, no message id completed twice in `events`, and the
/// append-only rules that read the batch alone ([`check_shapes`], [`check_titles`],
/// [`check_costs`], [`check_replacements`]). A fresh projection holds nothing that could
/// make a batch it refuses acceptable: every session refuses what this refuses.
///
/// [`Batch::validate`]: crate::Batch::validate
/// [`check_shapes`]: crate::model::payload::check_shapes
///
/// # Errors
/// As an append's: [`Error::InvalidPayload`], [`Error::InvalidInput`] or
/// [`Error::UnsupportedVersion`] (a required event of an unknown kind).
pub(crate) fn check_alone(events: &[Event]) -> Result<()> {
    crate::model::payload::check_shapes(events)?;
    let prepared = Projection::default().prepare(events)?;
    check_titles(&prepared)?;
    check_costs(&prepared)?;
    check_replacements(&prepared)
}

/// Parses and validates one event's payload against its kind's schema.
fn parse(event: &Event) -> Result<Parsed> {
    let kind = event.kind.as_str();
    if event.optional {
        return Ok(Parsed::Skip);
    }
    Ok(match kind {
        kind::MESSAGE_COMPLETE | kind::MESSAGE_UPSERT => {
            let p = MessagePayload::of(event)?;
            required_id(kind, p.message.id())?;
            if kind == kind::MESSAGE_COMPLETE {
                Parsed::MessageComplete(p.message)
            } else {
                Parsed::MessageUpsert(p.message)
            }
        }
        kind::ASSISTANT_ATTEMPT => {
            let p: AttemptPayload = decode(event)?;
            required_id(kind, &p.id)?;
            one_of(kind, "action", &p.action, &kind::ATTEMPT_ACTIONS)?;
            Parsed::Skip
        }
        kind::HISTORY_REPLACE => Parsed::HistoryReplace(decode::<MessagesPayload>(event)?.messages),
        kind::MODEL_CONTEXT_REPLACE | kind::COMPACTION => {
            let which = if kind == kind::COMPACTION {
                kind::COMPACTION
            } else {
                kind::MODEL_CONTEXT_REPLACE
            };
            Parsed::ModelReplace(which, decode::<MessagesPayload>(event)?.messages)
        }
        kind::LEGACY_IMPORT => Parsed::LegacyImport(decode(event)?),
        kind::SESSION_TITLE => Parsed::Title(decode::<TitlePayload>(event)?.title),
        kind::SESSION_CONFIG => {
            let p: ConfigPayload = decode(event)?;
            if let Some(why) = crate::model::payload::missing_or_blank("modelRef", &p.model_ref) {
                return Err(bad(kind, why));
            }
            Parsed::Config(p)
        }
        kind::TURN_START => Parsed::TurnStart,
        kind::TURN_END => {
            let p: TurnEndPayload = decode(event)?;
            one_of(kind, "status", &p.status, &TERMINAL_TURN_STATUSES)?;
            Parsed::TurnEnd(p.status)
        }
        kind::STEP_START | kind::STEP_END => {
            required_id(kind, &decode::<StepPayload>(event)?.id)?;
            Parsed::Skip
        }
        kind::TOOL_CALL => {
            let p: ToolCallPayload = decode(event)?;
            required_id(kind, &p.id)?;
            required_id(kind, &p.name)?;
            Parsed::Skip
        }
        kind::TOOL_START => {
            let p: ToolStartPayload = decode(event)?;
            required_id(kind, &p.id)?;
            required_id(kind, &p.name)?;
            Parsed::ToolStart(p.id, p.name)
        }
        kind::TOOL_RESULT => {
            let p: ToolResultPayload = decode(event)?;
            required_id(kind, &p.id)?;
            required_id(kind, &p.name)?;
            Parsed::ToolResult(p.id)
        }
        kind::TODO_WRITE => {
            let p: TodoPayload = decode(event)?;
            let mut seen = HashSet::default();
            for t in &p.todos {
                if t.content.trim().is_empty() || t.content.trim() != t.content {
                    return Err(bad(kind, "todo content must be non-blank and trimmed"));
                }
                if !seen.insert(t.content.as_str()) {
                    return Err(bad(kind, format!("duplicate todo {:?}", t.content)));
                }
                one_of(kind, "status", &t.status, &kind::TODO_STATUSES)?;
            }
            Parsed::Todos(p.todos)
        }
        kind::INTERACTION_CREATED => {
            let p: InteractionCreatedPayload = decode(event)?;
            required_id(kind, &p.id)?;
            one_of(kind, "state", &p.state, &["", kind::INTERACTION_PENDING])?;
            Parsed::InteractionCreated(p.id)
        }
        kind::INTERACTION_RESOLVED => {
            let p: InteractionResolvedPayload = decode(event)?;
            required_id(kind, &p.id)?;
            one_of(kind, "state", &p.state, &kind::INTERACTION_RESOLVED_STATES)?;
            Parsed::InteractionResolved(p.id)
        }
        kind::RUNTIME_RECOVERY => Parsed::Recovery(decode(event)?),
        kind::PLAN_STATE => Parsed::PlanState(json_object(event)?),
        kind::GOAL_STATE => Parsed::GoalState(json_object(event)?),
        kind::USAGE => Parsed::Usage(decode::<UsagePayload>(event)?.record()?),
        kind::DIAGNOSTIC => Parsed::Skip,
        other => {
            return Err(Error::unsupported(format!(
                "unknown required event kind {} (mark it optional to store it)",
                crate::error::quoted(other)
            )));
        }
    })
}

/// Refuses a `history/replace` or `legacy/import` with a message without an id, or whose
/// messages repeat an id, as a `message/complete` of either is refused: the transcript
/// would hold two positions of one id (or one no `message/upsert` can name), and a later
/// `message/upsert` of it would change only one. A `model/context-replace` or `compaction`
/// may hold messages without ids (a summary), but not one id twice: a later
/// `message/upsert` of it would change only the last copy. A stored one still folds.
/// (Outside testing, session 43: one id-less message was taken as `""`, two as "duplicate
/// message id \"\"", and a workset could hold an id twice.)
///
/// # Errors
/// [`Error::InvalidPayload`] of the event's kind naming the message, or the id and both
/// messages.
fn check_replacements(prepared: &PreparedFold) -> Result<()> {
    for p in &prepared.events {
        let (kind, messages, ids_required) = match p {
            Parsed::HistoryReplace(ms) => (kind::HISTORY_REPLACE, ms, true),
            Parsed::LegacyImport(LegacyImport { messages, .. }) => {
                (kind::LEGACY_IMPORT, messages, true)
            }
            Parsed::ModelReplace(kind, ms) => (*kind, ms, false),
            _ => continue,
        };
        let mut seen: HashMap<&str, usize> =
            HashMap::with_capacity_and_hasher(messages.len(), Default::default());
        for (i, m) in messages.iter().enumerate() {
            if let Some(why) = crate::model::payload::missing_or_blank("id", m.id()) {
                if ids_required {
                    return Err(bad(kind, format!("messages[{i}]: {why}")));
                }
                continue;
            }
            if let Some(first) = seen.insert(m.id(), i) {
                return Err(bad(
                    kind,
                    format!(
                        "duplicate message id {:?} (messages[{first}] and messages[{i}])",
                        m.id()
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// How an error names the `usage` event `events[i]` of a batch: its index, and its model
/// when it has one.
fn usage_event(i: usize, model: Option<&str>) -> String {
    match model {
        Some(model) => format!("events[{i}] (model {}):", crate::error::quoted(model)),
        None => format!("events[{i}]:"),
    }
}

/// `e`, the refusal of event `events[i]`'s payload, naming the event when it is a `usage`
/// event's, as the range checks of usage name it: in a batch of several, "invalid usage
/// payload: cost \"-1\" is not a decimal string" said nothing of which (outside testing C1).
fn naming_usage(e: Error, i: usize, event: &Event) -> Error {
    /// The `model` of a usage payload, when it is a string.
    #[derive(Deserialize)]
    struct ModelOf {
        model: Option<String>,
    }
    match e {
        Error::InvalidPayload { kind, reason } if kind == kind::USAGE => {
            let model = event
                .payload_str()
                .and_then(|text| serde_json::from_str::<ModelOf>(text).ok())
                .and_then(|m| m.model);
            let named = usage_event(i, model.as_deref());
            Error::InvalidPayload {
                kind,
                reason: format!("{named} {reason}"),
            }
        }
        other => other,
    }
}

/// Adds a stored `usage` event's payload to `usage` as the fold does, folding nothing else:
/// [`crate::Root::stats`] reads these events alone (its fold of every payload held a huge
/// message decoded, about 3 GB for an 800 MB one, per request of `serve`'s stats page:
/// outside testing V5).
///
/// # Errors
/// As the fold's: [`Error::InvalidPayload`] for a payload that is no usage record or totals
/// that would overflow.
pub(crate) fn fold_usage(usage: &mut Usage, payload: &str) -> Result<()> {
    let event = Event::new(kind::USAGE).with_payload_json(payload)?;
    let r = decode::<UsagePayload>(&event)?.record()?;
    usage.add(&r).map_err(|why| {
        bad(
            kind::USAGE,
            format!("(model {}): {why}", crate::error::quoted(&r.model)),
        )
    })
}

/// Refuses a `usage` event whose cost is more than one call may cost
/// ([`MAX_CALL_COST_WHOLE_DIGITS`] digits before the point): one such cost left the exact
/// totals no room for later costs of 18 decimals, every one refused for good. A stored one
/// still folds.
///
/// # Errors
/// [`Error::InvalidPayload`] for `usage`, naming the event and its cost.
fn check_costs(prepared: &PreparedFold) -> Result<()> {
    for (i, p) in prepared.events.iter().enumerate() {
        if let Parsed::Usage(r) = p
            && let Some(cost) = r.cost.filter(|c| c.is_over_one_call())
        {
            return Err(bad(
                kind::USAGE,
                format!(
                    "{} cost {cost} is over what one call may cost (at most \
                     {MAX_CALL_COST_WHOLE_DIGITS} digits before the point)",
                    usage_event(i, Some(&r.model))
                ),
            ));
        }
    }
    Ok(())
}

/// Refuses a `session/title` that `rename` refuses ([`title_problem`]: blank, which would
/// hide the session's preview in listings, holding NUL, or too long). A stored one still
/// folds.
///
/// # Errors
/// [`Error::InvalidPayload`] for `session/title`.
fn check_titles(prepared: &PreparedFold) -> Result<()> {
    for p in &prepared.events {
        if let Parsed::Title(title) = p
            && let Some(problem) = title_problem(title)
        {
            return Err(bad(kind::SESSION_TITLE, problem));
        }
    }
    Ok(())
}

impl Projection {
    /// Whether the state has an open turn or a pending interaction.
    pub fn has_active_authority(&self) -> bool {
        self.turn_id.is_some() || !self.interactions.is_empty()
    }

    /// Parses and checks a batch against this state without changing it.
    ///
    /// # Errors
    /// [`Error::InvalidPayload`] for a schema violation or a duplicate message id,
    /// [`Error::UnsupportedVersion`] for an unknown required kind.
    pub fn prepare(&self, events: &[Event]) -> Result<PreparedFold> {
        let mut parsed = Vec::with_capacity(events.len());
        for (i, event) in events.iter().enumerate() {
            parsed.push(parse(event).map_err(|e| naming_usage(e, i, event))?);
        }
        // Duplicate stable ids through message/complete reject the whole batch.
        let mut reset: Option<HashSet<&str>> = None;
        let mut added: HashSet<&str> =
            HashSet::with_capacity_and_hasher(events.len(), Default::default());
        let mut usage: Option<Usage> = None;
        for (i, p) in parsed.iter().enumerate() {
            match p {
                Parsed::Usage(r) => usage
                    .get_or_insert_with(|| self.usage.clone())
                    .add(r)
                    .map_err(|why| {
                        bad(
                            kind::USAGE,
                            format!("{} {why}", usage_event(i, Some(&r.model))),
                        )
                    })?,
                Parsed::MessageComplete(m) => {
                    let known = match &reset {
                        Some(ids) => ids.contains(m.id()),
                        None => self.knows_message(m.id()),
                    };
                    if known || !added.insert(m.id()) {
                        return Err(bad(
                            kind::MESSAGE_COMPLETE,
                            format!("duplicate message id {:?}", m.id()),
                        ));
                    }
                }
                Parsed::MessageUpsert(m) => {
                    added.insert(m.id());
                }
                Parsed::HistoryReplace(ms)
                | Parsed::LegacyImport(LegacyImport { messages: ms, .. }) => {
                    reset = Some(ms.iter().map(|m| m.id()).collect());
                    added.clear();
                }
                _ => {}
            }
        }
        Ok(PreparedFold {
            events: parsed,
            usage,
        })
    }

    /// The rules checked on append only, after [`Projection::prepare`]: a stored log folds
    /// without them, so files written before a rule keep opening, replaying and verifying.
    ///
    /// `turn_id` is the batch's turn id (as given, or derived for a `turn/start`).
    ///
    /// # Errors
    /// As [`Projection::check_turn_nesting`], [`Projection::check_named_turn`],
    /// [`check_titles`] and [`check_replacements`].
    pub(crate) fn check_append(
        &self,
        prepared: &PreparedFold,
        turn_id: Option<&str>,
    ) -> Result<()> {
        self.check_turn_nesting(prepared)?;
        self.check_named_turn(prepared, turn_id)?;
        check_titles(prepared)?;
        check_costs(prepared)?;
        check_replacements(prepared)
    }

    /// Refuses a batch that starts a turn while one is open (before it or earlier in the
    /// batch): the outer turn would be dropped without a `turn/end`, so it would never be
    /// recorded. A stored log folds as upstream does (the later `turn/start` replaces the
    /// open turn).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] naming the open turn.
    fn check_turn_nesting(&self, prepared: &PreparedFold) -> Result<()> {
        let mut open = self.turn_id.as_ref().map(|t| {
            format!(
                "turn {} (started at sequence {})",
                crate::error::quoted(t),
                self.current_turn_start
            )
        });
        for (i, p) in prepared.events.iter().enumerate() {
            match p {
                Parsed::TurnStart => {
                    if let Some(turn) = &open {
                        return Err(Error::invalid(format!(
                            "events[{i}] is a turn/start while {turn} is still open; \
                             append its turn/end first"
                        )));
                    }
                    open = Some("the turn started earlier in this batch".to_owned());
                }
                Parsed::TurnEnd(_) => open = None,
                _ => {}
            }
        }
        Ok(())
    }

    /// Refuses a batch that names a turn other than the open one without starting it: its
    /// events would go into the open turn, and the turn it names would never exist (a fork
    /// after it is not found). A batch that names no turn, or starts the one it names, or
    /// comes while no turn is open (a turn's terminal facts after restart recovery closed
    /// it), is not checked. A stored log folds as upstream does (commit turn ids after the
    /// `turn/start` are not cross-checked).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] naming both turns.
    fn check_named_turn(&self, prepared: &PreparedFold, turn_id: Option<&str>) -> Result<()> {
        let (Some(named), Some(open)) = (turn_id, &self.turn_id) else {
            return Ok(());
        };
        let starts = prepared
            .events
            .iter()
            .any(|p| matches!(p, Parsed::TurnStart));
        if named == open.as_str() || starts {
            return Ok(());
        }
        Err(Error::invalid(format!(
            "the batch names turn {} but turn {} (started at sequence {}) is open: append \
             it in the open turn, or end that turn and start {} with a turn/start",
            crate::error::quoted(named),
            crate::error::quoted(open),
            self.current_turn_start,
            crate::error::quoted(named),
        )))
    }

    /// Applies a prepared batch whose events carry sequences `first_seq..` and whose
    /// commit ends at `commit_last_seq`.
    pub fn apply_prepared(
        &mut self,
        prepared: PreparedFold,
        first_seq: u64,
        commit_last_seq: u64,
        turn_id: Option<&str>,
    ) {
        let mut effects = FoldEffects::default();
        self.apply_tracked(prepared, first_seq, commit_last_seq, turn_id, &mut effects);
    }

    /// As [`Projection::apply_prepared`], also recording the turns ended and the
    /// transcript changes in `effects`.
    pub(crate) fn apply_tracked(
        &mut self,
        prepared: PreparedFold,
        first_seq: u64,
        commit_last_seq: u64,
        turn_id: Option<&str>,
        effects: &mut FoldEffects,
    ) {
        let turns_before = effects.turns.len();
        effects.history.reserve(prepared.events.len());
        for (i, p) in prepared.events.into_iter().enumerate() {
            let seq = first_seq + i as u64;
            self.committed_sequence = seq;
            self.apply_one(p, seq, first_seq, commit_last_seq, turn_id, effects);
        }
        if let Some(usage) = prepared.usage {
            self.usage = usage;
        }
        let fork_safe = !self.has_active_authority();
        for t in &mut effects.turns[turns_before..] {
            t.fork_safe = fork_safe;
        }
    }

    /// Folds one stored commit (prepare + apply).
    ///
    /// # Errors
    /// As [`Projection::prepare`].
    pub fn apply_commit(&mut self, commit: &Commit) -> Result<()> {
        self.apply_commit_tracked(commit, &mut FoldEffects::default())
    }

    /// As [`Projection::apply_commit`], also recording what the fold changed.
    pub(crate) fn apply_commit_tracked(
        &mut self,
        commit: &Commit,
        effects: &mut FoldEffects,
    ) -> Result<()> {
        let prepared = self.prepare(&commit.events)?;
        self.apply_tracked(
            prepared,
            commit.first_seq,
            commit.last_seq(),
            commit.turn_id.as_deref(),
            effects,
        );
        Ok(())
    }

    /// Folds commits from an empty projection.
    ///
    /// # Errors
    /// As [`Projection::prepare`].
    pub fn fold<'a>(commits: impl IntoIterator<Item = &'a Commit>) -> Result<Projection> {
        let mut p = Projection::default();
        for c in commits {
            p.apply_commit(c)?;
        }
        Ok(p)
    }

    fn apply_one(
        &mut self,
        parsed: Parsed,
        seq: u64,
        commit_first_seq: u64,
        commit_last_seq: u64,
        turn_id: Option<&str>,
        effects: &mut FoldEffects,
    ) {
        match parsed {
            // The batch's usage totals were summed in `prepare` and are set once after it.
            Parsed::Skip | Parsed::Usage(_) => {}
            Parsed::MessageComplete(m) => {
                if let Some(model) = m.for_model() {
                    self.push_model(model, ModelRef::message(seq));
                }
                self.put_transcript(m, seq, &mut effects.history);
            }
            Parsed::MessageUpsert(m) => {
                self.upsert_model(&m, seq);
                self.put_transcript(m, seq, &mut effects.history);
            }
            Parsed::HistoryReplace(ms) => self.replace_history(ms, seq, &mut effects.history),
            Parsed::ModelReplace(_, ms) => self.replace_model(ms, seq),
            Parsed::LegacyImport(l) => {
                self.replace_history(l.messages, seq, &mut effects.history);
                self.goal_state = l.goal;
                self.model_ref = l.model_ref.trim().to_owned();
                self.model_identity = l.model_identity;
            }
            Parsed::Title(t) => {
                self.title = t;
                self.title_sequence = seq + 1;
            }
            Parsed::Config(c) => {
                self.model_ref = c.model_ref.trim().to_owned();
                self.model_identity = c.model_identity;
            }
            Parsed::TurnStart => {
                self.current_turn_rewind_safe =
                    seq == commit_first_seq && !self.has_active_authority();
                self.turn_id = Some(turn_id.unwrap_or_default().to_owned());
                self.turn_status = TURN_IN_PROGRESS.to_owned();
                self.current_turn_start = seq;
                self.todos.clear();
                self.todo_written = false;
                self.recovery = None;
            }
            Parsed::TurnEnd(status) => {
                if let Some(open) = self.turn_id.take()
                    && self.current_turn_start != 0
                {
                    self.ended_turns += 1;
                    effects.turns.push(TurnBoundary {
                        turn_id: open,
                        start_sequence: self.current_turn_start,
                        end_sequence: seq,
                        boundary_sequence: commit_last_seq,
                        status: status.clone(),
                        fork_safe: false,
                        rewind_safe: self.current_turn_rewind_safe,
                    });
                }
                self.turn_id = None;
                self.current_turn_start = 0;
                self.current_turn_rewind_safe = false;
                self.turn_status = status;
            }
            Parsed::ToolStart(id, name) => {
                self.active_tools.insert(id, name);
            }
            Parsed::ToolResult(id) => {
                self.active_tools.remove(&id);
            }
            Parsed::Todos(t) => {
                self.todos = t;
                self.todo_written = true;
            }
            Parsed::InteractionCreated(id) => {
                self.interactions
                    .insert(id, kind::INTERACTION_PENDING.to_owned());
            }
            Parsed::InteractionResolved(id) => {
                self.interactions.remove(&id);
            }
            Parsed::Recovery(r) => self.recovery = Some(r),
            Parsed::PlanState(v) => self.plan_state = Some(v),
            Parsed::GoalState(v) => self.goal_state = Some(v),
        }
    }

    fn knows_message(&self, id: &str) -> bool {
        self.transcript_ids.get(message_key(id)).is_some()
    }

    /// Puts `m` (from a `message/complete` or `message/upsert` at `seq`) into the
    /// transcript: at the position of its id, else at the end.
    fn put_transcript(&mut self, m: Arc<Message>, seq: u64, history: &mut Vec<HistoryChange>) {
        let key = message_key(m.id());
        let at = match self.transcript_ids.get(key) {
            Some(at) => u64::from(at),
            None => {
                let at = self.transcript_len;
                self.transcript_ids.insert(key, transcript_slot(at));
                self.transcript_len += 1;
                at
            }
        };
        self.note_preview(at + 1, &m);
        history.push(HistoryChange::Put {
            seq,
            position: at + 1,
            item: None,
            message: m,
        });
    }

    /// Keeps the preview on the first user message with text, given `m` now at
    /// `position` (1-based).
    fn note_preview(&mut self, position: u64, m: &Message) {
        // A message after the preview's cannot change it: its text is not read.
        if self.preview_position != 0 && position > self.preview_position {
            return;
        }
        let text = (m.role() == Some("user"))
            .then(|| m.text())
            .flatten()
            .map(|t| t.trim().chars().take(240).collect::<String>())
            .filter(|t| !t.is_empty());
        match text {
            Some(t) if self.preview_position == 0 || position <= self.preview_position => {
                self.preview = Some(t);
                self.preview_position = position;
            }
            // The position stays taken: a later user message does not take its place.
            None if position == self.preview_position => self.preview = None,
            _ => {}
        }
    }

    fn model_index(&mut self) -> &mut HashMap<MessageKey, usize> {
        let model = &self.model_messages;
        self.model_index.get_or_insert_with(|| {
            model
                .iter()
                .enumerate()
                .filter(|(_, m)| !m.id().is_empty())
                .map(|(i, m)| (message_key(m.id()), i))
                .collect()
        })
    }

    fn push_model(&mut self, m: Arc<Message>, from: ModelRef) {
        // Without an index yet, its first use builds it from the workset.
        if let Some(index) = &mut self.model_index
            && !m.id().is_empty()
        {
            index.insert(message_key(m.id()), self.model_messages.len());
        }
        self.model_messages.push(m);
        self.model_refs.push(from);
    }

    /// The provider view of `m` (from the `message/upsert` at `seq`) replaces the
    /// workset's message with its id, or joins the workset; a local-only `m` leaves it.
    fn upsert_model(&mut self, m: &Arc<Message>, seq: u64) {
        let from = ModelRef::message(seq);
        match (
            self.model_index().get(&message_key(m.id())).copied(),
            m.for_model(),
        ) {
            (Some(i), Some(model)) => {
                self.model_messages[i] = model;
                self.model_refs[i] = from;
            }
            (Some(i), None) => {
                self.model_messages.remove(i);
                self.model_refs.remove(i);
                self.model_index = None;
            }
            (None, Some(model)) => self.push_model(model, from),
            (None, None) => {}
        }
    }

    fn replace_history(
        &mut self,
        messages: Vec<Arc<Message>>,
        seq: u64,
        history: &mut Vec<HistoryChange>,
    ) {
        self.model_messages.clear();
        self.model_refs.clear();
        self.model_index = None;
        for (i, m) in messages.iter().enumerate() {
            if let Some(model) = m.for_model() {
                self.push_model(
                    model,
                    ModelRef {
                        seq,
                        item: Some(transcript_slot(i as u64)),
                        provider_view: true,
                    },
                );
            }
        }
        history.push(HistoryChange::Reset { seq });
        self.transcript_ids.clear();
        self.transcript_len = messages.len() as u64;
        self.preview = None;
        self.preview_position = 0;
        for (i, m) in messages.into_iter().enumerate() {
            let at = i as u64;
            if !m.id().is_empty() {
                self.transcript_ids
                    .insert(message_key(m.id()), transcript_slot(at));
            }
            self.note_preview(at + 1, &m);
            history.push(HistoryChange::Put {
                seq,
                position: at + 1,
                item: Some(at),
                message: m,
            });
        }
    }

    fn replace_model(&mut self, messages: Vec<Arc<Message>>, seq: u64) {
        self.model_index = None;
        self.model_refs = (0..messages.len())
            .map(|i| ModelRef {
                seq,
                item: Some(transcript_slot(i as u64)),
                provider_view: false,
            })
            .collect();
        self.model_messages = messages;
    }

    /// Where each model-workset message was read from (parallel to `model_messages`).
    pub(crate) fn model_refs(&self) -> &[ModelRef] {
        &self.model_refs
    }

    /// Puts back a workset read from its references (a checkpoint holds only those).
    pub(crate) fn restore_model(&mut self, messages: Vec<Arc<Message>>, refs: Vec<ModelRef>) {
        self.model_messages = messages;
        self.model_refs = refs;
        self.model_index = None;
    }

    /// The transcript index as a checkpoint stores it ([`TranscriptIndex::to_bytes`]).
    pub(crate) fn transcript_ids_bytes(&self) -> Vec<u8> {
        self.transcript_ids.to_bytes()
    }

    /// Puts back the transcript index of a checkpoint (loaded from
    /// [`Projection::transcript_ids_bytes`] for this `transcript_len`).
    pub(crate) fn restore_transcript_ids(&mut self, index: TranscriptIndex) {
        self.transcript_ids = index;
    }
}

/// A transcript position or item index as the indexes store it. Transcripts over 2³²
/// messages are far beyond what a session file can hold (SQLite's 2⁶⁴ bytes aside, the
/// smallest message event takes more than a byte), so the saturation is never reached.
fn transcript_slot(at: u64) -> u32 {
    u32::try_from(at).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ev(kind: &str, payload: Value) -> Event {
        Event::new(kind).with_payload(&payload).unwrap()
    }

    fn fold(events: Vec<Event>, turn: Option<&str>) -> Result<Projection> {
        let mut p = Projection::default();
        let prepared = p.prepare(&events)?;
        p.apply_prepared(prepared, 1, events.len() as u64, turn);
        Ok(p)
    }

    #[test]
    fn turn_boundaries_and_messages() {
        let p = fold(
            vec![
                Event::new("turn/start"),
                ev(
                    "message/complete",
                    json!({"message": {"id": "a", "role": "user", "content": "hi"}}),
                ),
                ev("turn/end", json!({"status": "completed"})),
            ],
            Some("t1"),
        )
        .unwrap();
        assert_eq!(p.ended_turns, 1);
        assert_eq!(p.transcript_len, 1);
        assert_eq!(p.turn_id, None);
        assert_eq!(p.turn_status, "completed");
        assert_eq!(p.model_messages.len(), 1);
        assert_eq!(p.preview.as_deref(), Some("hi"));
    }

    #[test]
    fn strict_payloads_are_refused() {
        for (kind, payload) in [
            ("tool/start", json!({"id": "x", "name": "bash", "extra": 1})),
            ("turn/end", json!({"status": "in_progress"})),
            ("message/complete", json!({"message": {"role": "user"}})),
            (
                "todo/write",
                json!({"todos": [{"content": " x", "status": "pending"}]}),
            ),
            ("plan/state", json!([1])),
            ("interaction/resolved", json!({"id": "i", "state": "maybe"})),
            ("runtime/recovery", json!({"State": "x"})),
        ] {
            let err = fold(vec![ev(kind, payload)], None).unwrap_err();
            assert!(matches!(err, Error::InvalidPayload { .. }), "{kind}: {err}");
        }
        assert!(matches!(
            fold(vec![Event::new("future/kind")], None).unwrap_err(),
            Error::UnsupportedVersion { .. }
        ));
        assert!(fold(vec![Event::new("future/kind").optional()], None).is_ok());
    }

    /// A blank title, one holding NUL or one over `MAX_TITLE_BYTES` is refused on append
    /// only (the last two were accepted, a megabyte of title included): a stored log
    /// holding one (written before the rule) still folds, so such files open, replay and
    /// verify.
    #[test]
    fn a_bad_title_is_refused_on_append_and_folded_when_stored() {
        let long = "t".repeat(crate::model::payload::MAX_TITLE_BYTES + 1);
        for blank in [
            "",
            "  ",
            "\n\t",
            "\u{200b}\u{200b}",
            " \u{3164}\u{feff}",
            "a\0b",
            long.as_str(),
        ] {
            let events = vec![ev("session/title", json!({ "title": blank }))];
            let p = Projection::default();
            let prepared = p.prepare(&events).unwrap();
            let err = p.check_append(&prepared, None).unwrap_err();
            assert!(
                matches!(err, Error::InvalidPayload { .. }),
                "{blank:?}: {err}"
            );
            assert_eq!(fold(events, None).unwrap().title, blank);
        }
        let p = Projection::default();
        let most = "é".repeat(crate::model::payload::MAX_TITLE_BYTES / 2);
        for good in [" a ", "a\tb", "\u{200b}a", most.as_str()] {
            let named = p
                .prepare(&[ev("session/title", json!({ "title": good }))])
                .unwrap();
            assert!(p.check_append(&named, None).is_ok(), "{good:?}");
        }
    }

    /// A payload (or a todo) given as a JSON array, which serde reads as a struct of its
    /// fields in order, is refused on append only: the log's other readers do not read it
    /// as the event, and a stored one (written before the rule) still folds.
    #[test]
    fn a_payload_given_as_an_array_is_refused_on_append_and_folded_when_stored() {
        let arrays = [
            ("session/title", json!(["x"])),
            (
                "message/complete",
                json!([{"id": "m", "role": "user", "content": "hi"}]),
            ),
            ("turn/end", json!(["completed"])),
            ("todo/write", json!({"todos": [["write it", "pending"]]})),
            (
                "todo/write",
                json!([[{"content": "a", "status": "pending"}]]),
            ),
            ("interaction/resolved", json!(["i", "answered"])),
        ];
        for (kind, payload) in arrays {
            let events = vec![ev(kind, payload.clone())];
            let err = check_alone(&events).unwrap_err();
            assert!(
                matches!(&err, Error::InvalidPayload { reason, .. } if reason.contains("not an array")),
                "{kind} {payload}: {err}"
            );
            assert!(
                fold(events, None).is_ok(),
                "{kind} {payload}: stored, it folds"
            );
        }
        assert_eq!(
            fold(vec![ev("session/title", json!(["x"]))], None)
                .unwrap()
                .title,
            "x"
        );
        for (kind, payload) in [
            ("turn/start", json!(["anything"])),
            ("diagnostic", json!([1, 2])),
            (
                "todo/write",
                json!({"todos": [{"content": "a", "status": "pending"}]}),
            ),
        ] {
            assert!(
                check_alone(&[ev(kind, payload.clone())]).is_ok(),
                "{kind} {payload}"
            );
        }
        let optional = ev("session/title", json!(["x"])).optional();
        assert!(
            check_alone(&[optional]).is_ok(),
            "an optional event is not read"
        );
    }

    /// A payload whose object holds a key twice is refused on append only (readers
    /// disagree on its value: the history page showed the first `content`, search and
    /// Python the last); a stored one still folds.
    #[test]
    fn a_repeated_key_is_refused_on_append_and_folded_when_stored() {
        let text =
            r#"{"message":{"id":"m1","role":"user","content":"harmless","content":"hidden"}}"#;
        let events = vec![
            Event::new("message/complete")
                .with_payload_json(text)
                .unwrap(),
        ];
        let err = check_alone(&events).unwrap_err();
        assert!(
            matches!(&err, Error::InvalidPayload { reason, .. } if reason.contains(r#"the key "content" twice"#)),
            "{err}"
        );
        assert_eq!(
            fold(events, None).unwrap().transcript_len,
            1,
            "stored, it folds"
        );
        let nested = r#"{"id":"c","name":"bash","args":{"cmd":"ls","cmd":"rm -rf /"}}"#;
        let events = vec![Event::new("tool/call").with_payload_json(nested).unwrap()];
        assert!(check_alone(&events).is_err(), "at any depth");
        let apart = r#"{"id":"c","name":"bash","args":[{"cmd":"ls"},{"cmd":"pwd"}]}"#;
        let events = vec![Event::new("tool/call").with_payload_json(apart).unwrap()];
        assert!(check_alone(&events).is_ok(), "one key in two objects");
    }

    #[test]
    fn duplicate_message_id_rejects_batch_without_change() {
        let m = json!({"message": {"id": "a", "role": "user", "content": "x"}});
        let mut p = fold(vec![ev("message/complete", m.clone())], None).unwrap();
        let err = p.prepare(&[
            ev("session/title", json!({"title": "t"})),
            ev("message/complete", m.clone()),
        ]);
        assert!(err.is_err());
        assert_eq!(p.title, "");
        // A history/replace earlier in the batch resets the known ids.
        let ok = p
            .prepare(&[
                ev("history/replace", json!({"messages": []})),
                ev("message/complete", m),
            ])
            .unwrap();
        p.apply_prepared(ok, 2, 3, None);
        assert_eq!(p.transcript_len, 1);
    }

    #[test]
    fn upserts_find_their_message_before_and_after_the_model_index_is_built() {
        let msg = |kind: &str, id: &str, content: &str| {
            ev(
                kind,
                json!({"message": {"id": id, "role": "assistant", "content": content}}),
            )
        };
        let p = fold(
            vec![
                msg("message/complete", "a", "1"),
                msg("message/complete", "b", "2"),
                msg("message/upsert", "b", "2'"),
                msg("message/complete", "c", "3"),
                msg("message/upsert", "c", "3'"),
                msg("message/upsert", "a", "1'"),
                msg("message/upsert", "d", "4"),
            ],
            None,
        )
        .unwrap();
        let texts: Vec<_> = p.model_messages.iter().map(|m| m.text()).collect();
        assert_eq!(
            texts,
            ["1'", "2'", "3'", "4"].map(|t| Some(t.to_owned())).to_vec()
        );
        assert_eq!(p.transcript_len, 4);
    }

    #[test]
    fn upsert_and_local_only_filter() {
        let p = fold(
            vec![
                ev("message/complete", json!({"message": {"id": "a", "role": "user", "content": "1"}})),
                ev("message/upsert", json!({"message": {"id": "a", "role": "user", "content": "2", "local_only": true}})),
                ev("message/upsert", json!({"message": {"id": "b", "role": "assistant", "content": "3", "provider_content": "P"}})),
            ],
            None,
        )
        .unwrap();
        assert_eq!(p.transcript_len, 2);
        assert_eq!(p.model_messages.len(), 1);
        assert_eq!(p.model_messages[0].text().as_deref(), Some("P"));
    }
}
