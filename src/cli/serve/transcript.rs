//! The session page: the header, the lineage and a page of the transcript, messages
//! grouped into their turns, tool calls and outputs in collapsed `<details>`, a permalink
//! anchor per message, blob content behind a link (loaded on demand).

use axum::response::Html;
use maud::{Markup, html};
use serde_json::{Map, Value};
use session_store::{Message, PersistentMessage, SessionId, TurnBoundary};

use super::data::{Params, SessionDetail, Transcript};
use super::links;
use super::templates::{SessionPage, clip, layout, session_nav, title_or_id};
use crate::cli::{human_bytes, shown};
use session_store::utc;

/// Text longer than this (in bytes) is collapsed behind its first line.
const LONG_TEXT: usize = 1500;
/// Characters of a collapsed text shown in its summary.
const SUMMARY_CHARS: usize = 120;

/// A role as a CSS class suffix: lowercase ASCII letters, digits and `-` only.
fn role_class(role: &str) -> String {
    let token: String = role
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
        .take(24)
        .collect::<String>()
        .to_ascii_lowercase();
    format!("message role-{token}")
}

/// A JSON value as text: a string as is, anything else pretty-printed.
fn json_text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => serde_json::to_string_pretty(other).unwrap_or_default(),
    }
}

/// One tool call of an assistant message: id, name, arguments.
struct ToolCall {
    id: String,
    name: String,
    arguments: String,
}

/// The `type` of a Responses-API item (`function_call`, `function_call_output`, …), as
/// openai-agents stores them: no `role`, the call or its output in fields of their own.
fn item_type(fields: &Map<String, Value>) -> Option<&str> {
    fields.get("type").and_then(Value::as_str)
}

/// The tool calls of a message (`tool_calls[]` in the OpenAI shape: `id`,
/// `function.name`, `function.arguments`; or `name` and `arguments` / `input`), or the
/// message itself when it is a `function_call` item (`call_id`, `name`, `arguments`).
fn tool_calls(fields: &Map<String, Value>) -> Vec<ToolCall> {
    let text = |v: Option<&Value>| v.map(json_text).unwrap_or_default();
    if item_type(fields) == Some("function_call") {
        return vec![ToolCall {
            id: text(fields.get("call_id")),
            name: text(fields.get("name")),
            arguments: text(fields.get("arguments")),
        }];
    }
    let Some(Value::Array(calls)) = fields.get("tool_calls") else {
        return Vec::new();
    };
    calls
        .iter()
        .map(|call| {
            let function = call.get("function").unwrap_or(call);
            ToolCall {
                id: text(call.get("id")),
                name: text(function.get("name")),
                arguments: text(function.get("arguments").or_else(|| function.get("input"))),
            }
        })
        .collect()
}

/// The body of an inline message: its text, or its content as JSON, and its tool calls; a
/// tool's output (role `tool`, or a `function_call_output` item) collapsed; a message with
/// none of these (a `reasoning` item, say) as its JSON, collapsed, so no field is hidden.
fn body(message: &Message) -> Markup {
    let fields = message.fields();
    let output_item = item_type(&fields) == Some("function_call_output");
    let text = match output_item {
        true => fields.get("output").map(json_text),
        false => message.display_text(),
    };
    let is_tool = message.role() == Some("tool") || output_item;
    let call_id = fields
        .get("tool_call_id")
        .or_else(|| fields.get("call_id"))
        .and_then(Value::as_str);
    let content = fields.get("content").filter(|c| !c.is_null());
    // Text read from a content array's parts: the parts themselves (an image, a
    // citation) stay one click away.
    let parts = (!output_item && text.is_some() && message.text().is_none())
        .then_some(content)
        .flatten();
    let calls = tool_calls(&fields);
    html! {
        @if let Some(text) = &text {
            @if is_tool {
                details.tool-output {
                    summary {
                        "tool output"
                        @if let Some(call) = call_id { " · " code { (call) } }
                        " · " (human_bytes(text.len() as u64))
                    }
                    pre { (text) }
                }
            } @else if text.len() > LONG_TEXT {
                details.long {
                    summary { (clip(text.lines().next().unwrap_or(""), SUMMARY_CHARS)) " … (" (human_bytes(text.len() as u64)) ")" }
                    div.text dir="auto" { (text) }
                }
            } @else {
                div.text dir="auto" { (text) }
            }
        } @else if let Some(content) = content {
            details.json {
                summary { "content (JSON)" }
                pre { (json_text(content)) }
            }
        } @else if calls.is_empty() {
            details.json {
                summary { (item_type(&fields).unwrap_or("message")) " (JSON)" }
                pre { (message.json()) }
            }
        }
        @if let Some(content) = parts {
            details.json {
                summary { "content (JSON)" }
                pre { (json_text(content)) }
            }
        }
        @for call in &calls {
            details.tool-call {
                summary { "tool call " code { (call.name) } @if !call.id.is_empty() { " · " code { (call.id) } } }
                pre { (call.arguments) }
            }
        }
    }
}

/// The page of a large message stored as a blob (a session page's "load it" link: the
/// blob is its event's payload, `{"message": {...}}`): the message as the session page
/// shows one, its bytes one click away. Bytes that are no such payload (content of another
/// kind, or JSON nested past serde_json's limit) are shown as text.
pub fn content_page(session: &SessionId, digest: &str, bytes: &[u8]) -> Html<String> {
    let message = serde_json::from_slice::<Value>(bytes)
        .ok()
        .and_then(|mut payload| payload.get_mut("message").map(Value::take))
        .filter(Value::is_object)
        .and_then(|value| Message::from_value(&value).ok());
    let short = digest.get(..12).unwrap_or(digest);
    layout(
        &format!("Content {short} of {}", shown(session)),
        None,
        html! {
            (session_nav(session, None))
            h1 { "Large message of " code { (shown(session)) } }
            p.meta {
                (human_bytes(bytes.len() as u64)) ", stored as a blob " code { (short) }
                " · " a href=(links::api_content(session, digest)) { "raw bytes" }
            }
            @match &message {
                Some(message) => {
                    @let role = message.role().unwrap_or("(no role)");
                    article class=(role_class(role)) {
                        header { span.role { (role) } " " span.meta { code { (message.id()) } } }
                        (body(message))
                    }
                },
                None => pre.blob-text { (String::from_utf8_lossy(bytes)) },
            }
        },
    )
}

