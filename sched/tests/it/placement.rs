//! Placement: gang placement, model and memory, MIG instances, best fit, reasons.

use crate::support::*;
use commons_sched::*;

fn mig(id: GpuId, profile: &str, gb: u64) -> Gpu {
    Gpu {
        id,
        model: "A100-80GB".into(),
        memory_mb: gb * 1024,
        mig_profile: Some(profile.into()),
        ..Default::default()
    }
}

/// (name, job, nodes, where it starts or the reason text).
type Case = (
    &'static str,
    QueuedJob,
    Vec<Node>,
    Result<(NodeId, Vec<GpuId>), &'static str>,
);

#[test]
fn placement_table() {
    let mut big = job(1, 2, 20, 1);
    big.min_memory_mb = 80 * 1024;
    let mut h100 = job(1, 2, 20, 1);
    h100.models = vec!["H100".into()];
    let mut slice = job(1, 2, 20, 1);
    slice.mig_profile = Some("1g.10gb".into());
    let mut any3 = job(1, 2, 20, 3);
    any3.time_limit_s = H;

    let mut with_mig = node(3, 1, 30, 1, "A100-80GB", 80);
    with_mig.gpus.push(mig(31, "1g.10gb", 10));
    with_mig.gpus.push(mig(32, "3g.40gb", 40));

    let nodes = || {
        vec![
            node(1, 1, 10, 2, "A100-40GB", 40),
            node(2, 1, 20, 4, "A100-80GB", 80),
            with_mig.clone(),
        ]
    };
    let cases: Vec<Case> = vec![
        (
            "best fit: fewest free GPUs left",
            job(1, 2, 20, 1),
            nodes(),
            Ok((1, vec![10])),
        ),
        (
            "memory",
            big.clone(),
            vec![
                node(1, 1, 10, 2, "A100-40GB", 40),
                node(2, 1, 20, 4, "A100-80GB", 80),
            ],
            Ok((2, vec![20])),
        ),
        (
            "gang on one node",
            any3.clone(),
            nodes(),
            Ok((2, vec![20, 21, 22])),
        ),
        ("MIG profile", slice.clone(), nodes(), Ok((3, vec![31]))),
        (
            "unknown model",
            h100.clone(),
            nodes(),
            Err("no server on campus has 1 matching GPUs (model H100)"),
        ),
        (
            "gang too big for any node",
            job(1, 2, 20, 5),
            nodes(),
            Err("no server on campus has 5 matching GPUs (of any model)"),
        ),
    ];
    for (name, j, nodes, want) in cases {
        let p = plan(&snap(nodes, vec![], vec![j]), &Policy::default(), NOW);
        match want {
            Ok((node, gpus)) => assert_eq!(
                p.start,
                vec![Start {
                    job: 1,
                    node,
                    gpus,
                    share: None
                }],
                "{name}"
            ),
            Err(text) => assert_eq!(reason(&p, 1).to_string(), text, "{name}"),
        }
    }
}

#[test]
fn whole_gpu_jobs_do_not_land_on_mig_slices() {
    let mut n = node(1, 1, 10, 0, "A100-80GB", 80);
    n.gpus.push(mig(11, "3g.40gb", 40));
    let p = plan(
        &snap(vec![n], vec![], vec![job(1, 2, 20, 1)]),
        &Policy::default(),
        NOW,
    );
    assert!(p.start.is_empty());
}

#[test]
fn busy_memory_request_says_what_it_waits_for() {
    let mut big = job(1, 2, 20, 1);
    big.min_memory_mb = 80 * 1024;
    let s = snap(
        vec![
            node(1, 1, 10, 1, "A100-80GB", 80),
            node(2, 1, 20, 1, "A100-40GB", 40),
        ],
        vec![run(100, 3, 1, &[10], NOW - H)],
        vec![big],
    );
    let p = plan(&s, &Policy::default(), NOW);
    assert_eq!(
        reason(&p, 1).to_string(),
        "waiting: no 1 free GPU with at least 80 GB"
    );
}

#[test]
fn busy_and_held_gpus_are_never_reused() {
    let mut n = node(1, 1, 10, 3, "A100", 80);
    n.gpus[1].local_use = true;
    let s = snap(
        vec![n],
        vec![run(100, 1, 1, &[10], NOW - H)],
        vec![job(1, 2, 20, 1), job(2, 2, 20, 1)],
    );
    let p = plan(&s, &Policy::default(), NOW);
    assert_eq!(
        p.start,
        vec![Start {
            job: 1,
            node: 1,
            gpus: vec![12],
            share: None,
        }]
    );
    assert_eq!(reason(&p, 2), Reason::WaitingForGpus { gpus: 1 });
}

#[test]
fn offline_nodes_take_nothing() {
    let mut n = node(1, 1, 10, 2, "A100", 80);
    n.schedulable = false;
    let p = plan(
        &snap(vec![n], vec![], vec![job(1, 2, 20, 1), job(2, 1, 10, 1)]),
        &Policy::default(),
        NOW,
    );
    assert!(p.start.is_empty());
    assert_eq!(p.pending.len(), 2);
}

#[test]
fn extreme_values_do_not_panic() {
    let mut n = node(1, 1, 10, 2, "A100", 80);
    n.gpus[0].idle_since = Time::MAX;
    n.lending.min_idle_s = i64::MAX;
    n.lending.mode = LendMode::Windows;
    n.lending.windows = vec![WeeklyWindow {
        start_minute: 0,
        end_minute: 0,
    }];
    n.grace_s = u32::MAX;
    let mut own = node(2, 2, 20, 2, "A100", 80);
    own.lending.max_guest_time_limit_s = Some(i64::MAX);
    let mut huge = job(1, 2, 20, 2);
    huge.time_limit_s = i64::MAX;
    huge.submitted_at = Time::MIN;
    let mut guest = run(100, 1, 2, &[20, 21], Time::MIN);
    guest.time_limit_s = i64::MAX;
    guest.last_checkpoint_at = Some(Time::MIN);
    let mut s = snap(
        vec![n, own],
        vec![guest],
        vec![huge, job(2, 1, 10, u32::MAX)],
    );
    s.labs = vec![LabInfo {
        id: 2,
        quota: Quota {
            max_gpus: Some(u32::MAX),
            max_gpu_hours: Some(f64::MAX),
            max_time_limit_s: Some(i64::MAX),
        },
        used_gpu_hours: f64::MAX,
        lent_gpu_hours: f64::NAN,
        ledger_at: Time::MIN,
        ..Default::default()
    }];
    for now in [Time::MIN, 0, NOW, Time::MAX] {
        let p = plan(&s, &Policy::default(), now);
        assert_eq!(p.start.len() + p.pending.len(), 2);
    }
}
