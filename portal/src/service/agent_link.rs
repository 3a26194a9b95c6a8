//! What an agent's messages do: enrolment, the `Hello` that claims a node for an agent
//! session, heartbeats that renew leases, attempt events and output. The broker owns the
//! WebSocket (rates, refusals, the registry); every rule and write is here.
//!
//! Invariants:
//! - One agent session at a time holds a node (`db::node_link`): a `Hello` while another
//!   session lives is refused with [`AppError::Conflict`], and a heartbeat of a session
//!   that no longer holds the node with [`AppError::Unauthenticated`]; nothing is renewed
//!   for either.
//! - Leases count from when a message arrived, on the database's clock.
//! - A node's capacity and disk are recorded the same way from a `Hello` and a heartbeat.

use super::attempts::{self, Timing};
use super::output::{self, Verdict};
use super::samples::{self, Sampler};
use super::Ctx;
use crate::db::gpu_stats::{self, GpuFigures};
use crate::db::models::{AgentClock, Lab, Node};
use crate::db::node_link::{self, Beat, Claim};
use crate::db::{nodes, DbConn};
use crate::error::AppError;
use commons_proto::{AgentMsg, AttemptReport, NodeCapacity, NodeDisk, PortalMsg};
use std::sync::{Arc, Mutex};

/// The portal's settings an agent's messages are judged by.
#[derive(Debug, Clone, Copy)]
pub struct LinkSettings {
    pub timing: Timing,
    pub heartbeat_s: u64,
    /// How long an agent may be silent before its node counts as gone (and another agent
    /// session may claim it).
    pub silence_s: u64,
}

/// One connection's context: which node, from where, its agent session once its `Hello`
/// was accepted, its sampler of utilisation, and the GPU figures the portal holds for
/// the node (read at its first heartbeat, forgotten at a `Hello`).
pub struct Link {
    pub node: i64,
    pub addr: String,
    pub session: Option<u64>,
    pub sampler: Arc<Mutex<Sampler>>,
    pub gpus: Arc<Mutex<GpuFigures>>,
}

/// Enrols a server with a one-time token: the node, its lab and its credential.
pub async fn enrol(
    ctx: &Ctx,
    token: String,
    hostname: String,
    agent_version: String,
) -> Result<(Node, Lab, String), AppError> {
    ctx.db
        .run(move |c| nodes::enrol(c, &token, &hostname, &agent_version))
        .await
        .map_err(AppError::from)
}

/// The node a connection's credential names; refused when unknown or revoked.
pub async fn node_for_credential(ctx: &Ctx, credential: String) -> Result<Node, AppError> {
    ctx.db
        .run(move |c| nodes::node_by_credential(c, &credential))
        .await?
        .ok_or_else(|| AppError::Unauthenticated("unknown or revoked node credential".into()))
}

/// The connection of agent session `session` ended: the node is let go unless a newer
/// session holds it.
pub async fn release(ctx: &Ctx, node: i64, session: u64) -> Result<(), AppError> {
    ctx.db
        .run(move |c| node_link::release(c, node, session))
        .await
        .map_err(AppError::from)
}

/// Applies one message of `link`; the replies to send. Wakes the scheduler when GPUs were
/// freed or the node changed.
pub async fn apply(
    ctx: &Ctx,
    set: LinkSettings,
    link: &Link,
    msg: AgentMsg,
) -> Result<Vec<PortalMsg>, AppError> {
    // When output arrived, for an attempt's last lines (see `service::output`); leases
    // count on the database's clock (`node_link`).
    let received_at = crate::db::now();
    let from = Sender {
        node: link.node,
        session: link.session,
        addr: link.addr.clone(),
        sampler: link.sampler.clone(),
        gpus: link.gpus.clone(),
        metrics: ctx.metrics.clone(),
        received_at,
    };
    let (replies, wake) = ctx.db.run(move |c| handle(c, set, &from, msg)).await?;
    if wake {
        ctx.wake.notify_one();
    }
    Ok(replies)
}

/// Where a message came from: the connection's node, agent session and address, its
/// sampler, and when the message arrived.
struct Sender {
    node: i64,
    session: Option<u64>,
    addr: String,
    sampler: Arc<Mutex<Sampler>>,
    gpus: Arc<Mutex<GpuFigures>>,
    metrics: crate::metrics::SharedMetrics,
    received_at: chrono::NaiveDateTime,
}

