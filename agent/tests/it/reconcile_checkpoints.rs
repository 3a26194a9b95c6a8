//! Table tests for `reconcile`'s checkpoint steps: periodic snapshots while an attempt
//! runs, and the upload after it stopped, which comes before its report (and hides its
//! final state from heartbeats until it is over).

use super::reconcile::*;
use commons_agent::reconcile::{
    reconcile, uploads_before_report, uploads_checkpoint, Action, AttemptResult, ContainerObs,
    Phase, Snapshots, UploadStage, Why,
};
use commons_proto::{AttemptState, StopReason};

/// Periodic snapshots every 60 s, the next due `due_in_s` from now (negative: overdue).
fn snapshots(mut h: ContainerObs, due_in_s: i64, busy: bool) -> ContainerObs {
    let next = if due_in_s >= 0 {
        NOW + secs(due_in_s.unsigned_abs())
    } else {
        NOW - secs(due_in_s.unsigned_abs())
    };
    h.snapshots = Some(Snapshots {
        every: secs(60),
        next,
        busy,
    });
    h
}

fn upload(mut h: ContainerObs, stage: UploadStage) -> ContainerObs {
    h.upload = stage;
    h
}

fn snapshot(job: i64) -> Action {
    Action::Snapshot {
        job,
        attempt: 1,
        next: NOW + secs(60),
    }
}

fn upload_of(job: i64) -> Action {
    Action::Upload { job, attempt: 1 }
}

fn report(job: i64, r: AttemptResult) -> Action {
    Action::Report {
        job,
        attempt: 1,
        result: r,
    }
}

fn rows() -> Vec<Row> {
    vec![
        row(
            "a running attempt whose snapshot is due takes one; the next is due an interval on",
            vec![want(1)],
            vec![snapshots(running(1), -5, false)],
            vec![snapshot(1)],
        ),
        row(
            "a snapshot due right now is taken",
            vec![want(1)],
            vec![snapshots(running(1), 0, false)],
            vec![snapshot(1)],
        ),
        row(
            "a snapshot not yet due waits",
            vec![want(1)],
            vec![snapshots(running(1), 5, false)],
            vec![],
        ),
        row(
            "one snapshot at a time: none while one is in flight",
            vec![want(1)],
            vec![snapshots(running(1), -5, true)],
            vec![],
        ),
        row(
            "a stop wins over a due snapshot",
            vec![ordered(want(1), 30, preempted())],
            vec![snapshots(running(1), -5, false)],
            vec![stop(1, secs(30), preempted())],
        ),
        row(
            "no snapshot while a stop is under way",
            vec![ordered(want(1), 30, preempted())],
            vec![snapshots(stopping(running(1), preempted(), 30), -5, false)],
            vec![],
        ),
        row(
            "a preempted attempt, removed, uploads its checkpoint before it is reported",
            vec![ordered(want(1), 30, preempted())],
            vec![recorded(
                have(1, Phase::Removed),
                stopped(Some(143), preempted()),
            )],
            vec![upload_of(1)],
        ),
        row(
            "so does one cancelled, one whose lease or time limit ran out, and one lost",
            vec![want(2), want(3), want(4), want(5)],
            vec![
                recorded(have(2, Phase::Removed), stopped(Some(143), cancelled())),
                recorded(have(3, Phase::Removed), stopped(Some(143), lease_why())),
                recorded(have(4, Phase::Removed), stopped(Some(143), limit_why())),
                recorded(have(5, Phase::Removed), stopped(None, Why::lost("gone"))),
            ],
            vec![upload_of(2), upload_of(3), upload_of(4), upload_of(5)],
        ),
        row(
            "the upload waits for its container's removal",
            vec![want(1)],
            vec![recorded(ended(1, 143), stopped(Some(143), preempted()))],
            vec![Action::Remove {
                job: 1,
                attempt: 1,
                container: c("c1"),
            }],
        ),
        row(
            "an upload under way holds the report",
            vec![want(1)],
            vec![upload(
                recorded(have(1, Phase::Removed), stopped(Some(143), preempted())),
                UploadStage::Busy,
            )],
            vec![],
        ),
        row(
            "once the upload is over, the stop is reported",
            vec![want(1)],
            vec![upload(
                recorded(have(1, Phase::Removed), stopped(Some(143), preempted())),
                UploadStage::Done,
            )],
            vec![report(1, stopped(Some(143), preempted()))],
        ),
        row(
            "a snapshot in flight holds the upload (it was cancelled and ends soon)",
            vec![want(1)],
            vec![snapshots(
                recorded(have(1, Phase::Removed), stopped(Some(143), preempted())),
                -5,
                true,
            )],
            vec![],
        ),
        row(
            "a snapshot in flight holds even the report of an exit",
            vec![want(1)],
            vec![snapshots(
                recorded(have(1, Phase::Removed), exited(0)),
                -5,
                true,
            )],
            vec![],
        ),
        row(
            "an attempt that exited by itself uploads its /outputs (no checkpoint): exit 0",
            vec![want(1)],
            vec![recorded(have(1, Phase::Removed), exited(0))],
            vec![upload_of(1)],
        ),
        row(
            "an attempt that exited by itself uploads its /outputs: a failure code",
            vec![want(1)],
            vec![recorded(have(1, Phase::Removed), exited(3))],
            vec![upload_of(1)],
        ),
        row(
            "once its /outputs are sent, an exit is reported",
            vec![want(1)],
            vec![upload(
                recorded(have(1, Phase::Removed), exited(0)),
                UploadStage::Done,
            )],
            vec![report(1, exited(0))],
        ),
        row(
            "an attempt whose container was never made uploads nothing",
            vec![want(1)],
            vec![recorded(
                have(1, Phase::NotCreated { error: "x".into() }),
                failed("x"),
            )],
            vec![report(1, failed("x"))],
        ),
        row(
            "an attempt the portal did not expect uploads nothing",
            vec![want(1)],
            vec![recorded(
                have(1, Phase::Removed),
                stopped(Some(143), Why::of(StopReason::NotExpected)),
            )],
            vec![report(
                1,
                stopped(Some(143), Why::of(StopReason::NotExpected)),
            )],
        ),
        row(
            "an attempt cancelled before it started goes through the upload too (nothing to send)",
            vec![want(1)],
            vec![recorded(
                have(1, Phase::Removed),
                stopped(None, cancelled()),
            )],
            vec![upload_of(1)],
        ),
        row(
            "a restored upload left pending by an earlier agent is taken up again",
            vec![adopted(want(1))],
            vec![recorded(
                have(1, Phase::Removed),
                stopped(Some(143), preempted()),
            )],
            vec![upload_of(1)],
        ),
    ]
}

