//! `plan` on a large campus: 1,000 nodes x 8 GPUs, 6,000 running jobs, 40 labs, and
//! 10k / 50k / 200k waiting jobs. Target: <= 100 ms per round at 50k on one core.
//!
//! The campus is generated from a fixed seed (no `rand`: a small LCG keeps it stable).

use std::hint::black_box;
use std::time::Duration;

use commons_sched::*;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};

const NOW: Time = 1_704_067_200 + 12 * 3600;
const H: i64 = 3600;

struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

const MODELS: [(&str, u64); 4] = [
    ("A100-80GB", 80),
    ("A100-40GB", 40),
    ("V100-32GB", 32),
    ("RTX4090-24GB", 24),
];
const LIMITS: [i64; 8] = [H / 2, H, 2 * H, 4 * H, 8 * H, 12 * H, 24 * H, 48 * H];

/// `nodes` nodes of 30 lending labs (labs 31..40 own none), `running` running jobs
/// (6 per 8 GPUs at full scale), `waiting` queued jobs from 40 labs of 10 members each.
fn campus(nodes: i64, running: i64, waiting: usize) -> Snapshot {
    let mut rng = Lcg(42);
    let mut s = Snapshot::default();
    for n in 0..nodes {
        let (model, gb) = MODELS[(n % 4) as usize];
        let mut lending = Lending::default();
        match n % 10 {
            0 => lending.mode = LendMode::Never,
            1 => {
                lending.mode = LendMode::Windows;
                lending.windows = WeeklyWindow::daily(&[0, 1, 2, 3, 4, 5, 6], 20 * 60, 8 * 60);
            }
            2 => lending.max_lent_gpus = Some(4),
            3 => lending.min_idle_s = 1800,
            _ => {}
        }
        s.nodes.push(Node {
            id: n + 1,
            name: format!("node{n}"),
            lab: n % 30 + 1,
            schedulable: n % 97 != 0,
            gpus: (0..8)
                .map(|g| Gpu {
                    id: n * 8 + g + 1,
                    model: model.into(),
                    memory_mb: gb * 1024,
                    idle_since: NOW - (rng.below(4 * H as u64) as i64),
                    ..Default::default()
                })
                .collect(),
            lending,
            ..Default::default()
        });
    }
    // 6,000 running jobs: 5,000 of 1 GPU and 1,000 of 2, packed node by node from a
    // random start, which leaves about 1,000 GPUs free in scattered holes.
    let mut next_gpu = vec![0usize; nodes as usize];
    for k in 0..running {
        let gpus = if k % 6 == 0 { 2 } else { 1 };
        let node = loop {
            let n = rng.below(nodes as u64) as usize;
            if next_gpu[n] + gpus <= 8 {
                break n;
            }
        };
        let first = next_gpu[node];
        next_gpu[node] += gpus;
        let lab = if rng.below(2) == 0 {
            node as i64 % 30 + 1
        } else {
            rng.below(40) as i64 + 1
        };
        s.running.push(RunningJob {
            id: 1_000_000 + k,
            user: lab * 100 + rng.below(10) as i64,
            lab,
            node: node as i64 + 1,
            gpus: (first..first + gpus)
                .map(|g| node as i64 * 8 + g as i64 + 1)
                .collect(),
            started_at: NOW - rng.below(20 * H as u64) as i64,
            time_limit_s: 24 * H,
            last_checkpoint_at: Some(NOW - rng.below(H as u64) as i64),
            ..Default::default()
        });
    }
    for i in 0..waiting as i64 {
        let lab = rng.below(40) as i64 + 1;
        let gpus = [1, 1, 1, 1, 2, 2, 4, 8][rng.below(8) as usize];
        let mut j = QueuedJob {
            id: i + 1,
            user: lab * 100 + rng.below(10) as i64,
            lab,
            gpus,
            time_limit_s: LIMITS[rng.below(8) as usize],
            submitted_at: NOW - rng.below(7 * 24 * H as u64) as i64,
            ..Default::default()
        };
        match rng.below(6) {
            0 => j.models = vec!["A100-80GB".into()],
            1 => j.min_memory_mb = 40 * 1024,
            _ => {}
        }
        s.queue.push(j);
    }
    for lab in 1..=40i64 {
        s.labs.push(LabInfo {
            id: lab,
            quota: Quota {
                max_gpus: (lab % 5 == 0).then_some(64),
                ..Default::default()
            },
            lent_gpu_hours: if lab <= 30 {
                500.0 + lab as f64 * 10.0
            } else {
                0.0
            },
            used_gpu_hours: lab as f64 * 20.0,
            ledger_at: NOW - H,
            ..Default::default()
        });
        for u in 0..10 {
            s.members.push(MemberInfo {
                lab,
                user: lab * 100 + u,
                quota: Quota {
                    max_gpus: (u == 0).then_some(8),
                    ..Default::default()
                },
                used_gpu_hours: u as f64 * 5.0,
                ledger_at: NOW - H,
                ..Default::default()
            });
        }
    }
    s
}

fn bench(c: &mut Criterion) {
    let policy = Policy::default();
    let mut group = c.benchmark_group("plan");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(10))
        .warm_up_time(Duration::from_secs(2));
    for waiting in [10_000, 50_000, 200_000] {
        let s = campus(1000, 6000, waiting);
        let p = plan(&s, &policy, NOW);
        {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            format!("{p:?}").hash(&mut h);
            eprintln!("digest {waiting}: {:x}", h.finish());
        }
        eprintln!(
            "{waiting} waiting: {} starts, {} preempts, {} pending",
            p.start.len(),
            p.preempt.len(),
            p.pending.len()
        );
        group.bench_with_input(BenchmarkId::from_parameter(waiting), &s, |b, s| {
            b.iter(|| plan(black_box(s), &policy, NOW))
        });
    }
    group.finish();
}

/// The simulator's scale: 75 nodes x 8 GPUs, 450 running and 500 waiting jobs; it
/// plans on every event of its trace.
fn bench_small(c: &mut Criterion) {
    let policy = Policy::default();
    let s = campus(75, 450, 500);
    c.bench_function("plan_small/600_gpus_500_waiting", |b| {
        b.iter(|| plan(black_box(&s), &policy, NOW))
    });
}

criterion_group!(benches, bench, bench_small);
criterion_main!(benches);
