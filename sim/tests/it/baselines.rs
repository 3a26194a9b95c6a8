//! The backfill baselines, users' overestimated time limits, and the start-time
//! estimates' figures, on hand-made traces with known answers.

use crate::support::{campus, run, times, workload};
use commons_sim::limits::{time_limits, OVERESTIMATE_MAX_FACTOR};
use commons_sim::{simulate, PolicyKind, SimOptions};

const ONE_NODE: &str = r#"
[[lab]]
name = "a"
tenants = ["va"]
nodes = 1
gpus_per_node = 4
[[lab]]
name = "b"
tenants = ["vb"]
"#;

#[test]
fn backfill_runs_a_short_job_around_a_blocked_wide_one() {
    let c = campus(ONE_NODE);
    // Job 0 holds 3 GPUs until t=100. Job 1 wants all 4 (waits for t=100). Job 2 (1 GPU,
    // 50 s) fits the free GPU and ends before job 1's reservation: EASY backfills it;
    // strict FCFS keeps it behind job 1. Job 3 (1 GPU, 500 s) would delay job 1.
    let w = workload(
        &c,
        &[
            (0, 100, 3, "va"),
            (1, 10, 4, "va"),
            (2, 50, 1, "va"),
            (3, 500, 1, "va"),
        ],
    );
    let (fifo, _) = run(&c, &w, PolicyKind::ShareFifo);
    assert_eq!(times(&fifo)[2].0, Some(110));
    for p in [PolicyKind::ShareBackfill, PolicyKind::ShareFairshare] {
        let (out, _) = run(&c, &w, p);
        let t = times(&out);
        assert_eq!(t[2], (Some(2), Some(52)), "{p}: backfilled");
        assert_eq!(t[1], (Some(100), Some(110)), "{p}: the head is not delayed");
        assert_eq!(t[3].0, Some(110), "{p}: the long job waits");
    }
}

#[test]
fn fair_share_puts_the_lab_that_used_less_first() {
    let c = campus(ONE_NODE);
    // Lab a uses the node for 1000 s, then for 100 s more. Meanwhile lab a (t=1001)
    // and then lab b (t=1002) queue a 4-GPU job: first come first served runs lab a's
    // first, fair share runs lab b's (no usage) first.
    let w = workload(
        &c,
        &[
            (0, 1000, 4, "va"),
            (1000, 100, 4, "va"),
            (1001, 100, 4, "va"),
            (1002, 100, 4, "vb"),
        ],
    );
    let (plain, _) = run(&c, &w, PolicyKind::ShareBackfill);
    assert_eq!(times(&plain)[2].0, Some(1100));
    assert_eq!(times(&plain)[3].0, Some(1200));
    let (fair, _) = run(&c, &w, PolicyKind::ShareFairshare);
    assert_eq!(times(&fair)[1].0, Some(1000));
    assert_eq!(times(&fair)[3].0, Some(1100));
    assert_eq!(times(&fair)[2].0, Some(1200));
}

#[test]
fn overestimated_limits_are_seeded_and_never_below_the_run_time() {
    let c = campus(ONE_NODE);
    let rows: Vec<(i64, i64, u32, &str)> = (0..200).map(|i| (i, 37 + 91 * i, 1, "va")).collect();
    let w = workload(&c, &rows);
    let exact = time_limits(&w, None);
    assert!(exact.iter().zip(&w.jobs).all(|(l, j)| *l == j.duration));
    let a = time_limits(&w, Some(7));
    assert_eq!(a, time_limits(&w, Some(7)));
    assert_ne!(a, time_limits(&w, Some(8)));
    for (l, j) in a.iter().zip(&w.jobs) {
        assert!(*l >= j.duration && l % 60 == 0, "{l} for {}", j.duration);
        assert!(*l as f64 <= (j.duration as f64 * OVERESTIMATE_MAX_FACTOR).ceil() + 60.0);
    }
    let mean: f64 = a
        .iter()
        .zip(&w.jobs)
        .map(|(l, j)| *l as f64 / j.duration as f64)
        .sum::<f64>()
        / 200.0;
    assert!((4.0..7.0).contains(&mean), "mean factor {mean}");
}

#[test]
fn commons_reports_how_good_its_estimates_were() {
    let c = campus(ONE_NODE);
    // Job 1 waits behind job 0 (limit = run time, 100 s): estimated at t=1 to start at
    // t=100, and it does. (One GPU stays free: with every GPU held the simulator does
    // not plan, so the first estimate would come at the next change.)
    let w = workload(&c, &[(0, 100, 3, "va"), (1, 10, 4, "va")]);
    let (out, m) = run(&c, &w, PolicyKind::Commons);
    assert_eq!(out.jobs[1].first_estimate, Some((1, 100)));
    assert_eq!(m.estimated_jobs, 1);
    assert_eq!(m.estimate_abs_error_median_s, Some(0.0));
    assert_eq!(m.estimate_within_2x, Some(1.0));
    // With overestimated limits the estimate is later than the real start.
    let mut opts = SimOptions::new(PolicyKind::Commons);
    opts.limit_seed = Some(3);
    let out = simulate(&c, &w, &opts, &mut |_| {}).unwrap();
    let (at, est) = out.jobs[1].first_estimate.unwrap();
    assert_eq!(at, 1);
    assert!(est > 100, "{est}");
    assert_eq!(out.jobs[1].first_start, Some(100));
}
