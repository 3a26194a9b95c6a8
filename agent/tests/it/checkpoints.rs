//! Checkpoints through the executor, on the in-memory runtime, with a test double of the
//! portal's checkpoint API over real HTTP (`portal_double`): restores (and what is
//! refused), the upload after a stop and before the report, an upload resumed by a
//! restarted agent, periodic snapshots, and what uploads nothing.

use super::fake_runtime::*;
use super::portal_double::{files_of, PortalDouble, CREDENTIAL};
use commons_agent::checkpoint::{
    self, archive, CheckpointClient, CheckpointFile, FinalUpload, Policy,
};
use commons_agent::clock;
use commons_agent::executor::Executor;
use commons_agent::outbox;
use commons_agent::reconcile::Launch;
use commons_agent::store::{self, Store};
use commons_proto::{AgentMsg, AttemptState, StopReason};
use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::time::Duration;

const JOB_LOG: &str = "[GPU Commons]";

pub(super) fn policy() -> Policy {
    Policy {
        first_backoff: Duration::from_millis(50),
        max_backoff: Duration::from_millis(200),
        restore_tries: 2,
        give_up_after: Duration::from_secs(60),
        snapshot_tries: 2,
        request_timeout: Duration::from_secs(10),
    }
}

struct Ck {
    exec: Executor<FakeRuntime>,
    ev: Events,
    rt: FakeRuntime,
    dir: tempfile::TempDir,
    portal: PortalDouble,
}

/// An agent process over `rt` and `dir` whose checkpoints go to `portal`.
fn ck_agent(
    rt: &FakeRuntime,
    dir: &Path,
    portal: &PortalDouble,
    policy: Policy,
) -> (Executor<FakeRuntime>, Events) {
    let client = CheckpointClient::new(&portal.url, CREDENTIAL, policy).unwrap();
    let (tx, rx) = outbox::channel(Default::default());
    let exec = Executor::with_checkpoints(rt.clone(), tx, Store::new(dir), Some(client));
    (exec, Events::new(rx))
}

async fn ck_setup(policy: Policy, part_bytes: u64) -> Ck {
    let portal = PortalDouble::start(part_bytes).await;
    let rt = FakeRuntime::default();
    let dir = tempfile::tempdir().unwrap();
    let (exec, ev) = ck_agent(&rt, dir.path(), &portal, policy);
    Ck {
        exec,
        ev,
        rt,
        dir,
        portal,
    }
}

fn launch(interval_s: Option<u64>, resume: bool) -> Launch {
    let mut s = spec("demo", 600);
    s.checkpoint_interval_s = interval_s;
    Launch {
        spec: s,
        gpus: vec![],
        resume,
    }
}

/// Starts job `job` (attempt 1) and waits until it runs; returns its checkpoint dir.
async fn run(ck: &mut Ck, job: i64, launch: Launch) -> PathBuf {
    ck.exec.start_with(job, 1, launch, far(&ck.exec));
    ck.ev.state_of(job, Some(AttemptState::Running)).await;
    ck.rt.created_of(job, 1).mount.host_dir
}

fn env_of(rt: &FakeRuntime, job: i64) -> Vec<String> {
    rt.created_of(job, 1).env
}

fn entries(dir: &Path) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    out.sort();
    out
}

/// Incompressible bytes, so the archive has as many parts as the test wants.
fn noise(len: usize) -> Vec<u8> {
    let mut x = 0x2545_f491_4f6c_dd1du64;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// An archive of `files`, made as the agent makes them.
pub(super) fn archive_of(files: &[(&str, &[u8])]) -> Vec<u8> {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    for (name, data) in files {
        let p = src.join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, data).unwrap();
    }
    let out = tmp.path().join("a.tar.zst");
    archive::pack(&src, &out, u64::MAX, &AtomicBool::new(false)).unwrap();
    std::fs::read(out).unwrap()
}

/// A tar + zstd archive with one file entry named exactly `name` (as an attacker writes).
fn evil_archive(name: &str) -> Vec<u8> {
    let mut h = tar::Header::new_gnu();
    h.as_gnu_mut().unwrap().name[..name.len()].copy_from_slice(name.as_bytes());
    h.set_entry_type(tar::EntryType::Regular);
    h.set_mode(0o644);
    h.set_size(4);
    h.set_cksum();
    let mut b = tar::Builder::new(Vec::new());
    b.append(&h, &b"evil"[..]).unwrap();
    zstd::encode_all(&b.into_inner().unwrap()[..], 3).unwrap()
}

