//! `commons-sim`: replays a GPU-cluster job trace through the same scheduler the portal
//! uses (`commons_sched::plan`), in virtual time, and compares policies side by side.
//!
//! The pieces, each pure and testable on its own:
//! - [`campus`]: the campus file (labs, nodes, tenants, departures) and its validation;
//! - [`checkpoint`]: the checkpoint model with failures (jobs that never checkpoint,
//!   writes that miss the grace period);
//! - [`trace`]: the trace CSV and the workload built from it;
//! - [`openb`]: the Alibaba GPU-sharing trace replayed for packing (shares of GPUs);
//! - [`policy`]: the policies compared, and the FCFS baselines implemented here;
//! - [`engine`]: the discrete-event loop of one policy;
//! - [`accounting`] and [`metrics`]: GPU-time bookkeeping and the reported figures;
//! - [`replay`](mod@replay): several policies over one workload, as the CLI runs them;
//! - [`report`]: the HTML page with SVG plots;
//! - [`suite`]: the robustness suite, many generated campuses and trace windows split
//!   into a tuning set and a test set, and the distribution of each ratio over them.

pub mod accounting;
pub mod backfill;
pub mod campus;
pub mod checkpoint;
pub mod engine;
pub mod limits;
pub mod metrics;
pub mod openb;
pub mod openb_plot;
pub mod policy;
pub mod replay;
pub mod report;
pub mod suite;
pub mod trace;

pub use campus::{Campus, CampusFile};
pub use engine::{simulate, simulate_with, SimOptions, SimOutput, Tuning};
pub use policy::PolicyKind;
pub use replay::{replay, Replay, ReplaySettings, RunSummary};
pub use trace::{read_trace, Workload};
