//! Knobs of the policy: campus-wide settings ([`Policy`]) and a node's lending rules
//! ([`Lending`]).
//!
//! Invariant: every default means "no restriction" for lending (lend always, no limit)
//! and a sensible campus default for the fair-share and preemption knobs.

use serde::{Deserialize, Serialize};

use crate::model::{LabId, Time};

/// Campus-wide knobs (operators), not part of the campus state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Policy {
    /// Offset of campus local time from UTC in seconds, for lending windows
    /// ("nights" are local nights). 3600 for CET.
    pub utc_offset_s: i32,
    /// Grace period for nodes that set none, in seconds.
    pub default_grace_s: u32,
    /// The disk (GiB) of a job that names none (its `disk_gb`): every host path it
    /// writes, and its checkpoint, hold at most this much. The portal applies it when
    /// the job is placed and started; nodes give a job at most their own largest.
    pub default_disk_gb: u64,
    /// A guest younger than this is preempted only when no older guest frees enough
    /// GPUs (owner reclaim may still take it; nothing else preempts).
    pub min_runtime_s: i64,
    /// Half-life of the usage and contribution ledgers, in seconds.
    pub half_life_s: i64,
    /// Share every lab has without lending anything, in GPU-hours of contribution, so
    /// labs without GPUs are never starved.
    pub base_share_gpu_hours: f64,
    /// GPU-hours charged to a lab's fair-share usage for each GPU it holds as a guest
    /// right now, so one plan spreads free GPUs over labs of equal standing.
    pub running_charge_gpu_hours: f64,
    /// How many waiting jobs may reserve GPUs for their earliest start; later jobs only
    /// backfill around those reservations.
    pub backfill_depth: u32,
    /// Weights of GPU classes for the ledgers (first matching prefix wins; others 1.0).
    pub gpu_class_weights: Vec<GpuClassWeight>,
    /// Place a guest where its node's owner is least likely to come back within the
    /// guest's time limit ([`crate::Node::owner_return_rate`]): nodes are compared by
    /// the expected take-backs in classes of [`Policy::return_risk_step`] first, then
    /// by best fit.
    pub return_risk_placement: bool,
    /// The width of a risk class for [`Policy::return_risk_placement`], in expected
    /// take-backs (rounded to tenths, at least 0.1): nodes whose expected take-backs
    /// fall in the same class are compared by best fit alone. Wider classes keep best
    /// fit (packing) for small differences in risk; the simulator's sweep is in the
    /// book's simulator results (docs/src/reports/simulator.md).
    pub return_risk_step: f64,
    /// Among an owner's possible victims, stop guests of labs that used more than their
    /// fair share (usage over share, see `fairshare`) before the others; inside each
    /// group the least work lost goes first, as before.
    pub victims_over_share_first: bool,
    /// Hysteresis: a GPU whose owner work ended less than this many seconds ago is not
    /// lent while the node's owner return rate this hour is at least
    /// [`Policy::relend_min_rate`]. 0 turns it off.
    pub relend_delay_s: i64,
    /// Take-backs per hour from which the owner "tends to come back" (see
    /// [`Policy::relend_delay_s`]).
    pub relend_min_rate: f64,
    /// An owner job that would preempt guests on its own nodes starts instead on free
    /// GPUs of another lab's node, as a guest, when the chance that that node's owner
    /// takes them back within its time limit is under 20 % (known return rates only).
    /// Off by default: on the simulator's Philly campus it multiplied preemptions (the
    /// moved owner jobs were taken back where they went, see docs/src/reports/simulator.md).
    pub owner_borrows_before_preempting: bool,
    /// Patience: an owner job does not preempt guests when the lab's own jobs on one
    /// of its nodes free enough GPUs within this many seconds (by their time limits);
    /// it waits for them instead. 0 (the default) turns it off: on the simulator's
    /// Philly campus it made owners wait longer than it saved (see docs/src/reports/simulator.md).
    pub owner_patience_s: i64,
    /// A guest that an owner already took back ([`crate::QueuedJob::take_backs`] at
    /// least 1) borrows again only on nodes whose expected take-backs within its time
    /// limit ([`crate::Node::owner_return_rate`]) are below this; otherwise it waits
    /// for its own lab's GPUs or a safe node. 0 turns it off. The default, 0.1 with a
    /// patience of 12 h, took the simulator's Philly campus under half of
    /// `commons-old`'s preemptions on the whole trace, on each half of it and with
    /// random departures, as did the limits 0.05-0.2 at 12 h on the whole trace and
    /// both halves; the earlier 0.3 with 6 h missed it on the second half
    /// (docs/src/reports/simulator.md, *Guests taken back before*).
    pub taken_back_max_risk: f64,
    /// The bound on that wait: [`Policy::taken_back_max_risk`] applies only for this
    /// many seconds after the job's last take-back ([`crate::QueuedJob::taken_back_at`]),
    /// then the job may borrow anywhere again, so it never starves.
    pub taken_back_patience_s: i64,
    /// Among an owner's possible victims, a guest expected to save all its work when
    /// told to stop (its latest checkpoint, [`crate::RunningJob::checkpoint_write_s`],
    /// took no longer than its grace period to write) costs only its restart, so such
    /// guests are stopped before guests that would lose work. Without write times (the
    /// default of a snapshot) nothing changes.
    pub victims_save_aware: bool,
    /// A guest whose latest checkpoint took longer than its node's grace period to
    /// write gets a grace period a quarter longer than that write, up to this many
    /// seconds, so that its save fits; 0 turns it off (every guest gets its node's
    /// grace period).
    pub grace_covers_checkpoint_s: u32,
    /// An owner job whose cheapest way to start would stop guests that lose more than
    /// this many GPU-hours of work (work since their latest checkpoint, or since their
    /// start without one) waits instead, for at most
    /// [`Policy::spare_costly_guests_s`] after its submission, for those guests or its
    /// lab's own jobs to end; then it stops them. 0 (the default) turns it off.
    pub spare_costly_guests_gpu_hours: f64,
    /// The bound on that wait, in seconds after the owner job's submission.
    pub spare_costly_guests_s: i64,
    /// The most an owner job is delayed to save guests' work, as a share of its time
    /// limit: it spares costly guests ([`Policy::spare_costly_guests_gpu_hours`]) for at
    /// most this share of its limit, and a guest's longer grace period
    /// ([`Policy::grace_covers_checkpoint_s`]) exceeds the node's by at most as much. A
    /// job without a time limit is delayed by at most those settings themselves. The
    /// default, 2 %, kept every lab of the simulator's tuning set within the 5 % margin
    /// of "labs worse off than alone"; more delay saves more guests' work but did not
    /// (docs/src/reports/robustness.md).
    pub owner_delay_share: f64,
    /// Adaptive hysteresis: [`Policy::relend_delay_s`] is scaled by the node's owner
    /// take-back rate this hour over [`Policy::relend_full_rate`] (at most 1) and by the
    /// queue pressure ([`Policy::relend_pressure_weight`]), so a node whose owner rarely
    /// comes back, on a quiet campus, lends again sooner.
    pub relend_adaptive: bool,
    /// Take-backs per hour from which the adaptive hysteresis holds a GPU back for the
    /// whole [`Policy::relend_delay_s`].
    pub relend_full_rate: f64,
    /// How much the queue pressure (the GPUs queued jobs ask for over the free GPUs, at
    /// most 1) scales the adaptive hysteresis: 0 not at all, 1 in proportion.
    pub relend_pressure_weight: f64,
    /// The same for [`Policy::taken_back_max_risk`]: the expected take-backs are
    /// weighed by `1 - w + w * pressure`, so on a quiet campus a guest taken back
    /// before may borrow riskier nodes. 0 (the default) leaves the limit as it is.
    pub taken_back_pressure_weight: f64,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            utc_offset_s: 0,
            default_grace_s: 300,
            // A checkpoint directory of a mid-sized model with its optimiser state; the
            // campus default lab cap on stored checkpoints is 50 GB, two kept per job.
            default_disk_gb: 20,
            min_runtime_s: 600,
            half_life_s: 7 * 24 * 3600,
            base_share_gpu_hours: 168.0,
            running_charge_gpu_hours: 1.0,
            backfill_depth: 64,
            gpu_class_weights: Vec::new(),
            return_risk_placement: true,
            return_risk_step: 0.1,
            victims_over_share_first: true,
            relend_delay_s: 3600,
            relend_min_rate: 0.02,
            owner_borrows_before_preempting: false,
            owner_patience_s: 0,
            taken_back_max_risk: 0.1,
            taken_back_patience_s: 12 * 3600,
            victims_save_aware: true,
            grace_covers_checkpoint_s: 600,
            // Off: on the suite's tuning set it saved no work that the longer grace did
            // not, and on the shipped campus it cost 14 % of the mean JCT with 60 % of
            // jobs never checkpointing (docs/src/reports/robustness.md). 8 GPU-hours
            // (more than 30-minute checkpoints lose on an 8-GPU node) when on.
            spare_costly_guests_gpu_hours: 0.0,
            spare_costly_guests_s: 2 * 3600,
            owner_delay_share: 0.02,
            relend_adaptive: false,
            relend_full_rate: 0.1,
            relend_pressure_weight: 0.0,
            taken_back_pressure_weight: 0.0,
        }
    }
}

