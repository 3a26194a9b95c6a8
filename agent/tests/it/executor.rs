//! The executor driven through the in-memory runtime: starts, exits, the portal's stops
//! with their grace and words, leases counted from the agent's own messages (and granting
//! nothing when they name another session or an unknown message), leases and time limits
//! enforced with no portal at all, failed waits, lost containers, the guard's stops.

use super::fake_runtime::*;
use commons_agent::clock;
use commons_agent::executor::Admission;
use commons_agent::gpu::{GpuError, GpuSource, Ours};
use commons_agent::reconcile::{ENFORCE_GRACE, TEXT_LEASE};
use commons_agent::store::{self, StoppedFile};
use commons_proto::{AgentMsg, AttemptState, GpuInfo, GpuStat, Lease, StopReason};
use std::path::Path;
use std::time::Duration;

#[tokio::test]
async fn a_job_runs_reports_after_removal_and_is_forgotten_once_acknowledged() {
    let Setup {
        exec,
        mut ev,
        rt,
        dir,
    } = setup();
    assert_eq!(
        exec.start(1, 1, spec("demo", 600), vec![], far(&exec)),
        Admission::Accepted
    );
    assert_eq!(
        exec.start(1, 1, spec("demo", 600), vec![], far(&exec)),
        Admission::Duplicate
    );
    ev.state_of(1, Some(AttemptState::Running)).await;
    assert_eq!(
        rt.calls(),
        [Call::Create(1, 1)],
        "a duplicate Start is harmless"
    );
    assert_eq!(state_in_reports(&exec, 1), Some(AttemptState::Running));

    rt.exit(1, 1, 7);
    let end = ev.final_of(1).await;
    assert_eq!(
        (end.state, end.exit_code, end.stop),
        (AttemptState::Exited, Some(7), None)
    );
    assert!(rt.ids().is_empty(), "removed before the final report");
    assert_eq!(
        *rt.result_on_disk_at_removal.lock().unwrap(),
        [true],
        "result.json is written before the container is removed"
    );
    assert!(
        ev.logs_of(1).contains("alice says hello"),
        "logs before the end"
    );

    exec.renew(lease_from_heartbeat(&exec, 3600), &[(1, 1)]);
    assert_eq!(
        state_in_reports(&exec, 1),
        Some(AttemptState::Exited),
        "kept while the portal still lists it"
    );
    assert!(store::attempt_dir(dir.path(), 1, 1).is_dir());
    exec.renew(lease_from_heartbeat(&exec, 3600), &[]);
    assert!(exec.reports().is_empty(), "forgotten once acknowledged");
    assert!(
        !store::attempt_dir(dir.path(), 1, 1).exists(),
        "and its directory deleted"
    );
}

#[tokio::test]
async fn hello_and_heartbeats_are_numbered_in_one_session() {
    let Setup { exec, .. } = setup();
    let AgentMsg::Hello {
        protocol,
        session,
        seq: s1,
        ..
    } = exec.hello("test", vec![])
    else {
        unreachable!()
    };
    assert_eq!(protocol, commons_proto::PROTOCOL_VERSION);
    assert_eq!(session, exec.session());
    let AgentMsg::Heartbeat { seq: s2, .. } = exec.heartbeat(vec![]) else {
        unreachable!()
    };
    let AgentMsg::Hello { seq: s3, .. } = exec.hello("test", vec![]) else {
        unreachable!()
    };
    assert!(s1 < s2 && s2 < s3, "{s1} {s2} {s3}");
    let (other, _) = agent(&FakeRuntime::default(), Path::new("/nonexistent"));
    assert_ne!(
        other.session(),
        exec.session(),
        "each agent process its own"
    );
}

#[tokio::test]
async fn a_lease_counts_from_when_its_message_was_sent_and_renewals_rewrite_lease_json() {
    let Setup {
        exec, mut ev, dir, ..
    } = setup();
    let before = clock::now();
    let lease = lease_from_hello(&exec, 30);
    let after = clock::now();
    // The Start arrives a while after the Hello: the lease still counts from the Hello.
    tokio::time::sleep(Duration::from_millis(600)).await;
    exec.start(2, 1, spec("demo", 600), vec![], lease);
    let deadline = exec.lease_deadline(2, 1).unwrap();
    assert!(
        before + Duration::from_secs(30) <= deadline && deadline <= after + Duration::from_secs(30),
        "{before:?} {deadline:?} {after:?}"
    );
    ev.state_of(2, Some(AttemptState::Running)).await;
    let on_disk = lease_file(dir.path(), 2, 1);
    assert_eq!(on_disk.container.as_deref(), Some(id_of(2, 1).as_str()));
    assert_eq!(on_disk.lease_deadline_ms, clock::to_ms(deadline));
    assert_eq!(
        on_disk.time_limit_deadline_ms.map(clock::from_ms),
        exec.time_limit_deadline(2, 1)
            .map(|d| Duration::from_millis(d.as_millis() as u64))
    );
    assert_eq!(on_disk.boot_id, clock::boot_id());

    let renewal = lease_from_heartbeat(&exec, 30);
    exec.renew(renewal, &[(2, 1)]);
    let renewed = exec.lease_deadline(2, 1).unwrap();
    assert!(renewed > deadline);
    assert_eq!(
        lease_file(dir.path(), 2, 1).lease_deadline_ms,
        clock::to_ms(renewed),
        "every renewal reaches lease.json"
    );
}