pub(super) async fn until(what: &str, mut ok: impl FnMut() -> bool) {
    let end = tokio::time::Instant::now() + Duration::from_secs(10);
    while !ok() {
        assert!(tokio::time::Instant::now() < end, "{what}: not within 10 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

#[tokio::test]
async fn a_restore_sets_commons_resume_and_the_files_arrive() {
    let mut ck = ck_setup(policy(), 1 << 20).await;
    ck.portal.set_latest(
        archive_of(&[("state/step", b"1200\n"), ("weights.bin", &[7u8; 5000])]),
        None,
        3,
    );
    let host = run(&mut ck, 1, launch(None, true)).await;
    let env = env_of(&ck.rt, 1);
    assert!(env.contains(&"COMMONS_RESUME=1".to_string()), "{env:?}");
    assert!(env.contains(&"COMMONS_CHECKPOINT_DIR=/checkpoint".to_string()));
    assert!(ck.rt.created_of(1, 1).mount.resumed);
    assert_eq!(host, ck.dir.path().join("attempts/1-1/disk/checkpoint"));
    assert_eq!(std::fs::read(host.join("state/step")).unwrap(), b"1200\n");
    assert_eq!(
        std::fs::read(host.join("weights.bin")).unwrap(),
        [7u8; 5000]
    );
    if is_root() {
        for p in ["", "state", "state/step", "weights.bin"] {
            let m = std::fs::symlink_metadata(host.join(p)).unwrap();
            assert_eq!((m.uid(), m.gid()), (65534, 65534), "{p:?}");
        }
    }
    let logs = ck.ev.logs_of(1);
    assert!(
        logs.contains("[GPU Commons] restored the checkpoint of attempt 3 into /checkpoint"),
        "{logs}"
    );
    let attempt_dir = store::attempt_dir(ck.dir.path(), 1, 1);
    assert!(!attempt_dir.join(checkpoint::DOWNLOAD_FILE).exists());
    assert!(!checkpoint::restoring_dir(&attempt_dir).exists());

    // Preempted before it wrote anything new: the store already has this content.
    let before = ck.portal.seen().len();
    ck.exec.stop(1, 1, 5, StopReason::Preempted, None);
    assert_eq!(ck.ev.final_of(1).await.stop, Some(StopReason::Preempted));
    assert_eq!(ck.portal.seen().len(), before, "nothing sent");
    assert!(ck.ev.logs_of(1).contains("has not changed"));
}

#[tokio::test]
async fn a_job_without_a_checkpoint_or_asked_for_none_starts_empty() {
    let mut ck = ck_setup(policy(), 1 << 20).await;
    let host = run(&mut ck, 2, launch(None, false)).await;
    assert!(entries(&host).is_empty());
    let env = env_of(&ck.rt, 2);
    assert!(env.contains(&"COMMONS_CHECKPOINT_DIR=/checkpoint".to_string()));
    assert!(!env.iter().any(|e| e.starts_with("COMMONS_RESUME")));
    assert!(ck.portal.seen().is_empty(), "no resume: no download");

    let host = run(&mut ck, 3, launch(None, true)).await;
    assert!(entries(&host).is_empty());
    assert!(!env_of(&ck.rt, 3)
        .iter()
        .any(|e| e.starts_with("COMMONS_RESUME")));
    assert!(ck
        .ev
        .logs_of(3)
        .contains("the portal has no checkpoint of this job"));
}

#[tokio::test]
async fn a_damaged_download_is_refused_and_the_job_starts_fresh_and_says_so() {
    let mut ck = ck_setup(policy(), 1 << 20).await;
    let archive = archive_of(&[("step", b"1")]);
    ck.portal.set_latest(archive, Some(&"0".repeat(64)), 1);
    let host = run(&mut ck, 4, launch(None, true)).await;
    assert!(entries(&host).is_empty(), "nothing restored");
    assert!(!env_of(&ck.rt, 4)
        .iter()
        .any(|e| e.starts_with("COMMONS_RESUME")));
    assert!(!ck.rt.created_of(4, 1).mount.resumed);
    let gets = ck
        .portal
        .seen()
        .iter()
        .filter(|s| s.path.ends_with("/latest"))
        .count();
    assert_eq!(gets, 2, "tried again (restore_tries), then gave up");
    let logs = ck.ev.logs_of(4);
    assert!(
        logs.contains("could not restore the job's checkpoint"),
        "{logs}"
    );
    assert!(logs.contains("damaged on the way"), "{logs}");
    assert!(
        logs.contains("starting with an empty /checkpoint, without COMMONS_RESUME"),
        "{logs}"
    );
    assert!(!store::attempt_dir(ck.dir.path(), 4, 1)
        .join(checkpoint::DOWNLOAD_FILE)
        .exists());
}

#[tokio::test]
async fn an_archive_that_climbs_out_or_names_an_absolute_path_is_refused() {
    let mut ck = ck_setup(policy(), 1 << 20).await;
    let outside = tempfile::tempdir().unwrap();
    let absolute = outside.path().join("abs-evil");
    let cases = [
        (5, "../evil".to_string()),
        (6, absolute.display().to_string()),
    ];
    for (job, name) in cases {
        ck.portal.set_latest(evil_archive(&name), None, 1);
        let host = run(&mut ck, job, launch(None, true)).await;
        assert!(entries(&host).is_empty(), "{name}");
        assert!(!env_of(&ck.rt, job)
            .iter()
            .any(|e| e.starts_with("COMMONS_RESUME")));
        let logs = ck.ev.logs_of(job);
        assert!(logs.contains("refused"), "{name}: {logs}");
        let attempt_dir = store::attempt_dir(ck.dir.path(), job, 1);
        assert!(!attempt_dir.join("evil").exists(), "nothing escaped");
        assert!(!checkpoint::restoring_dir(&attempt_dir).exists());
        let gets = ck
            .portal
            .seen()
            .iter()
            .filter(|s| s.path.ends_with("/latest"))
            .count();
        assert_eq!(
            gets,
            job as usize - 4,
            "a refused archive is not fetched again"
        );
    }
    assert!(!absolute.exists(), "nothing written at the absolute path");
}

#[tokio::test]
async fn a_preempted_attempt_uploads_its_checkpoint_before_it_is_reported() {
    let mut ck = ck_setup(policy(), 1 << 20).await;
    ck.portal
        .with(|s| s.commit_delay = Duration::from_millis(700));
    let host = run(&mut ck, 7, launch(None, false)).await;
    // The job writes its checkpoint (atomically), as the container would.
    std::fs::create_dir(host.join("ckpt")).unwrap();
    std::fs::write(host.join("ckpt/model.tmp"), b"weights").unwrap();
    std::fs::rename(host.join("ckpt/model.tmp"), host.join("ckpt/model")).unwrap();
    ck.exec.stop(7, 1, 5, StopReason::Preempted, Some("owner"));

    until("the container is removed", || ck.rt.ids().is_empty()).await;
    assert_eq!(
        state_in_reports(&ck.exec, 7),
        Some(AttemptState::Running),
        "its heartbeats hold the final state while the upload runs"
    );
    assert!(ck.portal.commits().is_empty());
    let end = ck.ev.final_of(7).await;
    assert_eq!(
        (end.state, end.stop),
        (AttemptState::Stopped, Some(StopReason::Preempted))
    );
    let commits = ck.portal.commits();
    assert_eq!(commits.len(), 1, "committed by the time it was reported");
    assert_eq!((commits[0].job, commits[0].attempt), (7, 1));
    assert_eq!(
        files_of(&commits[0].archive),
        BTreeMap::from([("ckpt/model".to_string(), b"weights".to_vec())])
    );
    let stored_at = ck.ev.seen.iter().position(
        |m| matches!(m, AgentMsg::Logs { chunk, .. } if chunk.contains("checkpoint stored")),
    );
    let reported_at = ck
        .ev
        .seen
        .iter()
        .position(|m| matches!(m, AgentMsg::AttemptEvent { state, .. } if state.is_final()));
    assert!(stored_at.unwrap() < reported_at.unwrap());
    assert_eq!(state_in_reports(&ck.exec, 7), Some(AttemptState::Stopped));
    let attempt_dir = store::attempt_dir(ck.dir.path(), 7, 1);
    let state = CheckpointFile::read(&attempt_dir).unwrap().unwrap();
    assert_eq!(state.final_upload, Some(FinalUpload::Stored));
    assert!(!attempt_dir.join(checkpoint::ARCHIVE_FILE).exists());
    assert!(!attempt_dir.join(checkpoint::UPLOAD_FILE).exists());
}

#[tokio::test]
async fn an_interrupted_upload_resumes_after_an_agent_restart_without_resending_parts() {
    let mut ck = ck_setup(policy(), 4096).await;
    let data = noise(20_000);
    let host = run(&mut ck, 8, launch(None, false)).await;
    std::fs::write(host.join("state.bin"), &data).unwrap();
    ck.portal.with(|s| s.fail_parts_from = Some(2));
    ck.exec.stop(8, 1, 5, StopReason::Preempted, None);
    until("part 2 is refused", || {
        ck.portal
            .seen()
            .iter()
            .any(|s| s.path.ends_with("/parts/2") && s.status == 503)
    })
    .await;

    // The agent dies half-way; its upload stops at its next try.
    let Ck {
        exec,
        mut ev,
        rt,
        dir,
        portal,
    } = ck;
    drop(exec);
    let meanwhile = ev.quiet_for(Duration::from_millis(600)).await;
    assert!(
        !meanwhile
            .iter()
            .chain(&ev.seen)
            .any(|m| matches!(m, AgentMsg::AttemptEvent { state, .. } if state.is_final())),
        "never reported before the upload is over"
    );
    let attempt_dir = store::attempt_dir(dir.path(), 8, 1);
    assert!(attempt_dir.join(checkpoint::ARCHIVE_FILE).is_file());
    assert!(attempt_dir.join(checkpoint::UPLOAD_FILE).is_file());
    assert_eq!(portal.parts_accepted(), BTreeMap::from([(0, 1), (1, 1)]));

    portal.with(|s| s.fail_parts_from = None);
    let (exec, mut ev) = ck_agent(&rt, dir.path(), &portal, policy());
    exec.adopt().await.unwrap();
    let end = ev.final_of(8).await;
    assert_eq!(end.stop, Some(StopReason::Preempted));
    let accepted = portal.parts_accepted();
    assert_eq!(
        accepted.values().copied().collect::<Vec<_>>(),
        [1; 5],
        "every part sent once: {accepted:?}"
    );
    let commits = portal.commits();
    assert_eq!(commits.len(), 1);
    assert_eq!(files_of(&commits[0].archive)["state.bin"], data);
    assert_eq!(
        commits[0].write_ms, None,
        "packed by the agent before its restart: how long it took is not known"
    );
    assert!(!attempt_dir.join(checkpoint::UPLOAD_FILE).exists());
    assert!(ev.logs_of(8).contains("checkpoint stored"));
}

/// Stops job `job` with a checkpoint of `len` bytes and waits for the final report.
async fn stop_with_checkpoint(ck: &mut Ck, job: i64, len: usize) {
    let host = run(ck, job, launch(None, false)).await;
    std::fs::write(host.join("state.bin"), noise(len)).unwrap();
    ck.exec.stop(job, 1, 5, StopReason::Preempted, None);
    let end = ck.ev.final_of(job).await;
    assert_eq!(end.stop, Some(StopReason::Preempted));
}

#[tokio::test]
async fn a_commit_says_how_long_the_checkpoint_took_to_write() {
    // Five parts of 4 KiB, each answered after 200 ms: at least a second to write.
    let mut ck = ck_setup(policy(), 4096).await;
    ck.portal
        .with(|s| s.part_delay = Duration::from_millis(200));
    stop_with_checkpoint(&mut ck, 10, 20_000).await;
    let commits = ck.portal.commits();
    assert_eq!(commits.len(), 1, "{:?}", ck.portal.seen());
    let ms = commits[0].write_ms.expect("the commit carries write_ms");
    assert!(
        (1_000..60_000).contains(&ms),
        "packing and five slow parts took {ms} ms"
    );
}

#[tokio::test]
async fn a_portal_that_predates_write_ms_gets_the_commit_without_it() {
    let mut ck = ck_setup(policy(), 1 << 20).await;
    ck.portal.with(|s| s.before_write_ms = true);
    stop_with_checkpoint(&mut ck, 11, 5_000).await;
    let commits = ck.portal.commits();
    assert_eq!(commits.len(), 1, "{:?}", ck.portal.seen());
    assert_eq!(commits[0].write_ms, None);
    let statuses: Vec<u16> = ck
        .portal
        .seen()
        .iter()
        .filter(|s| s.path.ends_with("/commit"))
        .map(|s| s.status)
        .collect();
    assert_eq!(statuses, [400, 200], "refused with write_ms, taken without");
}

#[tokio::test]
async fn periodic_snapshots_are_uploaded_while_the_job_runs_and_only_when_changed() {
    let mut ck = ck_setup(policy(), 1 << 20).await;
    let t0 = clock::now();
    let host = run(&mut ck, 9, launch(Some(60), false)).await;
    ck.exec.step(t0 + Duration::from_secs(30));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(ck.portal.seen().is_empty(), "not due yet, and empty anyway");

    std::fs::write(host.join("step"), b"1").unwrap();
    ck.exec.step(t0 + Duration::from_secs(61));
    until("the first snapshot", || ck.portal.commits().len() == 1).await;
    assert_eq!(state_in_reports(&ck.exec, 9), Some(AttemptState::Running));

    // Nothing changed: the next one sends nothing.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let requests = ck.portal.seen().len();
    ck.exec.step(t0 + Duration::from_secs(122));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(ck.portal.seen().len(), requests, "unchanged: nothing sent");

    std::fs::write(host.join("step.tmp"), b"2").unwrap();
    std::fs::rename(host.join("step.tmp"), host.join("step")).unwrap();
    ck.exec.step(t0 + Duration::from_secs(183));
    until("the second snapshot", || ck.portal.commits().len() == 2).await;
    assert_eq!(files_of(&ck.portal.commits()[1].archive)["step"], b"2");
    ck.ev.quiet_for(Duration::from_millis(100)).await;
    assert!(ck.ev.logs_of(9).contains("periodic checkpoint stored"));

    // It ends by itself: exit 0 uploads nothing more.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let requests = ck.portal.seen().len();
    ck.rt.exit(9, 1, 0);
    assert_eq!(ck.ev.final_of(9).await.exit_code, Some(0));
    assert_eq!(ck.portal.seen().len(), requests);
}

#[tokio::test]
async fn an_exit_0_uploads_nothing_and_an_empty_directory_neither() {
    let mut ck = ck_setup(policy(), 1 << 20).await;
    let host = run(&mut ck, 10, launch(None, false)).await;
    std::fs::write(host.join("step"), b"done").unwrap();
    ck.rt.exit(10, 1, 0);
    let end = ck.ev.final_of(10).await;
    assert_eq!((end.state, end.exit_code), (AttemptState::Exited, Some(0)));
    assert!(ck.portal.seen().is_empty());
    assert!(!ck.ev.logs_of(10).contains(JOB_LOG));

    run(&mut ck, 11, launch(None, false)).await;
    ck.exec.stop(11, 1, 5, StopReason::Preempted, None);
    assert_eq!(ck.ev.final_of(11).await.stop, Some(StopReason::Preempted));
    assert!(ck.portal.seen().is_empty());
    assert!(ck.ev.logs_of(11).contains("/checkpoint is empty"));
}

#[tokio::test]
async fn a_full_lab_cap_is_final_and_said_in_the_jobs_log() {
    let mut ck = ck_setup(policy(), 1 << 20).await;
    ck.portal.with(|s| s.cap = true);
    let host = run(&mut ck, 12, launch(None, false)).await;
    std::fs::write(host.join("step"), b"1").unwrap();
    ck.exec.stop(12, 1, 5, StopReason::Cancelled, None);
    assert_eq!(ck.ev.final_of(12).await.stop, Some(StopReason::Cancelled));
    let commits: Vec<_> = ck
        .portal
        .seen()
        .into_iter()
        .filter(|s| s.path.ends_with("/commit"))
        .map(|s| s.status)
        .collect();
    assert_eq!(commits, [409], "not tried again");
    let logs = ck.ev.logs_of(12);
    assert!(
        logs.contains("checkpoint NOT stored: the lab's checkpoint storage is full"),
        "{logs}"
    );
    let state = CheckpointFile::read(&store::attempt_dir(ck.dir.path(), 12, 1))
        .unwrap()
        .unwrap();
    assert_eq!(state.final_upload, Some(FinalUpload::GivenUp));
}

#[tokio::test]
async fn a_portal_that_stays_down_delays_the_report_only_for_the_bound() {
    let bounded = Policy {
        give_up_after: Duration::from_secs(1),
        ..policy()
    };
    let mut ck = ck_setup(bounded, 1 << 20).await;
    let host = run(&mut ck, 13, launch(None, false)).await;
    std::fs::write(host.join("step"), b"1").unwrap();
    ck.portal.with(|s| s.down = true);
    let stopped = std::time::Instant::now();
    ck.exec.stop(13, 1, 5, StopReason::Preempted, None);
    let end = ck.ev.final_of(13).await;
    assert_eq!(end.stop, Some(StopReason::Preempted));
    assert!(stopped.elapsed() >= Duration::from_secs(1));
    assert!(ck.portal.seen().len() >= 2, "it tried more than once");
    let logs = ck.ev.logs_of(13);
    assert!(
        logs.contains("checkpoint NOT stored: gave up after"),
        "{logs}"
    );
}
