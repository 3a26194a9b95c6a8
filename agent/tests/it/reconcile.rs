//! Table tests for `reconcile`: one row per situation an attempt can be in, with the one
//! step expected next; then the properties that hold across rows (order, one step each).
//! The rows about checkpoints are in `reconcile_checkpoints`, with these helpers.

use commons_agent::reconcile::{
    reconcile, Action, Assignment, AttemptResult, ContainerObs, Launch, Phase, StopOrder, Stopping,
    UploadStage, Why, ENFORCE_GRACE,
};
use commons_proto::{AttemptState, JobSpec, StopReason};
use std::sync::Arc;
use std::time::Duration;

/// "Now" in every row: boot-clock time (a day after boot).
pub(crate) const NOW: Duration = Duration::from_secs(86_400);
const LIMIT_S: u64 = 60;

pub(crate) fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn launch() -> Arc<Launch> {
    Arc::new(Launch {
        spec: JobSpec {
            inputs: Vec::new(),
            datasets: Vec::new(),
            image: "commons-demo:latest".into(),
            command: vec!["true".into()],
            env: Default::default(),
            cpus: 1.0,
            memory_mb: 128,
            time_limit_s: LIMIT_S,
            user: "alice".into(),
            checkpoint_interval_s: None,
            shm_mb: None,
            interactive: false,
            guest: false,
            lab: None,
            grace_s: None,
            image_digest: None,
            image_signature: None,
            image_campus: true,
            disk_gb: None,
            gpu_share: None,
        },
        gpus: vec![],
        resume: false,
    })
}

/// Wanted by the portal, lease well ahead.
pub(crate) fn want(job: i64) -> Assignment {
    Assignment {
        job,
        attempt: 1,
        launch: Some(launch()),
        lease_until: NOW + secs(100),
        stop: None,
        acknowledged: false,
    }
}

pub(crate) fn ordered(mut w: Assignment, grace_s: u64, why: Why) -> Assignment {
    w.stop = Some(StopOrder {
        grace: secs(grace_s),
        why,
    });
    w
}

pub(crate) fn cancelled() -> Why {
    Why::ordered(StopReason::Cancelled, None)
}

pub(crate) fn preempted() -> Why {
    Why::ordered(StopReason::Preempted, Some("the owner lab needs its GPUs"))
}

pub(crate) fn lease_why() -> Why {
    Why::of(StopReason::LeaseExpired)
}

pub(crate) fn limit_why() -> Why {
    Why::of(StopReason::TimeLimit)
}

fn lease(mut w: Assignment, until: Duration) -> Assignment {
    w.lease_until = until;
    w
}

fn acked(mut w: Assignment) -> Assignment {
    w.acknowledged = true;
    w
}

pub(crate) fn adopted(mut w: Assignment) -> Assignment {
    w.launch = None;
    w
}

pub(crate) fn c(id: &str) -> String {
    id.to_string()
}

/// Observed in `phase`, time limit well ahead.
pub(crate) fn have(job: i64, phase: Phase) -> ContainerObs {
    ContainerObs::new(job, 1, phase, Some(NOW + secs(50)))
}

pub(crate) fn running(job: i64) -> ContainerObs {
    have(job, Phase::Running { container: c("c1") })
}

pub(crate) fn ended(job: i64, code: i64) -> ContainerObs {
    have(
        job,
        Phase::Ended {
            container: c("c1"),
            exit_code: code,
        },
    )
}

/// Being stopped by this agent since `NOW - 1 s`, with `grace_s`.
pub(crate) fn stopping(mut h: ContainerObs, why: Why, grace_s: u64) -> ContainerObs {
    h.stopping = Some(Stopping {
        why,
        grace: secs(grace_s),
        since: NOW - secs(1),
        issued: true,
    });
    h
}

/// A stop an earlier agent began `ago_s` seconds ago (restored from disk, not issued).
fn restored_stop(mut h: ContainerObs, why: Why, grace_s: u64, ago_s: u64) -> ContainerObs {
    h.stopping = Some(Stopping {
        why,
        grace: secs(grace_s),
        since: NOW - secs(ago_s),
        issued: false,
    });
    h
}

