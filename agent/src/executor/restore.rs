//! What a (re)started agent takes back from the engine and the disk: pure, so that what a
//! restart restores is decided in one place.
//!
//! Invariants: a deadline is restored only from a `lease.json` written in this boot (the
//! boot clock restarts at boot); without one the lease counts as expired, never as fresh.
//! Every restored attempt gets an assignment, so its result stays until the portal
//! acknowledges it. A checkpoint upload not marked over in `checkpoint.json` is pending
//! again (the next agent resumes it); periodic snapshots resume at once, then every
//! interval.

use crate::clock::from_ms;
use crate::reconcile::{
    Assignment, AttemptResult, ContainerObs, Key, Phase, Snapshots, Stopping, UploadStage, Why,
};
use crate::runtime::FoundContainer;
use crate::store::OnDisk;
use std::collections::BTreeMap;
use std::time::Duration;

pub(super) struct Restored {
    pub attempts: Vec<(Assignment, ContainerObs)>,
    /// Attempt directories with nothing to restore (no lease, no result, no stop).
    pub strays: Vec<Key>,
}

pub(super) fn restore(
    found: Vec<FoundContainer>,
    mut disk: BTreeMap<Key, OnDisk>,
    boot_id: &str,
) -> Restored {
    let mut attempts = Vec::new();
    for c in found {
        let key = (c.job, c.attempt);
        let on_disk = disk.remove(&key).unwrap_or_default();
        let valid = on_disk.lease.as_ref().is_some_and(|l| l.boot_id == boot_id);
        if !valid && on_disk.result.is_none() {
            tracing::warn!(
                job = c.job,
                attempt = c.attempt,
                "container {} has no lease.json from this boot: its lease counts as expired",
                c.id
            );
        }
        let phase = Phase::Found {
            container: c.id,
            running: c.running,
        };
        attempts.push(entry(key, phase, on_disk, boot_id));
    }
    let mut strays = Vec::new();
    for (key, on_disk) in disk {
        if on_disk.is_stray() {
            strays.push(key);
            continue;
        }
        // The container is gone: its result (or lack of one) is all there is.
        attempts.push(entry(key, Phase::Removed, on_disk, boot_id));
    }
    Restored { attempts, strays }
}

