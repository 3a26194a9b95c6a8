//! Start-time estimates of waiting jobs: reservations, owner jobs' expected starts,
//! and the bound from the jobs ahead.

use crate::support::*;
use commons_sched::*;

fn estimate(p: &Plan, job: JobId) -> Option<Time> {
    p.pending
        .iter()
        .find(|x| x.job == job)
        .unwrap()
        .estimated_start
}

#[test]
fn a_guest_behind_a_running_job_gets_its_reservation() {
    // Lab 2's node has one GPU, held by a job that ends in 3 h.
    let mut r = run(100, 2, 1, &[10], NOW - H);
    r.time_limit_s = 4 * H;
    let s = snap(
        vec![node(1, 2, 10, 1, "A100", 80)],
        vec![r],
        vec![job(1, 1, 10, 1), job(2, 1, 10, 1)],
    );
    let p = plan(&s, &Policy::default(), NOW);
    assert!(p.start.is_empty());
    assert_eq!(estimate(&p, 1), Some(NOW + 3 * H));
    // The second job shares the first one's shape: the bound from the jobs ahead
    // (job 1 takes the GPU for its 1-hour limit) puts it an hour later.
    assert_eq!(estimate(&p, 2), Some(NOW + 4 * H));
}

#[test]
fn an_owner_job_waiting_for_its_own_jobs_gets_their_end() {
    let mut r = run(100, 1, 1, &[10, 11], NOW - H);
    r.time_limit_s = 2 * H;
    let s = snap(
        vec![node(1, 1, 10, 2, "A100", 80)],
        vec![r],
        vec![job(1, 1, 10, 2)],
    );
    let p = plan(&s, &Policy::default(), NOW);
    assert_eq!(estimate(&p, 1), Some(NOW + H));
}

#[test]
fn an_owner_job_waiting_for_guests_gets_the_grace_period() {
    let mut n = node(1, 1, 10, 1, "A100", 80);
    n.grace_s = 120;
    let s = snap(
        vec![n],
        vec![run(100, 2, 1, &[10], NOW - 2 * H)],
        vec![job(1, 1, 10, 1)],
    );
    let p = plan(&s, &Policy::default(), NOW);
    assert_eq!(preempted(&p), vec![100]);
    assert_eq!(estimate(&p, 1), Some(NOW + 120));
}

#[test]
fn no_estimate_without_time_limits_or_for_rules() {
    // The only GPU is held by a job without a time limit: nothing bounds the wait.
    let mut r = run(100, 2, 1, &[10], NOW - H);
    r.time_limit_s = 0;
    let mut wide = job(2, 1, 10, 4);
    wide.id = 2;
    let s = snap(
        vec![node(1, 2, 10, 1, "A100", 80)],
        vec![r],
        vec![job(1, 1, 10, 1), wide],
    );
    let p = plan(&s, &Policy::default(), NOW);
    assert_eq!(estimate(&p, 1), None);
    // No node has 4 GPUs: not a wait for GPUs, so no estimate.
    assert!(matches!(reason(&p, 2), Reason::NoNodeFits { .. }));
    assert_eq!(estimate(&p, 2), None);
}

#[test]
fn estimates_are_deterministic_and_ordered() {
    let mut running = Vec::new();
    for k in 0..4 {
        let mut r = run(100 + k, 2, 1, &[10 + k], NOW - H);
        r.time_limit_s = (k + 2) * H;
        running.push(r);
    }
    let queue: Vec<QueuedJob> = (1..=6).map(|i| job(i, 1, 10, 1)).collect();
    let s = snap(vec![node(1, 2, 10, 4, "A100", 80)], running, queue);
    let p = plan(&s, &Policy::default(), NOW);
    let mut reversed = s.clone();
    reversed.queue.reverse();
    reversed.running.reverse();
    assert_eq!(p, plan(&reversed, &Policy::default(), NOW));
    let est: Vec<Time> = p
        .pending
        .iter()
        .map(|x| x.estimated_start.unwrap())
        .collect();
    assert!(est.windows(2).all(|w| w[0] <= w[1]), "{est:?}");
    assert_eq!(est[0], NOW + H);
}

#[test]
fn a_job_that_fetches_data_starts_that_much_later() {
    // As in the first test, job 1 reserves the GPU that frees in 3 h; it fetches 2 GB of
    // inputs and datasets first, at the default 100 MB/s and then at a measured 1 GB/s.
    let mut r = run(100, 2, 1, &[10], NOW - H);
    r.time_limit_s = 4 * H;
    let mut j = job(1, 1, 10, 1);
    j.stage_bytes = 2_000_000_000;
    let mut s = snap(vec![node(1, 2, 10, 1, "A100", 80)], vec![r], vec![j]);
    let p = plan(&s, &Policy::default(), NOW);
    assert_eq!(estimate(&p, 1), Some(NOW + 3 * H + 20));
    s.nodes[0].fetch_bytes_per_s = 1_000_000_000;
    let p = plan(&s, &Policy::default(), NOW);
    assert_eq!(estimate(&p, 1), Some(NOW + 3 * H + 2));
}