/// One message in one transaction: the replies, and whether to wake the scheduler.
fn handle(
    c: &mut DbConn,
    set: LinkSettings,
    from: &Sender,
    msg: AgentMsg,
) -> Result<(Vec<PortalMsg>, bool), AppError> {
    let (node, session, addr) = (from.node, from.session, &from.addr);
    match msg {
        AgentMsg::Hello {
            agent_version,
            session,
            seq,
            gpus,
            attempts,
            capacity,
            disk,
            datasets,
            share_mode,
            ..
        } => {
            // Its inventory may change the GPUs: their figures are read again.
            *from.gpus.lock().unwrap_or_else(|e| e.into_inner()) = GpuFigures::default();
            nodes::set_share_mode(c, node, share_mode.map(|m| m.name()))?;
            let report = HelloReport {
                agent_version: &agent_version,
                session,
                seq,
                gpus: &gpus,
                reports: &attempts,
            };
            let node = NodeReport {
                node,
                capacity: &capacity,
                disk: &disk,
                datasets: &datasets,
            };
            hello(c, set, addr, node, report).map(|r| (r, true))
        }
        AgentMsg::Heartbeat {
            seq,
            gpu_stats,
            attempts,
            capacity,
            disk,
            datasets,
        } => {
            let session =
                session.ok_or_else(|| AppError::BadRequest("a heartbeat before Hello".into()))?;
            let node = NodeReport {
                node,
                capacity: &capacity,
                disk: &disk,
                datasets: &datasets,
            };
            let used: Vec<(i64, i32, u64)> = attempts
                .iter()
                .filter_map(|r| Some((r.job, r.attempt, r.gpu_memory_used_mb?)))
                .collect();
            if !used.is_empty() {
                nodes::set_gpu_memory_used(c, node.node, &used)?;
            }
            let beat = BeatReport {
                session,
                seq,
                gpu_stats: &gpu_stats,
                reports: &attempts,
            };
            let mut sampler = from.sampler.lock().unwrap_or_else(|e| e.into_inner());
            let mut gpus = from.gpus.lock().unwrap_or_else(|e| e.into_inner());
            heartbeat(c, set, node, beat, &mut sampler, &mut gpus)
        }
        AgentMsg::AttemptEvent {
            job,
            attempt,
            state,
            exit_code,
            stop,
            reason,
        } => {
            let r = AttemptReport {
                job,
                attempt,
                state,
                exit_code,
                stop,
                reason,
                gpu_memory_used_mb: None,
            };
            let out = attempts::apply_report(c, node, &r, set.timing)?;
            Ok((out.stop.into_iter().collect(), out.freed))
        }
        AgentMsg::Logs {
            job,
            attempt,
            chunk,
        } => on_logs(c, from, job, attempt, &chunk),
    }
}

/// A chunk of an attempt's output: written, dropped (the attempt is over), or refused
/// (not this node's attempt).
fn on_logs(
    c: &mut DbConn,
    from: &Sender,
    job: i64,
    attempt: i32,
    chunk: &str,
) -> Result<(Vec<PortalMsg>, bool), AppError> {
    let node = from.node;
    match output::append(c, node, job, attempt, chunk, from.received_at)? {
        Verdict::Written => Ok((Vec::new(), false)),
        Verdict::Over => {
            from.metrics.agent_messages_refused.inc();
            tracing::debug!(
                node,
                job,
                attempt,
                "output of an attempt that is over dropped"
            );
            Ok((Vec::new(), false))
        }
        Verdict::Foreign => Err(AppError::Forbidden(format!(
            "output for job {job} attempt {attempt}, which this node does not run"
        ))),
    }
}

/// The `Start`s a connection of session `session`, registered just now, still needs (see
/// [`attempts::starts_after_registering`]).
pub async fn starts_after_registering(
    ctx: &Ctx,
    set: LinkSettings,
    node: i64,
    session: u64,
    reports: Vec<AttemptReport>,
) -> Result<Vec<PortalMsg>, AppError> {
    ctx.db
        .run(move |c| attempts::starts_after_registering(c, node, session, &reports, set.timing))
        .await
}

/// Extends by `long_s` the leases a node's last heartbeat renewed (a portal shutting down
/// tells its agents); `None` when the node has no agent session.
pub async fn extend_for_shutdown(
    ctx: &Ctx,
    node: i64,
    lease_ttl_s: u64,
    long_s: u64,
) -> Result<Option<PortalMsg>, AppError> {
    ctx.db
        .run(move |c| {
            let Some(clock) = nodes::node_by_id(c, node)?.agent_clock() else {
                return Ok(None);
            };
            // What the agent's last heartbeat renewed (its reports are not at hand).
            let last = attempts::Renewable::RenewedUntil(clock.lease_until(lease_ttl_s));
            attempts::renew(c, node, &clock, long_s, last).map(Some)
        })
        .await
}

/// What a `Hello` and a heartbeat both say of the node.
struct NodeReport<'a> {
    node: i64,
    capacity: &'a Option<NodeCapacity>,
    disk: &'a Option<NodeDisk>,
    datasets: &'a Option<commons_proto::NodeDatasets>,
}

impl NodeReport<'_> {
    /// Records the node's capacity and disk; whether the disk changed (it is sent only
    /// then, and the scheduler looks again).
    fn record(&self, c: &mut DbConn) -> Result<bool, AppError> {
        if let Some(cap) = self.capacity {
            nodes::set_capacity(c, self.node, cap)?;
        }
        if let Some(d) = self.disk {
            nodes::set_disk(c, self.node, d)?;
        }
        if let Some(d) = self.datasets {
            crate::db::datasets::set_node(c, self.node, d)?;
        }
        Ok(self.disk.is_some() || self.datasets.is_some())
    }
}

