//! A job's inputs: checked at submission (a missing input, a bad path, a lab the user is
//! not in: 422 naming it), listed and streamed to the starting attempt's node only, its
//! staging shown in the job's view and history; and with a real agent and the Docker
//! Engine, a job that reads its inputs under `/inputs` (from the local store and from S3)
//! and cannot write there, and one whose staging fails naming the input.

use crate::checkpoints::{enrol, run};
use crate::support::files::{self as f, put, sha256};
use crate::support::harness::TestPortal;
use commons_portal::db::{self, DbError};
use commons_portal::domain::JobState;
use commons_proto::{input_file_path, inputs_path, staging_path};
use serde_json::{json, Value};

/// A job of `inputs` (with `command`), as the API takes it.
fn job_with(inputs: &[&str], command: &str) -> Value {
    json!({"image": "commons-demo:latest", "command": ["sh", "-c", command], "gpus": 1,
           "time_limit_minutes": 10, "inputs": inputs})
}

/// Submits `inputs` as `token`: the status and the answer.
async fn submit(p: &TestPortal, token: &str, inputs: &[&str]) -> (u16, Value) {
    p.post_json(token, "/api/v1/jobs", &job_with(inputs, "true"))
        .await
}

/// Attempt 1 of `job` placed on `node`, starting.
fn starting(c: &mut db::DbConn, job: i64, node: i64) -> Result<(), DbError> {
    let t = db::now();
    db::attempts::insert(c, job, 1, node, &[], t + chrono::Duration::hours(1), t)?;
    db::jobs::set_placed(c, job, 1, node)?;
    db::jobs::set_state(c, job, JobState::Starting, "starting")
}

/// Acts as the agent: GET the listing (empty `path`) or one file.
async fn get_input(p: &TestPortal, cred: &str, job: i64, path: &str) -> (u16, Vec<u8>) {
    let url = if path.is_empty() {
        inputs_path(job, 1)
    } else {
        input_file_path(job, 1, &commons_api::files::encode_path(path))
    };
    let r = p
        .http
        .get(format!("{}{url}", p.url))
        .bearer_auth(cred)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.bytes().await.unwrap().to_vec())
}

/// Acts as the agent: reports staging.
async fn report(p: &TestPortal, cred: &str, job: i64, body: Value) -> u16 {
    let r = p
        .http
        .post(format!("{}{}", p.url, staging_path(job, 1)))
        .bearer_auth(cred)
        .json(&body)
        .send()
        .await
        .unwrap();
    r.status().as_u16()
}

/// alice's files and lab vision's, as the tests use them.
async fn upload(p: &TestPortal) {
    let mine = "/api/v1/files";
    for (path, data) in [
        ("data/a.txt", "alpha\n"),
        ("code/run.sh", "echo run\n"),
        ("code/lib/x.py", "print(1)\n"),
    ] {
        let a = put(p, &p.alice, mine, path, data.as_bytes()).await;
        assert_eq!(a.status, 201, "{a}");
    }
    let lab = "/api/v1/labs/vision/files";
    let a = put(p, &p.carol, lab, "shared/s.txt", b"shared\n").await;
    assert_eq!(a.status, 201, "{a}");
}

