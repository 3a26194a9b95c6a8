//! The checkpoint store through the agents' HTTP API, acting as the agent with a real node
//! credential, on the local file store and on a real S3-compatible server (moto), over
//! both database backends.
//!
//! moto comes from `target/test-venv/bin/moto_server` (or `COMMONS_TEST_MOTO`); a missing
//! one is a failure that says how to install it, never a skip.

use crate::support::harness::{Backend, TestPortal, BACKENDS};
use commons_portal::db::{self, checkpoints as rows, models::AttemptStatus, DbConn, DbError};
use commons_portal::domain::JobState;
use commons_portal::error::AppError;
use commons_portal::service::checkpoints::{self, store};
use commons_proto::{
    checkpoint_commit_path, checkpoint_latest_path, checkpoint_part_path, checkpoint_parts_path,
    SHA256_HEADER,
};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

mod caps;
pub(crate) mod moto;
mod write_time;

use moto::Moto;

/// Which object store a portal keeps checkpoints in.
enum Kind {
    File,
    S3,
}

/// A portal with its checkpoint store, the scheduler stopped (the tests place attempts
/// by hand), and a 1 MiB part size.
async fn portal(
    backend: Backend,
    kind: &Kind,
    moto: Option<&Moto>,
) -> (TestPortal, tempfile::TempDir) {
    portal_with(backend, kind, moto, |_| {}).await
}

/// The same, with `[checkpoints]` adjusted after.
async fn portal_with(
    backend: Backend,
    kind: &Kind,
    moto: Option<&Moto>,
    adjust: impl FnOnce(&mut commons_portal::config::CheckpointsConfig),
) -> (TestPortal, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let p = TestPortal::builder(backend)
        .config(|c| {
            let k = &mut c.checkpoints;
            k.part_mb = 1;
            k.keep_per_job = 2;
            match kind {
                Kind::File => k.store = Some(format!("file://{}", dir.path().display())),
                Kind::S3 => {
                    k.store = Some(format!("s3://checkpoints/t{:x}", rand::random::<u32>()));
                    k.endpoint = moto.map(|m| m.endpoint.clone());
                    k.allow_http = true;
                    k.region = Some("us-east-1".into());
                    k.access_key_id = Some("testing".into());
                    k.secret_access_key = Some(commons_portal::config::Secret("testing".into()));
                }
            }
            adjust(k);
        })
        .start()
        .await;
    p.portal.scheduler.abort();
    (p, dir)
}

/// A node of `lab`, enrolled through the API: (node id, credential).
pub(crate) async fn enrol(p: &TestPortal, lab: &str, host: &str) -> (i64, String) {
    let (status, v) = p
        .post_json(
            "",
            commons_proto::ENROL_PATH,
            &json!({"token": p.enrol_token(lab), "hostname": host, "agent_version": "test"}),
        )
        .await;
    assert_eq!(status, 201, "{v}");
    (
        v["node_id"].as_i64().unwrap(),
        v["credential"].as_str().unwrap().to_string(),
    )
}

pub(crate) async fn run<T: Send + 'static, E: From<DbError> + std::fmt::Debug + Send + 'static>(
    p: &TestPortal,
    f: impl FnOnce(&mut DbConn) -> Result<T, E> + Send + 'static,
) -> T {
    p.portal.state.db.run(f).await.unwrap()
}

/// A job of alice (lab vision) running attempt 1 on `node`.
pub(crate) async fn running_job(p: &TestPortal, node: i64) -> i64 {
    run(p, move |c| {
        let alice = db::users::user_by_name(c, "alice")?.unwrap();
        let labs = db::users::all_lab_slugs(c)?
            .into_iter()
            .map(|(id, slug)| (slug, id))
            .collect::<Vec<_>>();
        let req = serde_json::from_value(json!(
            {"image": "commons-demo:latest", "gpus": 1, "time_limit_minutes": 5, "lab": "vision"}
        ))
        .unwrap();
        let job = db::jobs::insert(c, alice.id, &commons_portal::validate::job(req, &labs)?)?;
        place(c, job.id, 1, node)?;
        Ok::<_, AppError>(job.id)
    })
    .await
}

