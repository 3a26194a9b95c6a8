//! The executor against the real Docker Engine: exit codes and output, the time limit,
//! the portal's stop with its grace, and an expired lease.

use super::{docker_agent, final_event, lease_from_hello, new_agent_id, spec};
use commons_agent::runtime::{AssignedGpu, ContainerRuntime};
use commons_proto::{AttemptState, StopReason};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_code_and_output_come_back_and_the_container_goes() {
    let dir = tempfile::tempdir().unwrap();
    let (exec, mut rx, rt) = docker_agent(&new_agent_id(), dir.path()).await;
    let lease = lease_from_hello(&exec, 3600);
    exec.start(
        1,
        1,
        spec("echo out; echo err >&2; exit 7", 60),
        vec![],
        lease,
    );
    let end = final_event(&mut rx).await;
    assert_eq!((end.state, end.exit_code), (AttemptState::Exited, Some(7)));
    assert!(
        end.logs.contains("out") && end.logs.contains("err"),
        "{:?}",
        end.logs
    );
    assert!(
        rt.list().await.unwrap().is_empty(),
        "the container is removed"
    );
    let reports = exec.reports();
    assert_eq!(
        reports[0].exit_code,
        Some(7),
        "the final state is repeated in heartbeats"
    );
    exec.renew(lease, &[]);
    assert!(
        exec.reports().is_empty(),
        "forgotten once the portal stops renewing it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_time_limit_is_enforced() {
    let dir = tempfile::tempdir().unwrap();
    let (exec, mut rx, _rt) = docker_agent(&new_agent_id(), dir.path()).await;
    let started = std::time::Instant::now();
    exec.start(
        2,
        1,
        spec("sleep 120", 2),
        vec![],
        lease_from_hello(&exec, 3600),
    );
    let end = final_event(&mut rx).await;
    assert_eq!(end.state, AttemptState::Stopped);
    assert_eq!(end.stop, Some(StopReason::TimeLimit));
    assert_eq!(end.reason.as_deref(), Some("time limit reached"));
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_uses_the_grace_period_and_an_expired_lease_stops_the_job() {
    let dir = tempfile::tempdir().unwrap();
    let (exec, mut rx, _rt) = docker_agent(&new_agent_id(), dir.path()).await;
    // The job traps SIGTERM and writes a last word: the grace period lets it.
    exec.start(
        3,
        1,
        spec(
            "trap 'echo checkpointing; exit 0' TERM; while true; do sleep 0.2; done",
            600,
        ),
        vec![],
        lease_from_hello(&exec, 3600),
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(exec.stop(
        3,
        1,
        5,
        StopReason::Preempted,
        Some("the owner lab needs its GPUs")
    ));
    let end = final_event(&mut rx).await;
    assert_eq!(end.state, AttemptState::Stopped);
    assert_eq!(end.stop, Some(StopReason::Preempted));
    assert_eq!(
        end.reason.as_deref(),
        Some("preempted: the owner lab needs its GPUs")
    );
    assert!(
        end.logs.contains("checkpointing"),
        "SIGTERM first, within the grace: {:?}",
        end.logs
    );
    assert!(
        !exec.stop(99, 1, 5, StopReason::Cancelled, None),
        "an unknown attempt is not ours"
    );

    exec.start(
        4,
        1,
        spec("sleep 120", 600),
        vec![AssignedGpu {
            uuid: "GPU-fake-00".into(),
            fake: true,
        }],
        lease_from_hello(&exec, 1),
    );
    // No renewal and no call from the test: the executor's tick ends it.
    let end = final_event(&mut rx).await;
    assert_eq!(end.state, AttemptState::Stopped);
    assert_eq!(end.stop, Some(StopReason::LeaseExpired));
    assert!(end.reason.unwrap().starts_with("lease expired"));
}
