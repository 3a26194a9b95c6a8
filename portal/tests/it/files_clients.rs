//! Files from their clients: the `commons` CLI's `cp`, `files ls` and `files rm` (the
//! real binary against a running portal), the store on S3 (moto), and the Files page in
//! headless Chromium at 375 px.

use crate::checkpoints::moto::Moto;
use crate::cli::{refused, Cli};
use crate::pages_browser::{browser_login, check_page, js, validate_html};
use crate::support::browser::Browser;
use crate::support::files::{self as f, get, list, noise, paths, put, put_streamed, sha256};
use crate::support::harness::{wait_for, Backend, TestPortal};
use fantoccini::Locator;
use std::path::Path;
use std::time::Duration;

const MINE: &str = "/api/v1/files";

per_backend! {
    /// `commons cp` up and down (files and folders), `files ls`, `files rm`, and their
    /// refusals, each naming what is wrong.
    async fn the_cli_copies_lists_and_removes_files(backend: Backend) {
        let store = tempfile::tempdir().unwrap();
        let p = f::portal_in(backend, store.path(), |c| c.user_quota_gb = 0.005).await;
        let cli = Cli::new();
        cli.ok(&["login", &p.url, "--token", &p.alice]).await;
        let work = tempfile::tempdir().unwrap();
        let w = |rel: &str| work.path().join(rel).display().to_string();
        std::fs::create_dir_all(work.path().join("set/sub")).unwrap();
        std::fs::write(w("a.txt"), "alpha").unwrap();
        let b = noise(300_000, 9);
        std::fs::write(w("set/sub/b.bin"), &b).unwrap();
        std::fs::write(w("set/c.txt"), "c").unwrap();

        let r = cli.ok(&["cp", &w("a.txt"), "files:docs/"]).await;
        assert!(r.stderr.contains("-> files:docs/a.txt (5 B)"), "[{backend:?}] {r}");
        cli.ok(&["cp", "-r", &w("set"), "files:up"]).await;
        let r = cli.ok(&["files", "ls"]).await;
        for path in ["docs/a.txt", "up/set/c.txt", "up/set/sub/b.bin"] {
            assert!(r.stdout.contains(path), "{path}: {r}");
        }
        assert!(r.stdout.contains("3 files (300 kB)"), "{r}");
        let r = cli.ok(&["files", "ls", "up/", "--json"]).await;
        let listed: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
        assert_eq!(paths(&listed), ["up/set/c.txt", "up/set/sub/b.bin"]);
        assert_eq!(listed[1]["sha256"], sha256(&b));

        cli.ok(&["cp", "files:docs/a.txt", &w("out/")]).await;
        assert_eq!(std::fs::read_to_string(w("out/a.txt")).unwrap(), "alpha");
        cli.ok(&["cp", "-r", "files:up/set", &w("back")]).await;
        assert!(std::fs::read(w("back/set/sub/b.bin")).unwrap() == b);
        assert_eq!(
            f::files_under(&work.path().join("back")),
            ["set/c.txt", "set/sub/b.bin"],
            "no part files left"
        );

        cli.ok(&["files", "rm", "docs/a.txt", "files:up/set/c.txt"]).await;
        assert_eq!(paths(&list(&p, &p.alice, MINE, "").await.body), ["up/set/sub/b.bin"]);

        refused(&cli, &["cp", &w("a.txt"), "files:/abs"], 2, "invalid destination").await;
        refused(&cli, &["cp", &w("set"), "files:x"], 2, "use -r").await;
        refused(&cli, &["files", "rm", "no/such"], 1, "file not found").await;
        refused(&cli, &["cp", &w("a.txt"), "lab:vision/x"], 5, "only lab vision's admins").await;
        std::fs::write(w("big.bin"), noise(6_000_000, 3)).unwrap();
        refused(&cli, &["cp", &w("big.bin"), "files:big.bin"], 1, "your file quota of 5 MB").await;
        assert_eq!(paths(&list(&p, &p.alice, MINE, "").await.body), ["up/set/sub/b.bin"]);
        assert_eq!(f::files_under(&store.path().join("files")).len(), 1);
        let who = cli.ok(&["whoami"]).await;
        assert!(who.stdout.contains("your files: 300 kB of 5 MB (1 file)"), "{who}");
        assert!(who.stdout.contains("lab vision files: 0 B of 500 GB (0 files)"), "{who}");
    }
}

