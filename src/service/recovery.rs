//! Restart recovery: a session reopened with an open turn gets one batch that closes it,
//! without re-running anything or restoring any authority (upstream §3.7).

use serde_json::json;

use crate::error::Result;
use crate::model::{Batch, Event};
use crate::session::live::Session;

/// Why a recovered tool has no result.
const NO_RESULT: &str = "previous runtime exited before recording a result";

/// If the last turn is open: appends `tool/result` (`result_unknown`) for each active
/// tool, `interaction/resolved` (`unavailable`) for each pending interaction and
/// `turn/end` (`interrupted`), with operation id `restart-recovery:<generation>:<turn>`,
/// then flushes.
pub(crate) fn close_interrupted_turn(session: &Session) -> Result<()> {
    let Some((turn_id, tools, interactions)) = session.with_projection(|p| {
        p.turn_id.clone().map(|t| {
            let tools: Vec<(String, String)> = p
                .active_tools
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            let interactions: Vec<String> = p.interactions.keys().cloned().collect();
            (t, tools, interactions)
        })
    }) else {
        return Ok(());
    };
    let mut events = Vec::with_capacity(tools.len() + interactions.len() + 1);
    for (id, name) in tools {
        events.push(Event::new("tool/result").with_payload(
            &json!({"id": id, "name": name, "state": "result_unknown", "error": NO_RESULT}),
        )?);
    }
    for id in interactions {
        events.push(
            Event::new("interaction/resolved")
                .with_payload(&json!({"id": id, "state": "unavailable"}))?,
        );
    }
    events.push(Event::new("turn/end").with_payload(&json!({"status": "interrupted"}))?);
    let operation = format!("restart-recovery:{}:{turn_id}", session.owner().generation);
    session.append(Batch::new(operation, events).in_turn(turn_id))?;
    session.flush()?;
    Ok(())
}