per_backend! {
    async fn inputs_are_checked_at_submission_and_served_to_the_starting_node_only(backend: Backend) {
        let dir = tempfile::tempdir().unwrap();
        let p = f::portal_in(backend, dir.path(), |_| {}).await;
        p.portal.scheduler.abort();
        upload(&p).await;
        let refused = |(s, v): (u16, Value), needle: &str| {
            assert_eq!(s, 422, "[{backend:?}] {v}");
            assert_eq!(v["field"], "inputs", "{v}");
            assert!(v["message"].as_str().unwrap().contains(needle), "{needle}: {v}");
        };
        refused(submit(&p, &p.alice, &["data/missing.txt"]).await, "\"data/missing.txt\": no such file");
        refused(submit(&p, &p.alice, &["empty/"]).await, "\"empty/\": no files under that folder");
        refused(submit(&p, &p.alice, &["a//b"]).await, "empty segment");
        refused(submit(&p, &p.alice, &["../etc/passwd"]).await, "'..'");
        refused(submit(&p, &p.alice, &["lab:nolab/x"]).await, "no lab");
        refused(submit(&p, &p.bob, &["lab:vision/shared/s.txt"]).await, "only members of lab vision");
        let many: Vec<String> = (0..65).map(|n| format!("f{n}")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        refused(submit(&p, &p.alice, &many).await, "at most 64");

        let ok = ["data/a.txt", "code/", "lab:vision/shared/s.txt"];
        let (s, v) = submit(&p, &p.alice, &ok).await;
        assert_eq!(s, 201, "{v}");
        assert_eq!(v["inputs"], json!(ok));
        let job = v["id"].as_i64().unwrap();
        let (node, cred) = enrol(&p, "vision", "gpu-a").await;
        let (_, other) = enrol(&p, "vision", "gpu-b").await;
        assert_eq!(get_input(&p, &cred, job, "").await.0, 404, "not placed yet");
        run(&p, move |c| starting(c, job, node)).await;

        let (s, body) = get_input(&p, &cred, job, "").await;
        assert_eq!(s, 200);
        let listed: Value = serde_json::from_slice(&body).unwrap();
        let paths: Vec<&str> = listed.as_array().unwrap().iter().map(|f| f["path"].as_str().unwrap()).collect();
        assert_eq!(paths, ["code/lib/x.py", "code/run.sh", "data/a.txt", "lab/vision/shared/s.txt"]);
        assert_eq!(listed[2]["sha256"], sha256(b"alpha\n"));
        assert_eq!(listed[2]["size"], 6);
        let (s, body) = get_input(&p, &cred, job, "lab/vision/shared/s.txt").await;
        assert_eq!((s, body.as_slice()), (200, b"shared\n".as_slice()));
        assert_eq!(get_input(&p, &cred, job, "data/other.txt").await.0, 404, "only what the job names");
        assert_eq!(get_input(&p, &other, job, "data/a.txt").await.0, 404, "only the attempt's node");
        assert_eq!(get_input(&p, "nonsense", job, "data/a.txt").await.0, 401);

        // Staging progress: in the view while it lasts, in the history at its start and end.
        let progress = json!({"done_bytes": 6, "total_bytes": 31, "files": 4});
        assert_eq!(report(&p, &cred, job, progress).await, 204);
        assert_eq!(report(&p, &other, job, json!({"done_bytes": 0, "total_bytes": 1, "files": 1})).await, 404);
        let view = p.job(&p.alice, job).await;
        assert_eq!(view["staging"], json!({"done_bytes": 6, "total_bytes": 31}), "{view}");
        let alice = crate::support::session::BrowserSession::login(&p, "alice").await;
        let page = alice.page(&format!("/jobs/{job}")).await;
        assert!(page.contains("id=\"staging\"") && page.contains("lab:vision/shared/s.txt"), "the job page shows staging and inputs");
        // The submit form: one input a line; a missing one is named beside the field.
        let form = |inputs: &'static str| [("image", "commons-demo:latest"), ("gpus", "1"),
            ("time_limit_minutes", "5"), ("inputs", inputs)];
        let r = alice.post_form("/jobs", &form("data/a.txt\r\nnope/\r\n")).await;
        assert_eq!(r.status(), 422, "[{backend:?}]");
        let body = r.text().await.unwrap();
        assert!(body.contains("id=\"inputs-error\"") && body.contains("nope/"), "{body}");
        let r = alice.post_form("/jobs", &form("data/a.txt\r\n code/ \r\n")).await;
        assert_eq!(r.status(), 303, "[{backend:?}]");
        let mine = p.get_json(&p.alice, "/api/v1/jobs").await;
        assert_eq!(mine[0]["inputs"], json!(["data/a.txt", "code/"]), "{mine}");
        let done = json!({"done_bytes": 31, "total_bytes": 31, "files": 4, "finished": true});
        assert_eq!(report(&p, &cred, job, done).await, 204);
        let view = p.job(&p.alice, job).await;
        assert!(view.get("staging").is_none(), "{view}");
        let events = p.get_json(&p.alice, &format!("/api/v1/jobs/{job}/events")).await;
        let text = events.to_string();
        assert!(text.contains("attempt 1: staging its inputs into /inputs (4 files, 31 B)"), "{text}");
        assert!(text.contains("attempt 1: inputs staged (4 files, 31 B in"), "{text}");
        p.stop().await;
    }
}