struct HelloReport<'a> {
    agent_version: &'a str,
    session: u64,
    seq: u64,
    gpus: &'a [commons_proto::GpuInfo],
    reports: &'a [AttemptReport],
}

/// A `Hello`: claims the node for the session, records its inventory, and settles what it
/// reports against what the portal placed.
fn hello(
    c: &mut DbConn,
    set: LinkSettings,
    addr: &str,
    report: NodeReport,
    hello: HelloReport,
) -> Result<Vec<PortalMsg>, AppError> {
    let node = report.node;
    let silence = chrono::Duration::seconds(set.silence_s as i64);
    // Leases count from when this message arrived, on the database's clock (the agent
    // counts from when it left, on its own).
    let received_at = match node_link::claim(c, node, hello.session, hello.seq, addr, silence)? {
        Claim::Taken { received_at } => received_at,
        Claim::Held { by, seen } => return Err(credential_in_use(&by, seen)),
        Claim::Revoked => {
            return Err(AppError::Unauthenticated(
                "the node's credential was revoked".into(),
            ))
        }
    };
    report.record(c)?;
    let clock = AgentClock {
        session: hello.session,
        seq: hello.seq,
        received_at,
    };
    nodes::upsert_gpus(c, node, hello.agent_version, hello.gpus)?;
    super::inventory::judge(c, node, hello.gpus)?;
    let mut replies = vec![PortalMsg::Welcome {
        node_id: node,
        heartbeat_s: set.heartbeat_s,
        lease_ttl_s: set.timing.lease_ttl_s,
    }];
    for r in hello.reports {
        let out = attempts::apply_report(c, node, r, set.timing)?;
        replies.extend(out.stop);
    }
    attempts::reconcile_missing(c, node, hello.reports)?;
    replies.extend(attempts::pending_stops(c, node, set.timing)?);
    replies.extend(renew_and_start(c, set, node, &clock, hello.reports)?);
    Ok(replies)
}

fn credential_in_use(by: &str, seen: Option<chrono::NaiveDateTime>) -> AppError {
    let seen = seen.map_or("-".to_string(), |t| t.format("%H:%M:%S").to_string());
    AppError::conflict(
        "credential_in_use",
        format!(
            "another agent with this node's credential is connected (from {by}, last heard \
             {seen} UTC): two agents must not share one credential (a cloned server or state \
             dir?), so this one is refused while the other runs; the node's page shows both"
        ),
    )
}

/// Renews the leases of the attempts a node reported, and the `Start`s it has not got.
fn renew_and_start(
    c: &mut DbConn,
    set: LinkSettings,
    node: i64,
    clock: &AgentClock,
    reports: &[AttemptReport],
) -> Result<Vec<PortalMsg>, AppError> {
    let jobs = attempts::reported_jobs(reports);
    let which = attempts::Renewable::Reported(&jobs);
    let mut out = vec![attempts::renew(
        c,
        node,
        clock,
        set.timing.lease_ttl_s,
        which,
    )?];
    out.extend(attempts::undelivered_starts(
        c, node, reports, clock, set.timing,
    )?);
    Ok(out)
}

struct BeatReport<'a> {
    session: u64,
    seq: u64,
    gpu_stats: &'a [commons_proto::GpuStat],
    reports: &'a [AttemptReport],
}

/// A heartbeat: counts only from the session that holds the node; renews its leases and
/// records its utilisation. The replies and whether to wake the scheduler.
fn heartbeat(
    c: &mut DbConn,
    set: LinkSettings,
    report: NodeReport,
    beat: BeatReport,
    sampler: &mut Sampler,
    gpus: &mut GpuFigures,
) -> Result<(Vec<PortalMsg>, bool), AppError> {
    let node = report.node;
    // Revoked on any replica, or the node taken over by another agent session: refused
    // here too, and nothing is renewed.
    let received_at = match node_link::beat(c, node, beat.session, beat.seq)? {
        Beat::Counted {
            received_at,
            contended,
        } => {
            if contended {
                tracing::warn!(
                    node,
                    "two agents used this node's credential at once: the node is flagged \
                     for its lab admin"
                );
            }
            received_at
        }
        Beat::Superseded => {
            return Err(AppError::Unauthenticated(
                "another agent with this node's credential holds the node now".into(),
            ))
        }
        Beat::Revoked => {
            return Err(AppError::Unauthenticated(
                "the node's credential was revoked".into(),
            ))
        }
    };
    let clock = AgentClock {
        session: beat.session,
        seq: beat.seq,
        received_at,
    };
    let mut wake = report.record(c)?;
    wake |= gpu_stats::update_gpu_stats(c, node, beat.gpu_stats, gpus)?;
    let (stops, freed) = super::reports::apply_reports(c, node, beat.reports, set.timing)?;
    wake |= freed;
    let mut replies = stops;
    replies.extend(renew_and_start(c, set, node, &clock, beat.reports)?);
    // Last, and never in the way of the leases: a sample lost is a dot missing from a
    // chart.
    if let Err(e) = samples::record(c, sampler, node, beat.gpu_stats, beat.reports, received_at) {
        tracing::warn!(node, "utilisation samples not written: {e:#}");
    }
    Ok((replies, wake))
}
