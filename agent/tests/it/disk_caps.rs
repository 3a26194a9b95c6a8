//! A guest cannot fill its lender's disks, tried as an attacker would, in real containers:
//! `dd` into `/checkpoint` past the job's `disk_gb` (an image volume answers `ENOSPC` and
//! the host loses at most the cap; a watched one stops the job with the reason), and
//! `truncate -s 2T` before a preemption (the upload refuses at once, reading nothing).
//! Every volume is released when its attempt is forgotten, with its loop device.

use super::portal_double::{PortalDouble, CREDENTIAL};
use super::{
    demo_image, du_kib, free_kib, guard_exe, image_policy, lease_from_hello, loops_backed_by,
    new_agent_id, spec, Volumes,
};
use commons_agent::checkpoint::CheckpointClient;
use commons_agent::disk::{self, DiskPolicy};
use commons_agent::executor::Executor;
use commons_agent::runtime::DockerRuntime;
use commons_agent::store::{self, Store};
use commons_proto::{AgentMsg, AttemptState, StopReason};
use std::path::Path;
use std::time::Duration;

const GIB_KIB: u64 = 1 << 20;

/// An agent over the real engine with `policy`, and what cleans up after it (declared
/// after the state dir, so it runs first).
async fn agent(
    dir: &Path,
    policy: DiskPolicy,
    checkpoints: Option<CheckpointClient>,
) -> (Executor, commons_agent::outbox::OutboxRx, Volumes) {
    demo_image();
    let id = new_agent_id();
    let rt = DockerRuntime::connect(id.clone())
        .await
        .expect("the Docker Engine must run");
    let (tx, rx) = commons_agent::outbox::channel(Default::default());
    let store = Store::new(dir).with_guard(Some(guard_exe()));
    let exec = Executor::with_disk(rt, tx, store, checkpoints, policy);
    (exec, rx, Volumes(dir.to_path_buf(), Some(id)))
}

/// What happened to one job, as the portal would hear it.
#[derive(Debug, Default)]
struct Seen {
    logs: String,
    state: Option<AttemptState>,
    stop: Option<StopReason>,
    reason: Option<String>,
}

/// Reads the agent's messages about `job` until `done` says enough was seen, or fails
/// the test after `within`.
async fn watch(
    rx: &mut commons_agent::outbox::OutboxRx,
    job: i64,
    seen: &mut Seen,
    within: Duration,
    what: &str,
    done: impl Fn(&Seen) -> bool,
) {
    let deadline = tokio::time::Instant::now() + within;
    while !done(seen) {
        let msg = tokio::time::timeout_at(deadline, rx.recv())
            .await
            .unwrap_or_else(|_| panic!("{what}: not within {within:?}; saw {seen:?}"))
            .expect("the agent's channel");
        match msg {
            AgentMsg::Logs { job: j, chunk, .. } if j == job => seen.logs.push_str(&chunk),
            AgentMsg::AttemptEvent {
                job: j,
                state,
                stop,
                reason,
                ..
            } if j == job => {
                seen.state = Some(state);
                seen.stop = stop;
                seen.reason = reason;
            }
            _ => {}
        }
    }
}

/// A file system of its own for a test's state dir, playing the lender's disk: what the
/// job costs it is measured exactly, whatever other tests write meanwhile.
struct HostFs(std::path::PathBuf);

impl HostFs {
    fn new(tmp: &Path, bytes: u64) -> HostFs {
        let img = tmp.join("host.img");
        let dir = tmp.join("state");
        std::fs::create_dir_all(&dir).unwrap();
        disk::image::make(&img, bytes).expect("mkfs.ext4");
        disk::image::mount(&img, &dir).expect("mount -o loop (root)");
        HostFs(dir)
    }
}

impl Drop for HostFs {
    fn drop(&mut self) {
        if let Err(e) = disk::image::unmount(&self.0) {
            eprintln!("unmounting {}: {e}", self.0.display());
        }
    }
}

