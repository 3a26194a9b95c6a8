//! The discrete-event loop: replays a [`Workload`] on a [`Campus`] under one policy in
//! virtual time.
//!
//! 1. Events are job arrivals (from the workload, in submission order), job finishes,
//!    ends of grace periods, nodes leaving or returning, and scheduler ticks. All events
//!    of one instant are applied first. If something changed, the policy is asked once,
//!    at that instant if it falls on a tick (a multiple of [`SimOptions::tick_s`]),
//!    else at the next tick; its starts and preemptions take effect then.
//! 2. `commons` policies build a [`sched::Snapshot`] (kept up to date incrementally) and
//!    call the real [`sched::plan`]; every start and preemption of the plan is checked
//!    against the simulator's own state, and an inapplicable plan is an error.
//! 3. A preempted (or displaced) job keeps its GPUs for the grace period, then stops:
//!    it keeps the work up to its last checkpoint (checkpoints are taken every
//!    `checkpoint_interval` seconds of each attempt), loses the rest, and is queued again
//!    with its original submission time.
//!
//! Invariants: a GPU is held by at most one job; a job is in the queues iff it is
//! queued; the snapshot's `running` list mirrors the running jobs. Everything is
//! iterated in index order, so a run is a pure function of its inputs.

mod churn;
mod commons;
mod save;
mod share;

use crate::accounting::Accounting;
use crate::campus::Campus;
use crate::checkpoint::CheckpointModel;
use crate::policy::{Knobs, PolicyKind};
use crate::trace::Workload;
use commons::{initial_snapshot, running_job, sched_policy};
use commons_sched as sched;
use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};

/// A simulation that cannot go on.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("the scheduler's plan at t={now}s cannot be applied: {message}")]
    BadPlan { now: i64, message: String },
}

/// How to run one simulation.
#[derive(Debug, Clone)]
pub struct SimOptions {
    pub policy: PolicyKind,
    /// How many queued jobs at the head of each lab's queue the scheduler sees per call
    /// (like Slurm's `bf_max_job_test`); the plan is recomputed while the window moves.
    pub window_per_lab: usize,
    /// The scheduler loop runs at most once per tick, on multiples of `tick_s` seconds
    /// (like the portal's loop); changes in between wait for the next tick. 0: the
    /// policy is asked at the very instant of every change.
    pub tick_s: i64,
    /// `None`: every job's time limit is its true run time. `Some(seed)`: users
    /// overestimate, each limit is the run time times a factor drawn with this seed
    /// (see [`crate::limits`]).
    pub limit_seed: Option<u64>,
    /// Settings of the churn knobs other than `sched`'s defaults.
    pub tuning: Tuning,
    /// The checkpoint model with failures; `None`: the older model (see
    /// [`crate::checkpoint`]).
    pub checkpoints: Option<CheckpointModel>,
}

impl SimOptions {
    pub fn new(policy: PolicyKind) -> SimOptions {
        SimOptions {
            policy,
            window_per_lab: 8,
            tick_s: 0,
            limit_seed: None,
            tuning: Tuning::default(),
            checkpoints: None,
        }
    }
}

/// Settings of the churn knobs for the policies that turn them on (`None`: `sched`'s
/// default), to measure other values than the defaults.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Tuning {
    /// `Policy::relend_delay_s` where the hysteresis is on.
    pub relend_delay_s: Option<i64>,
    /// `Policy::relend_min_rate` where the hysteresis is on.
    pub relend_min_rate: Option<f64>,
    /// `Policy::return_risk_step` where return-risk placement is on.
    pub return_risk_step: Option<f64>,
    /// `Policy::taken_back_max_risk` for `commons` and its variants (0 elsewhere).
    pub taken_back_max_risk: Option<f64>,
    /// `Policy::taken_back_patience_s` (it matters only where the rule is on).
    pub taken_back_patience_s: Option<i64>,
    /// `Policy::grace_covers_checkpoint_s` where checkpoint-aware victims are on.
    pub grace_covers_checkpoint_s: Option<u32>,
    /// `Policy::spare_costly_guests_gpu_hours` where checkpoint-aware victims are on.
    pub spare_costly_guests_gpu_hours: Option<f64>,
    /// `Policy::spare_costly_guests_s`.
    pub spare_costly_guests_s: Option<i64>,
    /// `Policy::owner_delay_share`.
    pub owner_delay_share: Option<f64>,
    /// `Policy::relend_adaptive` (it matters only where the hysteresis is on).
    pub relend_adaptive: Option<bool>,
    /// `Policy::relend_full_rate`.
    pub relend_full_rate: Option<f64>,
    /// `Policy::relend_pressure_weight`.
    pub relend_pressure_weight: Option<f64>,
    /// `Policy::taken_back_pressure_weight` (where the take-back rule is on).
    pub taken_back_pressure_weight: Option<f64>,
}

