//! The executor against the real Docker Engine: exit codes and output, the time limit,
//! the portal's stop with its grace, an expired lease, and interactive jobs kept up
//! without a command.

use super::{docker_agent, final_event, lease_from_hello, new_agent_id, spec};
use commons_agent::runtime::{AssignedGpu, ContainerRuntime};
use commons_proto::{AttemptState, StopReason};
use std::time::Duration;

/// The engine's log follow ends with the container and can miss a last line without a
/// newline written a while before the end; the agent reads it once more. Each line
/// arrives once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_last_line_without_a_newline_is_not_lost() {
    let dir = tempfile::tempdir().unwrap();
    let (exec, mut rx, _rt) = docker_agent(&new_agent_id(), dir.path()).await;
    let lease = lease_from_hello(&exec, 3600);
    exec.start(
        1,
        1,
        spec("echo first; printf 'result: 42'; sleep 2", 60),
        vec![],
        lease,
    );
    let end = final_event(&mut rx).await;
    assert_eq!(end.exit_code, Some(0));
    assert_eq!(end.logs, "first\nresult: 42", "{:?}", end.logs);
}

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
    let (tx, mut rx) = commons_agent::outbox::channel(Default::default());
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
    let host = commons_agent::checkpoint::host_dir(&store::attempt_dir(dir.path(), 20, 1));
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
    let host = commons_agent::checkpoint::host_dir(&store::attempt_dir(dir.path(), 20, 2));
    assert_eq!(
        std::fs::read_to_string(host.join("model/step")).unwrap(),
        "1300\n",
        "the job may overwrite what was restored"
    );
}

/// An interactive job with no command stays up (nothing to run, nothing ends), and a stop
/// ends it within a second or two: the keep-alive shell does not sit out the grace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interactive_job_without_a_command_stays_up_until_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let (exec, mut rx, rt) = docker_agent(&new_agent_id(), dir.path()).await;
    let mut s = spec("", 600);
    s.command.clear();
    s.interactive = true;
    exec.start(30, 1, s, vec![], lease_from_hello(&exec, 3600));
    tokio::time::sleep(Duration::from_secs(4)).await;
    let report = exec.reports().into_iter().find(|r| r.job == 30).unwrap();
    assert_eq!(report.state, AttemptState::Running, "{report:?}");
    let found = rt.list().await.unwrap();
    assert!(
        found.iter().any(|c| c.job == 30 && c.running),
        "the container is up: {found:?}"
    );
    // A long grace: only a prompt exit on SIGTERM ends it quickly.
    let asked = std::time::Instant::now();
    assert!(exec.stop(30, 1, 30, StopReason::Cancelled, None));
    let end = final_event(&mut rx).await;
    let took = asked.elapsed();
    assert_eq!(end.state, AttemptState::Stopped);
    assert_eq!(end.stop, Some(StopReason::Cancelled));
    assert_eq!(
        end.exit_code,
        Some(0),
        "a clean exit on SIGTERM, not a kill"
    );
    assert!(end.logs.contains("interactive job ready"), "{:?}", end.logs);
    eprintln!("interactive job ended {took:?} after the stop");
    assert!(
        took < Duration::from_secs(3),
        "stopped {took:?} after the stop, not after the 30 s grace"
    );
    assert!(rt.list().await.unwrap().is_empty(), "and removed");
}

/// An image without /bin/sh cannot keep an interactive job up: the job fails at once
/// with a reason that says so, and no container is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interactive_job_on_an_image_without_a_shell_fails_with_a_clear_reason() {
    let image = no_shell_image();
    let dir = tempfile::tempdir().unwrap();
    let (exec, mut rx, rt) = docker_agent(&new_agent_id(), dir.path()).await;
    let mut s = spec("", 600);
    s.command.clear();
    s.interactive = true;
    s.image = image.clone();
    s.image_digest = Some(super::local_id(&image));
    exec.start(31, 1, s, vec![], lease_from_hello(&exec, 3600));
    let end = final_event(&mut rx).await;
    assert_eq!(end.state, AttemptState::Failed, "{end:?}");
    let reason = end.reason.unwrap();
    assert!(
        reason.contains("has no /bin/sh") && reason.contains(&image),
        "{reason}"
    );
    assert!(rt.list().await.unwrap().is_empty(), "nothing left behind");
}

/// `commons-noshell:test`: a FROM-scratch image with a static busybox but no /bin/sh.
fn no_shell_image() -> String {
    let image = "commons-noshell:test";
    let ctx = tempfile::tempdir().unwrap();
    std::fs::copy("/bin/busybox", ctx.path().join("busybox"))
        .expect("a static busybox at /bin/busybox (apt-get install busybox-static)");
    std::fs::write(
        ctx.path().join("Dockerfile"),
        "FROM scratch\nCOPY busybox /busybox\nCMD [\"/busybox\", \"true\"]\n",
    )
    .unwrap();
    let out = std::process::Command::new("docker")
        .args(["build", "-q", "-t", image])
        .arg(ctx.path())
        .output()
        .expect("the docker CLI is needed (apt-get install docker.io)");
    assert!(
        out.status.success(),
        "docker build: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    image.to_string()
}