/// One message, with its permalink anchor `m<position>`.
fn message(session: &SessionId, m: &PersistentMessage) -> Markup {
    let role = m.role.as_deref().unwrap_or("(no role)");
    html! {
        article class=(role_class(role)) id=(format!("m{}", m.position)) {
            header {
                span.role { (role) }
                " " a.permalink href=(links::message(session, m.position)) title="Permalink" { "#" (m.position) }
                " " span.meta { code { (m.message_id) } }
            }
            @match (&m.inline, &m.content_ref) {
                (Some(inline), _) => (body(inline)),
                (None, Some(content)) => p.blob {
                    "Large message (" (human_bytes(content.bytes)) ", stored as a blob): "
                    a href=(links::content(session, &content.digest)) { "load it" }
                },
                (None, None) => p.empty { "(no body)" },
            }
        }
    }
}

/// The page's messages grouped by the ended turn that holds them (`None`: outside any
/// ended turn, e.g. a turn still open).
fn sections(t: &Transcript) -> Vec<(Option<&TurnBoundary>, Vec<&PersistentMessage>)> {
    let mut out: Vec<(Option<&TurnBoundary>, Vec<&PersistentMessage>)> = Vec::new();
    for m in &t.page.messages {
        let seq = m.event_sequence;
        let turn = t
            .turns
            .iter()
            .find(|t| t.start_sequence <= seq && seq <= t.end_sequence);
        match out.last_mut() {
            Some((last, messages))
                if last.map(|l| l.start_sequence) == turn.map(|t| t.start_sequence) =>
            {
                messages.push(m);
            }
            _ => out.push((turn, vec![m])),
        }
    }
    out
}

/// The session page.
pub fn session_page(d: &SessionDetail, t: &Transcript, params: &Params) -> Html<String> {
    let h = &d.info.header;
    let id = &h.session_id;
    let title = title_or_id(&d.entry.title, id);
    let older = t.page.next_cursor.as_deref().map(|c| {
        links::with_query(
            &links::session(id),
            &[("limit", params.limit_text()), ("cursor", Some(c))],
        )
    });
    let newest = links::with_query(&links::session(id), &[("limit", params.limit_text())]);
    let newer = t.newer.map(|after| {
        links::with_query(
            &links::session(id),
            &[
                ("limit", params.limit_text()),
                ("after", Some(&after.to_string())),
            ],
        )
    });
    let pager = html! {
        p.pager {
            @if let Some(newer) = &newer {
                a href=(newest) { "« Newest messages" } " "
                a href=(newer) { "← Newer messages" } " "
            }
            @if let Some(older) = &older { a href=(older) { "Older messages →" } }
        }
    };
    layout(
        &title,
        None,
        html! {
            h1 {
                (title)
                @if d.writer.is_some() { " " span.badge.live title="A writer holds this session: the durable prefix is shown" { "live" } }
            }
            (session_nav(id, Some(SessionPage::Transcript)))
            dl.header {
                dt { "Id" } dd { code { (shown(id)) } }
                @if let Some(cwd) = &h.cwd { dt { "Working directory" } dd { code { (cwd) } } }
                dt { "Origin" } dd {
                    (h.origin.as_str())
                    @if let Some(parent) = &h.parent_id {
                        " of "
                        @if d.parent_exists { a href=(links::session(parent)) { code { (shown(parent)) } } }
                        @else { code { (shown(parent)) } " (deleted)" }
                    }
                }
                dt { "Created (UTC)" } dd { (utc(h.created_at_ms)) }
                dt { "Durable sequence" } dd { (d.info.durable_sequence) " (" (d.info.inherited_events) " inherited)" }
                dt { "Turns" } dd { (d.entry.turns) }
                dt { "File" } dd { (human_bytes(d.file_bytes)) }
                @if !d.entry.usage.is_empty() {
                    dt { "Tokens" } dd { (d.entry.usage.total.input_tokens) " in, " (d.entry.usage.total.output_tokens) " out" }
                }
                @if let Some(w) = &d.writer {
                    dt { "Writer" } dd { "pid " (w.pid) " on " (w.host) " since " (utc(w.since_ms)) }
                }
            }
            @if !d.info.lineage.is_empty() {
                h2 { "Lineage" }
                ol.lineage {
                    @for e in &d.info.lineage {
                        li { a href=(links::session(&e.ancestor_id)) { code { (shown(&e.ancestor_id)) } } " sequences " (e.after_seq + 1) "–" (e.through_seq) }
                    }
                    li { code { (shown(id)) } " (this session)" }
                }
            }
            h2 { "Transcript" }
            @if t.page.messages.is_empty() { p.empty { "No messages." } }
            (pager)
            @for (turn, messages) in sections(t) {
                section.turn id=[turn.map(|t| format!("t{}", t.start_sequence))] {
                    h3 {
                        @match turn {
                            Some(turn) => { "Turn " code { (turn.turn_id) } " " span.meta { (turn.status) } },
                            None => { "Outside an ended turn" },
                        }
                    }
                    @for m in messages { (message(id, m)) }
                }
            }
            (pager)
        },
    )
}