impl Policy {
    /// The width of a risk class in tenths of an expected take-back (at least 1).
    pub fn return_risk_step_tenths(&self) -> u32 {
        let tenths = (self.return_risk_step * 10.0).round();
        if tenths.is_finite() {
            tenths.clamp(1.0, 1e9) as u32
        } else {
            1
        }
    }

    /// The policy as it was before issue 16: no return-risk placement, no fair-share
    /// preference among victims, no re-lending hysteresis, and (issue 31) victims and
    /// grace periods blind to checkpoint write times.
    pub fn without_churn_knobs(self) -> Policy {
        Policy {
            return_risk_placement: false,
            victims_over_share_first: false,
            relend_delay_s: 0,
            owner_borrows_before_preempting: false,
            owner_patience_s: 0,
            taken_back_max_risk: 0.0,
            victims_save_aware: false,
            grace_covers_checkpoint_s: 0,
            spare_costly_guests_gpu_hours: 0.0,
            ..self
        }
    }

    /// Weight of one GPU-hour on `model` in the ledgers. The portal uses it when it
    /// books usage and contribution, so lending an H100 earns more than a T4.
    pub fn gpu_weight(&self, model: &str) -> f64 {
        self.gpu_class_weights
            .iter()
            .find(|w| model.starts_with(&w.model_prefix))
            .map_or(1.0, |w| w.weight)
    }
}

