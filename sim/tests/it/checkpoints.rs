//! The checkpoint model with failures (`commons_sim::checkpoint`) in the engine: a
//! guest taken back keeps or loses its work according to whether it checkpoints and
//! whether its write fits the grace period, and `commons` uses what it knows of
//! checkpoints for the grace period and for sparing costly guests.

use crate::support::{campus, workload};
use commons_sim::checkpoint::CheckpointModel;
use commons_sim::{simulate, PolicyKind, SimOptions, SimOutput, Tuning};

/// Lab a owns one 8-GPU A100-80GB node; lab b none. Grace 60 s, checkpoints every 30 min.
const CAMPUS: &str = r#"
grace_seconds = 60
checkpoint_interval_minutes = 30
[[lab]]
name = "a"
tenants = ["va"]
nodes = 1
gpus_per_node = 8
gpu_model = "A100-80GB"
[[lab]]
name = "b"
tenants = ["vb"]
"#;

const H: i64 = 3600;
/// The owner job's run time (and exact time limit): 2 % of it, the most `commons`
/// delays it for guests' sake, is 2 hours.
const OWNER_S: i64 = 100 * H;

/// Lab b's 8-GPU guest (trace id 0) from 0 for `guest_s`, then lab a's 8-GPU job
/// (trace id 1) at `owner_at` for [`OWNER_S`].
fn run(
    policy: PolicyKind,
    model: Option<CheckpointModel>,
    guest_s: i64,
    owner_at: i64,
) -> SimOutput {
    run_tuned(policy, model, guest_s, owner_at, Tuning::default())
}

fn run_tuned(
    policy: PolicyKind,
    model: Option<CheckpointModel>,
    guest_s: i64,
    owner_at: i64,
    tuning: Tuning,
) -> SimOutput {
    let c = campus(CAMPUS);
    let w = workload(&c, &[(0, guest_s, 8, "vb"), (owner_at, OWNER_S, 8, "va")]);
    let opts = SimOptions {
        checkpoints: model,
        tuning,
        ..SimOptions::new(policy)
    };
    simulate(&c, &w, &opts, &mut |_| {}).unwrap()
}

fn model(share: f64, gbps: f64) -> Option<CheckpointModel> {
    Some(CheckpointModel {
        no_checkpoint_share: share,
        gbps: Some(gbps),
        seed: 1,
    })
}

/// Seconds the guest's checkpoint takes at `gbps`.
fn write_s(gbps: f64) -> i64 {
    let m = model(0.0, gbps).unwrap();
    m.write_s(m.fill(0), 8, 80 * 1024)
}

/// Lost GPU-seconds and the owner job's first start.
fn lost_and_owner_start(out: &SimOutput) -> (f64, Option<i64>) {
    (out.accounting.lost_gpu_s, out.jobs[1].first_start)
}

#[test]
fn a_save_that_fits_the_grace_keeps_everything_and_frees_the_gpus_early() {
    let t = 3 * H + 600;
    let w = write_s(1000.0);
    assert!(w <= 1, "{w}");
    let out = run(PolicyKind::CommonsOld, model(0.0, 1000.0), 10 * H, t);
    assert_eq!(out.preemptions, 1);
    assert_eq!(lost_and_owner_start(&out), (0.0, Some(t + w)));
}

#[test]
fn a_save_that_misses_the_grace_keeps_only_the_last_snapshot() {
    let t = 3 * H + 600;
    let w = write_s(1.0);
    assert!(w > 60, "{w}");
    let out = run(PolicyKind::CommonsOld, model(0.0, 1.0), 10 * H, t);
    // Killed at the end of the grace; the work since the 3 h snapshot is lost.
    assert_eq!(lost_and_owner_start(&out), (600.0 * 8.0, Some(t + 60)));
    // The older model without the flags: the grace counts as work, and is lost too.
    let old = run(PolicyKind::CommonsOld, None, 10 * H, t);
    assert_eq!(lost_and_owner_start(&old), (660.0 * 8.0, Some(t + 60)));
}

#[test]
fn a_job_that_never_checkpoints_loses_everything_and_leaves_at_once() {
    let t = 3 * H + 600;
    let out = run(PolicyKind::CommonsOld, model(1.0, 1.0), 10 * H, t);
    assert_eq!(lost_and_owner_start(&out), (t as f64 * 8.0, Some(t)));
    // It restarts from scratch: it finishes 10 h after its second start.
    let guest = &out.jobs[0];
    assert_eq!(guest.attempts, 2);
    assert_eq!(guest.finish, Some(t + OWNER_S + 10 * H));
}

#[test]
fn commons_gives_a_slow_writer_the_grace_its_save_needs() {
    let t = 3 * H + 600;
    let w = write_s(2.0);
    assert!(w > 60 && w * 5 / 4 <= 600, "{w}");
    let old = run(PolicyKind::CommonsOld, model(0.0, 2.0), 10 * H, t);
    assert_eq!(lost_and_owner_start(&old), (600.0 * 8.0, Some(t + 60)));
    // It wrote a periodic checkpoint in w seconds: commons waits for its save.
    let out = run(PolicyKind::Commons, model(0.0, 2.0), 10 * H, t);
    assert_eq!(lost_and_owner_start(&out), (0.0, Some(t + w)));
}

#[test]
fn commons_spares_a_guest_without_checkpoints_that_ends_soon_with_the_rule_on() {
    // The guest never checkpoints and ends at 4 h; the owner arrives at 3 h.
    let old = run(PolicyKind::CommonsOld, model(1.0, 1.0), 4 * H, 3 * H);
    let stopped = (3.0 * H as f64 * 8.0, Some(3 * H));
    assert_eq!(lost_and_owner_start(&old), stopped);
    // Off by default: stopped at once.
    let out = run(PolicyKind::Commons, model(1.0, 1.0), 4 * H, 3 * H);
    assert_eq!(lost_and_owner_start(&out), stopped);
    let on = Tuning {
        spare_costly_guests_gpu_hours: Some(8.0),
        ..Tuning::default()
    };
    let out = run_tuned(PolicyKind::Commons, model(1.0, 1.0), 4 * H, 3 * H, on);
    assert_eq!(out.preemptions, 0);
    assert_eq!(lost_and_owner_start(&out), (0.0, Some(4 * H)));
    // One that would run on past the two hours is stopped then.
    let out = run_tuned(PolicyKind::Commons, model(1.0, 1.0), 10 * H, 3 * H, on);
    let late = (5.0 * H as f64 * 8.0, Some(5 * H));
    assert_eq!(lost_and_owner_start(&out), late);
}