/// The objects moto holds under `prefix` (its ListObjectsV2, unsigned).
async fn s3_keys(moto: &Moto, prefix: &str) -> usize {
    let text = reqwest::get(format!(
        "{}/checkpoints?list-type=2&prefix={prefix}",
        moto.endpoint
    ))
    .await
    .unwrap()
    .text()
    .await
    .unwrap();
    text.matches("<Key>").count()
}

/// Multipart uploads moto has begun and not completed nor aborted.
async fn s3_open_uploads(moto: &Moto) -> usize {
    let text = reqwest::get(format!("{}/checkpoints?uploads", moto.endpoint))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.matches("<UploadId>").count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_live_on_s3_and_a_refused_upload_leaves_no_part_there() {
    let moto = Moto::start().await;
    let prefix = format!("t{:x}", rand::random::<u32>());
    let (endpoint, store) = (moto.endpoint.clone(), format!("s3://checkpoints/{prefix}"));
    let p = TestPortal::builder(Backend::Sqlite)
        .config(move |c| {
            let k = &mut c.checkpoints;
            k.store = Some(store);
            k.endpoint = Some(endpoint);
            k.allow_http = true;
            k.access_key_id = Some("testing".into());
            k.secret_access_key = Some(commons_portal::config::Secret("testing".into()));
            c.files.user_quota_gb = 0.03;
        })
        .start()
        .await;
    assert_eq!(
        put(&p, &p.alice, MINE, "small.txt", b"on s3").await.status,
        201
    );
    let big = noise(20_000_000, 11);
    let a = put_streamed(&p, &p.alice, MINE, "big.bin", big.clone(), 250_000).await;
    assert_eq!(
        (a.status, a.body["sha256"].as_str()),
        (201, Some(sha256(&big).as_str())),
        "{a}"
    );
    let (s, _, body) = get(&p, &p.alice, MINE, "big.bin", Some("bytes=9000000-9000009")).await;
    assert_eq!((s, body.as_slice()), (206, &big[9_000_000..9_000_010]));
    let (_, _, body) = get(&p, &p.alice, MINE, "big.bin", None).await;
    assert!(
        body == big,
        "the big file came back as {} bytes",
        body.len()
    );
    assert_eq!(s3_keys(&moto, &format!("{prefix}/files/")).await, 2);
    // 20 MB more, streamed: past the 30 MB quota after its first parts went to S3.
    let a = put_streamed(
        &p,
        &p.alice,
        MINE,
        "more.bin",
        noise(20_000_000, 12),
        250_000,
    )
    .await;
    assert!(a.status == 413 || a.status == 0, "{a}");
    wait_for(
        Duration::from_secs(30),
        "the refused upload's parts to be aborted",
        || async { s3_open_uploads(&moto).await == 0 },
    )
    .await;
    assert_eq!(s3_keys(&moto, &format!("{prefix}/files/")).await, 2);
    assert_eq!(
        paths(&list(&p, &p.alice, MINE, "").await.body),
        ["big.bin", "small.txt"]
    );
    assert_eq!(f::delete(&p, &p.alice, MINE, "big.bin").await.status, 204);
    assert_eq!(s3_keys(&moto, &format!("{prefix}/files/")).await, 1);
}

/// On the Files page: chooses `paths` (one a line) in the file input `input`
/// (`upload-files`, or `upload-folder` for a folder) and presses *Upload*.
pub(crate) async fn choose_and_upload(b: &Browser, input: &str, paths: &str) {
    let field = b.client.find(Locator::Id(input)).await.unwrap();
    field.send_keys(paths).await.unwrap();
    b.client
        .find(Locator::Css("#upload button[type=submit]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
}

/// Uploads `one` (which fits) and `big` (which passes the quota) from the Files page at
/// once; checks each progress line says what became of its file.
async fn upload_one_that_fits_and_one_that_does_not(b: &Browser, one: &Path, big: &Path) {
    let both = format!("{}\n{}", one.display(), big.display());
    choose_and_upload(b, "upload-files", &both).await;
    let started = std::time::Instant::now();
    let lines = loop {
        let lines = js(b, "return Array.from(document.querySelectorAll('#progress li')).map(l => [l.className, l.textContent]);").await;
        if lines
            .as_array()
            .is_some_and(|l| l.len() == 2 && l.iter().all(|x| x[0] != ""))
        {
            break lines;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "both uploads to end: {lines}"
        );
        tokio::time::sleep(Duration::from_millis(150)).await;
    };
    assert_eq!(lines[0][0], "done", "{lines}");
    let first = lines[0][1].as_str().unwrap();
    assert!(
        first.contains("data/one.txt") && first.contains("stored"),
        "{lines}"
    );
    assert_eq!(lines[1][0], "failed", "{lines}");
    let second = lines[1][1].as_str().unwrap();
    assert!(
        second.contains("refused: your file quota of 5 MB"),
        "{lines}"
    );
    let error = js(
        b,
        "return document.getElementById('files-error').textContent;",
    )
    .await;
    assert!(
        error.as_str().unwrap().contains("1 of 2 uploads failed"),
        "{error}"
    );
    // The browser logs the refusal it was told about, and nothing else.
    let logged = b.console_errors().await;
    assert!(
        logged
            .iter()
            .all(|e| e.contains("big.bin") && e.contains("413")),
        "{logged:?}"
    );
}

/// On the Files page of `data/`: downloads `data/one.txt`, then deletes it (a cancelled
/// confirmation first, which keeps it).
async fn download_then_delete(b: &Browser, p: &TestPortal) {
    let got = js(b, "return fetch(document.querySelector('tr[data-path=\"data/one.txt\"] a').href).then(r => r.text());").await;
    assert_eq!(got, "first");
    let bar = js(
        b,
        "return document.getElementById('files-quota').textContent;",
    )
    .await;
    assert_eq!(bar, "7 B used of 5 MB");
    let button = "document.querySelector('button.delete[data-path=\"data/one.txt\"]')";
    let kept = js(
        b,
        &format!("window.confirm = () => false; {button}.click(); return {button}.disabled;"),
    )
    .await;
    assert_eq!(kept, false, "a cancelled confirmation sends nothing");
    assert_eq!(
        paths(&list(p, &p.alice, MINE, "data/").await.body),
        ["data/one.txt", "data/raw/x.bin"]
    );
    js(
        b,
        &format!("window.confirm = () => true; {button}.click(); return null;"),
    )
    .await;
    wait_for(Duration::from_secs(20), "the file to go", || async {
        paths(&list(p, &p.alice, MINE, "data/").await.body) == ["data/raw/x.bin"]
    })
    .await;
    wait_for(
        Duration::from_secs(20),
        "the page to show it gone",
        || async { js(b, "return document.querySelectorAll('tr.file').length;").await == 0 },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_files_page_uploads_with_progress_downloads_and_deletes_at_375_px() {
    let store = tempfile::tempdir().unwrap();
    let p = f::portal_in(Backend::Sqlite, store.path(), |c| c.user_quota_gb = 0.005).await;
    let a = put(&p, &p.alice, MINE, "data/raw/x.bin", b"xx").await;
    assert_eq!(a.status, 201, "{a}");
    let work = tempfile::tempdir().unwrap();
    let one = work.path().join("one.txt");
    let big = work.path().join("big.bin");
    std::fs::write(&one, "first").unwrap();
    std::fs::write(&big, noise(6_000_000, 5)).unwrap();

    let b = Browser::start().await;
    b.client.set_window_size(375, 800).await.unwrap();
    browser_login(&b, &p, "alice").await;
    let folder_page = format!("{}/files?dir=data%2F", p.url);
    b.client.goto(&folder_page).await.unwrap();
    check_page(&b, "files at 375 px").await;
    let folder = js(
        &b,
        "return document.querySelector('tr.folder a').textContent;",
    )
    .await;
    assert_eq!(folder, "raw/");
    upload_one_that_fits_and_one_that_does_not(&b, &one, &big).await;
    // The page again: the file is listed, downloads, and goes after a confirmation.
    b.client.goto(&folder_page).await.unwrap();
    check_page(&b, "files after the upload").await;
    download_then_delete(&b, &p).await;
    let http = crate::support::session::BrowserSession::login(&p, "alice").await;
    let (status, html) = crate::pages::page(&http, &p, "/files?dir=data%2F").await;
    assert_eq!(status, 200);
    validate_html(&[("files".into(), html)]);
    b.close().await;
}

/// The Files page sends a large file in parts: it resumes the upload an earlier visit
/// left unfinished (sending only the parts the portal lacks), and sends a part again
/// after a connection lost mid-way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_files_page_resumes_a_large_upload_and_retries_a_lost_part() {
    let store = tempfile::tempdir().unwrap();
    let p = f::portal_in(Backend::Sqlite, store.path(), |_| {}).await;
    let data = noise(20_000_000, 11);
    let work = tempfile::tempdir().unwrap();
    let big = work.path().join("big.bin");
    std::fs::write(&big, &data).unwrap();
    // An earlier visit started it and stored its first part, then lost its connection.
    let (s, up) = p
        .post_json(
            &p.alice,
            "/api/v1/uploads",
            &serde_json::json!({"path": "data/big.bin", "size": data.len()}),
        )
        .await;
    assert_eq!(s, 201, "{up}");
    let id = up["id"].as_i64().unwrap();
    let part = 8 << 20;
    let r = p
        .http
        .put(format!("{}/api/v1/uploads/{id}/parts/0", p.url))
        .bearer_auth(&p.alice)
        .body(data[..part].to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);

    let b = Browser::start().await;
    browser_login(&b, &p, "alice").await;
    b.client
        .goto(&format!("{}/files?dir=data%2F", p.url))
        .await
        .unwrap();
    // Record what the page sends; the first try of part 1 loses its connection.
    js(
        &b,
        "window.sent = []; window.lost = 0;
         const open = XMLHttpRequest.prototype.open, send = XMLHttpRequest.prototype.send;
         XMLHttpRequest.prototype.open = function (m, u) { this.target = m + ' ' + u; window.sent.push(this.target); sessionStorage.setItem('sent', JSON.stringify(window.sent)); return open.apply(this, arguments); };
         XMLHttpRequest.prototype.send = function (body) {
           if (this.target.endsWith('/parts/1') && window.lost === 0) {
             window.lost = 1; const x = this; setTimeout(function () { x.onerror(); }, 10); return;
           }
           return send.apply(this, arguments);
         };
         return null;",
    )
    .await;
    choose_and_upload(&b, "upload-files", &big.display().to_string()).await;
    // When every file is stored the page reloads itself: what it sent is in its
    // session storage.
    wait_for(Duration::from_secs(90), "the file to be stored", || async {
        paths(&list(&p, &p.alice, MINE, "data/").await.body) == ["data/big.bin"]
    })
    .await;
    let sent = js(
        &b,
        "return JSON.parse(sessionStorage.getItem('sent') || '[]');",
    )
    .await;
    let sent: Vec<&str> = sent
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s.as_str())
        .filter(|s| s.contains("/parts/") || s.contains("/complete"))
        .collect();
    let base = format!("/api/v1/uploads/{id}");
    assert_eq!(
        sent,
        [
            format!("PUT {base}/parts/1"),
            format!("PUT {base}/parts/1"),
            format!("PUT {base}/parts/2"),
            format!("POST {base}/complete"),
        ],
        "the page resumed upload {id}: part 0 was not sent again, part 1 twice"
    );
    let (s, _, body) = f::get(&p, &p.alice, MINE, "data/big.bin", None).await;
    assert!(s == 200 && body == data, "{s}: {} bytes", body.len());
    b.close().await;
}
