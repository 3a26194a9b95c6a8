//! Owner first: owner jobs outrank guests on their lab's nodes, reclaim from guests,
//! and are never preempted.

use crate::support::*;
use commons_sched::*;

#[test]
fn owner_job_outranks_earlier_guest() {
    let s = snap(
        vec![node(1, 1, 10, 1, "A100", 80)],
        vec![],
        vec![job(1, 2, 20, 1), job(2, 1, 10, 1)],
    );
    let p = plan(&s, &Policy::default(), NOW);
    assert_eq!(started(&p), vec![2]);
    assert_eq!(reason(&p, 1), Reason::WaitingForGpus { gpus: 1 });
}

#[test]
fn owner_preempts_just_the_cheapest_guest_with_grace() {
    let mut n = node(1, 1, 10, 4, "A100", 80);
    n.grace_s = 120;
    let mut fresh_ckpt = run(100, 2, 1, &[10], NOW - 10 * H);
    fresh_ckpt.last_checkpoint_at = Some(NOW - 60);
    let no_ckpt = run(101, 2, 1, &[11], NOW - 2 * H);
    let pair = run(102, 3, 1, &[12, 13], NOW - 3 * H);
    let s = snap(
        vec![n],
        vec![fresh_ckpt, no_ckpt, pair],
        vec![job(1, 1, 10, 1)],
    );
    let p = plan(&s, &Policy::default(), NOW);
    assert_eq!(preempted(&p), vec![100]);
    assert_eq!(p.preempt[0].grace_s, 120);
    assert!(p.start.is_empty());
    assert_eq!(
        reason(&p, 1),
        Reason::WaitingForGuestsToLeave {
            node: "n1".into(),
            grace_s: 120
        }
    );
    // The next plan waits for the stopping guest instead of preempting another.
    let again = plan(&apply(&s, &p, NOW), &Policy::default(), NOW + 5);
    assert!(
        again.preempt.is_empty() && again.start.is_empty(),
        "{again:?}"
    );
}

#[test]
fn owner_takes_several_guests_only_as_needed() {
    let s = snap(
        vec![node(1, 1, 10, 4, "A100", 80)],
        vec![
            run(100, 2, 1, &[10], NOW - 3 * H),
            run(101, 2, 1, &[11], NOW - 2 * H),
            run(102, 3, 1, &[12, 13], NOW - H),
        ],
        vec![job(1, 1, 10, 2)],
    );
    let p = plan(&s, &Policy::default(), NOW);
    // Two 1-GPU guests lose 5 GPU-hours, the 2-GPU guest loses 2: it is the one.
    assert_eq!(preempted(&p), vec![102]);
}

#[test]
fn young_guests_are_spared_when_older_ones_suffice() {
    let policy = Policy {
        min_runtime_s: 600,
        ..Default::default()
    };
    let young = run(100, 2, 1, &[10], NOW - 60);
    let mut old = run(101, 2, 1, &[11], NOW - 5 * H);
    old.last_checkpoint_at = Some(NOW - 300);
    let s = snap(
        vec![node(1, 1, 10, 2, "A100", 80)],
        vec![young, old],
        vec![job(1, 1, 10, 1)],
    );
    assert_eq!(preempted(&plan(&s, &policy, NOW)), vec![101]);
    // The owner still reclaims a young guest when nothing else frees enough.
    let s2 = snap(
        vec![node(1, 1, 10, 2, "A100", 80)],
        vec![
            run(100, 2, 1, &[10], NOW - 60),
            run(101, 1, 1, &[11], NOW - H),
        ],
        vec![job(1, 1, 10, 1)],
    );
    assert_eq!(preempted(&plan(&s2, &policy, NOW)), vec![100]);
}

#[test]
fn owner_jobs_are_never_preempted() {
    let s = snap(
        vec![node(1, 1, 10, 2, "A100", 80), node(2, 2, 20, 2, "A100", 80)],
        vec![
            run(100, 1, 1, &[10, 11], NOW - H),
            run(101, 2, 2, &[20, 21], NOW - H),
        ],
        vec![job(1, 2, 20, 2), job(2, 3, 30, 1)],
    );
    let p = plan(&s, &Policy::default(), NOW);
    assert!(p.preempt.is_empty());
    assert!(p.start.is_empty());
}

#[test]
fn guests_stay_off_gpus_the_owner_waits_for() {
    // Owner needs 4; 2 are free and 2 run owner jobs: the free ones are claimed.
    let s = snap(
        vec![node(1, 1, 10, 4, "A100", 80)],
        vec![run(100, 1, 1, &[10, 11], NOW - H)],
        vec![job(1, 1, 10, 4), job(2, 2, 20, 1)],
    );
    let p = plan(&s, &Policy::default(), NOW);
    assert!(p.start.is_empty());
    assert_eq!(
        reason(&p, 1),
        Reason::WaitingForOwnJobs { node: "n1".into() }
    );
    assert_eq!(reason(&p, 2), Reason::OwnerReserved { node: "n1".into() });
    assert_eq!(
        reason(&p, 2).to_string(),
        "the owner of node n1 reserved its free GPUs"
    );
}

#[test]
fn owner_backfills_its_own_claim_when_it_ends_in_time() {
    // The 4-GPU owner job waits ~1 h for the lab's own job; a 30-min owner job may use
    // a claimed GPU meanwhile, a 2-h one may not.
    let mut short = job(2, 1, 11, 1);
    short.time_limit_s = H / 2;
    let mut long = job(3, 1, 12, 1);
    long.time_limit_s = 2 * H;
    let mut own = run(100, 1, 1, &[10, 11], NOW - 23 * H);
    own.time_limit_s = 24 * H;
    let s = snap(
        vec![node(1, 1, 10, 4, "A100", 80)],
        vec![own],
        vec![job(1, 1, 10, 4), short, long],
    );
    let p = plan(&s, &Policy::default(), NOW);
    assert_eq!(started(&p), vec![2]);
}