/// Attempt `attempt` of `job` starts running on `node` (the last one ends).
pub(crate) fn place(c: &mut DbConn, job: i64, attempt: i32, node: i64) -> Result<(), DbError> {
    let t = db::now();
    if let Some(prev) = db::attempts::find(c, job, attempt - 1)? {
        db::attempts::end(c, prev.id, AttemptStatus::Stopped, None, None, t)?;
    }
    let until = t + chrono::Duration::hours(1);
    db::attempts::insert(c, job, attempt, node, &[], until, t)?;
    let a = db::attempts::find(c, job, attempt)?.unwrap();
    db::attempts::mark_running(c, a.id, t)?;
    db::jobs::set_placed(c, job, attempt, node)?;
    db::jobs::set_state(c, job, JobState::Running, "running")
}

fn sha(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

/// An archive of `len` bytes that differs with `seed`.
fn archive(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Acts as one agent: its credential and the portal's URL.
struct Agent<'a> {
    p: &'a TestPortal,
    credential: String,
}

impl Agent<'_> {
    async fn put(
        &self,
        job: i64,
        attempt: i32,
        n: u32,
        data: &[u8],
        claimed: &str,
    ) -> (u16, Value) {
        let r = self
            .p
            .http
            .put(format!(
                "{}{}",
                self.p.url,
                checkpoint_part_path(job, attempt, n)
            ))
            .bearer_auth(&self.credential)
            .header(SHA256_HEADER, claimed)
            .body(data.to_vec())
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// Uploads `data` as parts of `part` bytes, those in `only` (all when `None`).
    async fn upload(&self, job: i64, attempt: i32, data: &[u8], part: usize, only: Option<&[u32]>) {
        for (n, chunk) in data.chunks(part).enumerate() {
            let n = n as u32;
            if only.is_some_and(|o| !o.contains(&n)) {
                continue;
            }
            let (status, v) = self.put(job, attempt, n, chunk, &sha(chunk)).await;
            assert_eq!(status, 200, "part {n}: {v}");
            assert_eq!(v["sha256"], sha(chunk));
        }
    }

    async fn parts(&self, job: i64, attempt: i32) -> (u16, Value) {
        let r = self
            .p
            .http
            .get(format!(
                "{}{}",
                self.p.url,
                checkpoint_parts_path(job, attempt)
            ))
            .bearer_auth(&self.credential)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        if status == 200 {
            assert_eq!(r.headers()["x-commons-part-bytes"], "1048576");
        }
        (status, r.json().await.unwrap_or(Value::Null))
    }

    async fn commit(&self, job: i64, attempt: i32, parts: usize, data: &[u8]) -> (u16, Value) {
        self.commit_raw(job, attempt, parts, data.len(), &sha(data))
            .await
    }

    async fn commit_raw(
        &self,
        job: i64,
        attempt: i32,
        parts: usize,
        bytes: usize,
        sha256: &str,
    ) -> (u16, Value) {
        let r = self
            .p
            .http
            .post(format!(
                "{}{}",
                self.p.url,
                checkpoint_commit_path(job, attempt)
            ))
            .bearer_auth(&self.credential)
            .json(&json!({"parts": parts, "bytes": bytes, "sha256": sha256}))
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// `latest`: (status, bytes, the checksum header).
    async fn latest(&self, job: i64) -> (u16, Vec<u8>, Option<String>) {
        let r = self
            .p
            .http
            .get(format!("{}{}", self.p.url, checkpoint_latest_path(job)))
            .bearer_auth(&self.credential)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let header = r
            .headers()
            .get(SHA256_HEADER)
            .map(|h| h.to_str().unwrap().to_string());
        let declared = r.content_length();
        let body = r.bytes().await.unwrap().to_vec();
        if status == 200 {
            assert_eq!(declared, Some(body.len() as u64), "content-length");
        }
        (status, body, header)
    }
}

async fn count(p: &TestPortal, job: i64) -> usize {
    run(p, move |c| rows::for_job(c, job)).await.len()
}

/// The parts of `attempt` of `job` staged (uploaded, not committed): how many, how many
/// bytes.
async fn staged(p: &TestPortal, job: i64, attempt: i32) -> (usize, i64) {
    let parts: Vec<_> = run(p, move |c| db::checkpoint_parts::staged_of_job(c, job))
        .await
        .into_iter()
        .filter(|s| s.attempt == attempt)
        .collect();
    (parts.len(), parts.iter().map(|s| s.bytes).sum())
}

/// Everything the brief asks of the store, on one portal.
async fn scenario(p: &TestPortal) {
    let (node, credential) = enrol(p, "vision", "vision-a").await;
    let (node_b, credential_b) = enrol(p, "physics", "physics-b").await;
    let a = Agent { p, credential };
    let b = Agent {
        p,
        credential: credential_b,
    };
    let job = running_job(p, node).await;
    const PART: usize = 40_000;

    // Nothing yet.
    assert_eq!(a.latest(job).await.0, 404);
    assert_eq!(a.parts(job, 1).await, (200, json!([])));

    // Three parts and a commit; latest gives the same bytes and checksum.
    let one = archive(100_000, 1);
    a.upload(job, 1, &one, PART, None).await;
    let (status, v) = a.commit(job, 1, 3, &one).await;
    assert_eq!(status, 200, "{v}");
    assert!(
        v["id"].as_i64().is_some() && v["at"].as_str().unwrap().ends_with('Z'),
        "{v}"
    );
    // A commit sent again (its answer lost) is the same checkpoint.
    assert_eq!(a.commit(job, 1, 3, &one).await, (200, v.clone()));
    let (status, body, header) = a.latest(job).await;
    assert_eq!(status, 200);
    assert_eq!(body.len(), one.len());
    assert!(body == one, "latest returns the archive");
    assert_eq!(header.as_deref(), Some(sha(&one).as_str()));
    assert_eq!(
        a.parts(job, 1).await,
        (200, json!([])),
        "the next upload starts afresh"
    );

    // A part with a wrong checksum is refused, naming it.
    let (status, v) = a.put(job, 1, 0, &one[..10], &sha(b"other")).await;
    assert_eq!(status, 422, "{v}");
    assert_eq!(v["field"], SHA256_HEADER);
    assert!(
        v["message"].as_str().unwrap().contains(&sha(&one[..10])),
        "{v}"
    );
    // ... and so is a part over the size.
    let big = vec![0u8; (1 << 20) + 1];
    assert_eq!(a.put(job, 1, 0, &big, &sha(&big)).await.0, 413);

    // Resume: two of three parts, a list, the missing one, a commit.
    let two = archive(100_000, 2);
    a.upload(job, 1, &two, PART, Some(&[0, 2])).await;
    let (status, listed) = a.parts(job, 1).await;
    assert_eq!(status, 200);
    let ns: Vec<i64> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["n"].as_i64().unwrap())
        .collect();
    assert_eq!(ns, vec![0, 2], "{listed}");
    assert_eq!(listed[1]["bytes"], 20_000);
    // Missing part: refused, nothing recorded.
    let (status, v) = a.commit(job, 1, 3, &two).await;
    assert_eq!((status, v["field"].as_str()), (422, Some("parts")), "{v}");
    assert!(
        v["message"].as_str().unwrap().contains("part 1 is missing"),
        "{v}"
    );
    assert_eq!(count(p, job).await, 1);
    a.upload(job, 1, &two, PART, Some(&[1])).await;
    a.upload(job, 1, &two, PART, Some(&[1])).await; // idempotent
                                                    // Wrong whole checksum: refused, nothing recorded.
    let (status, v) = a.commit_raw(job, 1, 3, two.len(), &sha(b"not it")).await;
    assert_eq!((status, v["field"].as_str()), (422, Some("sha256")), "{v}");
    let (status, v) = a.commit_raw(job, 1, 3, two.len() - 1, &sha(&two)).await;
    assert_eq!((status, v["field"].as_str()), (422, Some("bytes")), "{v}");
    assert_eq!(count(p, job).await, 1);
    let (status, v) = a.commit(job, 1, 3, &two).await;
    assert_eq!(status, 200, "{v}");
    assert!(a.latest(job).await.1 == two);

    // Another node: neither uploads nor downloads for this job.
    assert_eq!(b.put(job, 1, 0, b"x", &sha(b"x")).await.0, 404);
    assert_eq!(b.parts(job, 1).await.0, 404);
    assert_eq!(b.commit(job, 1, 1, b"x").await.0, 404);
    assert_eq!(b.latest(job).await.0, 404);
    let r = p
        .http
        .get(format!("{}{}", p.url, checkpoint_latest_path(job)))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401, "no credential");

    // The job's view and the scheduler's snapshot show the last checkpoint.
    let view = p.job(&p.alice, job).await;
    assert!(view["last_checkpoint_at"].is_string(), "{view}");
    let policy = commons_sched::Policy::default();
    let snap = run(p, move |c| db::snapshot::read(c, &policy)).await;
    let running = snap.running.iter().find(|r| r.id == job).unwrap();
    assert!(running.last_checkpoint_at.is_some());

    // A third commit, made while the attempt is being stopped (the agent uploads its
    // final checkpoint before it reports the stop): the first is pruned (keep_per_job =
    // 2), objects and row.
    run(p, move |c| {
        let a = db::attempts::find(c, job, 1)?.unwrap();
        db::attempts::set_status(c, a.id, AttemptStatus::Stopping)
    })
    .await;
    let three = archive(50_000, 3);
    a.upload(job, 1, &three, PART, None).await;
    assert_eq!(a.commit(job, 1, 2, &three).await.0, 200);
    let kept = run(p, move |c| rows::for_job(c, job)).await;
    assert_eq!(kept.iter().map(|k| k.seq).collect::<Vec<_>>(), vec![3, 2]);
    let store = p.portal.state.checkpoints.clone();
    assert!(store
        .parts(&store::commit_prefix(job, 1, 1))
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        store
            .parts(&store::commit_prefix(job, 1, 2))
            .await
            .unwrap()
            .len(),
        3
    );

    // An upload cut short (the agent went away before it committed): its parts are
    // staged against the caps until the attempt is over.
    let cut = archive(60_000, 8);
    a.upload(job, 1, &cut, PART, None).await;
    assert_eq!(staged(p, job, 1).await, (2, 60_000));

    // The next attempt, on node B of another lab: it downloads; node A no longer may.
    run(p, move |c| place(c, job, 2, node_b)).await;
    let (status, body, _) = b.latest(job).await;
    assert_eq!(status, 200);
    assert!(body == three);
    assert_eq!(a.latest(job).await.0, 404);
    // Its first checkpoint supersedes attempt 1's.
    let four = archive(30_000, 4);
    b.upload(job, 2, &four, PART, None).await;
    assert_eq!(b.commit(job, 2, 1, &four).await.0, 200);
    assert!(b.latest(job).await.1 == four);
    // Node A no longer holds attempt 1: it may neither list, upload nor commit for it,
    // and nothing it sends is kept.
    let late = archive(1_000, 5);
    let (status, v) = a.put(job, 1, 0, &late, &sha(&late)).await;
    assert_eq!(
        status, 404,
        "an upload for an attempt the node no longer holds: {v}"
    );
    assert_eq!(a.parts(job, 1).await.0, 404);
    assert_eq!(a.commit(job, 1, 2, &cut).await.0, 404);
    assert_eq!(a.commit(job, 1, 1, &late).await.0, 404);
    assert_eq!(count(p, job).await, 2);
    assert!(b.latest(job).await.1 == four);
    // The cut-short upload of the replaced attempt goes at the next pruning, from the
    // store and from the staged parts; attempt 2's own upload under way stays.
    let five_part = archive(10_000, 9);
    b.upload(job, 2, &five_part, PART, None).await;
    checkpoints::prune_abandoned(&p.portal.state).await.unwrap();
    assert_eq!(staged(p, job, 1).await, (0, 0));
    assert!(store
        .parts(&store::commit_prefix(job, 1, 4))
        .await
        .unwrap()
        .is_empty());
    assert_eq!(staged(p, job, 2).await, (1, 10_000));
    assert_eq!(
        store
            .parts(&store::commit_prefix(job, 2, 2))
            .await
            .unwrap()
            .len(),
        1
    );

    // Over the lab's cap at commit (an operator lowered it after the parts came; the
    // caps as parts arrive are `caps.rs`'): refused with the numbers, nothing recorded.
    let five = archive(170_000, 6);
    b.upload(job, 2, &five, PART, None).await;
    let vision = run(p, |c| db::users::lab_by_slug(c, "vision")).await.id;
    run(p, move |c| rows::set_lab_cap(c, vision, Some(0.0001))).await;
    let before = count(p, job).await;
    let (status, v) = b.commit(job, 2, 5, &five).await;
    assert_eq!(
        (status, v["error"].as_str()),
        (409, Some("checkpoint_cap")),
        "{v}"
    );
    assert_eq!(
        v["message"], "lab vision's checkpoints would use 0.0002 of 0.0001 GB",
        "{v}"
    );
    assert_eq!(count(p, job).await, before);
    run(p, move |c| rows::set_lab_cap(c, vision, None)).await;
    assert_eq!(b.commit(job, 2, 5, &five).await.0, 200);

    // A job that ended more than a day ago loses its checkpoints; a running one keeps them.
    let other = running_job(p, node).await;
    let six = archive(10, 7);
    a.upload(other, 1, &six, PART, None).await;
    run(p, move |c| {
        db::jobs::set_state(c, job, JobState::Succeeded, "done")?;
        use db::schema::jobs;
        use diesel::prelude::*;
        diesel::update(jobs::table.find(job))
            .set(jobs::finished_at.eq(db::now() - chrono::Duration::days(2)))
            .execute(c)?;
        Ok::<_, DbError>(())
    })
    .await;
    assert_eq!(
        b.put(job, 2, 0, b"x", &sha(b"x")).await.0,
        409,
        "the job has ended"
    );
    assert_eq!(
        checkpoints::prune_finished(&p.portal.state).await.unwrap(),
        1
    );
    assert_eq!(count(p, job).await, 0);
    assert!(
        store.jobs().await.unwrap() == vec![other],
        "only the running job's objects stay"
    );
    assert_eq!(
        checkpoints::prune_finished(&p.portal.state).await.unwrap(),
        0
    );
}

