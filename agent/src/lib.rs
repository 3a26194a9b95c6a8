//! The GPU Commons agent: runs on a lab server and lends its idle GPUs to the portal.
//!
//! The agent dials out to the portal (labs sit behind firewalls) and keeps one WebSocket
//! open ([`session`]). The portal decides what should run; the agent reports what does run.
//! What to do about the difference is one pure function, [`reconcile::reconcile`]; the
//! [`executor`] applies its actions through a [`runtime::ContainerRuntime`] (the Docker
//! Engine in production). GPUs come from a [`gpu::GpuSource`]: NVML on real servers, a fake
//! list for tests and demos.
//!
//! Invariants:
//! - The agent never kills containers when it restarts: it re-adopts them by their labels.
//! - Every attempt has a lease; one the portal stops renewing is stopped here, so a job
//!   never runs twice at once after a network split.

pub mod config;
pub mod executor;
pub mod gpu;
pub mod reconcile;
pub mod runtime;
pub mod session;
pub mod state;

pub use config::{AgentConfig, GpuMode};

/// Enrols if needed, then serves the portal until the task is dropped.
pub async fn run(config: AgentConfig) -> anyhow::Result<()> {
    session::run(config).await
}