/// What happened to one job (indexed like [`Workload::jobs`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobOutcome {
    pub first_start: Option<i64>,
    pub finish: Option<i64>,
    /// The first attempt ran on a node of the job's own lab.
    pub owner_start: bool,
    pub attempts: u32,
    /// The first start-time estimate the scheduler gave: (when, estimated start).
    pub first_estimate: Option<(i64, i64)>,
}

/// The raw result of one simulation; [`crate::metrics`] summarises it.
#[derive(Debug, Clone)]
pub struct SimOutput {
    pub policy: PolicyKind,
    pub jobs: Vec<JobOutcome>,
    pub accounting: Accounting,
    /// Jobs stopped by the policy (not counting those displaced by a leaving node).
    pub preemptions: u64,
    /// Jobs displaced by a leaving node that lost at most one checkpoint interval.
    pub migrations_ok: u64,
    /// Jobs displaced by a leaving node that lost more.
    pub migrations_failed: u64,
    /// Virtual time when the last event happened.
    pub end_time: i64,
    pub plan_calls: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    Finish {
        job: usize,
        attempt: u32,
    },
    GraceEnd {
        job: usize,
        attempt: u32,
    },
    Leave(usize),
    Return(usize),
    Tick,
    /// Plan again (a GPU held back by the re-lending hysteresis may be lent now).
    Wake,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum St {
    Pending,
    Queued,
    Running,
    Done,
}

#[derive(Debug, Clone)]
struct Rt {
    st: St,
    /// Seconds of work safe in a checkpoint.
    saved: i64,
    start: i64,
    node: usize,
    gpus: Vec<sched::GpuId>,
    preempting: bool,
    displaced: bool,
    /// When the running attempt reaches its time limit.
    limit_end: i64,
    /// Attempts stopped by the policy (take-backs), and when the last one ended.
    take_backs: u32,
    taken_back_at: i64,
    /// When the running attempt was told to stop (while `preempting`).
    signal_at: i64,
    /// The checkpoint model: its save on stop fits the grace period.
    save_ok: bool,
    /// The checkpoint model: seconds its latest checkpoint took to write, in an
    /// earlier attempt (the running attempt's are computed, see `save`).
    write_s: Option<i64>,
    out: JobOutcome,
}

impl Rt {
    /// A job not yet submitted.
    fn pending() -> Rt {
        Rt {
            st: St::Pending,
            saved: 0,
            start: 0,
            node: 0,
            gpus: Vec::new(),
            preempting: false,
            displaced: false,
            limit_end: 0,
            take_backs: 0,
            taken_back_at: 0,
            signal_at: 0,
            save_ok: false,
            write_s: None,
            out: JobOutcome::default(),
        }
    }
}

/// GPU `k` of node `n` has id `n * GPU_STRIDE + k` (nodes have at most 64 GPUs).
const GPU_STRIDE: i64 = 100;

struct Engine<'a> {
    campus: &'a Campus,
    work: &'a Workload,
    opts: SimOptions,
    ckpt: Option<i64>,
    now: i64,
    seq: u64,
    heap: BinaryHeap<Reverse<(i64, u64, Ev)>>,
    next_arrival: usize,
    /// Departures in force per node; a node is up when 0.
    down: Vec<u32>,
    /// Free GPU ids per node, sorted.
    free: Vec<Vec<sched::GpuId>>,
    on_node: Vec<Vec<usize>>,
    lab_nodes: Vec<Vec<usize>>,
    jobs: Vec<Rt>,
    queue: BTreeSet<(i64, usize)>,
    /// Per lab, by (tier, submission, job): tier 0 holds the interactive jobs of a policy
    /// that boosts them (they go first in the lab's window), tier 1 every other job.
    lab_queue: Vec<BTreeSet<(u8, i64, usize)>>,
    dirty: Vec<bool>,
    changed: bool,
    /// Labs with a job that arrived at this instant.
    arrived: Vec<bool>,
    /// Something other than an arrival changed at this instant.
    other_change: bool,
    tick_pending: bool,
    guests: usize,
    snap: sched::Snapshot,
    run_pos: Vec<usize>,
    policy: sched::Policy,
    /// Per lab: GPU-hours borrowed and lent by finished guest attempts, decayed to `.2`.
    ledgers: Vec<(f64, f64, i64)>,
    acct: Accounting,
    preemptions: u64,
    migrations_ok: u64,
    migrations_failed: u64,
    plan_calls: u64,
    /// Each job's time limit (its run time, or an overestimate of it).
    limits: Vec<i64>,
    knobs: Knobs,
    /// A stopped job checkpoints within its grace period.
    ckpt_on_stop: bool,
    /// Owner take-backs per node and hour of the week (see `churn`).
    takebacks: Vec<Vec<u32>>,
    /// The hour (since the start) the snapshot's return rates were computed for.
    rates_hour: Option<i64>,
    /// Per lab: decayed GPU-hours of every finished attempt, and when (fair share of
    /// the `share-fairshare` baseline).
    fs_usage: Vec<(f64, i64)>,
    /// The checkpoint model's draws per job (empty without the model): whether it
    /// never checkpoints, and its fill (see [`crate::checkpoint`]).
    saves: Vec<(bool, f64)>,
    /// Times of the wake-ups asked for by [`Engine::wake_at`] and not yet due.
    wakes: BTreeSet<i64>,
}

