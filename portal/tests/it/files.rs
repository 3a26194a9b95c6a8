//! Files through the API, on the local store over both database backends: uploads
//! (declared and streamed, small and in parts), listings, downloads with ranges,
//! deletes, the path rules, the quotas (nothing of a refused upload stays) and who may
//! read and write a lab's space. The CLI, S3 and the browser are in `files_clients`.

use crate::support::files::{
    self as f, delete, get, list, noise, paths, put, put_streamed, sha256,
};
use crate::support::harness::{Backend, TestPortal};
use serde_json::json;

const MINE: &str = "/api/v1/files";
const VISION: &str = "/api/v1/labs/vision/files";

/// The objects the store holds under `files/` (the files' contents, nothing else).
fn objects(dir: &std::path::Path) -> Vec<String> {
    f::files_under(&dir.join("files"))
}

per_backend! {
    /// Upload, list, download (whole and ranges), replace and delete, on the local store.
    async fn files_go_round_trip_on_the_local_store(backend: Backend) {
        let dir = tempfile::tempdir().unwrap();
        let p = f::portal_in(backend, dir.path(), |_| {}).await;
        let a = put(&p, &p.alice, MINE, "data/hello.txt", b"hello world").await;
        assert_eq!(a.status, 201, "[{backend:?}] {a}");
        assert_eq!(a.body["size"], 11);
        assert_eq!(a.body["sha256"], sha256(b"hello world"));
        // Again, other contents: replaced (200), one object.
        let a = put(&p, &p.alice, MINE, "data/hello.txt", b"hello, world").await;
        assert_eq!(a.status, 200, "{a}");
        assert_eq!(objects(dir.path()).len(), 1, "{:?}", objects(dir.path()));
        // Any UTF-8 path, an empty file, and 20 MB streamed without a length (in parts).
        let odd = "données/été 1 + 1 = 2 %.txt";
        assert_eq!(put(&p, &p.alice, MINE, odd, b"x").await.status, 201);
        assert_eq!(put(&p, &p.alice, MINE, "empty", b"").await.status, 201);
        let big = noise(20_000_000, 7);
        let a = put_streamed(&p, &p.alice, MINE, "data/big.bin", big.clone(), 100_000).await;
        assert_eq!(a.status, 201, "{a}");
        assert_eq!(a.body["sha256"], sha256(&big));

        let all = list(&p, &p.alice, MINE, "").await;
        assert_eq!(paths(&all.body), ["data/big.bin", "data/hello.txt", odd, "empty"]);
        let data = list(&p, &p.alice, MINE, "data/").await;
        assert_eq!(paths(&data.body), ["data/big.bin", "data/hello.txt"]);
        let hello = &data.body[1];
        assert_eq!((hello["size"].as_u64(), hello["sha256"].as_str()), (Some(12), Some(sha256(b"hello, world").as_str())));
        assert!(hello["modified"].as_str().is_some(), "{hello}");

        let (s, h, body) = get(&p, &p.alice, MINE, "data/hello.txt", None).await;
        assert_eq!((s, body.as_slice()), (200, &b"hello, world"[..]));
        assert_eq!(h["x-commons-sha256"], sha256(b"hello, world").as_str());
        assert_eq!(h["accept-ranges"], "bytes");
        let (_, _, body) = get(&p, &p.alice, MINE, odd, None).await;
        assert_eq!(body, b"x");
        let (s, _, body) = get(&p, &p.alice, MINE, "empty", None).await;
        assert_eq!((s, body.len()), (200, 0));
        let (_, _, body) = get(&p, &p.alice, MINE, "data/big.bin", None).await;
        assert!(body == big, "the big file came back as {} bytes", body.len());
        // Ranges: one served (206), several ignored (200), one past the end refused (416).
        let (s, h, body) = get(&p, &p.alice, MINE, "data/hello.txt", Some("bytes=0-4")).await;
        assert_eq!((s, body.as_slice()), (206, &b"hello"[..]));
        assert_eq!(h["content-range"], "bytes 0-4/12");
        let (s, _, body) = get(&p, &p.alice, MINE, "data/hello.txt", Some("bytes=-5")).await;
        assert_eq!((s, body.as_slice()), (206, &b"world"[..]));
        let (s, h, body) = get(&p, &p.alice, MINE, "data/big.bin", Some("bytes=19000000-")).await;
        assert_eq!((s, body.as_slice()), (206, &big[19_000_000..]));
        assert_eq!(h["content-length"], "1000000");
        let (s, _, body) = get(&p, &p.alice, MINE, "data/hello.txt", Some("bytes=0-1,3-4")).await;
        assert_eq!((s, body.len()), (200, 12));
        let (s, h, _) = get(&p, &p.alice, MINE, "data/hello.txt", Some("bytes=12-")).await;
        assert_eq!((s, h["content-range"].to_str().unwrap()), (416, "bytes */12"));

        // Use shows in /me; nobody else sees alice's files.
        let me = p.get_json(&p.alice, "/api/v1/me").await;
        assert_eq!(me["files"]["files"], 4, "{me}");
        assert_eq!(me["files"]["used_bytes"], 20_000_013, "{me}");
        assert_eq!(me["files"]["quota_bytes"], 50_000_000_000u64, "{me}");
        let (s, _, _) = get(&p, &p.bob, MINE, "data/hello.txt", None).await;
        assert_eq!(s, 404);
        assert_eq!(paths(&list(&p, &p.bob, MINE, "").await.body).len(), 0);

        assert_eq!(delete(&p, &p.alice, MINE, "data/big.bin").await.status, 204);
        assert_eq!(delete(&p, &p.alice, MINE, "data/big.bin").await.status, 404);
        let (s, _, _) = get(&p, &p.alice, MINE, "data/big.bin", None).await;
        assert_eq!(s, 404);
        assert_eq!(objects(dir.path()).len(), 3, "the deleted file's object went: {:?}", objects(dir.path()));
    }
}

