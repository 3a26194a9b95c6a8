//! The portal's messages applied: starts, stops, renewals and SSH relays go to the
//! executor and the relays; the portal's heartbeat period comes back to the connection.
//!
//! Invariants: a `Stop` for an attempt this agent does not know is answered with a report
//! that it is stopped (the protocol's one rule); a stop ends the attempt's SSH sessions
//! first, with words for their users.

use crate::executor::{Admission, Executor};
use crate::metrics::METRICS;
use crate::reconcile::Launch;
use crate::relay::{self, RelayContext};
use crate::runtime::AssignedGpu;
use commons_proto::{GpuInfo, JobId, PortalMsg, StopReason};
use std::time::Duration;

/// Applies one portal message; returns a new heartbeat period when the portal sets one.
pub(super) fn handle(
    msg: PortalMsg,
    exec: &Executor,
    relay: &RelayContext,
    inventory: &[GpuInfo],
) -> Option<Duration> {
    match msg {
        PortalMsg::Welcome {
            node_id,
            heartbeat_s,
            ..
        } => {
            tracing::info!(node_id, heartbeat_s, "welcomed");
            return Some(Duration::from_secs(heartbeat_s.max(1)));
        }
        PortalMsg::Start {
            job,
            attempt,
            spec,
            gpus,
            lease,
            resume,
        } => {
            let assigned = gpus
                .iter()
                .map(|uuid| AssignedGpu {
                    uuid: uuid.clone(),
                    fake: inventory
                        .iter()
                        .find(|g| &g.uuid == uuid)
                        .is_none_or(|g| g.fake),
                })
                .collect();
            tracing::info!(job, attempt, image = %spec.image, resume, "start");
            let launch = Launch {
                spec,
                gpus: assigned,
                resume,
            };
            match exec.start_with(job, attempt, launch, lease) {
                Admission::Accepted | Admission::Duplicate => {}
                Admission::LeaseUnknown => tracing::warn!(
                    job,
                    attempt,
                    session = lease.session,
                    seq = lease.seq,
                    "not starting: the lease names a session or message this agent does not \
                     know, so it grants nothing (the portal sends the attempt again)"
                ),
            }
        }
        PortalMsg::Stop {
            job,
            attempt,
            grace_s,
            reason,
            detail,
        } => {
            tracing::info!(job, attempt, %reason, grace_s, detail = detail.as_deref().unwrap_or(""), "stop");
            relay
                .relays
                .close_attempt(job, attempt, &session_end(job, reason, detail.as_deref()));
            if !exec.stop(job, attempt, grace_s, reason, detail.as_deref()) {
                // Not ours (any more): say so, so the portal can settle it.
                exec.report_unknown(job, attempt, reason);
            }
        }
        PortalMsg::Renew {
            lease,
            attempts,
            time_limits,
        } => {
            exec.set_time_limits(&time_limits);
            METRICS.lease_renewals.inc();
            exec.renew(lease, &attempts);
        }
        PortalMsg::OpenRelay(open) => relay::open(relay, exec, open),
    }
    None
}

/// What an SSH user reads when the job's stop ends their session.
fn session_end(job: JobId, reason: StopReason, detail: Option<&str>) -> String {
    let why = match detail.map(str::trim).filter(|d| !d.is_empty()) {
        Some(d) => format!("{reason}: {d}"),
        None => reason.to_string(),
    };
    let next = if reason.requeues() {
        " It goes back to the queue; connect again when it runs."
    } else {
        ""
    };
    format!("GPU Commons: job {job} is stopping ({why}), so this session ends.{next}")
}