#[test]
fn each_checkpoint_situation_gives_its_one_next_step() {
    check(&rows());
}

/// A preempted attempt walks Record, Remove, Upload, Report, Forget, and its heartbeats
/// say `running` until the upload is over.
#[test]
fn a_stopped_attempt_uploads_before_it_is_reported() {
    let mut w = ordered(want(1), 30, preempted());
    let mut h = stopping(ended(1, 143), preempted(), 30);
    let mut steps = Vec::new();
    for _ in 0..10 {
        let actions = reconcile(std::slice::from_ref(&w), std::slice::from_ref(&h), NOW);
        let Some(a) = actions.into_iter().next() else {
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
            Action::Remove { .. } => h.phase = Phase::Removed,
            Action::Upload { .. } => {
                let seen = h.report();
                assert_eq!(
                    (seen.state, seen.stop),
                    (AttemptState::Running, None),
                    "the final state waits for the upload"
                );
                h.upload = UploadStage::Busy;
                assert!(
                    reconcile(std::slice::from_ref(&w), std::slice::from_ref(&h), NOW).is_empty()
                );
                assert_eq!(h.report().state, AttemptState::Running);
                h.upload = UploadStage::Done;
                assert_eq!(h.report().state, AttemptState::Stopped, "then it shows");
            }
            Action::Report { .. } => {
                assert_eq!(h.upload, UploadStage::Done, "reported before uploaded");
                h.reported = true;
            }
            Action::Forget { .. } => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(steps, ["Record", "Remove", "Upload", "Report", "Forget"]);
}

#[test]
fn which_ends_upload_a_checkpoint() {
    assert!(uploads_checkpoint(&stopped(Some(143), preempted())));
    assert!(uploads_checkpoint(&stopped(None, lease_why())));
    assert!(!uploads_checkpoint(&exited(0)));
    assert!(!uploads_checkpoint(&exited(1)));
    assert!(!uploads_checkpoint(&failed("image missing")));
    assert!(!uploads_checkpoint(&stopped(
        None,
        Why::of(StopReason::NotExpected)
    )));
    let h = recorded(have(1, Phase::Removed), exited(0));
    assert!(uploads_before_report(&exited(0), &Phase::Removed));
    assert!(!uploads_before_report(
        &failed("image missing"),
        &Phase::NotCreated { error: "x".into() }
    ));
    assert!(!uploads_before_report(
        &stopped(None, Why::of(StopReason::NotExpected)),
        &Phase::Removed
    ));
    assert_eq!(
        h.report().state,
        AttemptState::Running,
        "an exit is held until its /outputs are sent"
    );
    assert_eq!(
        upload(h, UploadStage::Done).report().state,
        AttemptState::Exited,
        "then it is in heartbeats"
    );
}
