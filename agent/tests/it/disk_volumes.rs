//! Jobs' volumes through the executor, on the in-memory runtime (the job's writes are
//! played by the test in the host directory): a restore and periodic snapshots through
//! a mounted image, a restore over the job's cap refused before anything is written,
//! volumes taken back (mounted again) after a restart and released with stray
//! directories, and a guest turned back under the free-space floor.

use super::checkpoints::{archive_of, policy, until};
use super::fake_runtime::*;
use super::portal_double::{PortalDouble, CREDENTIAL};
use super::{du_kib, image_policy, loops_backed_by, Volumes};
use commons_agent::checkpoint::{self, archive, CheckpointClient};
use commons_agent::clock;
use commons_agent::disk::{self, image, DiskPolicy, Enforcement};
use commons_agent::executor::Executor;
use commons_agent::reconcile::Launch;
use commons_agent::store::{self, Store};
use commons_proto::{AttemptState, StopReason};
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

fn agent_with(
    rt: &FakeRuntime,
    dir: &Path,
    portal: Option<&PortalDouble>,
    disk: DiskPolicy,
) -> (Executor<FakeRuntime>, Events) {
    let client = portal.map(|p| CheckpointClient::new(&p.url, CREDENTIAL, policy()).unwrap());
    let (tx, rx) = commons_agent::outbox::channel(Default::default());
    let exec = Executor::with_disk(rt.clone(), tx, Store::new(dir), client, disk);
    (exec, Events::new(rx))
}

fn launch(disk_gb: Option<u64>, interval_s: Option<u64>, resume: bool) -> Launch {
    let mut s = spec("demo", 600);
    s.disk_gb = disk_gb;
    s.checkpoint_interval_s = interval_s;
    Launch {
        spec: s,
        gpus: vec![],
        resume,
    }
}

#[tokio::test]
async fn a_restore_and_periodic_snapshots_go_through_a_mounted_volume() {
    let dir = tempfile::tempdir().unwrap();
    let _volumes = Volumes(dir.path().to_path_buf(), None);
    let portal = PortalDouble::start(1 << 20).await;
    portal.set_latest(archive_of(&[("step", b"1200\n")]), None, 1);
    let rt = FakeRuntime::default();
    let (exec, mut ev) = agent_with(&rt, dir.path(), Some(&portal), image_policy(dir.path()));
    let t0 = clock::now();
    exec.start_with(5, 2, launch(Some(1), Some(60), true), far(&exec));
    ev.state_of(5, Some(AttemptState::Running)).await;
    let attempt = store::attempt_dir(dir.path(), 5, 2);
    let host = rt.created_of(5, 2).mount.host_dir;
    assert_eq!(host, checkpoint::host_dir(&attempt));
    assert!(image::is_mountpoint(&disk::volume_dir(&attempt)));
    assert_eq!(
        disk::DiskFile::read(&attempt).unwrap().enforced_by,
        Enforcement::Image
    );
    let (_, total) = disk::free_space(&host).unwrap();
    assert!(
        total <= 1 << 30,
        "the volume holds at most the cap: {total}"
    );
    assert_eq!(std::fs::read(host.join("step")).unwrap(), b"1200\n");
    assert!(ev
        .logs_of(5)
        .contains("restored the checkpoint of attempt 1"));

    std::fs::write(host.join("step"), b"1300\n").unwrap();
    exec.step(t0 + Duration::from_secs(61));
    until("the periodic snapshot", || portal.commits().len() == 1).await;
    assert_eq!(
        super::portal_double::files_of(&portal.commits()[0].archive)["step"],
        b"1300\n"
    );

    exec.stop(5, 2, 1, StopReason::Preempted, None);
    assert_eq!(ev.final_of(5).await.stop, Some(StopReason::Preempted));
    assert_eq!(
        loops_backed_by(&attempt).len(),
        1,
        "kept until acknowledged"
    );
    exec.renew(far(&exec), &[]);
    until("the attempt forgotten", || !attempt.exists()).await;
    assert!(loops_backed_by(&attempt).is_empty());
}

