//! Uploads in parts (`/api/v1/uploads`) on the local store over both database backends:
//! a file sent in parts survives a part that was cut off, resumes from what the portal
//! kept, and becomes a file only when joined; who may touch an upload, the quota at the
//! start, a wrong checksum, giving up, and the sweep of an upload nobody came back to.
//! The browser's resume is in `files_clients`.

use crate::support::files::{self as f, get, list, noise, paths, sha256};
use crate::support::harness::{Backend, TestPortal};
use serde_json::{json, Value};

const PART: usize = 8 << 20;

/// The objects the store holds under `files/`.
fn objects(dir: &std::path::Path) -> Vec<String> {
    f::files_under(&dir.join("files"))
}

/// PUT part `n` of upload `id` with `data`: status and answer.
async fn part(p: &TestPortal, token: &str, id: i64, n: u32, data: &[u8]) -> f::Answer {
    let r = p
        .http
        .put(format!("{}/api/v1/uploads/{id}/parts/{n}", p.url))
        .bearer_auth(token)
        .body(data.to_vec())
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap_or_default();
    f::Answer {
        status,
        body: serde_json::from_str(&text).unwrap_or(Value::String(text)),
    }
}

async fn complete(p: &TestPortal, token: &str, id: i64) -> (u16, Value) {
    p.post_json(
        token,
        &format!("/api/v1/uploads/{id}/complete"),
        &json!(null),
    )
    .await
}

async fn used(p: &TestPortal) -> u64 {
    let me = p.get_json(&p.alice, "/api/v1/me").await;
    me["files"]["used_bytes"].as_u64().unwrap()
}

per_backend! {
    /// A 20 MB file in three parts: a cut-off part is refused and not kept, the upload
    /// resumes from the parts the portal lists, and only the join makes the file (its
    /// bytes and checksum whole, the parts' objects gone).
    async fn an_upload_in_parts_resumes_and_joins(backend: Backend) {
        let dir = tempfile::tempdir().unwrap();
        let p = f::portal_in(backend, dir.path(), |_| {}).await;
        let data = noise(20_000_000, 3);
        let (s, up) = p
            .post_json(&p.alice, "/api/v1/uploads", &json!({"path": "data/big.bin", "size": data.len()}))
            .await;
        assert_eq!(s, 201, "[{backend:?}] {up}");
        assert_eq!((up["parts"].as_u64(), up["part_bytes"].as_u64()), (Some(3), Some(PART as u64)), "{up}");
        let id = up["id"].as_i64().unwrap();
        // The whole size counts against the quota from the start; no file is visible.
        assert_eq!(used(&p).await, 20_000_000);
        assert!(paths(&list(&p, &p.alice, "/api/v1/files", "").await.body).is_empty());

        let a = part(&p, &p.alice, id, 0, &data[..PART]).await;
        assert_eq!(a.status, 200, "{a}");
        assert_eq!(a.body["received"], json!([0]), "{a}");
        // Part 1 cut off after 1 MB: refused, naming the length; nothing of it is kept.
        let a = part(&p, &p.alice, id, 1, &data[PART..PART + (1 << 20)]).await;
        assert_eq!(a.status, 400, "{a}");
        assert!(a.body["message"].as_str().unwrap().contains("part 1 must be 8388608 bytes"), "{a}");
        // A part that does not exist, and a join before every part arrived.
        let a = part(&p, &p.alice, id, 3, b"x").await;
        assert_eq!((a.status, a.body["field"].as_str()), (422, Some("n")), "{a}");
        let (s, v) = complete(&p, &p.alice, id).await;
        assert_eq!((s, v["error"].as_str()), (409, Some("upload_incomplete")), "{v}");
        assert!(v["message"].as_str().unwrap().contains("parts 1, 2"), "{v}");

        // Resuming: the list says what the portal kept.
        let mine = p.get_json(&p.alice, "/api/v1/uploads").await;
        assert_eq!(mine.as_array().unwrap().len(), 1, "{mine}");
        assert_eq!((mine[0]["path"].as_str(), mine[0]["received"].clone()), (Some("data/big.bin"), json!([0])));
        assert_eq!(mine[0]["received_bytes"], PART);
        // Out of order, and part 0 sent again: fine.
        assert_eq!(part(&p, &p.alice, id, 2, &data[2 * PART..]).await.status, 200);
        assert_eq!(part(&p, &p.alice, id, 0, &data[..PART]).await.status, 200);
        let a = part(&p, &p.alice, id, 1, &data[PART..2 * PART]).await;
        assert_eq!(a.body["received"], json!([0, 1, 2]), "{a}");
        assert_eq!(a.body["received_bytes"], 20_000_000, "{a}");

        let (s, v) = complete(&p, &p.alice, id).await;
        assert_eq!(s, 201, "{v}");
        assert_eq!((v["size"].as_u64(), v["sha256"].as_str()), (Some(20_000_000), Some(sha256(&data).as_str())), "{v}");
        let (s, _, body) = get(&p, &p.alice, "/api/v1/files", "data/big.bin", None).await;
        assert!(s == 200 && body == data, "{s}: {} bytes came back", body.len());
        assert_eq!(used(&p).await, 20_000_000);
        // One object: the file's; the parts went. The upload is over.
        assert_eq!(objects(dir.path()).len(), 1, "{:?}", objects(dir.path()));
        assert_eq!(p.get_json(&p.alice, "/api/v1/uploads").await, json!([]));
        let (s, _) = complete(&p, &p.alice, id).await;
        assert_eq!(s, 404);
    }
}