/// Acknowledges every recorded result (a `Renew` that lists none) and waits until the
/// attempt's directory is gone.
async fn forget(exec: &Executor, dir: &Path, job: i64) {
    let attempt = store::attempt_dir(dir, job, 1);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while attempt.exists() {
        exec.renew(lease_from_hello(exec, 60), &[]);
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} still there",
            attempt.display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_dds_past_its_cap_gets_enospc_and_the_host_loses_at_most_the_cap() {
    let tmp = tempfile::tempdir().unwrap();
    // The lender's disk: 3 GiB, of which the job's 2 GiB of `dd` would take two thirds.
    let host = HostFs::new(tmp.path(), 3 << 30);
    let dir = &host.0;
    let (exec, mut rx, _cleanup) = agent(dir, image_policy(dir), None).await;
    // The file system that backs the attempt's directory (where the image grows).
    let free_before = free_kib(dir);
    let mut s = spec(
        "dd if=/dev/zero of=/checkpoint/fill bs=1M count=2048 2>&1; echo dd=$?; \
         df -k /checkpoint | tail -1; sleep 600",
        900,
    );
    s.disk_gb = Some(1);
    exec.start(41, 1, s, vec![], lease_from_hello(&exec, 3600));
    let mut seen = Seen::default();
    watch(
        &mut rx,
        41,
        &mut seen,
        Duration::from_secs(180),
        "dd's end and the agent's note",
        |s| s.logs.contains("dd=") && s.logs.contains("/checkpoint is full"),
    )
    .await;
    let attempt = store::attempt_dir(dir, 41, 1);
    let used = du_kib(&attempt);
    let lost = free_before.saturating_sub(free_kib(dir));
    eprintln!(
        "dd into a 1 GiB volume: the attempt's directory takes {} MiB; the file system \
         lost {} MiB meanwhile; {}",
        used / 1024,
        lost / 1024,
        seen.logs.trim()
    );
    assert!(
        seen.logs.contains("No space left on device") && !seen.logs.contains("dd=0"),
        "{}",
        seen.logs
    );
    assert!(
        seen.logs
            .contains("[GPU Commons] /checkpoint is full: the job's disk cap is 1.0 GiB"),
        "{}",
        seen.logs
    );
    assert_eq!(loops_backed_by(&attempt).len(), 1, "one loop device");
    // Everything the job wrote is in the image, which cannot hold more than its size.
    assert!(
        used <= GIB_KIB + 4 * 1024,
        "the attempt takes {used} KiB of the host's disk, over its 1 GiB cap"
    );
    // Besides the image: the attempt's small files (lease, guard log, ...).
    assert!(
        lost <= GIB_KIB + 16 * 1024,
        "the host's file system lost {} MiB",
        lost / 1024
    );

    exec.stop(41, 1, 0, StopReason::Cancelled, None);
    watch(
        &mut rx,
        41,
        &mut seen,
        Duration::from_secs(60),
        "the stop",
        |s| s.state.is_some_and(|st| st.is_final()),
    )
    .await;
    forget(&exec, dir, 41).await;
    assert!(
        loops_backed_by(&attempt).is_empty(),
        "the loop device went with the volume: {:?}",
        loops_backed_by(&attempt)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watched_job_past_its_cap_is_stopped_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let policy = DiskPolicy {
        max_job_gb: 4,
        floor: disk::Floor::Percent(0),
        mode: disk::CapMode::Watch,
    };
    let (exec, mut rx, _cleanup) = agent(dir.path(), policy, None).await;
    let mut s = spec(
        "dd if=/dev/zero of=/checkpoint/fill bs=1M count=1100 2>&1; echo dd=$?; sleep 600",
        900,
    );
    s.disk_gb = Some(1);
    exec.start(42, 1, s, vec![], lease_from_hello(&exec, 3600));
    let mut seen = Seen::default();
    watch(
        &mut rx,
        42,
        &mut seen,
        Duration::from_secs(180),
        "the stop over the cap",
        |s| s.state.is_some_and(|st| st.is_final()),
    )
    .await;
    eprintln!("watched: {seen:?}");
    assert_eq!(seen.state, Some(AttemptState::Stopped), "{seen:?}");
    assert_eq!(seen.stop, Some(StopReason::Cancelled), "the job ends");
    let reason = seen.reason.clone().unwrap_or_default();
    assert!(
        reason.contains("over the job's disk cap of 1.0 GiB (disk_gb)"),
        "{reason}"
    );
    assert!(
        seen.logs
            .contains("[GPU Commons] stopped: /checkpoint holds"),
        "{}",
        seen.logs
    );
    forget(&exec, dir.path(), 42).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2t_sparse_file_then_a_preemption_is_refused_at_once_reading_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let portal = PortalDouble::start(1 << 20).await;
    let client =
        CheckpointClient::new(&portal.url, CREDENTIAL, super::checkpoints::policy()).unwrap();
    let (exec, mut rx, _cleanup) = agent(dir.path(), image_policy(dir.path()), Some(client)).await;
    let mut s = spec(
        // `truncate -s 2T` (busybox spells 2 TiB 2048G).
        "echo 7 > /checkpoint/step && truncate -s 2048G /checkpoint/huge && \
         ls -l /checkpoint/huge && echo ready; sleep 600",
        900,
    );
    s.disk_gb = Some(1);
    exec.start(43, 1, s, vec![], lease_from_hello(&exec, 3600));
    let mut seen = Seen::default();
    watch(
        &mut rx,
        43,
        &mut seen,
        Duration::from_secs(60),
        "the 2 TiB file",
        |s| s.logs.contains("ready"),
    )
    .await;
    let preempted = std::time::Instant::now();
    exec.stop(43, 1, 2, StopReason::Preempted, Some("the owner needs it"));
    watch(
        &mut rx,
        43,
        &mut seen,
        Duration::from_secs(60),
        "the report after the upload",
        |s| s.state.is_some_and(|st| st.is_final()),
    )
    .await;
    let took = preempted.elapsed();
    eprintln!("from the preemption to the report: {took:?}; {}", seen.logs);
    assert_eq!(seen.stop, Some(StopReason::Preempted), "{seen:?}");
    assert!(
        seen.logs.contains(
            "checkpoint NOT stored: cannot archive /checkpoint (/checkpoint holds 2.0 TiB"
        ) && seen.logs.contains("over the job's disk cap of 1.0 GiB"),
        "{}",
        seen.logs
    );
    assert!(portal.commits().is_empty() && portal.parts_accepted().is_empty());
    // The container's stop (SIGTERM, up to 2 s of grace) is most of it; reading 2 TiB of
    // zeros would take hours.
    assert!(took < Duration::from_secs(20), "{took:?}");
    forget(&exec, dir.path(), 43).await;
}
