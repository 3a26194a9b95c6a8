//! The GPU Commons scheduler: a pure function from a [`Snapshot`] of the campus to a
//! [`Plan`] (jobs to start, guests to preempt, and why every other job waits).
//!
//! Invariants this crate keeps:
//! - No I/O, no clock, no randomness: `now` is an argument, so the portal and the
//!   simulator run exactly the same code and the same input always gives the same plan,
//!   whatever the order of the snapshot's vectors.
//! - Everything is iterated in id order (`BTreeMap`, sorted `Vec`), never in hash order.
//! - A plan never gives one GPU to two jobs, never places a job on a GPU that is held
//!   or used locally by the owner, never exceeds a quota or a lending rule, never
//!   preempts an owner's job, and never starts and preempts the same job.
//! - Planning again after applying a plan starts and preempts nothing new.
//!
//! # What the caller fills in
//!
//! Every field has a default meaning "no restriction", so a snapshot with only ids,
//! GPUs, running jobs and the queue schedules first come, first served with owner
//! priority. For the full policy the portal also passes:
//! - [`Node::lending`] (the lab admin's rules), [`Node::grace_s`], [`Node::reclaim`]
//!   (`commons-agent reclaim --now`), `schedulable = false` for offline/draining, and
//!   [`Node::inventory_unapproved`] while new GPUs await the lab admin (no guests then).
//! - [`Gpu::local_use`] and [`Gpu::idle_since`] from the agent's heartbeat, and MIG
//!   instances as GPUs of their own with [`Gpu::mig_profile`] and their own memory.
//! - [`RunningJob::last_checkpoint_at`] from `CheckpointStored`, and `preempting` for
//!   attempts told to stop; where known, [`RunningJob::checkpoint_write_s`] (how long
//!   the job's latest checkpoint took to write), which victims and grace periods use.
//! - [`LabInfo`] per lab: the operator quota (it limits borrowing only), the GPU-hours
//!   borrowed in the quota period, and the fair-share ledgers (GPU-hours lent and used,
//!   weighted with [`Policy::gpu_weight`], decayed with [`decay`] to `ledger_at`).
//! - [`MemberInfo`] per (lab, user): the lab admin's quota, period usage, and ledger.
//! - [`Policy`]: campus knobs (UTC offset for lending windows, default grace, minimum
//!   runtime, half-life, base share, backfill depth).
//!
//! # How a plan is made
//!
//! See [`plan`]: owner reclaims, then owner jobs on their own nodes (`owner`), then
//! every other job in fair-share order (`fairshare`) with quotas (`quota`), lending
//! rules (`lending`), best-fit placement and backfill reservations (`placement`);
//! victims are chosen in `preemption`, reasons worded in `reason`, and the working
//! copy of the snapshot lives in `state`.

mod estimate;
mod fairshare;
mod lending;
mod model;
mod owner;
mod owner_share;
mod placement;
mod plan;
mod policy;
mod preemption;
mod quota;
mod reason;
mod request;
mod risk;
pub mod share;
mod sharing;
mod state;
mod world;

pub use fairshare::decay;
pub use model::*;
pub use plan::plan;
pub(crate) use plan::Round;
pub use policy::{GpuClassWeight, LendMode, Lending, Policy, WeeklyWindow, WEEK_MINUTES};
pub use reason::{QuotaScope, Reason};
pub use risk::{hour_of_week, smooth_return_rate, WEEK_HOURS};
