//! Restart recovery: a session reopened with an open turn gets one batch that closes it,
//! without re-running anything or restoring any authority (upstream §3.7).

use crate::error::Result;
use crate::model::kind::{self, INTERACTION_UNAVAILABLE, TOOL_RESULT_UNKNOWN, TURN_INTERRUPTED};
use crate::model::payload::{InteractionResolvedPayload, ToolResultOut, TurnEndPayload};
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
    for (id, name) in &tools {
        events.push(Event::new(kind::TOOL_RESULT).with_payload(&ToolResultOut {
            error: NO_RESULT,
            id,
            name,
            state: TOOL_RESULT_UNKNOWN,
        })?);
    }
    for id in interactions {
        events.push(Event::new(kind::INTERACTION_RESOLVED).with_payload(
            &InteractionResolvedPayload {
                id,
                state: INTERACTION_UNAVAILABLE.to_owned(),
            },
        )?);
    }
    events.push(Event::new(kind::TURN_END).with_payload(&TurnEndPayload {
        status: TURN_INTERRUPTED.to_owned(),
    })?);
    let operation = format!("restart-recovery:{}:{turn_id}", session.owner().generation);
    session.append(Batch::new(operation, events).in_turn(turn_id))?;
    session.flush()?;
    Ok(())
}