per_backend! {
    /// Only the user who started an upload sees or changes it, only while they may write
    /// its space; the quota refuses the whole size at the start; a wrong checksum keeps
    /// the parts; giving up removes them and the reservation.
    async fn uploads_in_parts_keep_their_rules(backend: Backend) {
        let dir = tempfile::tempdir().unwrap();
        let p = f::portal_in(backend, dir.path(), |c| c.user_quota_gb = 0.03).await;
        // Over the quota: refused at the start, naming it.
        let (s, v) = p.post_json(&p.alice, "/api/v1/uploads", &json!({"path": "a.bin", "size": 40_000_000})).await;
        assert_eq!((s, v["error"].as_str()), (413, Some("file_quota")), "[{backend:?}] {v}");
        assert!(v["message"].as_str().unwrap().contains("your file quota of 30 MB"), "{v}");
        // Bad fields are named.
        for (body, field) in [
            (json!({"path": "../a", "size": 1}), "path"),
            (json!({"path": "a", "size": -1}), "size"),
            (json!({"path": "a", "size": 1, "sha256": "zz"}), "sha256"),
            (json!({"path": "a", "size": 1, "extra": 1}), "extra"),
        ] {
            let (s, v) = p.post_json(&p.alice, "/api/v1/uploads", &body).await;
            assert_eq!((s, v["field"].as_str()), (422, Some(field)), "{body}: {v}");
        }
        // A lab's space: its admins only.
        let (s, v) = p.post_json(&p.alice, "/api/v1/uploads", &json!({"path": "lab:vision/x", "size": 1})).await;
        assert_eq!(s, 403, "{v}");
        let (s, v) = p.post_json(&p.carol, "/api/v1/uploads", &json!({"path": "lab:vision/x", "size": 1})).await;
        assert_eq!((s, v["path"].as_str()), (201, Some("lab:vision/x")), "{v}");

        let data = noise(9_000_000, 5);
        let wrong = sha256(b"something else");
        let (s, up) = p
            .post_json(&p.alice, "/api/v1/uploads", &json!({"path": "b.bin", "size": data.len(), "sha256": wrong}))
            .await;
        assert_eq!(s, 201, "{up}");
        let id = up["id"].as_i64().unwrap();
        // Another user: as if there were no such upload.
        let (s, _, _) = get(&p, &p.bob, "/api/v1", &format!("uploads/{id}"), None).await;
        assert_eq!(s, 404);
        assert_eq!(part(&p, &p.bob, id, 0, &data[..PART]).await.status, 404);
        assert_eq!(complete(&p, &p.bob, id).await.0, 404);
        assert_eq!(p.get_json(&p.bob, "/api/v1/uploads").await, json!([]));
        // The parts arrive; the join finds another checksum: refused, the parts stay.
        assert_eq!(part(&p, &p.alice, id, 0, &data[..PART]).await.status, 200);
        assert_eq!(part(&p, &p.alice, id, 1, &data[PART..]).await.status, 200);
        let (s, v) = complete(&p, &p.alice, id).await;
        assert_eq!((s, v["field"].as_str()), (422, Some("sha256")), "{v}");
        assert!(v["message"].as_str().unwrap().contains(&sha256(&data)), "{v}");
        let again = p.get_json(&p.alice, &format!("/api/v1/uploads/{id}")).await;
        assert_eq!(again["received"], json!([0, 1]), "{again}");
        assert!(paths(&list(&p, &p.alice, "/api/v1/files", "").await.body).is_empty());
        // Giving up: the parts' objects and the reservation go.
        let r = p.http.delete(format!("{}/api/v1/uploads/{id}", p.url)).bearer_auth(&p.alice).send().await.unwrap();
        assert_eq!(r.status().as_u16(), 204);
        assert_eq!(used(&p).await, 0);
        assert!(objects(dir.path()).is_empty(), "{:?}", objects(dir.path()));
        assert_eq!(complete(&p, &p.alice, id).await.0, 404);
    }
}