fn deadline(mut h: ContainerObs, at: Option<Duration>) -> ContainerObs {
    h.deadline = at;
    h
}

/// Recorded and saved in `result.json`.
pub(crate) fn recorded(mut h: ContainerObs, r: AttemptResult) -> ContainerObs {
    h.result = Some(r);
    h.saved = true;
    h
}

fn unsaved(mut h: ContainerObs) -> ContainerObs {
    h.saved = false;
    h
}

/// Its upload after the end (outputs, checkpoint) is over.
fn sent(mut h: ContainerObs) -> ContainerObs {
    h.upload = UploadStage::Done;
    h
}

fn reported(mut h: ContainerObs) -> ContainerObs {
    h.reported = true;
    h
}

pub(crate) fn exited(code: i64) -> AttemptResult {
    AttemptResult {
        state: AttemptState::Exited,
        exit_code: Some(code),
        stop: None,
        reason: None,
    }
}

pub(crate) fn stopped(exit_code: Option<i64>, why: Why) -> AttemptResult {
    AttemptResult {
        state: AttemptState::Stopped,
        exit_code,
        stop: Some(why.reason),
        reason: Some(why.text),
    }
}

pub(crate) fn failed(reason: &str) -> AttemptResult {
    AttemptResult {
        state: AttemptState::Failed,
        exit_code: None,
        stop: None,
        reason: Some(reason.into()),
    }
}

/// A fresh stop, now, with `grace`.
pub(crate) fn stop(job: i64, grace: Duration, why: Why) -> Action {
    Action::Stop {
        job,
        attempt: 1,
        container: c("c1"),
        grace,
        stopping: Stopping {
            why,
            grace,
            since: NOW,
            issued: true,
        },
    }
}

/// A stop re-issued with `left` of the `grace` an earlier agent began `ago_s` seconds ago.
fn restop(job: i64, left: Duration, why: Why, grace_s: u64, ago_s: u64) -> Action {
    Action::Stop {
        job,
        attempt: 1,
        container: c("c1"),
        grace: left,
        stopping: Stopping {
            why,
            grace: secs(grace_s),
            since: NOW - secs(ago_s),
            issued: true,
        },
    }
}

fn found(job: i64, running: bool) -> ContainerObs {
    have(
        job,
        Phase::Found {
            container: c("c1"),
            running,
        },
    )
}

fn adopt(job: i64, running: bool) -> Action {
    Action::Adopt {
        job,
        attempt: 1,
        container: c("c1"),
        running,
    }
}

fn record(job: i64, r: AttemptResult) -> Action {
    Action::Record {
        job,
        attempt: 1,
        result: r,
    }
}

pub(crate) struct Row {
    name: &'static str,
    want: Vec<Assignment>,
    have: Vec<ContainerObs>,
    expect: Vec<Action>,
}

pub(crate) fn row(
    name: &'static str,
    want: Vec<Assignment>,
    have: Vec<ContainerObs>,
    expect: Vec<Action>,
) -> Row {
    Row {
        name,
        want,
        have,
        expect,
    }
}

