//! The portal's Prometheus metrics: one registry per process, served at `/metrics` in the
//! text format (OpenMetrics 1.0, which Prometheus reads).
//!
//! Invariants:
//! - Labels come from bounded sets only: lab slugs, node names, job states, route
//!   patterns (`/api/v1/jobs/{id}`, never a raw path), message types, preemption causes.
//!   No job, attempt, user or request id is ever a label.
//! - What the scheduler sees (queue per lab, GPUs by state) is set by the replica that
//!   runs the scheduler, from the snapshot each tick already reads, and cleared on the
//!   others, so summing over replicas counts each GPU once. Job counts by state are read
//!   from the database at each scrape and are the same on every replica.

use commons_sched::{Snapshot, Time};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpLabels {
    pub method: String,
    /// The route pattern the request matched, or `unmatched`.
    pub route: String,
    pub status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LabLabel {
    pub lab: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct JobLabels {
    pub lab: String,
    pub state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeLabels {
    pub node: String,
    pub lab: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GpuLabels {
    pub node: String,
    pub lab: String,
    pub state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CauseLabel {
    pub cause: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MessageLabels {
    /// `in` (agent to portal) or `out`.
    pub direction: &'static str,
    #[prometheus(flatten)]
    pub kind: KindLabel,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabel {
    pub phase: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabel {
    pub state: &'static str,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    // 0.5 ms .. about 16 s.
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

fn wait_histogram() -> Histogram {
    // 1 s .. about 12 days.
    Histogram::new(exponential_buckets(1.0, 3.0, 14))
}

/// Every metric of the portal, shared by the HTTP middleware, the broker and the
/// scheduler loop.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    pub http_requests: HistogramFamily<HttpLabels>,
    pub tick_duration: Histogram,
    pub tick_phase: HistogramFamily<PhaseLabel>,
    pub plan_size: Family<KindLabel, Gauge>,
    pub scheduler_leader: Gauge,
    pub last_tick: Gauge<f64, std::sync::atomic::AtomicU64>,
    /// How rounds brought the scheduler's world up to date (`full`, `changes`, `check`).
    pub world_updates: Family<KindLabel, Counter>,
    /// Change rows the rounds took out of the log.
    pub world_changes: Counter,
    /// Checks that found the world unlike a fresh read (each repaired by that read).
    pub world_mismatches: Counter,
    pub preemptions: Family<CauseLabel, Counter>,
    pub starts: Family<LabLabel, Counter>,
    pub queue_wait: HistogramFamily<LabLabel>,
    pub queue_jobs: Family<LabLabel, Gauge>,
    pub queue_oldest: Family<LabLabel, Gauge>,
    pub gpus: Family<GpuLabels, Gauge>,
    pub jobs: Family<JobLabels, Gauge>,
    pub node_up: Family<NodeLabels, Gauge>,
    pub agents_connected: Gauge,
    pub agent_messages: Family<MessageLabels, Counter>,
    pub agent_message_duration: HistogramFamily<KindLabel>,
    pub agent_messages_refused: Counter,
    pub agent_log_chunks_dropped: Counter,
    pub db_pool: Family<PoolLabel, Gauge>,
    pub db_pool_max: Gauge,
    /// Time from asking the pool for a connection to having one (the database work's
    /// queueing delay).
    pub db_pool_wait: Histogram,
    /// Statements the pool's connections sent (moved up to the pool's own count at each
    /// scrape, under the lock).
    db_statements: std::sync::Mutex<Counter>,
    /// Lab id to slug, for labels; refreshed at each scrape and when a tick meets a
    /// lab it does not know.
    labs: RwLock<HashMap<i64, String>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut r = Registry::with_prefix("commons");
        let m = Metrics {
            registry: Registry::default(),
            http_requests: Family::new_with_constructor(latency_histogram),
            tick_duration: latency_histogram(),
            tick_phase: Family::new_with_constructor(latency_histogram),
            plan_size: Family::default(),
            scheduler_leader: Gauge::default(),
            last_tick: Gauge::default(),
            world_updates: Family::default(),
            world_changes: Counter::default(),
            world_mismatches: Counter::default(),
            preemptions: Family::default(),
            starts: Family::default(),
            queue_wait: Family::new_with_constructor(wait_histogram),
            queue_jobs: Family::default(),
            queue_oldest: Family::default(),
            gpus: Family::default(),
            jobs: Family::default(),
            node_up: Family::default(),
            agents_connected: Gauge::default(),
            agent_messages: Family::default(),
            agent_message_duration: Family::new_with_constructor(latency_histogram),
            agent_messages_refused: Counter::default(),
            agent_log_chunks_dropped: Counter::default(),
            db_pool: Family::default(),
            db_pool_max: Gauge::default(),
            // 50 us .. about 26 s.
            db_pool_wait: Histogram::new(exponential_buckets(0.000_05, 2.0, 20)),
            db_statements: Default::default(),
            labs: RwLock::default(),
        };
        m.register_scheduler(&mut r);
        m.register_queue(&mut r);
        m.register_cluster(&mut r);
        m.register_agents(&mut r);
        m.register_db(&mut r);
        Metrics { registry: r, ..m }
    }

    /// HTTP and the scheduler's rounds.
    fn register_scheduler(&self, r: &mut Registry) {
        r.register_with_unit(
            "http_request_duration",
            "HTTP requests by method, route pattern and status",
            Unit::Seconds,
            self.http_requests.clone(),
        );
        r.register_with_unit(
            "scheduler_tick_duration",
            "One scheduler round end to end: snapshot read, plan, commit, starts sent",
            Unit::Seconds,
            self.tick_duration.clone(),
        );
        r.register_with_unit(
            "scheduler_tick_phase_duration",
            "The scheduler round's phases (read, plan, commit, send)",
            Unit::Seconds,
            self.tick_phase.clone(),
        );
        r.register(
            "scheduler_plan_size",
            "The last plan: jobs to start, to preempt, and left pending",
            self.plan_size.clone(),
        );
        r.register(
            "scheduler_leader",
            "1 when this replica runs the scheduler",
            self.scheduler_leader.clone(),
        );
        r.register_with_unit(
            "scheduler_last_tick_timestamp",
            "Unix time of this replica's last finished scheduler round",
            Unit::Seconds,
            self.last_tick.clone(),
        );
        r.register(
            "scheduler_world_updates",
            "Rounds by how they brought the scheduler's world up to date: a full read, \
             the changes in the log, or the changes and a full read to check them",
            self.world_updates.clone(),
        );
        r.register(
            "scheduler_world_changes",
            "Change rows the scheduler's rounds took out of the change log",
            self.world_changes.clone(),
        );
        r.register(
            "scheduler_world_mismatches",
            "Checks that found the scheduler's world unlike a fresh read (repaired by it)",
            self.world_mismatches.clone(),
        );
    }

    /// Preemptions, starts and the queue.
    fn register_queue(&self, r: &mut Registry) {
        r.register(
            "preemptions",
            "Guest jobs preempted, by cause (owner_job, reclaim, local_use, other)",
            self.preemptions.clone(),
        );
        r.register(
            "job_starts",
            "Attempts started by the scheduler, by the job's lab",
            self.starts.clone(),
        );
        r.register_with_unit(
            "queue_wait",
            "Time from submission to each attempt's start, by the job's lab",
            Unit::Seconds,
            self.queue_wait.clone(),
        );
        r.register(
            "queue_jobs",
            "Jobs waiting to start, by lab (scheduler replica only)",
            self.queue_jobs.clone(),
        );
        r.register_with_unit(
            "queue_oldest_wait",
            "How long the oldest waiting job of each lab has waited",
            Unit::Seconds,
            self.queue_oldest.clone(),
        );
    }

    /// GPUs, jobs and nodes.
    fn register_cluster(&self, r: &mut Registry) {
        r.register(
            "gpus",
            "GPUs by node, owning lab and state: owner, guest, lent (free, open to guests), \
             idle (free, lending closed), withheld (local use, reclaimed, drained or offline)",
            self.gpus.clone(),
        );
        r.register("jobs", "Jobs by lab and state", self.jobs.clone());
        r.register(
            "node_up",
            "1 when the node's agent is connected (to any replica), by node and lab",
            self.node_up.clone(),
        );
    }

    /// The agents' connections and messages.
    fn register_agents(&self, r: &mut Registry) {
        r.register(
            "agents_connected",
            "Agents connected to this replica",
            self.agents_connected.clone(),
        );
        r.register(
            "agent_messages",
            "Agent protocol messages by direction and type",
            self.agent_messages.clone(),
        );
        r.register_with_unit(
            "agent_message_handling",
            "Time to handle one agent message (database work included), by type",
            Unit::Seconds,
            self.agent_message_duration.clone(),
        );
        r.register(
            "agent_messages_refused",
            "Agent messages refused (limits, rate, another node's attempt)",
            self.agent_messages_refused.clone(),
        );
        r.register(
            "agent_log_chunks_dropped",
            "Jobs' output chunks dropped over a connection's output rate (not refusals: \
             the job's log says how much)",
            self.agent_log_chunks_dropped.clone(),
        );
    }

    /// The database pool.
    fn register_db(&self, r: &mut Registry) {
        r.register(
            "db_pool_connections",
            "Database pool connections by state (idle, in_use)",
            self.db_pool.clone(),
        );
        r.register(
            "db_pool_max_connections",
            "Size limit of the database pool",
            self.db_pool_max.clone(),
        );
        r.register(
            "db_statements",
            "Statements this process sent to the database",
            self.db_statements
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        );
        r.register_with_unit(
            "db_pool_wait",
            "Time from asking the database pool for a connection to having one",
            Unit::Seconds,
            self.db_pool_wait.clone(),
        );
    }

    /// Brings `commons_db_statements_total` up to `total` (the pool's own count).
    pub fn count_statements(&self, total: u64) {
        let c = self.db_statements.lock().unwrap_or_else(|p| p.into_inner());
        c.inc_by(total.saturating_sub(c.get()));
    }

    /// The registry in the text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// The slug of a lab for labels (its id when unknown).
    pub fn lab(&self, id: i64) -> String {
        self.labs
            .read()
            .ok()
            .and_then(|l| l.get(&id).cloned())
            .unwrap_or_else(|| id.to_string())
    }

    pub fn knows_labs(&self, ids: impl IntoIterator<Item = i64>) -> bool {
        let Ok(l) = self.labs.read() else {
            return false;
        };
        ids.into_iter().all(|id| l.contains_key(&id))
    }

    pub fn set_labs(&self, labs: impl IntoIterator<Item = (i64, String)>) {
        if let Ok(mut l) = self.labs.write() {
            l.extend(labs);
        }
    }

    pub fn message(&self, direction: &'static str, kind: &'static str) {
        self.agent_messages
            .get_or_create(&MessageLabels {
                direction,
                kind: KindLabel { kind },
            })
            .inc();
    }

    /// Sets what the scheduler replica sees: GPUs by state, queue per lab.
    /// Observes how long a phase of the scheduler's round took, `since` its start (the
    /// round's `read`, `plan`, `commit`, `send`, `waiting`; the read's own parts
    /// `read_judge`, `read_world`, `read_build`).
    pub fn phase(&self, phase: &'static str, since: std::time::Instant) {
        self.tick_phase
            .get_or_create(&PhaseLabel { phase })
            .observe(since.elapsed().as_secs_f64());
    }

    pub fn observe_snapshot(&self, s: &Snapshot, now: Time, utc_offset_s: i32) {
        self.gpus.clear();
        for ((node, lab, state), n) in gpu_states(s, now, utc_offset_s) {
            self.gpus
                .get_or_create(&GpuLabels {
                    node,
                    lab: self.lab(lab),
                    state,
                })
                .set(n);
        }
        let mut queue: BTreeMap<i64, (i64, Time)> = BTreeMap::new();
        for q in &s.queue {
            let e = queue.entry(q.lab).or_insert((0, q.submitted_at));
            e.0 += 1;
            e.1 = e.1.min(q.submitted_at);
        }
        self.queue_jobs.clear();
        self.queue_oldest.clear();
        for (lab, (n, oldest)) in queue {
            let lab = LabLabel { lab: self.lab(lab) };
            self.queue_jobs.get_or_create(&lab).set(n);
            self.queue_oldest
                .get_or_create(&lab)
                .set((now - oldest).max(0));
        }
    }

    /// This replica does not run the scheduler: it reports none of its views.
    pub fn not_leading(&self) {
        self.scheduler_leader.set(0);
        self.gpus.clear();
        self.queue_jobs.clear();
        self.queue_oldest.clear();
        self.plan_size.clear();
    }
}

/// Shared by every part of one portal process.
pub type SharedMetrics = Arc<Metrics>;

/// The cause of a preemption, from the scheduler's reason (a bounded label).
pub fn preemption_cause(reason: &str) -> &'static str {
    if reason.contains("reclaimed") {
        "reclaim"
    } else if reason.contains("using the GPU directly") {
        "local_use"
    } else if reason.contains("needs its GPUs back") {
        "owner_job"
    } else {
        "other"
    }
}

/// GPUs counted by (node name, owning lab, state); see the `gpus` metric's help.
pub fn gpu_states(
    s: &Snapshot,
    now: Time,
    utc_offset_s: i32,
) -> BTreeMap<(String, i64, &'static str), i64> {
    let mut holder: HashMap<i64, i64> = HashMap::new();
    for r in &s.running {
        for g in &r.gpus {
            holder.insert(*g, r.lab);
        }
    }
    let mut out = BTreeMap::new();
    for n in &s.nodes {
        let lends = n.lending.lend_until(now, utc_offset_s).is_some();
        for g in &n.gpus {
            let state = match holder.get(&g.id) {
                Some(&lab) if lab == n.lab => "owner",
                Some(_) => "guest",
                None if !n.schedulable || n.reclaim || g.local_use => "withheld",
                None if lends => "lent",
                None => "idle",
            };
            *out.entry((n.name.clone(), n.lab, state)).or_insert(0) += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use commons_sched::{Gpu, LendMode, Lending, Node, RunningJob};

    #[test]
    fn gpu_states_cover_the_five_states() {
        let gpu = |id| Gpu {
            id,
            ..Default::default()
        };
        let mut local = gpu(5);
        local.local_use = true;
        let s = Snapshot {
            nodes: vec![
                Node {
                    id: 1,
                    name: "a".into(),
                    lab: 1,
                    schedulable: true,
                    gpus: vec![gpu(1), gpu(2), gpu(3), local],
                    ..Default::default()
                },
                Node {
                    id: 2,
                    name: "b".into(),
                    lab: 2,
                    schedulable: true,
                    gpus: vec![gpu(6)],
                    lending: Lending {
                        mode: LendMode::Never,
                        ..Default::default()
                    },
                    ..Default::default()
                },
            ],
            running: vec![
                RunningJob {
                    id: 10,
                    lab: 1,
                    node: 1,
                    gpus: vec![1],
                    ..Default::default()
                },
                RunningJob {
                    id: 11,
                    lab: 2,
                    node: 1,
                    gpus: vec![2],
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let got = gpu_states(&s, 0, 0);
        let want: BTreeMap<_, _> = [
            (("a".to_string(), 1, "owner"), 1),
            (("a".to_string(), 1, "guest"), 1),
            (("a".to_string(), 1, "lent"), 1),
            (("a".to_string(), 1, "withheld"), 1),
            (("b".to_string(), 2, "idle"), 1),
        ]
        .into_iter()
        .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn preemption_causes_match_the_schedulers_words() {
        assert_eq!(
            preemption_cause("the owner of node g1 reclaimed it"),
            "reclaim"
        );
        assert_eq!(
            preemption_cause("the owner of node g1 is using the GPU directly"),
            "local_use"
        );
        assert_eq!(
            preemption_cause("the owner lab of node g1 needs its GPUs back"),
            "owner_job"
        );
        assert_eq!(preemption_cause("drained"), "other");
    }

    #[test]
    fn encodes_names_with_units_and_no_ids() {
        let m = Metrics::new();
        m.http_requests
            .get_or_create(&HttpLabels {
                method: "GET".into(),
                route: "/api/v1/jobs/{id}".into(),
                status: 200,
            })
            .observe(0.01);
        m.preemptions
            .get_or_create(&CauseLabel { cause: "reclaim" })
            .inc();
        let text = m.encode();
        assert!(text.contains(
            "commons_http_request_duration_seconds_count{method=\"GET\",route=\"/api/v1/jobs/{id}\",status=\"200\"} 1"
        ));
        assert!(text.contains("commons_preemptions_total{cause=\"reclaim\"} 1"));
        assert!(text.ends_with("# EOF\n"));
    }
}
