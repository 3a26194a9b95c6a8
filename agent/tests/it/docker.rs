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

/// The job writes into `/checkpoint` as uid 65534 and the file lands in the attempt's host
/// directory; a later attempt that resumes gets it back (restored through the portal's
/// API, here its test double), sees `COMMONS_RESUME=1`, and may overwrite it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_writes_its_checkpoint_as_uid_65534_and_a_resumed_attempt_reads_it() {
    use super::portal_double::{PortalDouble, CREDENTIAL};
    use commons_agent::checkpoint::{CheckpointClient, Policy};
    use commons_agent::executor::Executor;
    use commons_agent::reconcile::Launch;
    use commons_agent::store::{self, Store};
    use std::os::unix::fs::MetadataExt;

    super::demo_image();
    let portal = PortalDouble::start(1 << 20).await;
    let dir = tempfile::tempdir().unwrap();
    let rt = commons_agent::runtime::DockerRuntime::connect(new_agent_id())
        .await
        .unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let client = CheckpointClient::new(&portal.url, CREDENTIAL, Policy::default()).unwrap();
    let store = Store::new(dir.path()).with_guard(Some(super::guard_exe()));
    let exec = Executor::with_checkpoints(rt, tx, store, Some(client));

    let write = "echo \"dir=$COMMONS_CHECKPOINT_DIR resume=${COMMONS_RESUME:-none}\"; \
                 id -u > /checkpoint/uid.tmp && mv /checkpoint/uid.tmp /checkpoint/uid && \
                 mkdir -p /checkpoint/model && echo 1200 > /checkpoint/model/step";
    exec.start(
        20,
        1,
        spec(write, 60),
        vec![],
        lease_from_hello(&exec, 3600),
    );
    let end = final_event(&mut rx).await;
    assert_eq!(
        (end.state, end.exit_code),
        (AttemptState::Exited, Some(0)),
        "{end:?}"
    );
    assert!(
        end.logs.contains("dir=/checkpoint resume=none"),
        "{:?}",
        end.logs
    );
    let host = store::attempt_dir(dir.path(), 20, 1).join("checkpoint");
    assert_eq!(
        std::fs::read_to_string(host.join("uid")).unwrap(),
        "65534\n"
    );
    let m = std::fs::metadata(host.join("model/step")).unwrap();
    assert_eq!((m.uid(), m.gid()), (65534, 65534));
    assert!(portal.seen().is_empty(), "exit 0: nothing uploaded");

    // Attempt 2 resumes from what attempt 1 left (served as the job's latest).
    let mut b = tar::Builder::new(Vec::new());
    b.append_dir_all(".", &host).unwrap();
    let archive = zstd::encode_all(&b.into_inner().unwrap()[..], 3).unwrap();
    portal.set_latest(archive, None, 1);
    let read = "echo \"resume=$COMMONS_RESUME step=$(cat /checkpoint/model/step)\"; \
                echo 1300 > /checkpoint/model/step.tmp && mv /checkpoint/model/step.tmp \
                /checkpoint/model/step";
    let launch = Launch {
        spec: spec(read, 60),
        gpus: vec![],
        resume: true,
    };
    exec.start_with(20, 2, launch, lease_from_hello(&exec, 3600));
    let end = final_event(&mut rx).await;
    assert_eq!(end.exit_code, Some(0), "{end:?}");
    assert!(end.logs.contains("resume=1 step=1200"), "{:?}", end.logs);
    let host = store::attempt_dir(dir.path(), 20, 2).join("checkpoint");
    assert_eq!(
        std::fs::read_to_string(host.join("model/step")).unwrap(),
        "1300\n",
        "the job may overwrite what was restored"
    );
}