/// The function that plans for the `commons` policies: [`sched::plan`] in production,
/// a scripted one in tests of the engine's mechanics.
pub type Planner<'p> = dyn FnMut(&sched::Snapshot, &sched::Policy, sched::Time) -> sched::Plan + 'p;

/// Run one policy over the workload. `progress` is called now and then with the
/// virtual time reached.
pub fn simulate(
    campus: &Campus,
    work: &Workload,
    opts: &SimOptions,
    progress: &mut dyn FnMut(i64),
) -> Result<SimOutput, SimError> {
    simulate_with(campus, work, opts, &mut sched::plan, progress)
}

/// [`simulate`] with another planner in place of [`sched::plan`].
pub fn simulate_with(
    campus: &Campus,
    work: &Workload,
    opts: &SimOptions,
    planner: &mut Planner<'_>,
    progress: &mut dyn FnMut(i64),
) -> Result<SimOutput, SimError> {
    let mut e = Engine::new(campus, work, opts.clone());
    for (i, d) in campus.departures.iter().enumerate() {
        e.push(work.span.0 + d.leave_at, Ev::Leave(i));
        if let Some(r) = d.return_at {
            e.push(work.span.0 + r, Ev::Return(i));
        }
    }
    progress(e.now);
    let mut steps = 0u64;
    loop {
        let next_arrival = work.jobs.get(e.next_arrival).map(|j| j.submit);
        let next_event = e.heap.peek().map(|Reverse((t, _, _))| *t);
        let t = match (next_arrival, next_event) {
            (None, None) => break,
            (Some(a), None) => a,
            (None, Some(b)) => b,
            (Some(a), Some(b)) => a.min(b),
        };
        e.acct.advance(t);
        e.now = t;
        while let Some(&Reverse((et, _, ev))) = e.heap.peek() {
            if et != t {
                break;
            }
            e.heap.pop();
            e.handle(ev);
        }
        while let Some(j) = work.jobs.get(e.next_arrival) {
            if j.submit != t {
                break;
            }
            e.arrive(j.idx);
            e.next_arrival += 1;
        }
        if e.changed {
            let tick = e.opts.tick_s.max(1);
            let at = (t + tick - 1).div_euclid(tick) * tick;
            if at == t {
                e.schedule(planner)?;
            } else if !e.tick_pending {
                e.tick_pending = true;
                e.push(at, Ev::Tick);
            }
        }
        steps += 1;
        if steps.is_multiple_of(4096) {
            progress(t);
        }
    }
    progress(e.now);
    Ok(SimOutput {
        policy: opts.policy,
        jobs: e.jobs.into_iter().map(|r| r.out).collect(),
        accounting: e.acct,
        preemptions: e.preemptions,
        migrations_ok: e.migrations_ok,
        migrations_failed: e.migrations_failed,
        end_time: e.now,
        plan_calls: e.plan_calls,
    })
}