/// An upload in parts nobody came back to for a day is swept with its parts; one
/// touched within the day stays (the hourly sweep of unnamed objects keeps its parts).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_upload_in_parts_is_swept_with_its_parts() {
    let dir = tempfile::tempdir().unwrap();
    let p = f::portal_in(Backend::Sqlite, dir.path(), |_| {}).await;
    let data = noise(PART + 10, 9);
    let mut ids = Vec::new();
    for name in ["old.bin", "recent.bin"] {
        let (s, up) = p
            .post_json(
                &p.alice,
                "/api/v1/uploads",
                &json!({"path": name, "size": data.len()}),
            )
            .await;
        assert_eq!(s, 201, "{up}");
        let id = up["id"].as_i64().unwrap();
        assert_eq!(part(&p, &p.alice, id, 0, &data[..PART]).await.status, 200);
        ids.push(id);
    }
    assert_eq!(objects(dir.path()).len(), 2);
    // The first was last touched 25 hours ago, the second 2 hours ago: past the streamed
    // uploads' 30 minutes, within the day that uploads in parts are kept.
    let state = p.portal.state.clone();
    let (old, recent) = (ids[0], ids[1]);
    state
        .db
        .run(move |c| {
            let now = commons_portal::db::now();
            for (id, h) in [(old, 25), (recent, 2)] {
                let at = now - chrono::Duration::hours(h);
                assert!(commons_portal::db::files::touch_upload(
                    c,
                    id,
                    (PART + 10) as i64,
                    at
                )?);
            }
            Ok::<_, commons_portal::db::DbError>(())
        })
        .await
        .unwrap();
    let gone = commons_portal::service::files::sweep(&state).await.unwrap();
    assert!(gone >= 1, "the sweep removed {gone}");
    let left = p.get_json(&p.alice, "/api/v1/uploads").await;
    assert_eq!(left.as_array().unwrap().len(), 1, "{left}");
    assert_eq!(left[0]["path"], "recent.bin");
    let objs = objects(dir.path());
    assert_eq!(
        objs.len(),
        1,
        "only the recent upload's part stays: {objs:?}"
    );
    assert_eq!(used(&p).await, (PART + 10) as u64);
}
