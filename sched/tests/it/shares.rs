//! Shares of one GPU in the plan (issue 32 §2): where they go, how they are counted,
//! and how owners take their GPUs back.

use commons_sched::*;

use crate::support::*;

/// A node of `lab` whose GPUs take shares.
fn sharing(id: NodeId, lab: LabId, first: GpuId, count: i64, gb: u64) -> Node {
    let mut n = node(id, lab, first, count, "A100", gb);
    n.lending.share_gpus = true;
    n
}

/// A 1-hour job of `lab` asking for `milli` of a GPU and `gb` of its memory.
fn share_job(id: JobId, lab: LabId, milli: u32, gb: u64) -> QueuedJob {
    let mut j = job(id, lab, 100 + lab, 1);
    j.share = Some(GpuShare {
        milli,
        memory_mb: gb * 1024,
    });
    j
}

/// A guest of `lab` running since `started_at` on `milli` and `gb` of GPU `gpu`.
fn share_run(id: JobId, lab: LabId, node: NodeId, gpu: GpuId, milli: u32, gb: u64) -> RunningJob {
    let mut r = run(id, lab, node, &[gpu], NOW - 2 * H);
    r.share = Some(GpuShare {
        milli,
        memory_mb: gb * 1024,
    });
    r
}

fn half() -> Option<GpuShare> {
    Some(GpuShare {
        milli: 500,
        memory_mb: 20 * 1024,
    })
}

#[test]
fn two_halves_share_one_gpu_then_the_owner_takes_it_back() {
    let mut n = sharing(1, 1, 10, 1, 80);
    n.grace_s = 120;
    let s = snap(
        vec![n],
        vec![],
        vec![
            share_job(1, 2, 500, 20),
            share_job(2, 2, 500, 20),
            share_job(3, 2, 500, 20),
        ],
    );
    let p = plan(&s, &Policy::default(), NOW);
    let want = |job| Start {
        job,
        node: 1,
        gpus: vec![10],
        share: half(),
    };
    assert_eq!(p.start, vec![want(1), want(2)]);
    let r = reason(&p, 3);
    assert_eq!(
        r,
        Reason::WaitingForShare {
            milli: 500,
            memory_mb: 20 * 1024
        }
    );
    assert_eq!(r.to_string(), "waiting for 0.5 of a GPU with 20 GB free");
    let waiting = p.pending.iter().find(|pe| pe.job == 3).unwrap();
    assert_eq!(waiting.estimated_start, Some(NOW + H), "{waiting:?}");

    // The owner lab wants its GPU whole: both guests go, with the node's grace.
    let mut next = apply(&s, &p, NOW);
    next.queue.push(job(4, 1, 101, 1));
    let p = plan(&next, &Policy::default(), NOW);
    assert!(p.start.is_empty(), "{:?}", p.start);
    assert_eq!(preempted(&p), vec![1, 2]);
    for pr in &p.preempt {
        assert_eq!(pr.grace_s, 120);
        assert_eq!(pr.reason, "the owner lab of node n1 needs its GPUs back");
    }
    assert_eq!(
        reason(&p, 4),
        Reason::WaitingForGuestsToLeave {
            node: "n1".into(),
            grace_s: 120
        }
    );
    assert!(matches!(reason(&p, 3), Reason::WaitingForShare { .. }));
    let again = plan(&apply(&next, &p, NOW), &Policy::default(), NOW);
    assert!(
        again.start.is_empty() && again.preempt.is_empty(),
        "{again:?}"
    );
}

#[test]
fn shares_go_only_where_sharing_is_on() {
    let s = snap(
        vec![node(1, 1, 10, 2, "A100", 80)],
        vec![],
        vec![share_job(1, 2, 500, 0), share_job(2, 1, 500, 0)],
    );
    let p = plan(&s, &Policy::default(), NOW);
    assert!(p.start.is_empty(), "{:?}", p.start);
    assert_eq!(
        reason(&p, 1).to_string(),
        "not lent: node n1 does not share its GPUs (it lends whole GPUs only)"
    );
    // The owner's own share job waits too: its node takes no shares.
    assert_eq!(
        reason(&p, 2).to_string(),
        "not lent: node n1 does not share its GPUs (it lends whole GPUs only)"
    );
}

#[test]
fn whole_gpu_jobs_never_land_on_a_gpu_with_shares() {
    let s = snap(
        vec![sharing(1, 1, 10, 2, 80)],
        vec![share_run(50, 2, 1, 10, 250, 10)],
        vec![job(1, 3, 300, 1), job(2, 3, 300, 1)],
    );
    let p = plan(&s, &Policy::default(), NOW);
    assert_eq!(started(&p), vec![1]);
    assert_eq!(p.start[0].gpus, vec![11]);
    assert_eq!(reason(&p, 2), Reason::WaitingForGpus { gpus: 1 });
}

#[test]
fn a_share_goes_where_shares_are_and_keeps_whole_gpus_free() {
    // Node 2 has a GPU already half taken; node 1 only empty GPUs. Whole-GPU jobs wait
    // in the mix, so the share packs onto the taken GPU.
    let mut s = snap(
        vec![sharing(1, 1, 10, 2, 80), sharing(2, 1, 20, 2, 80)],
        vec![share_run(50, 2, 2, 21, 500, 40)],
        vec![share_job(1, 2, 250, 10)],
    );
    s.queue.push(job(2, 2, 102, 8));
    let p = plan(&s, &Policy::default(), NOW);
    assert_eq!(p.start.len(), 1, "{:?}", p.start);
    assert_eq!(p.start[0].gpus, vec![21]);
    assert_eq!(
        p.start[0].share,
        Some(GpuShare {
            milli: 250,
            memory_mb: 10 * 1024
        })
    );
}