/// With a real agent and the Docker Engine: the job reads a file input and a folder input
/// under `/inputs` (and a lab's under `/inputs/lab/vision/`), cannot write there, and
/// its history says when staging started and ended. The agent read each file from its
/// signed URL: never through the portal's per-file route; through the portal's signed
/// object route when `signed_by_portal` (a local store), else straight from the store.
async fn reads_its_inputs_read_only(p: &TestPortal, signed_by_portal: bool) {
    use crate::files_signed::{route_hits, INPUT_FILE_ROUTE, OBJECT_ROUTE};
    use std::time::Duration;
    upload(p).await;
    let _agent = p.agent("vision", "fake:1xA100-80GB").await;
    let script = "cat /inputs/data/a.txt /inputs/code/run.sh /inputs/code/lib/x.py \
                  /inputs/lab/vision/shared/s.txt; echo \"dir=$COMMONS_INPUTS_DIR\"; \
                  if echo x > /inputs/data/a.txt 2>/dev/null || touch /inputs/new 2>/dev/null; \
                  then echo WROTE; else echo read-only; fi";
    let inputs = ["data/a.txt", "code/", "lab:vision/shared/s.txt"];
    let job = p.submit(&p.alice, job_with(&inputs, script)).await;
    let done = p
        .wait_state(
            &p.alice,
            job,
            &["succeeded", "failed", "cancelled"],
            Duration::from_secs(120),
        )
        .await;
    let log = p.logs(&p.alice, job).await;
    assert_eq!(done["state"], "succeeded", "{done}\n{log}");
    for line in [
        "alpha",
        "echo run",
        "print(1)",
        "shared",
        "dir=/inputs",
        "read-only",
    ] {
        assert!(log.contains(line), "{line:?} in\n{log}");
    }
    assert!(!log.contains("WROTE"), "{log}");
    assert!(
        log.contains("staged 4 input files (31 B) into /inputs"),
        "{log}"
    );
    let events = p
        .get_json(&p.alice, &format!("/api/v1/jobs/{job}/events"))
        .await
        .to_string();
    assert!(
        events.contains("inputs staged (4 files, 31 B in"),
        "{events}"
    );
    assert_eq!(
        route_hits(p, INPUT_FILE_ROUTE),
        0,
        "no byte through the old route"
    );
    let through_portal = route_hits(p, OBJECT_ROUTE);
    if signed_by_portal {
        assert_eq!(through_portal, 4, "one signed GET a file");
    } else {
        assert_eq!(through_portal, 0, "read from the bucket, not the portal");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_reads_its_inputs_read_only_under_inputs() {
    let dir = tempfile::tempdir().unwrap();
    let p = f::portal_in(crate::support::harness::Backend::Sqlite, dir.path(), |_| {}).await;
    reads_its_inputs_read_only(&p, true).await;
    p.stop().await;
}

/// The same with the file spaces on S3 (moto): the agent reads each object from the
/// bucket through its presigned URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_reads_its_inputs_from_s3() {
    use crate::checkpoints::moto::Moto;
    let moto = Moto::start().await;
    let prefix = format!("t{:x}", rand::random::<u32>());
    let (endpoint, store) = (moto.endpoint.clone(), format!("s3://checkpoints/{prefix}"));
    let p = TestPortal::builder(crate::support::harness::Backend::Sqlite)
        .config(move |c| {
            let k = &mut c.checkpoints;
            k.store = Some(store);
            k.endpoint = Some(endpoint);
            k.allow_http = true;
            k.access_key_id = Some("testing".into());
            k.secret_access_key = Some(commons_portal::config::Secret("testing".into()));
        })
        .start()
        .await;
    reads_its_inputs_read_only(&p, false).await;
    p.stop().await;
}

/// With a real agent: an input deleted after the job was submitted fails its staging; the
/// job's log and history name the input and why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_staging_failure_names_the_input() {
    use std::time::Duration;
    let dir = tempfile::tempdir().unwrap();
    let p = f::portal_in(crate::support::harness::Backend::Sqlite, dir.path(), |_| {}).await;
    upload(&p).await;
    let job = p
        .submit(&p.alice, job_with(&["data/a.txt", "code/"], "echo RAN"))
        .await;
    let gone = f::delete(&p, &p.alice, "/api/v1/files", "data/a.txt").await;
    assert!(gone.status < 300, "{gone}");
    let _agent = p.agent("vision", "fake:1xA100-80GB").await;
    let done = p
        .wait_state(
            &p.alice,
            job,
            &["succeeded", "failed", "cancelled"],
            Duration::from_secs(120),
        )
        .await;
    let log = p.logs(&p.alice, job).await;
    let events = p
        .get_json(&p.alice, &format!("/api/v1/jobs/{job}/events"))
        .await
        .to_string();
    assert_eq!(done["state"], "failed", "{done}\n{log}\n{events}");
    assert!(!log.contains("RAN"), "{log}");
    let why = "input \\\"data/a.txt\\\": no such file in your files";
    assert!(
        log.contains("staging failed: cannot list the inputs"),
        "{log}"
    );
    assert!(events.contains(why), "{events}");
    p.stop().await;
}