#[tokio::test]
async fn a_restore_over_the_jobs_cap_is_refused_before_anything_is_written() {
    let tmp = tempfile::tempdir().unwrap();
    // A checkpoint of 2 GiB (a sparse file: the archive is small), for a 1 GiB job.
    let src = tmp.path().join("src");
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("step"), b"9").unwrap();
    std::fs::File::create(src.join("weights"))
        .unwrap()
        .set_len(2 << 30)
        .unwrap();
    let out = tmp.path().join("a.tar.zst");
    archive::pack(&src, &out, u64::MAX, &AtomicBool::new(false)).unwrap();
    let portal = PortalDouble::start(1 << 20).await;
    portal.set_latest(std::fs::read(&out).unwrap(), None, 1);

    let dir = tempfile::tempdir().unwrap();
    let rt = FakeRuntime::default();
    let (exec, mut ev) = agent_with(&rt, dir.path(), Some(&portal), DiskPolicy::default());
    exec.start_with(6, 2, launch(Some(1), None, true), far(&exec));
    ev.state_of(6, Some(AttemptState::Running)).await;
    let logs = ev.logs_of(6);
    assert!(
        logs.contains(
            "could not restore the job's checkpoint (the checkpoint holds 2.0 GiB (files count \
             at their apparent size, sparse ones whole), over the job's disk cap of 1.0 GiB)"
        ),
        "{logs}"
    );
    let env = rt.created_of(6, 2).env;
    assert!(
        !env.iter().any(|e| e.starts_with("COMMONS_RESUME")),
        "{env:?}"
    );
    let attempt = store::attempt_dir(dir.path(), 6, 2);
    let host = checkpoint::host_dir(&attempt);
    assert_eq!(std::fs::read_dir(&host).unwrap().count(), 0, "empty");
    assert!(!checkpoint::restoring_dir(&attempt).exists());
    assert!(du_kib(&attempt) < 1024, "{} KiB written", du_kib(&attempt));
}

#[tokio::test]
async fn volumes_are_mounted_again_after_a_restart_and_strays_released() {
    let dir = tempfile::tempdir().unwrap();
    let _volumes = Volumes(dir.path().to_path_buf(), None);
    let rt = FakeRuntime::default();
    let disk = image_policy(dir.path());
    let (exec, mut ev) = agent_with(&rt, dir.path(), None, disk);
    exec.start_with(7, 1, launch(Some(1), None, false), far(&exec));
    ev.state_of(7, Some(AttemptState::Running)).await;
    let attempt = store::attempt_dir(dir.path(), 7, 1);
    let host = checkpoint::host_dir(&attempt);
    std::fs::write(host.join("step"), b"42").unwrap();
    // A directory an earlier agent left with nothing to restore, its volume mounted.
    let stray = store::attempt_dir(dir.path(), 8, 1);
    std::fs::create_dir_all(&stray).unwrap();
    disk::prepare(&stray, 1 << 30, Enforcement::Image).unwrap();
    assert_eq!(loops_backed_by(&stray).len(), 1);

    // The agent dies, and the server reboots: the mount is gone, the image stays.
    drop(exec);
    drop(ev);
    disk::release(&attempt).unwrap();
    assert!(
        !host.exists(),
        "unmounted: the volume's files are in the image"
    );
    let (exec, mut ev) = agent_with(&rt, dir.path(), None, disk);
    exec.adopt().await.unwrap();
    assert!(image::is_mountpoint(&disk::volume_dir(&attempt)));
    assert_eq!(std::fs::read(host.join("step")).unwrap(), b"42");
    assert!(!stray.exists(), "the stray's directory is gone");
    assert!(loops_backed_by(&stray).is_empty(), "and its loop device");

    rt.exit(7, 1, 0);
    ev.final_of(7).await;
    exec.renew(far(&exec), &[]);
    until("the attempt forgotten", || !attempt.exists()).await;
    assert!(loops_backed_by(dir.path()).is_empty());
}

#[tokio::test]
async fn a_guest_is_not_started_under_the_free_space_floor_and_goes_back() {
    let dir = tempfile::tempdir().unwrap();
    let rt = FakeRuntime::default();
    let disk = DiskPolicy {
        floor: disk::Floor::Gb(1 << 30),
        ..Default::default()
    };
    let (exec, mut ev) = agent_with(&rt, dir.path(), None, disk);
    let mut guest = launch(None, None, false);
    guest.spec.guest = true;
    exec.start_with(9, 1, guest, far(&exec));
    let end = ev.final_of(9).await;
    assert_eq!(
        (end.state, end.stop),
        (AttemptState::Stopped, Some(StopReason::Preempted)),
        "requeued by the portal: {end:?}"
    );
    let reason = end.reason.unwrap_or_default();
    assert!(
        reason.contains("under its floor") && reason.contains("no new guests"),
        "{reason}"
    );
    assert!(rt.created.lock().unwrap().is_empty(), "no container");
    // The owner's own jobs still start.
    exec.start_with(10, 1, launch(None, None, false), far(&exec));
    ev.state_of(10, Some(AttemptState::Running)).await;
}