#[tokio::test]
async fn a_lease_from_another_session_or_an_unknown_message_grants_nothing() {
    let Setup { exec, rt, .. } = setup();
    let mine = lease_from_hello(&exec, 3600);
    let foreign = Lease {
        session: mine.session.wrapping_add(1),
        ..mine
    };
    let unknown = Lease {
        seq: mine.seq + 1000,
        ..mine
    };
    assert_eq!(
        exec.start(3, 1, spec("demo", 600), vec![], foreign),
        Admission::LeaseUnknown
    );
    assert_eq!(
        exec.start(3, 1, spec("demo", 600), vec![], unknown),
        Admission::LeaseUnknown
    );
    assert!(exec.reports().is_empty(), "not taken on");
    assert!(rt.calls().is_empty(), "not started");

    let short = lease_from_heartbeat(&exec, 5);
    assert_eq!(
        exec.start(3, 1, spec("demo", 600), vec![], short),
        Admission::Accepted,
        "the portal's next delivery, with a lease it may grant"
    );
    let before = exec.lease_deadline(3, 1);
    exec.renew(foreign, &[(3, 1)]);
    exec.renew(unknown, &[(3, 1)]);
    assert_eq!(
        exec.lease_deadline(3, 1),
        before,
        "renewals that grant nothing"
    );
}

#[tokio::test]
async fn a_portal_stop_uses_its_grace_reason_and_detail() {
    let Setup {
        exec, mut ev, rt, ..
    } = setup();
    exec.start(2, 1, spec("demo", 600), vec![], far(&exec));
    ev.state_of(2, Some(AttemptState::Running)).await;
    assert!(exec.stop(
        2,
        1,
        5,
        StopReason::Preempted,
        Some("the owner lab needs its GPUs")
    ));
    let end = ev.final_of(2).await;
    assert_eq!(
        end,
        End {
            state: AttemptState::Stopped,
            exit_code: Some(SIGTERM_EXIT),
            stop: Some(StopReason::Preempted),
            reason: Some("preempted: the owner lab needs its GPUs".into()),
        }
    );
    let calls = rt.calls();
    assert_eq!(
        calls[1..],
        [
            Call::Stop(id_of(2, 1), Duration::from_secs(5)),
            Call::Remove(id_of(2, 1))
        ]
    );
    assert!(
        exec.stop(2, 1, 60, StopReason::Cancelled, None),
        "still known until acknowledged"
    );
    assert_eq!(rt.calls().len(), calls.len(), "and stopped only once");
    assert!(
        !exec.stop(99, 1, 5, StopReason::Cancelled, None),
        "an unknown attempt"
    );
}

#[tokio::test]
async fn leases_and_time_limits_stop_attempts_with_the_enforcement_grace() {
    let Setup {
        exec, mut ev, rt, ..
    } = setup();
    let now = clock::now();
    exec.start(3, 1, spec("demo", 30), vec![], far(&exec));
    exec.start(4, 1, spec("demo", 3600), vec![], lease_from_hello(&exec, 5));
    ev.state_of(3, Some(AttemptState::Running)).await;
    ev.state_of(4, Some(AttemptState::Running)).await;

    exec.step(now + Duration::from_secs(10));
    let end = ev.final_of(4).await;
    assert_eq!(end.state, AttemptState::Stopped);
    assert_eq!(end.stop, Some(StopReason::LeaseExpired));
    assert_eq!(end.reason.as_deref(), Some(TEXT_LEASE));
    assert_eq!(state_in_reports(&exec, 3), Some(AttemptState::Running));

    exec.step(now + Duration::from_secs(40));
    let end = ev.final_of(3).await;
    assert_eq!(end.state, AttemptState::Stopped);
    assert_eq!(end.stop, Some(StopReason::TimeLimit));
    for id in [id_of(3, 1), id_of(4, 1)] {
        assert!(rt.calls().contains(&Call::Stop(id, ENFORCE_GRACE)));
    }
}