fn rows() -> Vec<Row> {
    vec![
        row("nothing wanted, nothing here", vec![], vec![], vec![]),
        row(
            "a wanted attempt with no container starts, its deadline its time limit from now",
            vec![want(1)],
            vec![],
            vec![Action::Start {
                job: 1,
                attempt: 1,
                launch: launch(),
                deadline: NOW + secs(LIMIT_S),
            }],
        ),
        row(
            "an attempt stopped before it started never starts, and says why as the portal did",
            vec![ordered(want(1), 30, cancelled())],
            vec![],
            vec![record(1, stopped(None, cancelled()))],
        ),
        row(
            "an attempt whose lease ran out before it started never starts",
            vec![lease(want(1), NOW - secs(1))],
            vec![],
            vec![record(1, stopped(None, lease_why()))],
        ),
        row(
            "a restored attempt with neither container nor result is lost (requeued), not failed",
            vec![adopted(want(1))],
            vec![],
            vec![record(
                1,
                stopped(None, Why::lost("the container is not on this server")),
            )],
        ),
        row(
            "a container being created is left alone, even when asked to stop",
            vec![ordered(want(1), 30, cancelled())],
            vec![have(1, Phase::Creating)],
            vec![],
        ),
        row(
            "a running container within lease and limit is left alone",
            vec![want(1)],
            vec![running(1)],
            vec![],
        ),
        row(
            "the portal's stop uses the portal's grace, reason and detail",
            vec![ordered(want(1), 30, preempted())],
            vec![running(1)],
            vec![stop(1, secs(30), preempted())],
        ),
        row(
            "a container is stopped once: a second reason changes nothing",
            vec![ordered(want(1), 30, cancelled())],
            vec![stopping(running(1), limit_why(), 10)],
            vec![],
        ),
        row(
            "a lease that ran out stops the container with the enforcement grace",
            vec![lease(want(1), NOW - secs(1))],
            vec![running(1)],
            vec![stop(1, ENFORCE_GRACE, lease_why())],
        ),
        row(
            "a lease that ends right now has not run out",
            vec![lease(want(1), NOW)],
            vec![running(1)],
            vec![],
        ),
        row(
            "a restored attempt without a lease on disk (lease zero) is stopped as lease-expired",
            vec![lease(adopted(want(1)), Duration::ZERO)],
            vec![deadline(running(1), None)],
            vec![stop(1, ENFORCE_GRACE, lease_why())],
        ),
        row(
            "a passed time limit stops the container",
            vec![want(1)],
            vec![deadline(running(1), Some(NOW - secs(1)))],
            vec![stop(1, ENFORCE_GRACE, limit_why())],
        ),
        row(
            "the time limit is reached at the deadline itself",
            vec![want(1)],
            vec![deadline(running(1), Some(NOW))],
            vec![stop(1, ENFORCE_GRACE, limit_why())],
        ),
        row(
            "no known deadline, no time limit",
            vec![want(1)],
            vec![deadline(running(1), None)],
            vec![],
        ),
        row(
            "the portal's order wins over an expired lease and a passed limit",
            vec![lease(ordered(want(1), 5, cancelled()), NOW - secs(1))],
            vec![deadline(running(1), Some(NOW - secs(1)))],
            vec![stop(1, secs(5), cancelled())],
        ),
        row(
            "an expired lease wins over a passed limit",
            vec![lease(want(1), NOW - secs(1))],
            vec![deadline(running(1), Some(NOW - secs(1)))],
            vec![stop(1, ENFORCE_GRACE, lease_why())],
        ),
        row(
            "a stop an earlier agent began is issued again with what is left of its grace",
            vec![adopted(want(1))],
            vec![restored_stop(running(1), preempted(), 30, 20)],
            vec![restop(1, secs(10), preempted(), 30, 20)],
        ),
        row(
            "a re-stop whose grace has passed kills at once, and keeps its first reason",
            vec![ordered(adopted(want(1)), 60, cancelled())],
            vec![restored_stop(running(1), preempted(), 30, 45)],
            vec![restop(1, Duration::ZERO, preempted(), 30, 45)],
        ),
        row(
            "a running container found after a restart is adopted",
            vec![adopted(want(1))],
            vec![found(1, true)],
            vec![adopt(1, true)],
        ),
        row(
            "a found container is adopted even when its limit passed (stopped next)",
            vec![adopted(want(1))],
            vec![deadline(found(1, true), Some(NOW - secs(5)))],
            vec![adopt(1, true)],
        ),
        row(
            "a container found ended is adopted to read its exit code",
            vec![lease(adopted(want(1)), Duration::ZERO)],
            vec![found(1, false)],
            vec![adopt(1, false)],
        ),
        row(
            "an ended container being drained is never stopped, even with its lease gone",
            vec![lease(adopted(want(1)), Duration::ZERO)],
            vec![deadline(
                have(1, Phase::Draining { container: c("c1") }),
                Some(NOW - secs(1)),
            )],
            vec![],
        ),
        row(
            "a container that ended by itself records its exit code",
            vec![want(1)],
            vec![ended(1, 7)],
            vec![record(1, exited(7))],
        ),
        row(
            "a container that ended after our stop records the stop's reason",
            vec![want(1)],
            vec![stopping(ended(1, 143), cancelled(), 30)],
            vec![record(1, stopped(Some(143), cancelled()))],
        ),
        row(
            "a container the guard stopped while the agent was down records the guard's reason",
            vec![adopted(want(1))],
            vec![restored_stop(ended(1, 143), limit_why(), 10, 60)],
            vec![record(1, stopped(Some(143), limit_why()))],
        ),
        row(
            "a container the engine lost is stopped as Lost (requeued), not failed",
            vec![want(1)],
            vec![have(
                1,
                Phase::Lost {
                    container: c("c1"),
                    error: "gone".into(),
                },
            )],
            vec![record(1, stopped(None, Why::lost("gone")))],
        ),
        row(
            "a container lost while stopping counts as stopped for the stop's reason",
            vec![want(1)],
            vec![stopping(
                have(
                    1,
                    Phase::Lost {
                        container: c("c1"),
                        error: "gone".into(),
                    },
                ),
                cancelled(),
                30,
            )],
            vec![record(1, stopped(None, cancelled()))],
        ),
        row(
            "a container that vanished with no result is lost",
            vec![adopted(want(1))],
            vec![have(1, Phase::Removed)],
            vec![record(
                1,
                stopped(None, Why::lost("the container vanished")),
            )],
        ),
        row(
            "a container that could not be created is a failure with the runtime's words",
            vec![want(1)],
            vec![have(
                1,
                Phase::NotCreated {
                    error: "image missing".into(),
                },
            )],
            vec![record(1, failed("image missing"))],
        ),
        row(
            "only a saved result lets the container go",
            vec![want(1)],
            vec![recorded(ended(1, 0), exited(0))],
            vec![Action::Remove {
                job: 1,
                attempt: 1,
                container: c("c1"),
            }],
        ),
        row(
            "a result not yet on disk is recorded again, and the container stays",
            vec![want(1)],
            vec![unsaved(recorded(ended(1, 0), exited(0)))],
            vec![record(1, exited(0))],
        ),
        row(
            "a result restored from disk whose container is still there removes it",
            vec![adopted(want(1))],
            vec![recorded(found(1, false), exited(3))],
            vec![Action::Remove {
                job: 1,
                attempt: 1,
                container: c("c1"),
            }],
        ),
        row(
            "a removal under way is left alone",
            vec![want(1)],
            vec![recorded(
                have(1, Phase::Removing { container: c("c1") }),
                exited(0),
            )],
            vec![],
        ),
        row(
            "once removed, its /outputs are sent",
            vec![want(1)],
            vec![recorded(have(1, Phase::Removed), exited(0))],
            vec![Action::Upload { job: 1, attempt: 1 }],
        ),
        row(
            "once removed and its /outputs sent, the result is reported",
            vec![want(1)],
            vec![sent(recorded(have(1, Phase::Removed), exited(0)))],
            vec![Action::Report {
                job: 1,
                attempt: 1,
                result: exited(0),
            }],
        ),
        row(
            "a failure to create is reported without a removal",
            vec![want(1)],
            vec![recorded(
                have(1, Phase::NotCreated { error: "x".into() }),
                failed("x"),
            )],
            vec![Action::Report {
                job: 1,
                attempt: 1,
                result: failed("x"),
            }],
        ),
        row(
            "a reported result stays until the portal acknowledges it",
            vec![want(1)],
            vec![reported(recorded(have(1, Phase::Removed), exited(0)))],
            vec![],
        ),
        row(
            "a restored, reported result stays until the portal acknowledges it",
            vec![adopted(want(1))],
            vec![reported(recorded(have(1, Phase::Removed), exited(0)))],
            vec![],
        ),
        row(
            "an acknowledged, reported attempt is forgotten",
            vec![acked(want(1))],
            vec![reported(recorded(have(1, Phase::Removed), exited(0)))],
            vec![Action::Forget { job: 1, attempt: 1 }],
        ),
        row(
            "an acknowledged attempt is not forgotten before it is reported",
            vec![acked(want(1))],
            vec![sent(recorded(have(1, Phase::Removed), exited(0)))],
            vec![Action::Report {
                job: 1,
                attempt: 1,
                result: exited(0),
            }],
        ),
        row(
            "an acknowledgement does not stop a running container",
            vec![acked(want(1))],
            vec![running(1)],
            vec![],
        ),
        row(
            "several attempts: one step each, in (job, attempt) order",
            vec![want(3), ordered(want(2), 1, cancelled())],
            vec![running(2), ended(1, 0)],
            vec![
                record(1, exited(0)),
                stop(2, secs(1), cancelled()),
                Action::Start {
                    job: 3,
                    attempt: 1,
                    launch: launch(),
                    deadline: NOW + secs(LIMIT_S),
                },
            ],
        ),
    ]
}

