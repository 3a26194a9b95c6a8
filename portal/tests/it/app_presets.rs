//! App presets and the Launch page (`/api/v1/app-presets`, `/launch`, `/app-presets`,
//! `commons launch`) on both backends: who may write which preset, its image against
//! the allow-list its users see, a launch bounded by the preset; then, with the real
//! Docker Engine, a launch followed to its app's address, and the idle rule: an app
//! left alone is warned, then ended; one with an open WebSocket, and one with an SSH
//! session into its job, keep running.

use crate::support::cluster::free_port;
use crate::support::harness::{wait_for, Backend, TestPortal};
use crate::support::session::BrowserSession;
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A portal that serves web apps (`[apps]` on a listener of its own); the port.
async fn portal(backend: Backend) -> (TestPortal, u16) {
    portal_with(backend, None).await
}

/// The same, with the SSH gateway on `ssh` (`(port, host key file)`) when given.
async fn portal_with(
    backend: Backend,
    ssh: Option<(u16, std::path::PathBuf)>,
) -> (TestPortal, u16) {
    let apps_port = free_port();
    let p = TestPortal::builder(backend)
        .config(move |c| {
            c.apps.url = Some(format!("http://{{host}}.apps.localhost:{apps_port}"));
            c.apps.listen = Some(format!("127.0.0.1:{apps_port}"));
            // The idle notice's webhook receiver listens on loopback.
            c.notify.allow_private_targets = true;
            if let Some((port, key)) = ssh {
                c.ssh.listen = Some(format!("127.0.0.1:{port}"));
                c.ssh.host_key_file = Some(key);
            }
        })
        .start()
        .await;
    (p, apps_port)
}

/// An SSH session into job `id` through the gateway (a command that stays), once it
/// has said it is up.
async fn ssh_session(
    p: &TestPortal,
    dir: &std::path::Path,
    port: u16,
    id: i64,
) -> tokio::process::Child {
    use tokio::io::AsyncBufReadExt;
    let key = crate::ssh::keygen(dir, "alice", "ed25519");
    let public = std::fs::read_to_string(key.with_extension("pub")).unwrap();
    let (status, body) = p
        .post_json(&p.alice, "/api/v1/ssh-keys", &json!({"public_key": public}))
        .await;
    assert_eq!(status, 201, "{body}");
    let g = p.get_json(&p.alice, "/api/v1/ssh-gateway").await;
    std::fs::write(
        dir.join("known_hosts"),
        format!("{}\n", g["known_hosts"].as_str().unwrap()),
    )
    .unwrap();
    let alias = g["host_key_alias"].as_str().unwrap();
    let mut child = tokio::process::Command::new("ssh")
        .args(crate::ssh::ssh_options(dir, &key, alias, port))
        .arg(format!("job-{id}@127.0.0.1"))
        .arg("echo up; exec sleep 600")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("ssh (apt-get install openssh-client)");
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
        .await
        .expect("the session says it is up")
        .unwrap();
    assert_eq!(first.as_deref(), Some("up"));
    child
}

/// A preset of the demo image serving `script` (a shell script with `{port}`).
fn preset(name: &str, script: &str, idle_minutes: i64) -> Value {
    json!({
        "name": name, "title": format!("App {name}"), "image": "commons-demo:latest",
        "command": ["sh", "-c", script], "port": 8888,
        "gpus": 1, "max_gpus": 2, "hours": 1, "max_hours": 4,
        "cpus": 0.5, "memory_gb": 0.25, "user_sets": ["gpus", "hours"],
        "idle_minutes": idle_minutes
    })
}

/// busybox's httpd on `{port}`.
const HTTPD: &str = "mkdir -p /tmp/www && echo 'hello from the preset' > /tmp/www/index.html \
                     && exec httpd -f -p 127.0.0.1:{port} -h /tmp/www";