#[test]
fn a_share_that_names_only_memory_gets_its_fraction() {
    let s = snap(
        vec![sharing(1, 1, 10, 1, 80)],
        vec![],
        vec![share_job(1, 2, 0, 30)],
    );
    let p = plan(&s, &Policy::default(), NOW);
    // 30 of 80 GB is 0.375, rounded up to 0.4.
    assert_eq!(
        p.start[0].share,
        Some(GpuShare {
            milli: 400,
            memory_mb: 30 * 1024
        })
    );
}

#[test]
fn memory_is_never_over_allocated() {
    // Compute is left (0.25 + 0.25) but not memory (60 + 30 > 80 GB).
    let s = snap(
        vec![sharing(1, 1, 10, 1, 80)],
        vec![share_run(50, 2, 1, 10, 250, 60)],
        vec![share_job(1, 2, 250, 30)],
    );
    let p = plan(&s, &Policy::default(), NOW);
    assert!(p.start.is_empty());
    assert_eq!(
        reason(&p, 1).to_string(),
        "waiting for 0.25 of a GPU with 30 GB free"
    );
}

#[test]
fn a_gpu_with_guest_shares_counts_once_as_lent() {
    let mut n = sharing(1, 1, 10, 2, 80);
    n.lending.max_lent_gpus = Some(1);
    let s = snap(
        vec![n],
        vec![share_run(50, 2, 1, 10, 250, 10)],
        vec![share_job(1, 2, 250, 10), job(2, 3, 300, 1)],
    );
    let p = plan(&s, &Policy::default(), NOW);
    assert_eq!(started(&p), vec![1]);
    assert_eq!(p.start[0].gpus, vec![10]);
    assert_eq!(
        reason(&p, 2).to_string(),
        "not lent: node n1 already lends its limit of 1 GPUs"
    );
}

#[test]
fn quotas_count_a_share_as_its_fraction() {
    let mut s = snap(
        vec![sharing(1, 1, 10, 2, 80)],
        vec![share_run(50, 2, 1, 10, 500, 10)],
        vec![
            share_job(1, 2, 500, 10),
            share_job(2, 2, 250, 10),
            job(3, 2, 102, 1),
        ],
    );
    s.labs.push(LabInfo {
        id: 2,
        quota: Quota {
            max_gpus: Some(1),
            max_gpu_hours: Some(100.0),
            ..Default::default()
        },
        ..Default::default()
    });
    let p = plan(&s, &Policy::default(), NOW);
    assert_eq!(started(&p), vec![1]);
    assert_eq!(
        reason(&p, 2),
        Reason::QuotaGpus {
            scope: QuotaScope::Lab,
            used: 1,
            limit: 1
        }
    );
}

#[test]
fn an_owner_share_stops_just_enough_guest_shares() {
    let mut n = sharing(1, 1, 10, 1, 80);
    n.grace_s = 60;
    let mut cheap = share_run(50, 2, 1, 10, 250, 10);
    cheap.last_checkpoint_at = Some(NOW - 60);
    let dear = share_run(51, 2, 1, 10, 500, 10);
    let s = snap(vec![n], vec![cheap, dear], vec![share_job(1, 1, 500, 10)]);
    let p = plan(&s, &Policy::default(), NOW);
    assert_eq!(preempted(&p), vec![50], "{p:?}");
    assert_eq!(p.preempt[0].grace_s, 60);
    assert!(matches!(
        reason(&p, 1),
        Reason::WaitingForGuestsToLeave { .. }
    ));
    let again = plan(&apply(&s, &p, NOW), &Policy::default(), NOW);
    assert!(
        again.start.is_empty() && again.preempt.is_empty(),
        "{again:?}"
    );
}

#[test]
fn an_owner_share_fits_beside_guests_without_stopping_them() {
    let s = snap(
        vec![sharing(1, 1, 10, 1, 80)],
        vec![share_run(50, 2, 1, 10, 500, 40)],
        vec![share_job(1, 1, 500, 40)],
    );
    let p = plan(&s, &Policy::default(), NOW);
    assert!(p.preempt.is_empty());
    assert_eq!(p.start[0].gpus, vec![10]);
}

#[test]
fn local_use_and_reclaim_stop_shares() {
    let mut n1 = sharing(1, 1, 10, 1, 80);
    n1.gpus[0].local_use = true;
    let mut n2 = sharing(2, 1, 20, 1, 80);
    n2.reclaim = true;
    let s = snap(
        vec![n1, n2],
        vec![
            share_run(50, 2, 1, 10, 250, 10),
            share_run(51, 2, 2, 20, 250, 10),
            share_run(52, 1, 2, 20, 250, 10),
        ],
        vec![],
    );
    let p = plan(&s, &Policy::default(), NOW);
    assert_eq!(preempted(&p), vec![50, 51]);
}

#[test]
fn fair_share_charges_a_share_as_its_fraction() {
    // Equal ledgers; lab 2 holds half a GPU, lab 3 a quarter: lab 3 goes first (counted
    // as whole GPUs they would tie, and lab 2 would go first by id).
    let s = snap(
        vec![sharing(1, 1, 10, 3, 80)],
        vec![
            share_run(50, 2, 1, 10, 500, 10),
            share_run(51, 3, 1, 11, 250, 10),
        ],
        vec![job(1, 2, 102, 1), job(2, 3, 103, 1)],
    );
    let p = plan(&s, &Policy::default(), NOW);
    assert_eq!(started(&p), vec![2]);
}
