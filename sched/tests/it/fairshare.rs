//! Fair share among guests, and backfill around reservations.

use crate::support::*;
use commons_sched::*;

fn lab(id: LabId, lent: f64, used: f64) -> LabInfo {
    LabInfo {
        id,
        lent_gpu_hours: lent,
        used_gpu_hours: used,
        ledger_at: NOW,
        ..Default::default()
    }
}

/// One free GPU on lab 1's node; guests of labs 2 and 3 both want it.
fn contest(labs: Vec<LabInfo>) -> Vec<JobId> {
    let mut s = snap(
        vec![node(1, 1, 10, 1, "A100", 80)],
        vec![],
        vec![job(1, 2, 20, 1), job(2, 3, 30, 1)],
    );
    s.labs = labs;
    started(&plan(&s, &Policy::default(), NOW))
}

#[test]
fn fair_share_table() {
    let cases: Vec<(&str, Vec<LabInfo>, Vec<JobId>)> = vec![
        ("equal standing: lower lab id", vec![], vec![1]),
        (
            "less usage first",
            vec![lab(2, 0.0, 100.0), lab(3, 0.0, 10.0)],
            vec![2],
        ),
        (
            "contribution outweighs usage",
            vec![lab(2, 2000.0, 100.0), lab(3, 0.0, 50.0)],
            vec![1],
        ),
        (
            "a lab without GPUs keeps its base share",
            vec![lab(2, 5000.0, 500.0), lab(3, 0.0, 0.0)],
            vec![2],
        ),
        (
            "usage decays with the half-life",
            vec![
                lab(2, 0.0, 100.0),
                LabInfo {
                    ledger_at: NOW - 4 * 7 * 24 * H,
                    ..lab(3, 0.0, 1000.0)
                },
            ],
            vec![2],
        ),
    ];
    for (name, labs, want) in cases {
        assert_eq!(contest(labs), want, "{name}");
    }
}

#[test]
fn members_with_less_usage_go_first_inside_a_lab() {
    let mut s = snap(
        vec![node(1, 1, 10, 1, "A100", 80)],
        vec![],
        vec![job(1, 2, 20, 1), job(2, 2, 21, 1)],
    );
    s.members = vec![MemberInfo {
        lab: 2,
        user: 20,
        used_gpu_hours: 50.0,
        ledger_at: NOW,
        ..Default::default()
    }];
    assert_eq!(started(&plan(&s, &Policy::default(), NOW)), vec![2]);
}

#[test]
fn one_plan_spreads_gpus_over_equal_labs() {
    let s = snap(
        vec![node(1, 1, 10, 2, "A100", 80)],
        vec![],
        vec![job(1, 2, 20, 1), job(2, 2, 20, 1), job(3, 3, 30, 1)],
    );
    let mut got = started(&plan(&s, &Policy::default(), NOW));
    got.sort();
    assert_eq!(got, vec![1, 3]);
}

#[test]
fn backfill_only_before_the_reserved_start() {
    // Node of lab 1: 4 GPUs, 2 held by a guest for 2 more hours. A 4-GPU job reserves
    // the node for then; a 1-h job backfills, a 3-h one waits behind it.
    let mut held = run(100, 3, 1, &[10, 11], NOW - 22 * H);
    held.time_limit_s = 24 * H;
    let big = job(1, 2, 20, 4);
    let small = job(2, 2, 20, 1);
    let mut long = job(3, 2, 20, 1);
    long.time_limit_s = 3 * H;
    let s = snap(
        vec![node(1, 1, 10, 4, "A100", 80)],
        vec![held],
        vec![big, small, long],
    );
    let p = plan(&s, &Policy::default(), NOW);
    assert_eq!(started(&p), vec![2]);
    assert_eq!(reason(&p, 1), Reason::WaitingForGpus { gpus: 4 });
    assert_eq!(reason(&p, 3), Reason::BehindEarlierJob { job: 1 });
    assert_eq!(
        p.pending
            .iter()
            .map(|p| (p.job, p.position))
            .collect::<Vec<_>>(),
        vec![(1, 1), (3, 2)]
    );
}
