//! Interactive jobs in the simulator: their waits reported apart from batch jobs', and
//! `commons-boost` (every lab's interactive boost on) letting them go first in their lab.

use crate::support::{campus, run, times, HEADER};
use commons_sim::trace::parse_trace;
use commons_sim::{PolicyKind, Workload};

const ONE_GPU: &str = r#"
[[lab]]
name = "a"
tenants = ["va"]
nodes = 1
gpus_per_node = 1
"#;

/// Rows of `(submit, duration, interactive)`, one GPU each, in lab a.
fn jobs(rows: &[(i64, i64, bool)]) -> Workload {
    let mut text = HEADER.trim_end().to_string() + ",interactive\n";
    for (i, (submit, duration, interactive)) in rows.iter().enumerate() {
        text += &format!(
            "{i},{submit},-,{duration},1,va,{i},{}\n",
            u8::from(*interactive)
        );
    }
    Workload::new(&parse_trace(&text, None).unwrap(), &campus(ONE_GPU)).unwrap()
}

#[test]
fn interactive_waits_are_reported_apart_and_the_boost_shortens_them() {
    let c = campus(ONE_GPU);
    // Two batch jobs hold the one GPU for 100 s each; a 10 s interactive job comes last.
    let w = jobs(&[(0, 100, false), (1, 100, false), (2, 10, true)]);
    for p in [PolicyKind::Isolated, PolicyKind::Commons] {
        let (out, m) = run(&c, &w, p);
        assert_eq!(
            times(&out),
            vec![
                (Some(0), Some(100)),
                (Some(100), Some(200)),
                (Some(200), Some(210))
            ],
            "{p}"
        );
        assert_eq!(m.interactive_jobs, 1);
        assert_eq!(m.interactive_wait_mean_s, Some(198.0), "{p}");
        assert_eq!(m.interactive_wait_p95_s, Some(198.0), "{p}");
        assert_eq!(m.batch_wait_mean_s, Some(49.5), "{p}");
        assert_eq!(m.batch_wait_p95_s, Some(99.0), "{p}");
    }
    let (out, m) = run(&c, &w, PolicyKind::CommonsBoost);
    assert_eq!(
        times(&out),
        vec![
            (Some(0), Some(100)),
            (Some(110), Some(210)),
            (Some(100), Some(110))
        ]
    );
    assert_eq!(m.interactive_wait_mean_s, Some(98.0));
    assert_eq!(m.batch_wait_mean_s, Some(54.5));
}

#[test]
fn a_boosted_job_behind_a_long_queue_is_seen_by_the_scheduler() {
    // Ten batch jobs queue in lab a, more than the scheduler's window of 8 per lab; the
    // interactive job comes after them and still takes the GPU first.
    let c = campus(ONE_GPU);
    let mut rows: Vec<(i64, i64, bool)> = (0..10).map(|i| (i, 100, false)).collect();
    rows.push((20, 10, true));
    let w = jobs(&rows);
    let (out, _) = run(&c, &w, PolicyKind::CommonsBoost);
    assert_eq!(out.jobs[10].first_start, Some(100));
    let (out, _) = run(&c, &w, PolicyKind::Commons);
    assert_eq!(out.jobs[10].first_start, Some(1000), "unboosted: last");
}

#[test]
fn the_boost_policy_is_named_and_not_run_by_default() {
    assert_eq!(
        "commons-boost".parse::<PolicyKind>().unwrap(),
        PolicyKind::CommonsBoost
    );
    assert!(!PolicyKind::ALL.contains(&PolicyKind::CommonsBoost));
}