async fn delete(p: &TestPortal, token: &str, path: &str) -> u16 {
    p.http
        .delete(format!("{}{path}", p.url))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

per_backend! {
    async fn presets_are_written_by_who_may_and_launched_within_their_bounds(backend: Backend) {
        let (p, _) = portal(backend).await;
        // Operators write the campus's presets, with an image every lab may run.
        let (status, campus) = p.post_json(&p.olga, "/api/v1/app-presets", &preset("web", HTTPD, 30)).await;
        assert_eq!(status, 201, "[{backend:?}] {campus}");
        assert_eq!(campus["lab"], Value::Null);
        assert_eq!(campus["user_sets"], json!(["gpus", "hours"]));
        let campus_id = campus["id"].as_i64().unwrap();
        let mut bad = preset("other", HTTPD, 30);
        bad["image"] = json!("busybox:1.36");
        let (status, body) = p.post_json(&p.olga, "/api/v1/app-presets", &bad).await;
        assert_eq!((status, body["field"].as_str()), (422, Some("image")), "{body}");
        for (field, value) in [("port", json!(80)), ("max_gpus", json!(17)), ("idle_minutes", json!(0)), ("colour", json!("red"))] {
            let mut bad = preset("other", HTTPD, 30);
            bad[field] = value;
            let (status, body) = p.post_json(&p.olga, "/api/v1/app-presets", &bad).await;
            assert_eq!((status, body["field"].as_str()), (422, Some(field)), "{body}");
        }
        let (status, body) = p.post_json(&p.olga, "/api/v1/app-presets", &preset("web", HTTPD, 30)).await;
        assert_eq!((status, body["error"].as_str()), (409, Some("preset_exists")), "{body}");
        // Lab admins write their lab's; members and other labs' admins nothing.
        let (status, _) = p.post_json(&p.alice, "/api/v1/app-presets", &preset("mine", HTTPD, 30)).await;
        assert_eq!(status, 403);
        let (status, _) = p.post_json(&p.carol, "/api/v1/app-presets", &preset("mine", HTTPD, 30)).await;
        assert_eq!(status, 403, "a campus preset is the operators'");
        let mut lab = preset("web", HTTPD, 30);
        lab["lab"] = json!("vision");
        let (status, vision) = p.post_json(&p.carol, "/api/v1/app-presets", &lab).await;
        assert_eq!(status, 201, "{vision}");
        assert_eq!(vision["lab"], "vision");
        let vision_id = vision["id"].as_i64().unwrap();
        lab["lab"] = json!("physics");
        let (status, _) = p.post_json(&p.carol, "/api/v1/app-presets", &lab).await;
        assert_eq!(status, 403);
        // Each sees the campus's and their labs'.
        let names = |v: Value| -> Vec<i64> {
            v.as_array().unwrap().iter().map(|x| x["id"].as_i64().unwrap()).collect()
        };
        assert_eq!(names(p.get_json(&p.alice, "/api/v1/app-presets").await), vec![campus_id, vision_id]);
        assert_eq!(names(p.get_json(&p.bob, "/api/v1/app-presets").await), vec![campus_id]);
        let r = p.http.get(format!("{}/api/v1/app-presets/{vision_id}", p.url)).bearer_auth(&p.bob).send().await.unwrap();
        assert_eq!(r.status(), 404, "another lab's preset is not there for bob");
        // Changed by who may write it; it stays with its lab.
        let mut change = preset("web", HTTPD, 45);
        change["title"] = json!("Vision's web");
        let (status, body) = p.put_json(&p.carol, &format!("/api/v1/app-presets/{vision_id}"), &change).await;
        assert_eq!((status, body["title"].as_str(), body["idle_minutes"].as_i64()), (200, Some("Vision's web"), Some(45)), "{body}");
        let (status, _) = p.put_json(&p.alice, &format!("/api/v1/app-presets/{vision_id}"), &change).await;
        assert_eq!(status, 403);
        change["lab"] = json!("physics");
        let (status, body) = p.put_json(&p.olga, &format!("/api/v1/app-presets/{vision_id}"), &change).await;
        assert_eq!((status, body["field"].as_str()), (422, Some("lab")), "{body}");

        // A launch within the bounds; past them, or a setting the preset fixes, named.
        let launch = |id: i64| format!("/api/v1/app-presets/{id}/launch");
        for (body, field) in [(json!({"gpus": 3}), "gpus"), (json!({"hours": 5}), "hours"), (json!({"cpus": 2}), "cpus")] {
            let (status, r) = p.post_json(&p.alice, &launch(campus_id), &body).await;
            assert_eq!((status, r["field"].as_str()), (422, Some(field)), "{body}: {r}");
        }
        let (status, r) = p.post_json(&p.alice, &launch(campus_id), &json!({"colour": 1})).await;
        assert_eq!((status, r["field"].as_str()), (422, Some("colour")), "{r}");
        assert_eq!(p.get_json(&p.alice, "/api/v1/jobs").await.as_array().unwrap().len(), 0, "nothing stored");
        let (status, job) = p.post_json(&p.alice, &launch(campus_id), &json!({"gpus": 2, "hours": 3})).await;
        assert_eq!(status, 201, "{job}");
        assert_eq!((job["kind"].as_str(), job["gpus_requested"].as_i64(), job["time_limit_minutes"].as_i64()), (Some("interactive"), Some(2), Some(180)), "{job}");
        assert_eq!((job["name"].as_str(), job["tags"]["preset"].as_str()), (Some("App web"), Some("web")), "{job}");
        let command = job["command"][2].as_str().unwrap();
        assert!(command.contains("-p 127.0.0.1:8888 "), "{{port}} filled in: {command}");
        let (status, job) = p.post_json(&p.bob, &launch(vision_id), &json!({})).await;
        assert_eq!(status, 404, "{job}");

        // The pages: the launch form (a refusal beside its field), the console.
        let alice = BrowserSession::login(&p, "alice").await;
        let html = alice.page("/launch").await;
        assert!(html.contains(&format!("id=\"preset-{campus_id}\"")) && html.contains(&format!("id=\"preset-{vision_id}\"")), "{html}");
        assert!(html.contains(&format!("id=\"p{campus_id}-gpus\"")) && !html.contains(&format!("id=\"p{campus_id}-cpus\"")), "only what may change");
        assert!(!html.contains("manage-presets"), "members manage none");
        let r = alice.post_form(&format!("/launch/{campus_id}"), &[("gpus", "9"), ("hours", "1")]).await;
        assert_eq!(r.status(), 422);
        let html = r.text().await.unwrap();
        assert!(html.contains(&format!("id=\"p{campus_id}-gpus-error\"")), "{html}");
        let mut pages = vec![("launch-refused".to_string(), html)];
        let r = alice.post_form(&format!("/launch/{vision_id}"), &[("hours", "2")]).await;
        assert_eq!(r.status(), 303);
        let to = r.headers()["location"].to_str().unwrap().to_string();
        assert!(to.starts_with("/jobs/"), "to the job's page: {to}");
        let olga = BrowserSession::login(&p, "olga").await;
        let html = olga.page("/app-presets").await;
        assert!(html.contains("id=\"preset-form\"") && html.contains(&format!("id=\"preset-row-{vision_id}\"")), "{html}");
        let mut form = vec![("name", "tb"), ("title", "TensorBoard"), ("image", "commons-demo:latest"), ("command", "tensorboard --port {port}"),
            ("port", "6006"), ("gpus", "1"), ("hours", "2"), ("cpus", "1"), ("memory_gb", "2"), ("idle_minutes", "20"), ("colour", "#ff8800"), ("lab", "")];
        let r = olga.post_form("/app-presets", &form).await;
        assert_eq!(r.status(), 303, "{}", r.text().await.unwrap_or_default());
        form[4] = ("port", "22");
        form[0] = ("name", "tb2");
        let r = olga.post_form("/app-presets", &form).await;
        assert_eq!(r.status(), 422);
        let html = r.text().await.unwrap();
        assert!(html.contains("id=\"port-error\""), "{html}");
        pages.push(("presets-refused".to_string(), html));
        let tb = p.get_json(&p.bob, "/api/v1/app-presets").await;
        let tb = tb.as_array().unwrap().iter().find(|x| x["name"] == "tb").cloned().unwrap();
        assert_eq!(tb["command"], json!(["sh", "-c", "tensorboard --port {port}"]), "{tb}");
        let html = olga.page(&format!("/app-presets?edit={}", tb["id"])).await;
        assert!(html.contains("Change preset tb") && html.contains("tensorboard --port {port}"), "{html}");
        pages.push(("presets-edit".to_string(), html));
        if matches!(backend, Backend::Sqlite) {
            crate::pages_browser::validate_html(&pages);
        }
        let audit = olga.page("/audit").await;
        assert!(audit.contains("add_app_preset") && audit.contains("change_app_preset"), "audited");

        // Removed by who may write it; launched jobs go on.
        assert_eq!(delete(&p, &p.alice, &format!("/api/v1/app-presets/{campus_id}")).await, 403);
        assert_eq!(delete(&p, &p.olga, &format!("/api/v1/app-presets/{campus_id}")).await, 204);
        assert_eq!(names(p.get_json(&p.bob, "/api/v1/app-presets").await), vec![tb["id"].as_i64().unwrap()]);
        assert_eq!(p.get_json(&p.alice, "/api/v1/jobs").await.as_array().unwrap().len(), 2);
        p.stop().await;
    }
}

/// Waits until `id`'s history has an entry containing `words`; that entry's message.
async fn wait_event(p: &TestPortal, id: i64, words: &str, within: Duration) -> String {
    let deadline = Instant::now() + within;
    loop {
        let events = p
            .get_json(&p.alice, &format!("/api/v1/jobs/{id}/events"))
            .await;
        if let Some(e) = events
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["message"].as_str().unwrap_or_default().contains(words))
        {
            return e["message"].as_str().unwrap().to_string();
        }
        assert!(
            Instant::now() < deadline,
            "job {id}: no {words:?} in its history within {within:?}: {events}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Opens a WebSocket (the switch, then bytes echoed) to the app at `host` through the
/// proxy as alice and checks one echo; `None` while the app does not switch yet (502).
async fn open_websocket(
    p: &TestPortal,
    host: &str,
    apps_port: u16,
) -> Option<tokio::net::TcpStream> {
    let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", apps_port))
        .await
        .unwrap();
    let head = format!(
        "GET /ws HTTP/1.1\r\nHost: {host}:{apps_port}\r\nAuthorization: Bearer {}\r\n\
         Connection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
        p.alice
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(60), tcp.read(&mut buf))
            .await
            .expect("the switch is answered")
            .unwrap();
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&got).to_string();
    if text.starts_with("HTTP/1.1 502") {
        return None;
    }
    assert!(text.starts_with("HTTP/1.1 101"), "{text}");
    tcp.write_all(b"ping").await.unwrap();
    let n = tokio::time::timeout(Duration::from_secs(30), tcp.read(&mut buf))
        .await
        .expect("the echo")
        .unwrap();
    assert_eq!(&buf[..n], b"ping");
    Some(tcp)
}

/// An app that switches protocols and echoes, on `{port}` (what a WebSocket needs of
/// the proxy; busybox has no WebSocket server).
const ECHO: &str = r#"cr=$(printf '\r')
cat > /tmp/switch.sh <<EOS
#!/bin/sh
while read -r l; do case "\$l" in "$cr"|"") break;; esac; done
printf 'HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n'
exec cat
EOS
exec nc -ll -p {port} -e sh /tmp/switch.sh"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_launched_app_left_alone_is_warned_then_ended_and_open_websockets_or_ssh_keep_one() {
    let dir = tempfile::tempdir().unwrap();
    let ssh_port = free_port();
    let (p, apps_port) = portal_with(
        Backend::Sqlite,
        Some((ssh_port, dir.path().join("host_key"))),
    )
    .await;
    // Alice hears of an app about to end by webhook.
    let rx = crate::notifications::Receiver::start(0);
    let (status, v) = p
        .put_json(
            &p.alice,
            "/api/v1/me/notifications",
            &json!({"webhooks": [{"url": rx.url, "secret": crate::notifications::SECRET}],
                    "events": ["ending"]}),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    let _agent = p.agent("vision", "fake:3xA100-80GB").await;
    let mut ids = Vec::new();
    for (name, script) in [("web", HTTPD), ("echo", ECHO)] {
        let (status, body) = p
            .post_json(&p.olga, "/api/v1/app-presets", &preset(name, script, 1))
            .await;
        assert_eq!(status, 201, "{body}");
        ids.push(body["id"].as_i64().unwrap());
    }
    let web = ids[0];
    // `commons launch` prints the job's id, then, once it runs, its app's address.
    let cli = crate::cli::signed_in(&p, &p.alice).await;
    let r = cli.ok(&["launch", "web", "--print"]).await;
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{r}");
    let idle: i64 = lines[0].parse().unwrap();
    let url = lines[1].to_string();
    assert_eq!(p.job(&p.alice, idle).await["app_url"], url.as_str(), "{r}");
    let r = cli.run(&["launch", "web", "--gpus", "3"]).await;
    assert!(
        r.code != 0 && r.stderr.contains("web offers 1 to 2 GPUs"),
        "refused before sending: {r}"
    );
    let r = cli.ok(&["launch", "echo", "--no-wait"]).await;
    let kept: i64 = r.stdout.trim().parse().unwrap();
    p.wait_state(&p.alice, kept, &["running"], Duration::from_secs(120))
        .await;
    let kept_url = crate::apps::wait_app_url(&p, kept).await;
    let kept_host = kept_url
        .strip_prefix("http://")
        .and_then(|r| r.split(':').next())
        .unwrap()
        .to_string();
    // The WebSocket stays open for the whole test; one echo proves it passes.
    let deadline = Instant::now() + Duration::from_secs(60);
    let ws = loop {
        let opened = Instant::now();
        if let Some(ws) = open_websocket(&p, &kept_host, apps_port).await {
            break (ws, opened);
        }
        assert!(Instant::now() < deadline, "the echo app never listened");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };

    // A third, kept by an SSH session into its job.
    let (status, shelled) = p
        .post_json(
            &p.alice,
            &format!("/api/v1/app-presets/{web}/launch"),
            &json!({}),
        )
        .await;
    assert_eq!(status, 201, "{shelled}");
    let shelled = shelled["id"].as_i64().unwrap();
    p.wait_state(&p.alice, shelled, &["running"], Duration::from_secs(120))
        .await;
    let session = ssh_session(&p, dir.path(), ssh_port, shelled).await;
    let shell_opened = Instant::now();

    // The app left alone: warned at 45 s (a quarter of its minute before the end),
    // shown on its page, then ended at its minute.
    let warning = wait_event(&p, idle, "this app ends at", Duration::from_secs(150)).await;
    assert!(
        warning.starts_with("idle for ") && warning.contains(" s: this app ends at "),
        "{warning}"
    );
    let view = p.job(&p.alice, idle).await;
    assert!(view["app_idle_ends_at"].is_string(), "{view}");
    let alice = BrowserSession::login(&p, "alice").await;
    let html = alice.page(&format!("/jobs/{idle}")).await;
    assert!(html.contains("id=\"app-idle-warning\""), "{html}");
    let warned_page = html;
    // ... and by webhook, once, with the same end.
    let calls = rx
        .wait("the idle app's ending notice", |c| !c.is_empty())
        .await;
    let e: serde_json::Value = serde_json::from_str(&calls[0].body).unwrap();
    assert_eq!(e["type"], "job.ending", "{e}");
    assert_eq!(e["data"]["job"]["id"], idle, "{e}");
    assert!(
        e["data"]["reason"]
            .as_str()
            .unwrap()
            .starts_with("no use of the app since "),
        "{e}"
    );
    p.wait_state(&p.alice, idle, &["cancelled"], Duration::from_secs(120))
        .await;
    let view = p.job(&p.alice, idle).await;
    assert_eq!(view["reason"], "ended after 1 idle minute", "{view}");
    wait_event(
        &p,
        idle,
        "ended after 1 idle minute",
        Duration::from_secs(5),
    )
    .await;

    // The one with an open WebSocket runs on, never warned, well past its minute and
    // warning after the last request (the handshake): the open WebSocket is its use.
    let (ws, opened) = ws;
    tokio::time::sleep_until((opened.max(shell_opened) + Duration::from_secs(90)).into()).await;
    for id in [kept, shelled] {
        let view = p.job(&p.alice, id).await;
        assert_eq!(view["state"], "running", "{view}");
        let events = p
            .get_json(&p.alice, &format!("/api/v1/jobs/{id}/events"))
            .await;
        assert!(!events.to_string().contains("idle for"), "{events}");
    }
    drop(session);
    let view = p.job(&p.alice, kept).await;
    assert_eq!(view["state"], "running", "{view}");
    let events = p
        .get_json(&p.alice, &format!("/api/v1/jobs/{kept}/events"))
        .await;
    assert!(!events.to_string().contains("idle for"), "{events}");
    let mut ws = ws;
    ws.write_all(b"still here").await.unwrap();
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(30), ws.read(&mut buf))
        .await
        .expect("the echo")
        .unwrap();
    assert_eq!(&buf[..n], b"still here");
    drop(ws);
    let (status, _) = p
        .post_json(&p.alice, &format!("/api/v1/jobs/{kept}/cancel"), &json!({}))
        .await;
    assert_eq!(status, 200);
    let me = &p;
    wait_for(
        Duration::from_secs(60),
        "the kept app cancelled",
        || async move { me.job(&me.alice, kept).await["state"] == "cancelled" },
    )
    .await;
    crate::pages_browser::validate_html(&[("job-idle-warning".into(), warned_page)]);
    p.stop().await;
}