impl<'a> Engine<'a> {
    fn new(campus: &'a Campus, work: &'a Workload, opts: SimOptions) -> Engine<'a> {
        let n = campus.nodes.len();
        let mut lab_nodes = vec![Vec::new(); campus.labs.len()];
        for (i, node) in campus.nodes.iter().enumerate() {
            lab_nodes[node.lab].push(i);
        }
        let free = campus
            .nodes
            .iter()
            .enumerate()
            .map(|(i, node)| {
                (0..i64::from(node.gpus))
                    .map(|k| i as i64 * GPU_STRIDE + k)
                    .collect()
            })
            .collect();
        let snap = initial_snapshot(campus);
        let ckpt = if opts.policy.checkpoints() {
            campus.checkpoint_interval_s
        } else {
            None
        };
        Engine {
            campus,
            work,
            ckpt,
            now: work.span.0,
            seq: 0,
            heap: BinaryHeap::new(),
            next_arrival: 0,
            down: vec![0; n],
            free,
            on_node: vec![Vec::new(); n],
            lab_nodes,
            jobs: vec![Rt::pending(); work.jobs.len()],
            queue: BTreeSet::new(),
            lab_queue: vec![BTreeSet::new(); campus.labs.len()],
            dirty: vec![false; campus.labs.len()],
            changed: false,
            arrived: vec![false; campus.labs.len()],
            other_change: false,
            tick_pending: false,
            guests: 0,
            snap,
            run_pos: vec![usize::MAX; work.jobs.len()],
            policy: sched_policy(campus, opts.policy, &opts.tuning),
            ledgers: vec![(0.0, 0.0, work.span.0); campus.labs.len()],
            acct: Accounting::new(work.span.0, work.span.1),
            preemptions: 0,
            migrations_ok: 0,
            migrations_failed: 0,
            plan_calls: 0,
            limits: crate::limits::time_limits(work, opts.limit_seed),
            knobs: opts.policy.knobs(),
            ckpt_on_stop: campus.checkpoint_on_stop || opts.policy.knobs().stop_ckpt,
            takebacks: vec![vec![0; commons_sched::WEEK_HOURS]; n],
            rates_hour: None,
            fs_usage: vec![(0.0, work.span.0); campus.labs.len()],
            saves: save::draws(work, opts.checkpoints.as_ref()),
            wakes: BTreeSet::new(),
            opts,
        }
    }

    fn push(&mut self, at: i64, ev: Ev) {
        self.seq += 1;
        self.heap.push(Reverse((at, self.seq, ev)));
    }

    fn touch(&mut self, lab: usize) {
        self.dirty[lab] = true;
        self.changed = true;
    }

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::Finish { job, attempt } => {
                if self.current(job, attempt) {
                    self.release(job);
                    let rt = &mut self.jobs[job];
                    rt.st = St::Done;
                    rt.out.finish = Some(self.now);
                }
            }
            Ev::GraceEnd { job, attempt } => {
                if self.current(job, attempt) {
                    self.stop(job, true);
                }
            }
            Ev::Leave(d) => {
                let dep = &self.campus.departures[d];
                let node = dep.node;
                self.down[node] += 1;
                if self.down[node] == 1 {
                    self.snap.nodes[node].schedulable = false;
                    for job in self.on_node[node].clone() {
                        self.jobs[job].displaced = true;
                        if dep.abrupt {
                            self.stop(job, false);
                        } else if !self.jobs[job].preempting {
                            self.begin_stop(job, self.campus.grace_s);
                        }
                    }
                }
            }
            Ev::Tick => self.tick_pending = false,
            Ev::Wake => {
                self.wakes.remove(&self.now);
                self.other_change = true;
                self.changed = true;
            }
            Ev::Return(d) => {
                let node = self.campus.departures[d].node;
                self.down[node] -= 1;
                if self.down[node] == 0 {
                    self.snap.nodes[node].schedulable = true;
                    self.other_change = true;
                    self.touch(self.campus.nodes[node].lab);
                }
            }
        }
    }

    /// Where a job sorts in its lab's queue: boosted interactive jobs first.
    fn lab_key(&self, job: usize) -> (u8, i64, usize) {
        let j = &self.work.jobs[job];
        let boosted = j.interactive && self.opts.policy.boosts_interactive();
        (u8::from(!boosted), j.submit, job)
    }

    /// The job runs the attempt an event was scheduled for.
    fn current(&self, job: usize, attempt: u32) -> bool {
        let rt = &self.jobs[job];
        rt.st == St::Running && rt.out.attempts == attempt
    }

    fn arrive(&mut self, job: usize) {
        let j = &self.work.jobs[job];
        self.jobs[job].st = St::Queued;
        self.queue.insert((j.submit, job));
        let key = self.lab_key(job);
        self.lab_queue[j.lab].insert(key);
        self.arrived[j.lab] = true;
        self.touch(j.lab);
    }

    fn start(&mut self, job: usize, node: usize, gpus: Vec<sched::GpuId>) {
        let j = &self.work.jobs[job];
        let owner = self.campus.nodes[node].lab == j.lab;
        self.queue.remove(&(j.submit, job));
        let key = self.lab_key(job);
        self.lab_queue[j.lab].remove(&key);
        self.free[node].retain(|g| !gpus.contains(g));
        self.on_node[node].push(job);
        self.acct.take(gpus.len() as u64);
        if !owner {
            self.guests += 1;
        }
        let rt = &mut self.jobs[job];
        rt.st = St::Running;
        rt.start = self.now;
        rt.node = node;
        rt.preempting = false;
        rt.out.attempts += 1;
        if rt.out.first_start.is_none() {
            rt.out.first_start = Some(self.now);
            rt.out.owner_start = owner;
        }
        let remaining = j.duration - rt.saved;
        let limit = (self.limits[job] - rt.saved).max(remaining);
        rt.limit_end = self.now + limit;
        let attempt = rt.out.attempts;
        rt.gpus = gpus.clone();
        self.push(self.now + remaining, Ev::Finish { job, attempt });
        self.run_pos[job] = self.snap.running.len();
        self.snap
            .running
            .push(running_job(j, node, gpus, self.now, limit));
    }

    /// Free the GPUs of a running job (it finished or stopped).
    fn release(&mut self, job: usize) {
        let node = self.jobs[job].node;
        let gpus = std::mem::take(&mut self.jobs[job].gpus);
        self.acct.release(gpus.len() as u64);
        self.free[node].extend(gpus.iter().copied());
        self.free[node].sort_unstable();
        self.on_node[node].retain(|&j| j != job);
        let (owner, borrower) = (self.campus.nodes[node].lab, self.work.jobs[job].lab);
        self.released(job, node, &gpus);
        if owner != borrower {
            self.guests -= 1;
            let gpu_h = gpus.len() as f64 * (self.now - self.jobs[job].start) as f64 / 3600.0;
            self.book(borrower, gpu_h, 0.0);
            self.book(owner, 0.0, gpu_h);
        }
        let pos = std::mem::replace(&mut self.run_pos[job], usize::MAX);
        self.snap.running.swap_remove(pos);
        if let Some(moved) = self.snap.running.get(pos) {
            self.run_pos[moved.id as usize] = pos;
        }
        self.other_change = true;
        self.touch(self.campus.nodes[node].lab);
    }

    fn schedule(&mut self, planner: &mut Planner<'_>) -> Result<(), SimError> {
        if !std::mem::take(&mut self.changed) {
            return Ok(());
        }
        match self.opts.policy {
            PolicyKind::Isolated => self.run_isolated(),
            PolicyKind::ShareFifo => self.run_share_fifo(),
            PolicyKind::ShareBackfill => self.run_backfill(false),
            PolicyKind::ShareFairshare => self.run_backfill(true),
            _ => self.run_sched(planner)?,
        }
        self.dirty.fill(false);
        self.arrived.fill(false);
        self.other_change = false;
        Ok(())
    }
}
