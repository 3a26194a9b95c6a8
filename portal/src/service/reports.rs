//! A heartbeat's attempt reports, applied in bulk: the node's running attempts are read
//! in one query, and a report that changes nothing (an attempt the portal already knows
//! as running on that node, reported running) costs nothing more. The others go through
//! [`attempts::apply_report`] one by one, as events do.
//!
//! The load test measured a heartbeat of a server with 8 running jobs at 3 statements per
//! report (a transaction around one read) before this.

use super::attempts::{self, Timing};
use crate::db::{self, models::AttemptStatus, DbConn};
use crate::error::AppError;
use commons_proto::{AttemptReport, AttemptState, PortalMsg};
use std::collections::BTreeSet;

/// Applies every report of one heartbeat; returns the `Stop`s to send back and whether
/// GPUs were freed.
pub fn apply_reports(
    c: &mut DbConn,
    node: i64,
    reports: &[AttemptReport],
    timing: Timing,
) -> Result<(Vec<PortalMsg>, bool), AppError> {
    let (mut stops, mut freed) = (Vec::new(), false);
    if reports.is_empty() {
        return Ok((stops, freed));
    }
    let running: BTreeSet<(i64, i32)> = db::attempts::on_node(c, node, &[AttemptStatus::Running])?
        .into_iter()
        .map(|a| (a.job_id, a.attempt))
        .collect();
    for r in reports {
        if r.state == AttemptState::Running && running.contains(&(r.job, r.attempt)) {
            continue;
        }
        let one = attempts::apply_report(c, node, r, timing)?;
        freed |= one.freed;
        stops.extend(one.stop);
    }
    Ok((stops, freed))
}