#[tokio::test]
async fn a_lease_runs_out_with_no_portal_connection_at_all() {
    // Nobody renews and nobody calls `step`: the executor's own tick stops the attempt.
    let Setup {
        exec, mut ev, rt, ..
    } = setup();
    exec.start(5, 1, spec("demo", 3600), vec![], lease_from_hello(&exec, 1));
    ev.state_of(5, Some(AttemptState::Running)).await;
    let end = ev.final_of(5).await;
    assert_eq!(end.state, AttemptState::Stopped);
    assert_eq!(end.stop, Some(StopReason::LeaseExpired));
    assert_eq!(stops(&rt), [(id_of(5, 1), ENFORCE_GRACE)]);
}

#[tokio::test]
async fn a_failed_wait_on_a_running_container_keeps_watching_it() {
    let Setup {
        exec, mut ev, rt, ..
    } = setup();
    rt.fail_next_wait(6, 1);
    exec.start(6, 1, spec("demo", 600), vec![], far(&exec));
    ev.state_of(6, Some(AttemptState::Running)).await;
    let meanwhile = ev.quiet_for(Duration::from_millis(1500)).await;
    assert!(
        !meanwhile
            .iter()
            .any(|m| matches!(m, AgentMsg::AttemptEvent { state, .. } if state.is_final())),
        "a failed wait is not an end: {meanwhile:?}"
    );
    assert_eq!(state_in_reports(&exec, 6), Some(AttemptState::Running));
    assert!(*rt.waits.lock().unwrap() >= 2, "it waits again");
    assert!(rt.running(6, 1));

    rt.exit(6, 1, 0);
    let end = ev.final_of(6).await;
    assert_eq!(
        (end.state, end.exit_code, end.stop),
        (AttemptState::Exited, Some(0), None)
    );
}

#[tokio::test]
async fn a_container_the_engine_loses_is_reported_lost_and_requeued() {
    let Setup {
        exec, mut ev, rt, ..
    } = setup();
    exec.start(7, 1, spec("demo", 600), vec![], far(&exec));
    ev.state_of(7, Some(AttemptState::Running)).await;
    rt.vanish(7, 1);
    let end = ev.final_of(7).await;
    assert_eq!(end.state, AttemptState::Stopped, "{end:?}");
    assert_eq!(end.stop, Some(StopReason::Lost));
    assert!(StopReason::Lost.requeues());
}

#[tokio::test]
async fn an_end_the_guard_caused_is_reported_with_the_guards_reason() {
    let Setup {
        exec,
        mut ev,
        rt,
        dir,
    } = setup();
    exec.start(11, 1, spec("demo", 600), vec![], far(&exec));
    ev.state_of(11, Some(AttemptState::Running)).await;
    // The guard writes its reason, then stops the container behind the agent's back.
    store::write_json(
        &store::attempt_dir(dir.path(), 11, 1).join(store::STOPPED_FILE),
        &StoppedFile {
            reason: StopReason::TimeLimit,
            at_ms: clock::to_ms(clock::now()),
            grace_s: 10,
        },
    )
    .unwrap();
    rt.exit(11, 1, SIGTERM_EXIT);
    let end = ev.final_of(11).await;
    assert_eq!(
        (end.state, end.exit_code, end.stop),
        (
            AttemptState::Stopped,
            Some(SIGTERM_EXIT),
            Some(StopReason::TimeLimit)
        )
    );
}

#[tokio::test]
async fn a_missing_image_fails_with_the_reason() {
    let Setup {
        exec, mut ev, rt, ..
    } = setup();
    exec.start(7, 1, spec("missing:1", 60), vec![], far(&exec));
    let end = ev.final_of(7).await;
    assert_eq!((end.state, end.exit_code), (AttemptState::Failed, None));
    assert!(end.reason.unwrap().contains("is not on this server"));
    assert!(rt.ids().is_empty());
    assert!(!rt.calls().iter().any(|c| matches!(c, Call::Remove(_))));
}

/// A GPU whose processes are fixed: the owner's unless the executor names them as ours.
struct OneGpu {
    pids: Vec<u32>,
}

impl GpuSource for OneGpu {
    fn inventory(&self) -> Result<Vec<GpuInfo>, GpuError> {
        Ok(vec![])
    }

    fn stats(&self, ours: &Ours) -> Result<Vec<GpuStat>, GpuError> {
        Ok(vec![GpuStat {
            uuid: "GPU-0".into(),
            utilization_pct: 50,
            memory_used_mb: 1,
            local_use: self.pids.iter().any(|p| !ours.pids.contains(p)),
            fault: None,
        }])
    }
}

#[tokio::test]
async fn gpu_processes_in_our_containers_are_not_local_use() {
    let Setup { exec, mut ev, .. } = setup();
    exec.start(8, 1, spec("demo", 600), vec![], far(&exec));
    ev.state_of(8, Some(AttemptState::Running)).await;
    let ours = OneGpu { pids: vec![1008] };
    assert!(!exec.gpu_stats(&ours).await.unwrap()[0].local_use);
    let owner = OneGpu {
        pids: vec![1008, 4242],
    };
    assert!(exec.gpu_stats(&owner).await.unwrap()[0].local_use);
}
