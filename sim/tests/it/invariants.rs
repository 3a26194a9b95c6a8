//! Invariants over random workloads (fixed seeds): every policy, with and without
//! departures, runs each job for at least its duration, never overbooks the campus,
//! and finishes everything that can run.

use crate::support::{campus, workload};
use commons_sim::metrics::summarize;
use commons_sim::{simulate, PolicyKind, SimOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const CAMPUS: &str = r#"
grace_seconds = 90
checkpoint_interval_minutes = 5
[[lab]]
name = "big"
tenants = ["b"]
nodes = 3
gpus_per_node = 8
[[lab]]
name = "small"
tenants = ["s"]
nodes = 2
gpus_per_node = 4
[[lab]]
name = "none"
tenants = ["n"]
[[departure]]
node = "big-1"
leave_at_s = 20000
return_at_s = 40000
[[departure]]
node = "small-0"
leave_at_s = 30000
abrupt = true
"#;

#[test]
fn random_workloads_keep_the_invariants() {
    for seed in 0..4u64 {
        let mut rng = StdRng::seed_from_u64(seed);
        let rows: Vec<(i64, i64, u32, &str)> = (0..300)
            .map(|_| {
                let gpus = [1, 1, 1, 2, 4, 8][rng.random_range(0..6)];
                let vc = ["b", "b", "s", "n"][rng.random_range(0..4)];
                (
                    rng.random_range(0..60_000),
                    rng.random_range(1..20_000),
                    gpus,
                    vc,
                )
            })
            .collect();
        let mut c = campus(CAMPUS);
        let w = workload(&c, &rows);
        for departures in [true, false] {
            if !departures {
                c.departures.clear();
            }
            for p in PolicyKind::ALL {
                let out = simulate(&c, &w, &SimOptions::new(p), &mut |_| {}).unwrap();
                let m = summarize(&c, &w, &out);
                let case = format!("seed {seed}, departures {departures}, {p}");
                assert!(m.utilization <= 1.0 && m.goodput <= m.utilization, "{case}");
                for (j, o) in w.jobs.iter().zip(&out.jobs) {
                    if let (Some(s), Some(f)) = (o.first_start, o.finish) {
                        assert!(
                            s >= j.submit && f - s >= j.duration,
                            "{case}: job {}",
                            j.idx
                        );
                        if out.preemptions == 0 && !departures {
                            assert_eq!(f - s, j.duration, "{case}: job {}", j.idx);
                        }
                    }
                }
                if p != PolicyKind::Isolated {
                    assert_eq!(m.unfinished_jobs, 0, "{case}");
                }
                if departures {
                    assert!(out.migrations_ok + out.migrations_failed > 0, "{case}");
                }
            }
        }
    }
}
