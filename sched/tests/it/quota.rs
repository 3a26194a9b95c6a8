//! Quotas, table-driven: lab (borrowing) and member quotas on GPUs, GPU-hours and
//! time limits.

use crate::support::*;
use commons_sched::*;

/// (name, labs, members, the reason text if the job waits).
type Case = (
    &'static str,
    Vec<LabInfo>,
    Vec<MemberInfo>,
    Option<&'static str>,
);

#[test]
fn quota_table() {
    let lab2 = |quota: Quota, period: f64| LabInfo {
        id: 2,
        quota,
        period_gpu_hours: period,
        ..Default::default()
    };
    let member = |quota: Quota| MemberInfo {
        lab: 2,
        user: 20,
        quota,
        ..Default::default()
    };
    let gpus = |n| Quota {
        max_gpus: Some(n),
        ..Default::default()
    };
    let hours = |h| Quota {
        max_gpu_hours: Some(h),
        ..Default::default()
    };
    let longest = |s| Quota {
        max_time_limit_s: Some(s),
        ..Default::default()
    };
    // Lab 2 borrows 2 GPUs on node 1 (23 h of their 24-h limits left) and asks for 2.
    let cases: Vec<Case> = vec![
        ("no quota", vec![], vec![], None),
        ("lab gpus fit", vec![lab2(gpus(4), 0.0)], vec![], None),
        (
            "lab gpus full",
            vec![lab2(gpus(3), 0.0)],
            vec![],
            Some("lab quota: 2 of 3 GPUs in use"),
        ),
        (
            "member gpus full",
            vec![],
            vec![member(gpus(2))],
            Some("your quota in this lab: 2 of 2 GPUs in use"),
        ),
        ("lab hours fit", vec![lab2(hours(100.0), 50.0)], vec![], None),
        (
            "lab hours: committed running time counts",
            vec![lab2(hours(57.0), 10.0)],
            vec![],
            Some("lab quota: 56 of 57 GPU-hours used or committed this period, and this job may need 2"),
        ),
        (
            "member longest job",
            vec![],
            vec![member(longest(1800))],
            Some("your quota in this lab: jobs may run at most 30 min; lower the time limit"),
        ),
    ];
    for (name, labs, members, want) in cases {
        let mut r = run(100, 2, 1, &[10, 11], NOW - H);
        r.user = 20;
        let mut s = snap(
            vec![node(1, 1, 10, 8, "A100", 80)],
            vec![r],
            vec![job(1, 2, 20, 2)],
        );
        s.labs = labs;
        s.members = members;
        let p = plan(&s, &Policy::default(), NOW);
        match want {
            None => assert_eq!(started(&p), vec![1], "{name}: {p:?}"),
            Some(text) => {
                assert!(p.start.is_empty(), "{name}");
                assert_eq!(reason(&p, 1).to_string(), text, "{name}");
            }
        }
    }
}

#[test]
fn lab_quota_does_not_apply_on_own_nodes() {
    let mut s = snap(
        vec![node(1, 2, 10, 4, "A100", 80)],
        vec![],
        vec![job(1, 2, 20, 4)],
    );
    s.labs = vec![LabInfo {
        id: 2,
        quota: Quota {
            max_gpus: Some(0),
            ..Default::default()
        },
        ..Default::default()
    }];
    assert_eq!(started(&plan(&s, &Policy::default(), NOW)), vec![1]);
}

#[test]
fn quota_counts_starts_of_the_same_plan() {
    let mut s = snap(
        vec![node(1, 1, 10, 8, "A100", 80)],
        vec![],
        (1..=5).map(|i| job(i, 2, 20, 1)).collect(),
    );
    s.members = vec![MemberInfo {
        lab: 2,
        user: 20,
        quota: Quota {
            max_gpus: Some(3),
            ..Default::default()
        },
        ..Default::default()
    }];
    let p = plan(&s, &Policy::default(), NOW);
    assert_eq!(started(&p).len(), 3);
    assert_eq!(
        reason(&p, 4).to_string(),
        "your quota in this lab: 3 of 3 GPUs in use"
    );
    assert_eq!(
        p.pending.iter().map(|p| p.position).collect::<Vec<_>>(),
        vec![1, 2]
    );
}
