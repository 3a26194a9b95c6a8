//! Staging a job's inputs (`commons_agent::inputs::stage`) against a test double of the
//! portal's inputs API over real HTTP: files land read-only where the listing says,
//! transient failures are tried again, a damaged copy, inputs over the disk cap, a refused
//! listing and a stopped attempt each fail naming the file and why, and progress reaches
//! the portal from 0 to the total.

use super::checkpoints::policy;
use super::portal_double::{PortalDouble, CREDENTIAL};
use commons_agent::checkpoint::CheckpointClient;
use commons_agent::inputs::{stage, TRIES};
use sha2::{Digest, Sha256};
use std::os::unix::fs::PermissionsExt;

fn sha(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

async fn double(files: &[(&str, &[u8])]) -> (PortalDouble, CheckpointClient) {
    let portal = PortalDouble::start(1 << 20).await;
    portal.with(|s| {
        s.inputs = files
            .iter()
            .map(|(p, d)| (p.to_string(), d.to_vec(), sha(d)))
            .collect();
    });
    let client = CheckpointClient::new(&portal.url, CREDENTIAL, policy()).unwrap();
    (portal, client)
}

#[tokio::test]
async fn inputs_land_read_only_after_transient_failures_with_progress() {
    let big = vec![7u8; 700_000];
    let (portal, client) =
        double(&[("data/a.txt", b"alpha\n"), ("lab/vision/big.bin", &big)]).await;
    portal.with(|s| s.input_failures.insert("data/a.txt".into(), TRIES - 1));
    let dir = tempfile::tempdir().unwrap();
    let got = stage(&client, (7, 1), dir.path(), 10 << 20, &|| true)
        .await
        .unwrap();
    assert_eq!((got.files, got.bytes), (2, 700_006));
    let a = dir.path().join("data/a.txt");
    assert_eq!(std::fs::read(&a).unwrap(), b"alpha\n");
    assert_eq!(
        std::fs::read(dir.path().join("lab/vision/big.bin")).unwrap(),
        big
    );
    assert_eq!(
        std::fs::metadata(&a).unwrap().permissions().mode() & 0o777,
        0o444
    );
    let reports = portal.with(|s| s.staging.clone());
    let first = &reports[0];
    let last = reports.last().unwrap();
    assert_eq!(
        (first["done_bytes"].as_u64(), first["total_bytes"].as_u64()),
        (Some(0), Some(700_006))
    );
    assert_eq!(
        (last["done_bytes"].as_u64(), last["finished"].as_bool()),
        (Some(700_006), Some(true))
    );
    assert!(last.get("error").is_none(), "{last}");
}

#[tokio::test]
async fn failures_name_the_file_and_why() {
    let dir = tempfile::tempdir().unwrap();
    // Damaged on every try: given up after TRIES, naming the file and the checksum.
    let (portal, client) = double(&[("x.bin", b"xyz")]).await;
    portal.with(|s| s.inputs[0].2 = sha(b"other"));
    let e = stage(&client, (7, 1), dir.path(), 1 << 20, &|| true)
        .await
        .unwrap_err();
    let text = e.to_string();
    assert!(
        text.starts_with("input x.bin:")
            && text.contains("SHA-256")
            && text.contains(&format!("after {TRIES} tries")),
        "{text}"
    );
    let last = portal.with(|s| s.staging.last().cloned()).unwrap();
    assert_eq!(last["error"].as_str(), Some(text.as_str()));
    // More than the job's disk: nothing fetched.
    let (portal, client) = double(&[("x.bin", b"xyz")]).await;
    let e = stage(&client, (7, 1), dir.path(), 2, &|| true)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("more than the job's disk"), "{e}");
    assert!(portal.seen().iter().all(|r| !r.path.ends_with("x.bin")));
    // A refused listing (the input is gone) fails at once, with the portal's words.
    let (portal, client) = double(&[]).await;
    portal.with(|s| {
        s.inputs_refused = Some("input \"data/a.txt\": no such file in your files".into())
    });
    let e = stage(&client, (7, 1), dir.path(), 1 << 20, &|| true)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("no such file in your files"), "{e}");
    assert_eq!(
        portal.seen().iter().filter(|r| r.status == 422).count(),
        1,
        "not tried again"
    );
    // A stopped attempt stops staging.
    let (_portal, client) = double(&[("y.bin", b"y")]).await;
    let e = stage(&client, (7, 1), dir.path(), 1 << 20, &|| false)
        .await
        .unwrap_err();
    assert_eq!(e.to_string(), "input y.bin: the attempt was stopped");
}

