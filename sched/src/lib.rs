//! The GPU Commons scheduler: a pure function from a [`Snapshot`] of the campus to a
//! [`Plan`] (jobs to start, guests to preempt, and why every other job waits).
//!
//! Invariants this crate keeps:
//! - No I/O, no clock, no randomness: `now` is an argument, so the portal and the
//!   simulator run exactly the same code and the same input always gives the same plan.
//! - Everything is iterated in id order (`BTreeMap`, sorted `Vec`), never in hash order.
//! - A plan never gives one GPU to two jobs, never places a job on a GPU that is held
//!   or used locally by the owner, never exceeds a quota, never preempts an owner's
//!   job, and never starts and preempts the same job.
//! - Planning again after applying a plan starts and preempts nothing new.
//!
//! The modules, in the order a plan uses them: [`state`](self) (working copy of the
//! snapshot), `preemption` (owner reclaims, victims), `owner` (owner-first placement),
//! `quota`, `fairshare` (guest order), `lending` (rules per node), `placement` (best
//! fit and backfill reservations), `plan` (the loop), `reason` (why a job waits).

mod fairshare;
mod lending;
mod model;
mod owner;
mod placement;
mod plan;
mod policy;
mod preemption;
mod quota;
mod reason;
mod state;

pub use fairshare::decay;
pub use model::*;
pub use plan::plan;
pub(crate) use plan::Round;
pub use policy::{GpuClassWeight, LendMode, Lending, Policy, WeeklyWindow, WEEK_MINUTES};
pub use reason::{QuotaScope, Reason};
