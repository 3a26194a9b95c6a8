//! The GPU Commons agent: runs on a lab server and lends its idle GPUs to the portal.
//!
//! The agent dials out to the portal (labs sit behind firewalls) and keeps one WebSocket
//! open ([`session`]). The portal decides what should run; the agent reports what does run.
//! What to do about the difference is one pure function, [`reconcile::reconcile`]; the
//! [`executor`] applies its actions through a [`runtime::ContainerRuntime`] (the Docker
//! Engine in production). GPUs come from a [`gpu::GpuSource`]: NVML on real servers, a fake
//! list for tests and demos. Each attempt's state is also on disk ([`store`]), where a
//! per-attempt [`guard`] process enforces its lease and time limit while the agent is down.
//! Every job gets a writable `/checkpoint` that [`checkpoint`] restores from, and uploads
//! to, the portal's checkpoint store; it lives in the attempt's volume, capped at the
//! job's `disk_gb` ([`disk`]).
//!
//! Invariants:
//! - The agent never kills its containers when it restarts: it re-adopts them by their
//!   labels, with the deadlines they had (never a fresh lease). Containers of an earlier
//!   identity of the same host (a state dir lost and enrolled again) are stopped ([`host`]).
//! - Every attempt has a lease, counted on the boot clock ([`clock`]) from the agent's own
//!   message; one the portal stops renewing is stopped here, by the agent or, while the
//!   agent is down, by the attempt's guard, so a job never runs twice at once.
//! - A result is on disk before its container goes, and reported until acknowledged, so a
//!   job is never lost by an agent restart.
//! - A stopped attempt's checkpoint is uploaded (or given up on, after a bounded time)
//!   before its final state reaches the portal, so the next attempt, on any server,
//!   resumes from it.

pub mod atomic;
pub mod checkpoint;
pub mod clock;
pub mod config;
pub mod datasets;
pub mod deadline;
pub mod disk;
pub mod executor;
pub mod gpu;
pub mod guard;
pub mod host;
pub mod inputs;
pub mod metrics;
pub mod outbox;
pub mod outputs;
pub mod owner;
pub mod reconcile;
pub mod relay;
pub mod runtime;
pub mod session;
pub mod share;
pub mod signed;
pub mod state;
pub mod store;

pub use config::{AgentConfig, GpuMode};

/// Enrols if needed, then serves the portal until the task is dropped.
pub async fn run(config: AgentConfig) -> anyhow::Result<()> {
    session::run(config).await
}