/// The weight of a GPU class in the ledgers.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct GpuClassWeight {
    /// Model names that start with this, e.g. "H100".
    pub model_prefix: String,
    /// GPU-hours of ledger per GPU-hour used.
    pub weight: f64,
}

/// When a node lends its GPUs to other labs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LendMode {
    /// Lend whenever the GPUs are idle.
    #[default]
    Always,
    /// Never lend: only the owner's jobs run here.
    Never,
    /// Lend only inside [`Lending::windows`]; a guest must end before its window does.
    Windows,
}

/// A weekly time window in campus local time, in minutes from Monday 00:00
/// (0..=10080). `end_minute <= start_minute` wraps over the end of the week.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct WeeklyWindow {
    /// First minute of the window.
    pub start_minute: u32,
    /// First minute after the window.
    pub end_minute: u32,
}

/// Minutes in a week.
pub const WEEK_MINUTES: u32 = 7 * 24 * 60;

impl WeeklyWindow {
    /// The same daily window on each of the given weekdays (0 = Monday), from `from`
    /// to `to` minutes after midnight; `to <= from` runs into the next day.
    pub fn daily(weekdays: &[u32], from: u32, to: u32) -> Vec<WeeklyWindow> {
        weekdays
            .iter()
            .map(|d| {
                let start = d * 24 * 60 + from;
                let len = if to > from {
                    to - from
                } else {
                    to + 24 * 60 - from
                };
                WeeklyWindow {
                    start_minute: start % WEEK_MINUTES,
                    end_minute: (start + len) % WEEK_MINUTES,
                }
            })
            .collect()
    }

    /// Saturday 00:00 to Monday 00:00.
    pub fn weekend() -> WeeklyWindow {
        WeeklyWindow {
            start_minute: 5 * 24 * 60,
            end_minute: 0,
        }
    }
}

/// A lab admin's lending rules for one node. The default lends always, without limits.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Lending {
    /// Never, always, or in windows.
    pub mode: LendMode,
    /// The windows, used when `mode` is `Windows`.
    pub windows: Vec<WeeklyWindow>,
    /// At most this many GPUs of the node held by guests at once.
    pub max_lent_gpus: Option<u32>,
    /// A GPU is lent only after it was idle (no owner job, no local use) this long.
    pub min_idle_s: i64,
    /// Longest time limit of a guest job here, in seconds.
    pub max_guest_time_limit_s: Option<i64>,
    /// Labs that may borrow; empty means every lab.
    pub borrowers: Vec<LabId>,
    /// The node's GPUs may carry shares ([`crate::QueuedJob::share`]): several share jobs
    /// on one GPU. Off by default: a share job, the owner lab's own included, starts only
    /// where this is on. For `max_lent_gpus`, a GPU that carries any guest share counts
    /// as one lent GPU (however small the shares), since the owner cannot use it whole.
    pub share_gpus: bool,
}

impl Lending {
    /// Until when a guest starting at `now` may run here: `None` if the node lends
    /// nothing at `now`, `Some(Time::MAX)` if lending does not end.
    pub fn lend_until(&self, now: Time, utc_offset_s: i32) -> Option<Time> {
        match self.mode {
            LendMode::Always => Some(Time::MAX),
            LendMode::Never => None,
            LendMode::Windows => crate::lending::window_end(&self.windows, now, utc_offset_s),
        }
    }
}