#[test]
fn owner_job_runs_elsewhere_while_own_nodes_are_full() {
    let s = snap(
        vec![node(1, 1, 10, 2, "A100", 80), node(2, 2, 20, 2, "A100", 80)],
        vec![run(100, 1, 1, &[10, 11], NOW - H)],
        vec![job(1, 1, 10, 1)],
    );
    let p = plan(&s, &Policy::default(), NOW);
    assert_eq!(
        p.start,
        vec![Start {
            job: 1,
            node: 2,
            gpus: vec![20],
            share: None,
        }]
    );
    assert!(p.pending.is_empty());
}

#[test]
fn owner_reclaims_by_local_use_or_reclaim_flag() {
    let mut n1 = node(1, 1, 10, 2, "A100", 80);
    n1.gpus[0].local_use = true;
    let mut n2 = node(2, 1, 20, 2, "A100", 80);
    n2.reclaim = true;
    let s = snap(
        vec![n1, n2],
        vec![
            run(100, 2, 1, &[10], NOW - H),
            run(101, 2, 1, &[11], NOW - H),
            run(102, 3, 2, &[20, 21], NOW - H),
        ],
        vec![job(1, 2, 20, 1)],
    );
    let p = plan(&s, &Policy::default(), NOW);
    assert_eq!(preempted(&p), vec![100, 102]);
    assert!(p.preempt[0].reason.contains("using the GPU directly"));
    assert!(p.preempt[1].reason.contains("reclaimed"));
    assert_eq!(p.preempt[0].grace_s, Policy::default().default_grace_s);
}

#[test]
fn no_start_then_preempt_in_one_plan() {
    // A guest starts on the free GPU; the owner job that fits only after the owner's
    // own job ends must not preempt it in the same plan.
    let mut n = node(1, 1, 10, 3, "A100", 80);
    n.gpus[2].model = "T4".into();
    let mut owner = job(2, 1, 10, 2);
    owner.models = vec!["A100".into()];
    let s = snap(
        vec![n],
        vec![run(100, 1, 1, &[10], NOW - H)],
        vec![job(1, 2, 20, 1), owner],
    );
    let p = plan(&s, &Policy::default(), NOW);
    for pr in &p.preempt {
        assert!(!started(&p).contains(&pr.job));
    }
}

#[test]
fn owner_jobs_keep_their_victims_when_planning_again() {
    // Two owner jobs each reclaim a different guest on n2; once both guests are
    // stopping, the choice (and the reasons) must not change.
    let mut s = snap(
        vec![node(1, 1, 1, 3, "A100", 80), node(2, 1, 4, 4, "A100", 80)],
        vec![
            RunningJob {
                time_limit_s: 0,
                ..run(1000, 1, 1, &[1, 2], NOW - 1000)
            },
            run(1001, 2, 2, &[4, 5], NOW - 2000),
            run(1002, 2, 2, &[6], NOW - 3000),
        ],
        vec![job(1, 2, 20, 1), job(2, 1, 10, 2), job(3, 1, 10, 2)],
    );
    s.nodes[1].grace_s = 60;
    let p = plan(&s, &Policy::default(), NOW);
    // n1's free GPU could serve them too once job 1000 ends: no guest gets it.
    assert!(p.start.is_empty());
    assert_eq!(reason(&p, 1), Reason::OwnerReserved { node: "n1".into() });
    assert_eq!(preempted(&p), vec![1002, 1001]);
    let leaving = Reason::WaitingForGuestsToLeave {
        node: "n2".into(),
        grace_s: 60,
    };
    assert_eq!(reason(&p, 2), leaving);
    assert_eq!(reason(&p, 3), leaving);
    let again = plan(&apply(&s, &p, NOW), &Policy::default(), NOW);
    assert!(again.start.is_empty() && again.preempt.is_empty());
    assert_eq!(reason(&again, 3), leaving);
}

#[test]
fn member_quota_holds_when_an_owner_job_runs_elsewhere() {
    // Member 12 may hold 1 GPU. Job 5 claims the lab's free T4s; job 1 (no time limit)
    // then waits for the own node, job 4 (30 min) backfills on a claimed T4, and job 1
    // must not also start on the other lab's node.
    let mut j1 = job(1, 1, 12, 1);
    j1.time_limit_s = 0;
    let mut j4 = job(4, 1, 12, 1);
    j4.time_limit_s = 1800;
    let mut j5 = job(5, 1, 10, 3);
    j5.time_limit_s = 0;
    j5.models = vec!["T4".into()];
    let mut s = snap(
        vec![node(1, 3, 1, 3, "A100", 80), node(2, 1, 4, 3, "T4", 16)],
        vec![RunningJob {
            time_limit_s: 0,
            user: 10,
            ..run(100, 1, 2, &[4], NOW - H)
        }],
        vec![j1, j4, j5],
    );
    s.members = vec![MemberInfo {
        lab: 1,
        user: 12,
        quota: Quota {
            max_gpus: Some(1),
            ..Default::default()
        },
        ..Default::default()
    }];
    let p = plan(&s, &Policy::default(), NOW);
    assert_eq!(
        p.start,
        vec![Start {
            job: 4,
            node: 2,
            gpus: vec![5],
            share: None,
        }]
    );
    assert_eq!(
        reason(&p, 1).to_string(),
        "your quota in this lab: 1 of 1 GPUs in use"
    );
}