/// A listing with signed URLs: each file is read from its URL with no credential, never
/// through the portal's per-file route; a URL refused (expired) is not the end: the files
/// are listed again and the fresh URL read. A listing without URLs (an older portal) is
/// read through the portal, as before.
#[tokio::test]
async fn inputs_come_from_their_signed_urls_with_no_credential() {
    let (portal, client) = double(&[("data/a.txt", b"alpha\n"), ("b.bin", b"bravo")]).await;
    portal.with(|s| {
        s.signed_valid_s = Some(300);
        s.store_refusals = 1;
    });
    let dir = tempfile::tempdir().unwrap();
    let got = stage(&client, (7, 1), dir.path(), 1 << 20, &|| true)
        .await
        .unwrap();
    assert_eq!((got.files, got.bytes), (2, 11));
    assert_eq!(
        std::fs::read(dir.path().join("data/a.txt")).unwrap(),
        b"alpha\n"
    );
    let seen = portal.seen();
    let count = |f: &dyn Fn(&str) -> bool| seen.iter().filter(|r| f(&r.path)).count();
    assert_eq!(
        count(&|p| p.starts_with("/store/")),
        3,
        "one refused, two read: {seen:?}"
    );
    assert_eq!(
        count(&|p| p == "/api/agent/v1/inputs/7/1"),
        2,
        "listed again once"
    );
    assert_eq!(
        count(&|p| p.starts_with("/api/agent/v1/inputs/7/1/")),
        0,
        "{seen:?}"
    );
    assert_eq!(
        portal.with(|s| s.store_saw_credential),
        0,
        "nothing of ours to the store"
    );

    // Refused every time: given up after TRIES, in the store's words, not its XML.
    let (portal, client) = double(&[("x.bin", b"xyz")]).await;
    portal.with(|s| {
        s.signed_valid_s = Some(300);
        s.store_refusals = 100;
    });
    let e = stage(&client, (7, 1), dir.path(), 1 << 20, &|| true)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("the object store refused the signed URL (AccessDenied)") && !e.contains('<'),
        "{e}"
    );

    // URLs too close to their end are not started on: the portal's route instead.
    let (portal, client) = double(&[("y.bin", b"y")]).await;
    portal.with(|s| s.signed_valid_s = Some(5));
    let other = tempfile::tempdir().unwrap();
    stage(&client, (7, 1), other.path(), 1 << 20, &|| true)
        .await
        .unwrap();
    let seen = portal.seen();
    assert!(
        seen.iter().all(|r| !r.path.starts_with("/store/")),
        "{seen:?}"
    );
    assert!(
        seen.iter()
            .any(|r| r.path == "/api/agent/v1/inputs/7/1/y.bin"),
        "{seen:?}"
    );
}

/// Through the executor on the in-memory runtime: a job whose input takes 2.5 s to stage
/// gets it read-only at `/inputs` (`COMMONS_INPUTS_DIR`), and its 2 s time limit counts
/// from its container's start, not from the `Start` (before: already over when it ran).
#[tokio::test]
async fn staging_comes_before_the_container_and_outside_the_time_limit() {
    use super::fake_runtime::*;
    use commons_agent::executor::Executor;
    use commons_agent::reconcile::Launch;
    use commons_agent::{clock, outbox, store::Store};
    use commons_proto::AttemptState;
    use std::time::Duration;
    let (portal, client) = double(&[("data/a.txt", b"alpha\n")]).await;
    portal.with(|s| s.input_delay = Duration::from_millis(2500));
    let rt = FakeRuntime::default();
    let dir = tempfile::tempdir().unwrap();
    let (tx, rx) = outbox::channel(Default::default());
    let exec = Executor::with_checkpoints(rt.clone(), tx, Store::new(dir.path()), Some(client));
    let mut ev = Events::new(rx);
    let mut s = spec("demo", 2);
    s.inputs = vec!["data/a.txt".into()];
    let launch = Launch {
        spec: s,
        gpus: vec![],
        resume: false,
    };
    exec.start_with(7, 1, launch, far(&exec));
    ev.state_of(7, Some(AttemptState::Running)).await;
    let left = exec
        .time_limit_deadline(7, 1)
        .unwrap()
        .saturating_sub(clock::now());
    assert!(
        left > Duration::from_millis(1000),
        "the time limit has {left:?} left"
    );
    let created = rt.created_of(7, 1);
    let staged = created.mount.inputs_dir.expect("mounted");
    assert_eq!(
        std::fs::read(staged.join("data/a.txt")).unwrap(),
        b"alpha\n"
    );
    assert!(created
        .env
        .contains(&"COMMONS_INPUTS_DIR=/inputs".to_string()));
    let log = ev.logs_of(7);
    assert!(
        log.contains("staged 1 input files (6 B) into /inputs"),
        "{log}"
    );
}

/// An attempt preempted while it stages gets no container and ends as its stop says
/// (stopped, preempted), not as a failure to start.
#[tokio::test]
async fn an_attempt_stopped_while_staging_ends_as_the_stop_says() {
    use super::fake_runtime::*;
    use commons_agent::executor::Executor;
    use commons_agent::reconcile::Launch;
    use commons_agent::{outbox, store::Store};
    use commons_proto::{AttemptState, StopReason};
    use std::time::{Duration, Instant};
    let (portal, client) = double(&[("data/a.txt", b"alpha\n")]).await;
    portal.with(|s| s.input_delay = Duration::from_millis(1500));
    let rt = FakeRuntime::default();
    let dir = tempfile::tempdir().unwrap();
    let (tx, rx) = outbox::channel(Default::default());
    let exec = Executor::with_checkpoints(rt.clone(), tx, Store::new(dir.path()), Some(client));
    let mut ev = Events::new(rx);
    let mut s = spec("demo", 600);
    s.inputs = vec!["data/a.txt".into()];
    let launch = Launch {
        spec: s,
        gpus: vec![],
        resume: false,
    };
    exec.start_with(7, 1, launch, far(&exec));
    // Stopped once staging has listed its files (their download is slow).
    let since = Instant::now();
    while !portal
        .seen()
        .iter()
        .any(|r| r.path.ends_with("/inputs/7/1"))
    {
        assert!(
            since.elapsed() < Duration::from_secs(20),
            "no listing: {:?}",
            portal.seen().len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(exec.stop(7, 1, 30, StopReason::Preempted, None));
    let end = ev.final_of(7).await;
    assert_eq!(
        (end.state, end.stop),
        (AttemptState::Stopped, Some(StopReason::Preempted)),
        "{end:?}"
    );
    assert!(rt.ids().is_empty(), "no container: {:?}", rt.ids());
    assert!(ev
        .logs_of(7)
        .contains("staging failed: input data/a.txt: the attempt was stopped"));
}
