//! Issue 28 §5, the agent never holds storage credentials: a starting attempt's listing
//! gives each file a short-lived URL of its one object. From a local store that is a
//! signed portal URL (`OBJECTS_PATH`), served without any credential and refused (403,
//! saying why) when tampered with, expired, made for another node or object, or when the
//! node was revoked or the attempt is no longer starting; from S3 it is the store's own
//! presigned GET, which the agent reads from the bucket. With a real agent, both stores:
//! the bytes do not pass through the portal's per-file route (its request metrics).

use crate::checkpoints::{enrol, run};
use crate::support::files::{self as f, put};
use crate::support::harness::{Backend, TestPortal};
use commons_portal::db::{self, DbError};
use commons_portal::domain::{AttemptStatus, JobState};
use commons_portal::service::files::signed::Grant;
use commons_proto::{inputs_path, InputFile};
use serde_json::{json, Value};

/// Attempt 1 of `job` placed on `node`, starting.
pub(crate) fn starting(c: &mut db::DbConn, job: i64, node: i64) -> Result<(), DbError> {
    let t = db::now();
    db::attempts::insert(c, job, 1, node, &[], t + chrono::Duration::hours(1), t)?;
    db::jobs::set_placed(c, job, 1, node)?;
    db::jobs::set_state(c, job, JobState::Starting, "starting")
}