fn entry(key: Key, phase: Phase, d: OnDisk, boot_id: &str) -> (Assignment, ContainerObs) {
    let (job, attempt) = key;
    let lease = d.lease.filter(|l| l.boot_id == boot_id);
    let lease_until = lease
        .as_ref()
        .map_or(Duration::ZERO, |l| from_ms(l.lease_deadline_ms));
    let deadline = lease
        .as_ref()
        .and_then(|l| l.time_limit_deadline_ms)
        .map(from_ms);
    let time_limit = lease
        .as_ref()
        .and_then(|l| l.time_limit_s)
        .map(Duration::from_secs);
    let marked = lease.and_then(|l| l.stop).map(|m| Stopping {
        why: Why {
            reason: m.reason,
            text: m.text,
            fails: m.fails,
        },
        grace: from_ms(m.grace_ms),
        since: from_ms(m.since_ms),
        issued: false,
    });
    let by_guard = d.stopped.map(|s| Stopping {
        why: Why::of(s.reason),
        grace: Duration::from_secs(s.grace_s),
        since: from_ms(s.at_ms),
        issued: false,
    });
    let mut obs = ContainerObs::new(job, attempt, phase, deadline);
    obs.time_limit = time_limit;
    obs.stopping = marked.or(by_guard);
    if let Some(c) = d.checkpoint {
        if c.final_upload.is_some() {
            obs.upload = UploadStage::Done;
        }
        obs.snapshots = c.interval_s.filter(|s| *s > 0).map(|s| Snapshots {
            every: Duration::from_secs(s),
            next: Duration::ZERO,
            busy: false,
        });
    }
    if let Some(r) = d.result {
        obs.result = Some(AttemptResult {
            state: r.state,
            exit_code: r.exit_code,
            stop: r.stop,
            reason: r.reason,
        });
        obs.saved = true;
    }
    let want = Assignment {
        job,
        attempt,
        launch: None,
        lease_until,
        stop: None,
        acknowledged: false,
    };
    (want, obs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::{CheckpointFile, FinalUpload};
    use crate::reconcile::UploadStage;
    use crate::store::{LeaseFile, StopMark, StoppedFile};
    use commons_proto::StopReason;

    fn lease(boot: &str) -> LeaseFile {
        LeaseFile {
            container: Some("c".into()),
            boot_id: boot.into(),
            lease_deadline_ms: 50_000,
            time_limit_deadline_ms: Some(90_000),
            time_limit_s: None,
            grace_s: 10,
            stop: None,
        }
    }

    fn found(running: bool) -> FoundContainer {
        FoundContainer {
            id: "c".into(),
            job: 1,
            attempt: 2,
            running,
        }
    }

    #[test]
    fn deadlines_come_from_this_boots_lease_file_only() {
        let disk = BTreeMap::from([(
            (1, 2),
            OnDisk {
                lease: Some(lease("boot-a")),
                ..Default::default()
            },
        )]);
        let r = restore(vec![found(true)], disk.clone(), "boot-a");
        let (w, h) = &r.attempts[0];
        assert_eq!(w.lease_until, Duration::from_secs(50));
        assert_eq!(h.deadline, Some(Duration::from_secs(90)));
        assert!(w.launch.is_none() && !w.acknowledged);

        let r = restore(vec![found(true)], disk, "boot-b");
        let (w, h) = &r.attempts[0];
        assert_eq!(w.lease_until, Duration::ZERO, "another boot: expired");
        assert_eq!(h.deadline, None);

        let r = restore(vec![found(true)], BTreeMap::new(), "boot-a");
        assert_eq!(
            r.attempts[0].0.lease_until,
            Duration::ZERO,
            "no file: expired"
        );
    }

    #[test]
    fn stops_under_way_and_the_guards_stops_are_restored_not_issued() {
        let mut l = lease("b");
        l.stop = Some(StopMark {
            reason: StopReason::Preempted,
            text: "preempted: owner".into(),
            fails: false,
            grace_ms: 30_000,
            since_ms: 40_000,
        });
        let disk = BTreeMap::from([
            (
                (1, 2),
                OnDisk {
                    lease: Some(l),
                    ..Default::default()
                },
            ),
            (
                (3, 1),
                OnDisk {
                    stopped: Some(StoppedFile {
                        reason: StopReason::TimeLimit,
                        at_ms: 1000,
                        grace_s: 10,
                    }),
                    ..Default::default()
                },
            ),
            ((4, 1), OnDisk::default()),
        ]);
        let r = restore(vec![found(true)], disk, "b");
        assert_eq!(r.strays, [(4, 1)]);
        let s = r.attempts[0].1.stopping.clone().unwrap();
        assert_eq!(s.why.reason, StopReason::Preempted);
        assert_eq!(
            (s.grace, s.since),
            (Duration::from_secs(30), Duration::from_secs(40))
        );
        assert!(!s.issued);
        let (_, gone) = &r.attempts[1];
        assert_eq!(gone.phase, Phase::Removed);
        assert_eq!(
            gone.stopping.as_ref().unwrap().why.reason,
            StopReason::TimeLimit
        );
    }

    #[test]
    fn an_unfinished_upload_is_pending_again_and_snapshots_resume_at_once() {
        let ck = |interval_s, final_upload| CheckpointFile {
            interval_s,
            final_upload,
            ..Default::default()
        };
        let disk = BTreeMap::from([
            (
                (1, 2),
                OnDisk {
                    lease: Some(lease("b")),
                    checkpoint: Some(ck(Some(60), None)),
                    ..Default::default()
                },
            ),
            (
                (3, 1),
                OnDisk {
                    lease: Some(lease("b")),
                    checkpoint: Some(ck(None, Some(FinalUpload::GivenUp))),
                    ..Default::default()
                },
            ),
            (
                (4, 1),
                OnDisk {
                    checkpoint: Some(ck(Some(60), None)),
                    ..Default::default()
                },
            ),
        ]);
        let r = restore(vec![found(true)], disk, "b");
        let running = &r.attempts[0].1;
        assert_eq!(running.upload, UploadStage::Pending);
        let s = running.snapshots.clone().unwrap();
        assert_eq!(
            (s.every, s.next, s.busy),
            (Duration::from_secs(60), Duration::ZERO, false)
        );
        assert_eq!(
            r.attempts[1].1.upload,
            UploadStage::Done,
            "over: not tried again"
        );
        assert_eq!(r.strays, [(4, 1)], "a checkpoint.json alone says nothing");
    }
}