per_backend! {
    async fn checkpoints_on_the_file_store(backend: Backend) {
        let (p, _dir) = portal(backend, &Kind::File, None).await;
        scenario(&p).await;
        p.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_on_s3() {
    let moto = Moto::start().await;
    for backend in BACKENDS {
        let (p, _dir) = portal(backend, &Kind::S3, Some(&moto)).await;
        scenario(&p).await;
        // The objects are in the bucket, under the configured prefix.
        let store = p.portal.state.config.checkpoints.store.clone().unwrap();
        let prefix = store.trim_start_matches("s3://checkpoints/");
        let listing = reqwest::get(format!(
            "{}/checkpoints?list-type=2&prefix={prefix}/jobs/",
            moto.endpoint
        ))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
        assert!(listing.contains("/part-00000-"), "{listing}");
        p.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_store_is_beside_the_sqlite_file_and_made_on_first_use() {
    let p = TestPortal::start(Backend::Sqlite).await;
    p.portal.scheduler.abort();
    let db_file = p
        .portal
        .state
        .config
        .database_url
        .trim_start_matches("sqlite://")
        .to_string();
    let dir = std::path::Path::new(&db_file)
        .parent()
        .unwrap()
        .join("checkpoints");
    assert!(!dir.exists(), "nothing is made before it is needed");
    let (node, credential) = enrol(&p, "vision", "vision-a").await;
    let job = running_job(&p, node).await;
    let a = Agent { p: &p, credential };
    let data = archive(5_000, 9);
    a.upload(job, 1, &data, 4_096, None).await;
    assert_eq!(a.commit(job, 1, 2, &data).await.0, 200);
    let manifest = dir.join(format!("jobs/{job}/1/1/manifest.json"));
    let m: commons_proto::CheckpointManifest =
        serde_json::from_slice(&std::fs::read(&manifest).unwrap()).unwrap();
    assert_eq!((m.bytes, m.parts.len(), m.sha256), (5_000, 2, sha(&data)));
    // The job page says when.
    let b = crate::support::session::BrowserSession::login(&p, "alice").await;
    let page = b
        .fetch(&format!("/jobs/{job}/status"))
        .await
        .text()
        .await
        .unwrap();
    assert!(
        page.contains("Last checkpoint") && page.contains(&m.at[..10]),
        "{page}"
    );
    p.stop().await;
}