/// How many requests the portal answered on `route` (its pattern), any status.
pub(crate) fn route_hits(p: &TestPortal, route: &str) -> u64 {
    let needle = format!("route=\"{route}\"");
    p.portal
        .state
        .metrics
        .encode()
        .lines()
        .filter(|l| l.starts_with("commons_http_request_duration_seconds_count{"))
        .filter(|l| l.contains(&needle))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// The per-file routes through which the bytes would pass the portal.
pub(crate) const INPUT_FILE_ROUTE: &str = "/api/agent/v1/inputs/{job}/{attempt}/{path:.*}";
/// The signed object route (a local store).
pub(crate) const OBJECT_ROUTE: &str = "/api/agent/v1/objects/{key:.*}";

/// `node`'s listing of job `job`'s attempt 1, as the agent reads it.
pub(crate) async fn listing(p: &TestPortal, cred: &str, job: i64) -> Vec<InputFile> {
    let r = p
        .http
        .get(format!("{}{}", p.url, inputs_path(job, 1)))
        .bearer_auth(cred)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.json().await.unwrap()
}

/// GET `url` (relative to the portal) with no credential: status, body, JSON message.
async fn get(p: &TestPortal, url: &str, range: Option<&str>) -> (u16, Vec<u8>, String) {
    let mut req = p.http.get(format!("{}{url}", p.url));
    if let Some(r) = range {
        req = req.header("range", r);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    let body = r.bytes().await.unwrap().to_vec();
    let message = serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|v| v["message"].as_str().map(str::to_string))
        .unwrap_or_default();
    (status, body, message)
}

/// Asserts `url` is refused 403 with a message holding `why`.
async fn refused(p: &TestPortal, url: &str, why: &str) {
    let (status, body, message) = get(p, url, None).await;
    assert_eq!(status, 403, "{url}: {}", String::from_utf8_lossy(&body));
    assert!(
        message.contains(why),
        "{url}: {message:?} should say {why:?}"
    );
}

/// The object key and the query of a signed portal URL.
fn split(url: &str) -> (String, String) {
    let rest = url
        .strip_prefix(&format!("{}/", commons_proto::OBJECTS_PATH))
        .unwrap();
    let (key, query) = rest.split_once('?').unwrap();
    (key.to_string(), query.to_string())
}

/// alice's job of two inputs, placed on a fresh node and starting; (job, node, cred,
/// the other node, its credential).
pub(crate) async fn placed(p: &TestPortal) -> (i64, i64, String, i64, String) {
    for (path, data) in [("data/a.txt", "alpha\n"), ("data/b.txt", "bravo\n")] {
        let a = put(p, &p.alice, "/api/v1/files", path, data.as_bytes()).await;
        assert_eq!(a.status, 201, "{a}");
    }
    let job = json!({"image": "commons-demo:latest", "command": ["true"], "gpus": 1,
                     "time_limit_minutes": 10, "inputs": ["data/"]});
    let (s, v) = p.post_json(&p.alice, "/api/v1/jobs", &job).await;
    assert_eq!(s, 201, "{v}");
    let job = v["id"].as_i64().unwrap();
    let (node, cred) = enrol(p, "vision", "gpu-a").await;
    let (other, other_cred) = enrol(p, "vision", "gpu-b").await;
    run(p, move |c| starting(c, job, node)).await;
    (job, node, cred, other, other_cred)
}

per_backend! {
    async fn signed_object_urls_are_scoped_to_one_object_node_and_attempt(backend: Backend) {
        let dir = tempfile::tempdir().unwrap();
        let p = f::portal_in(backend, dir.path(), |_| {}).await;
        p.portal.scheduler.abort();
        let (job, node, cred, other, _) = placed(&p).await;
        let files = listing(&p, &cred, job).await;
        assert_eq!(files.len(), 2);
        let (a, b) = (&files[0], &files[1]);
        let url = a.url.clone().unwrap();
        assert!(url.starts_with("/api/agent/v1/objects/files/users/"), "{url}");
        assert_eq!(a.url_valid_s, Some(300), "minutes, not hours");

        // No credential at all: the signature is the grant. Range as the files API.
        let (s, body, _) = get(&p, &url, None).await;
        assert_eq!((s, body.as_slice()), (200, b"alpha\n".as_slice()));
        let (s, body, _) = get(&p, &url, Some("bytes=1-3")).await;
        assert_eq!((s, body.as_slice()), (206, b"lph".as_slice()));
        assert_eq!(get(&p, &url, Some("bytes=99-")).await.0, 416);

        // Tampered: the signature, the object, the node, the expiry.
        let (key, query) = split(&url);
        let (b_key, _) = split(b.url.as_deref().unwrap());
        let flipped = if url.ends_with('0') { "1" } else { "0" };
        let bad = format!("{}{flipped}", &url[..url.len() - 1]);
        refused(&p, &bad, "bad signature").await;
        refused(&p, &format!("{}/{b_key}?{query}", commons_proto::OBJECTS_PATH), "bad signature").await;
        let to_other = query.replace(&format!("node={node}&"), &format!("node={other}&"));
        assert_ne!(to_other, query);
        refused(&p, &format!("{}/{key}?{to_other}", commons_proto::OBJECTS_PATH), "bad signature").await;
        let later = query.replace("expires=", "expires=9");
        refused(&p, &format!("{}/{key}?{later}", commons_proto::OBJECTS_PATH), "bad signature").await;
        refused(&p, &format!("{}/{key}", commons_proto::OBJECTS_PATH), "not one the portal signed").await;
        refused(&p, &format!("{}/{key}?{}", commons_proto::OBJECTS_PATH, query.replace("sig=", "sig=zz")), "bad signature").await;

        // Signed with the portal's own key, but for what the checks behind the signature
        // refuse: each fails without its check.
        let signer = p.portal.state.files.signer.clone();
        let now = chrono::Utc::now().timestamp();
        let object = key.clone();
        let grant = |node: i64, attempt: i32, expires: i64| Grant { node, job, attempt, object: object.clone(), expires };
        refused(&p, &signer.url(&grant(node, 1, now - 1)), "expired").await;
        refused(&p, &signer.url(&grant(other, 1, now + 60)), "another node").await;
        refused(&p, &signer.url(&grant(node, 2, now + 60)), "no longer starting").await;
        refused(&p, &signer.url(&grant(9999, 1, now + 60)), "not enrolled").await;
        assert_eq!(get(&p, &signer.url(&grant(node, 1, now + 60)), None).await.0, 200);

        // Still signed and fresh, but the attempt moved on, then the node was revoked.
        run(&p, move |c| {
            let a = db::attempts::find(c, job, 1)?.unwrap();
            db::attempts::set_status(c, a.id, AttemptStatus::Running)
        }).await;
        refused(&p, &url, "no longer starting").await;
        run(&p, move |c| {
            let a = db::attempts::find(c, job, 1)?.unwrap();
            db::attempts::set_status(c, a.id, AttemptStatus::Starting)
        }).await;
        assert_eq!(get(&p, &url, None).await.0, 200);
        run(&p, move |c| db::nodes::revoke(c, node)).await;
        refused(&p, &url, "revoked").await;
        p.stop().await;
    }
}

/// On S3 (moto) the listing's URL is the bucket's own presigned GET: read with no
/// credential of ours it gives the object, and nothing passes the portal. With
/// `agents_read_from_store = false`, the portal's own signed URL instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_s3_the_url_is_the_stores_presigned_get() {
    use crate::checkpoints::moto::Moto;
    let moto = Moto::start().await;
    let p = on_moto(&moto, true).await;
    p.portal.scheduler.abort();
    let (job, _, cred, _, _) = placed(&p).await;
    let files = listing(&p, &cred, job).await;
    let url = files[0].url.clone().unwrap();
    assert!(url.starts_with(&moto.endpoint), "{url}");
    assert!(
        url.contains("X-Amz-Signature=") && url.contains("X-Amz-Expires=300"),
        "{url}"
    );
    let (objects, inputs) = (
        route_hits(&p, OBJECT_ROUTE),
        route_hits(&p, INPUT_FILE_ROUTE),
    );
    let r = reqwest::get(&url).await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.bytes().await.unwrap().as_ref(), b"alpha\n");
    assert_eq!(route_hits(&p, OBJECT_ROUTE), objects);
    assert_eq!(route_hits(&p, INPUT_FILE_ROUTE), inputs);
    p.stop().await;

    // Servers that cannot reach the bucket: the portal's own signed URL, streamed.
    let p = on_moto(&moto, false).await;
    p.portal.scheduler.abort();
    let (job, _, cred, _, _) = placed(&p).await;
    let url = listing(&p, &cred, job).await[0].url.clone().unwrap();
    assert!(url.starts_with(commons_proto::OBJECTS_PATH), "{url}");
    let (s, body, _) = get(&p, &url, None).await;
    assert_eq!((s, body.as_slice()), (200, b"alpha\n".as_slice()));
    p.stop().await;
}

/// A portal whose store is a fresh prefix of moto's bucket; `presign`: `[files]
/// agents_read_from_store`.
pub(crate) async fn on_moto(moto: &crate::checkpoints::moto::Moto, presign: bool) -> TestPortal {
    let prefix = format!("t{:x}", rand::random::<u32>());
    let (endpoint, store) = (moto.endpoint.clone(), format!("s3://checkpoints/{prefix}"));
    TestPortal::builder(Backend::Sqlite)
        .config(move |c| {
            let k = &mut c.checkpoints;
            k.store = Some(store);
            k.endpoint = Some(endpoint);
            k.allow_http = true;
            k.access_key_id = Some("testing".into());
            k.secret_access_key = Some(commons_portal::config::Secret("testing".into()));
            c.files.agents_read_from_store = presign;
        })
        .start()
        .await
}