#[test]
fn each_situation_gives_its_one_next_step() {
    check(&rows());
}

/// Runs a table: every row's actions must be exactly the expected ones.
pub(crate) fn check(rows: &[Row]) {
    let mut failures = Vec::new();
    for r in rows {
        let got = reconcile(&r.want, &r.have, NOW);
        if got != r.expect {
            failures.push(format!(
                "{}:\n  expected {:?}\n  got      {:?}",
                r.name, r.expect, got
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} rows failed:\n{}",
        failures.len(),
        rows.len(),
        failures.join("\n")
    );
}

#[test]
fn a_portal_stop_says_its_reason_and_detail_in_words() {
    assert_eq!(preempted().text, "preempted: the owner lab needs its GPUs");
    assert_eq!(cancelled().text, "cancelled");
    assert_eq!(
        Why::ordered(StopReason::Cancelled, Some("  ")).text,
        "cancelled",
        "a blank detail adds nothing"
    );
    assert_eq!(lease_why().reason, StopReason::LeaseExpired);
    assert!(lease_why().text.starts_with("lease expired"));
}

#[test]
fn the_same_inputs_in_any_order_give_the_same_actions() {
    let want = vec![
        want(5),
        ordered(want(2), 1, cancelled()),
        lease(want(9), NOW - secs(1)),
    ];
    let have = vec![running(9), running(2), ended(4, 1)];
    let a = reconcile(&want, &have, NOW);
    let mut rwant = want.clone();
    rwant.reverse();
    let mut rhave = have.clone();
    rhave.reverse();
    assert_eq!(reconcile(&rwant, &rhave, NOW), a);
    let keys: Vec<_> = a.iter().map(Action::key).collect();
    let mut sorted = keys.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(keys, sorted, "ordered, at most one action per attempt");
}

/// Applying each step as the executor would must bring a finished attempt from its end to
/// being forgotten, and never remove a container before its result is recorded.
#[test]
fn a_finished_attempt_walks_record_remove_upload_report_forget() {
    let mut w = want(1);
    let mut h = ended(1, 0);
    let mut steps = Vec::new();
    for _ in 0..10 {
        let actions = reconcile(std::slice::from_ref(&w), std::slice::from_ref(&h), NOW);
        let Some(a) = actions.into_iter().next() else {
            // Waits for the acknowledgement, then goes.
            if w.acknowledged {
                break;
            }
            w.acknowledged = true;
            continue;
        };
        steps.push(
            format!("{a:?}")
                .split([' ', '{'])
                .next()
                .unwrap()
                .to_string(),
        );
        match a {
            Action::Record { result, .. } => {
                h.result = Some(result);
                h.saved = true;
            }
            Action::Remove { .. } => {
                assert!(h.result.is_some() && h.saved, "removed before saved");
                h.phase = Phase::Removed;
            }
            Action::Upload { .. } => h.upload = UploadStage::Done,
            Action::Report { .. } => {
                assert_eq!(
                    h.upload,
                    UploadStage::Done,
                    "reported before /outputs were sent"
                );
                h.reported = true
            }
            Action::Forget { .. } => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(steps, ["Record", "Remove", "Upload", "Report", "Forget"]);
}
