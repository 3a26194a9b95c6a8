//! The executor across agent restarts, on the in-memory runtime: a new executor over the
//! same state dir keeps results until acknowledged, the deadlines on disk (never a fresh
//! lease), a stop under way with the rest of its grace, and stops what has no lease.

use super::fake_runtime::*;
use commons_agent::clock;
use commons_agent::reconcile::ENFORCE_GRACE;
use commons_agent::store::{self, LeaseFile, ResultFile, StopMark};
use commons_proto::{AgentMsg, AttemptState, Lease, StopReason};
use std::time::Duration;

#[tokio::test]
async fn a_result_survives_an_agent_restart_until_acknowledged() {
    let Setup {
        exec,
        mut ev,
        rt,
        dir,
    } = setup();
    exec.start(8, 1, spec("demo", 600), vec![], far(&exec));
    ev.state_of(8, Some(AttemptState::Running)).await;
    rt.exit(8, 1, 3);
    assert_eq!(ev.final_of(8).await.exit_code, Some(3));
    let file: ResultFile =
        store::read_json(&store::attempt_dir(dir.path(), 8, 1).join(store::RESULT_FILE))
            .unwrap()
            .unwrap();
    assert_eq!(
        (file.state, file.exit_code),
        (AttemptState::Exited, Some(3))
    );
    assert!(file.log_tail.contains("alice says hello"), "{file:?}");
    assert!(file.ended_unix_ms > 0);

    // The agent restarts before the portal acknowledged anything.
    drop(exec);
    drop(ev);
    let (exec, mut ev) = agent(&rt, dir.path());
    exec.adopt().await.unwrap();
    let AgentMsg::Hello {
        attempts,
        seq,
        session,
        ..
    } = exec.hello("test", vec![])
    else {
        unreachable!()
    };
    let r = attempts.iter().find(|r| r.job == 8).expect("in the Hello");
    assert_eq!((r.state, r.exit_code), (AttemptState::Exited, Some(3)));
    assert_eq!(
        ev.final_of(8).await.exit_code,
        Some(3),
        "and sent as an event again"
    );

    let lease = Lease {
        session,
        seq,
        valid_for_s: 60,
    };
    exec.renew(lease, &[(8, 1)]);
    assert!(
        report_of(&exec, 8).is_some(),
        "kept while the portal lists it"
    );
    exec.renew(lease, &[]);
    assert!(report_of(&exec, 8).is_none());
    assert!(!store::attempt_dir(dir.path(), 8, 1).exists());
}

#[tokio::test]
async fn a_restarted_agent_keeps_the_deadlines_on_disk_not_a_fresh_lease() {
    let Setup {
        exec,
        ev: mut ev1,
        rt,
        dir,
    } = setup();
    exec.start(9, 1, spec("demo", 50), vec![], lease_from_hello(&exec, 20));
    ev1.state_of(9, Some(AttemptState::Running)).await;
    let on_disk = lease_file(dir.path(), 9, 1);
    drop(exec);

    let (exec, mut ev) = agent(&rt, dir.path());
    exec.adopt().await.unwrap();
    assert_eq!(
        exec.lease_deadline(9, 1),
        Some(clock::from_ms(on_disk.lease_deadline_ms))
    );
    assert_eq!(
        exec.time_limit_deadline(9, 1),
        on_disk.time_limit_deadline_ms.map(clock::from_ms)
    );
    assert_eq!(state_in_reports(&exec, 9), Some(AttemptState::Running));
    assert_eq!(
        rt.calls()
            .iter()
            .filter(|c| matches!(c, Call::Create(..)))
            .count(),
        1,
        "re-adopted, not started again"
    );

    // Past the old deadline, with no renewal from the new session: stopped.
    exec.step(clock::from_ms(on_disk.lease_deadline_ms) + Duration::from_secs(1));
    let end = ev.final_of(9).await;
    assert_eq!(end.stop, Some(StopReason::LeaseExpired));
}

#[tokio::test]
async fn containers_found_after_a_restart_without_lease_json_are_stopped_but_ended_ones_keep_their_code(
) {
    let Setup {
        exec, mut ev, rt, ..
    } = setup();
    rt.plant(5, 1, None);
    rt.plant(6, 1, Some(0));
    exec.adopt().await.unwrap();

    // The one that ended while no agent ran: reported with its code (never "stopped").
    let end = ev.final_of(6).await;
    assert_eq!(
        (end.state, end.exit_code, end.stop),
        (AttemptState::Exited, Some(0), None)
    );
    // The running one has no lease.json: its lease counts as expired.
    let end = ev.final_of(5).await;
    assert_eq!(end.state, AttemptState::Stopped);
    assert_eq!(end.stop, Some(StopReason::LeaseExpired));
    assert_eq!(stops(&rt), [(id_of(5, 1), ENFORCE_GRACE)]);
    assert!(!rt.calls().iter().any(|c| matches!(c, Call::Create(..))));
    assert!(
        !ev.seen.iter().any(|m| matches!(
            m,
            AgentMsg::AttemptEvent {
                state: AttemptState::Running,
                ..
            }
        )),
        "adoption is not a new start"
    );
}

#[tokio::test]
async fn a_stop_begun_before_a_restart_gets_only_the_rest_of_its_grace() {
    let Setup {
        exec,
        mut ev,
        rt,
        dir,
    } = setup();
    rt.plant(10, 1, None);
    let now = clock::now();
    write_lease(
        dir.path(),
        10,
        1,
        &LeaseFile {
            container: Some(id_of(10, 1)),
            boot_id: clock::boot_id(),
            lease_deadline_ms: clock::to_ms(now + Duration::from_secs(600)),
            time_limit_deadline_ms: None,
            time_limit_s: None,
            grace_s: 10,
            stop: Some(StopMark {
                reason: StopReason::Preempted,
                text: "preempted: the owner lab needs its GPUs".into(),
                fails: false,
                grace_ms: 30_000,
                since_ms: clock::to_ms(now - Duration::from_secs(20)),
            }),
        },
    );
    exec.adopt().await.unwrap();
    let end = ev.final_of(10).await;
    assert_eq!(end.stop, Some(StopReason::Preempted));
    assert_eq!(
        end.reason.as_deref(),
        Some("preempted: the owner lab needs its GPUs")
    );
    let s = stops(&rt);
    assert_eq!(s.len(), 1, "{s:?}");
    assert!(
        s[0].1 <= Duration::from_secs(10) && s[0].1 >= Duration::from_secs(9),
        "30 s of grace, 20 already gone: {:?}",
        s[0].1
    );
}