/// A request with its path exactly as given (a browser's URL parser would resolve `..`
/// and `.` before sending), over a plain connection: status and body.
async fn raw(p: &TestPortal, method: reqwest::Method, path: &str) -> f::Answer {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = p.url.trim_start_matches("http://");
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {}\r\n\
         Content-Length: 4\r\nConnection: close\r\n\r\ndata",
        p.alice
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    s.read_to_end(&mut got).await.unwrap();
    let text = String::from_utf8_lossy(&got);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    f::Answer {
        status,
        body: serde_json::from_str(body).unwrap_or(serde_json::Value::String(body.into())),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_paths_are_refused_naming_the_rule() {
    let dir = tempfile::tempdir().unwrap();
    let p = f::portal_in(Backend::Sqlite, dir.path(), |_| {}).await;
    let long = "x".repeat(1025);
    let cases = [
        ("/api/v1/files/", "required"),
        ("/api/v1/files/a/%2E%2E/b", "'..'"),
        ("/api/v1/files/%2E%2E", "'..'"),
        ("/api/v1/files/a/./b", "'.'"),
        ("/api/v1/files/a//b", "empty segment"),
        ("/api/v1/files/a/", "empty segment"),
        ("/api/v1/files/%2Fetc", "relative"),
        ("/api/v1/files/a%0Ab", "U+000A"),
        ("/api/v1/files/%FF%FE", "UTF-8"),
        (&format!("/api/v1/files/{long}"), "at most 1024 bytes"),
        ("/api/v1/labs/vision/files/a%2F%2Fb", "empty segment"),
    ];
    for (path, rule) in cases {
        for method in [
            reqwest::Method::PUT,
            reqwest::Method::GET,
            reqwest::Method::DELETE,
        ] {
            let a = raw(&p, method.clone(), path).await;
            assert_eq!(a.status, 422, "{method} {path}: {a}");
            assert_eq!(a.body["field"], "path", "{method} {path}: {a}");
            let m = a.body["message"].as_str().unwrap_or_default();
            assert!(
                m.contains(rule),
                "{method} {path} should name {rule:?}: {m}"
            );
        }
    }
    let a = list(&p, &p.alice, MINE, "../").await;
    assert_eq!(
        (a.status, a.body["field"].as_str()),
        (422, Some("prefix")),
        "{a}"
    );
    assert!(paths(&list(&p, &p.alice, MINE, "").await.body).is_empty());
    assert!(objects(dir.path()).is_empty(), "{:?}", objects(dir.path()));
    // A checksum that does not match keeps nothing either.
    let r = p
        .http
        .put(f::url(&p, MINE, "sum"))
        .bearer_auth(&p.alice)
        .header("x-commons-sha256", sha256(b"other"))
        .body("data")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 422);
    assert!(objects(dir.path()).is_empty(), "{:?}", objects(dir.path()));
}

per_backend! {
    /// Quotas count as bytes arrive: an upload past one is refused (413, naming it) and
    /// leaves nothing; lab admins and operators set them.
    async fn quotas_refuse_uploads_and_keep_nothing_of_them(backend: Backend) {
        let dir = tempfile::tempdir().unwrap();
        let p = f::portal_in(backend, dir.path(), |c| {
            c.user_quota_gb = 0.001;
            c.lab_quota_gb = 0.001;
        })
        .await;
        let first = noise(600_000, 1);
        assert_eq!(put(&p, &p.alice, MINE, "a.bin", &first).await.status, 201);
        // Declared: refused before it is read.
        let a = put(&p, &p.alice, MINE, "b.bin", &noise(600_000, 2)).await;
        assert_eq!((a.status, a.body["error"].as_str()), (413, Some("file_quota")), "[{backend:?}] {a}");
        let m = a.body["message"].as_str().unwrap();
        assert!(m.contains("your file quota of 1 MB") && m.contains("600 kB is in use"), "{m}");
        // Streamed without a length: refused part way.
        let a = put_streamed(&p, &p.alice, MINE, "c.bin", noise(900_000, 3), 30_000).await;
        assert!(a.status == 413 || a.status == 0, "{a}");
        if a.status == 413 {
            assert!(a.body["message"].as_str().unwrap().contains("had sent"), "{a}");
        }
        // Nothing of either stayed: no file, no object, no bytes reserved.
        let wait = std::time::Duration::from_secs(30);
        crate::support::harness::wait_for(wait, "the refused uploads to be forgotten", || async {
            let me = p.get_json(&p.alice, "/api/v1/me").await;
            me["files"]["used_bytes"] == 600_000
        })
        .await;
        assert_eq!(paths(&list(&p, &p.alice, MINE, "").await.body), ["a.bin"]);
        assert_eq!(objects(dir.path()).len(), 1, "{:?}", objects(dir.path()));
        // Replacing a file counts the new one in place of the old one.
        assert_eq!(put(&p, &p.alice, MINE, "a.bin", &noise(700_000, 4)).await.status, 200);

        // The lab's admin gives alice more; alice cannot, nor can carol set the lab's.
        let q = "/api/v1/labs/vision/members/alice/files-quota";
        let (s, v) = p.put_json(&p.alice, q, &json!({"quota_gb": 1})).await;
        assert_eq!(s, 403, "{v}");
        let (s, v) = p.put_json(&p.carol, q, &json!({"quota_gb": -1})).await;
        assert_eq!((s, v["field"].as_str()), (422, Some("quota_gb")), "{v}");
        let (s, v) = p.put_json(&p.carol, q, &json!({"quota_gb": 0.002})).await;
        assert_eq!((s, v["quota_bytes"].as_u64()), (200, Some(2_000_000)), "{v}");
        assert_eq!(put(&p, &p.alice, MINE, "b.bin", &noise(600_000, 2)).await.status, 201);
        let me = p.get_json(&p.alice, "/api/v1/me").await;
        assert_eq!(me["files"]["quota_bytes"], 2_000_000, "{me}");
        assert_eq!(me["files"]["used_bytes"], 1_300_000, "{me}");

        // The lab's space: the operators' quota.
        let a = put(&p, &p.carol, VISION, "big.bin", &noise(1_200_000, 5)).await;
        assert_eq!(a.status, 413, "{a}");
        assert!(a.body["message"].as_str().unwrap().contains("lab vision's file quota of 1 MB"), "{a}");
        let lq = "/api/v1/labs/vision/files-quota";
        let (s, _) = p.put_json(&p.carol, lq, &json!({"quota_gb": 1})).await;
        assert_eq!(s, 403);
        let (s, v) = p.put_json(&p.olga, lq, &json!({"quota_gb": 0.002})).await;
        assert_eq!((s, v["quota_bytes"].as_u64()), (200, Some(2_000_000)), "{v}");
        assert_eq!(put(&p, &p.carol, VISION, "big.bin", &noise(1_200_000, 5)).await.status, 201);
        let me = p.get_json(&p.alice, "/api/v1/me").await;
        assert_eq!(me["labs"][0]["lab_files"]["used_bytes"], 1_200_000, "{me}");
    }
}

per_backend! {
    /// A lab's space: its members read, its admins (and operators) write, others are
    /// refused.
    async fn lab_files_are_read_by_members_and_written_by_admins(backend: Backend) {
        let dir = tempfile::tempdir().unwrap();
        let p = f::portal_in(backend, dir.path(), |_| {}).await;
        assert_eq!(put(&p, &p.carol, VISION, "shared/a.txt", b"from carol").await.status, 201, "[{backend:?}]");
        // alice, a member: reads.
        assert_eq!(paths(&list(&p, &p.alice, VISION, "shared/").await.body), ["shared/a.txt"]);
        let (s, _, body) = get(&p, &p.alice, VISION, "shared/a.txt", None).await;
        assert_eq!((s, body.as_slice()), (200, &b"from carol"[..]));
        // ... and may not write.
        let a = put(&p, &p.alice, VISION, "shared/b.txt", b"x").await;
        assert_eq!(a.status, 403, "{a}");
        assert!(a.body["message"].as_str().unwrap().contains("only lab vision's admins"), "{a}");
        assert_eq!(delete(&p, &p.alice, VISION, "shared/a.txt").await.status, 403);
        // bob, of another lab: nothing.
        let a = list(&p, &p.bob, VISION, "").await;
        assert_eq!(a.status, 403, "{a}");
        assert!(a.body["message"].as_str().unwrap().contains("only members of lab vision"), "{a}");
        let (s, _, _) = get(&p, &p.bob, VISION, "shared/a.txt", None).await;
        assert_eq!(s, 403);
        assert_eq!(put(&p, &p.bob, VISION, "x", b"x").await.status, 403);
        // olga, an operator: reads and writes; an unknown lab is 404.
        assert_eq!(put(&p, &p.olga, VISION, "shared/o.txt", b"ops").await.status, 201);
        assert_eq!(list(&p, &p.olga, "/api/v1/labs/nolab/files", "").await.status, 404);
        // The lab's space is its own: alice's space does not hold it.
        assert!(paths(&list(&p, &p.alice, MINE, "").await.body).is_empty());
        let me = p.get_json(&p.alice, "/api/v1/me").await;
        assert_eq!(me["labs"][0]["lab_files"]["files"], 2, "{me}");
        assert_eq!(delete(&p, &p.carol, VISION, "shared/a.txt").await.status, 204);
        assert_eq!(paths(&list(&p, &p.alice, VISION, "").await.body), ["shared/o.txt"]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_cut_off_by_its_client_leaves_nothing() {
    use tokio::io::AsyncWriteExt;
    let dir = tempfile::tempdir().unwrap();
    let p = f::portal_in(Backend::Sqlite, dir.path(), |_| {}).await;
    let addr = p.url.trim_start_matches("http://").to_string();
    let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let head = format!(
        "PUT /api/v1/files/cut.bin HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {}\r\n\
         Transfer-Encoding: chunked\r\n\r\n",
        p.alice
    );
    s.write_all(head.as_bytes()).await.unwrap();
    // 12 MB in 1 MB chunks: past the first part, so the store holds a multipart upload.
    let chunk = noise(1 << 20, 21);
    for _ in 0..12 {
        s.write_all(format!("{:x}\r\n", chunk.len()).as_bytes())
            .await
            .unwrap();
        s.write_all(&chunk).await.unwrap();
        s.write_all(b"\r\n").await.unwrap();
    }
    let wait = std::time::Duration::from_secs(30);
    crate::support::harness::wait_for(wait, "the upload to count against the quota", || async {
        let me = p.get_json(&p.alice, "/api/v1/me").await;
        me["files"]["used_bytes"].as_u64().unwrap_or(0) > 0
    })
    .await;
    drop(s);
    crate::support::harness::wait_for(wait, "the cut-off upload to be forgotten", || async {
        let me = p.get_json(&p.alice, "/api/v1/me").await;
        me["files"]["used_bytes"] == 0 && objects(dir.path()).is_empty()
    })
    .await;
    assert!(paths(&list(&p, &p.alice, MINE, "").await.body).is_empty());
}