/// The figure for the book (`cargo test -p commons-portal --test it --release --
/// --ignored staging_throughput --nocapture`): staging a 256 MB input through the portal
/// (the agent's `inputs::stage`, over HTTP on loopback) against reading the same object
/// straight from the store with `object_store`; both hash and write what they read.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "a measurement, not a check"]
async fn staging_throughput() {
    use commons_agent::checkpoint::{CheckpointClient, Policy};
    use futures_util::StreamExt;
    use object_store::ObjectStoreExt;
    use sha2::{Digest, Sha256};
    use std::time::Instant;
    use tokio::io::AsyncWriteExt;
    let dir = tempfile::tempdir().unwrap();
    let p = f::portal_in(crate::support::harness::Backend::Sqlite, dir.path(), |c| {
        c.user_quota_gb = 10.0
    })
    .await;
    p.portal.scheduler.abort();
    let size = 256 << 20;
    let a = put(&p, &p.alice, "/api/v1/files", "big.bin", &f::noise(size, 9)).await;
    assert_eq!(a.status, 201, "{a}");
    let (s, v) = p
        .post_json(&p.alice, "/api/v1/jobs", &job_with(&["big.bin"], "true"))
        .await;
    assert_eq!(s, 201, "{v}");
    let job = v["id"].as_i64().unwrap();
    let (node, cred) = enrol(&p, "vision", "gpu-a").await;
    run(&p, move |c| starting(c, job, node)).await;
    let object = run(&p, |c| {
        let alice = db::users::user_by_name(c, "alice")?.unwrap();
        let row = db::files::get(c, &format!("user:{}", alice.id), "big.bin")?;
        Ok::<_, DbError>(row.unwrap().object)
    })
    .await;
    let mut best = (f64::MAX, f64::MAX);
    for round in 0..3 {
        let to = tempfile::tempdir().unwrap();
        let client = CheckpointClient::new(&p.url, &cred, Policy::default()).unwrap();
        let t = Instant::now();
        commons_agent::inputs::stage(&client, (job, 1), to.path(), u64::MAX, &|| true)
            .await
            .unwrap();
        best.0 = best.0.min(t.elapsed().as_secs_f64());
        let store = object_store::local::LocalFileSystem::new_with_prefix(dir.path()).unwrap();
        let t = Instant::now();
        let key = object_store::path::Path::from(object.as_str());
        let got = store.get(&key).await.unwrap();
        let mut body = got.into_stream();
        let mut out = tokio::fs::File::create(to.path().join("direct.bin"))
            .await
            .unwrap();
        let mut sha = Sha256::new();
        while let Some(chunk) = body.next().await {
            let chunk = chunk.unwrap();
            sha.update(&chunk);
            out.write_all(&chunk).await.unwrap();
        }
        out.flush().await.unwrap();
        best.1 = best.1.min(t.elapsed().as_secs_f64());
        println!(
            "round {round}: staged in {:.3} s, direct in {:.3} s",
            best.0, best.1
        );
    }
    let mb = size as f64 / 1e6;
    println!(
        "staging {:.0} MB/s, direct {:.0} MB/s, ratio {:.2}",
        mb / best.0,
        mb / best.1,
        best.1 / best.0
    );
    p.stop().await;
}
