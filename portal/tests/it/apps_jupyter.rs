//! A real Jupyter Server and JupyterLab behind the apps' proxy (issue 29): the image is
//! `commons-jupyter:test` (a debootstrap root with the packages from PyPI, built by
//! `deploy/images/build-jupyter.sh`, which `scripts/test.sh` runs). Through the proxy,
//! with the owner's token: the contents API, a kernel started over REST, `print(6*7)`
//! executed over the kernel's WebSocket and `42` read back; then JupyterLab's page in
//! headless Chromium, reached the way a browser does (the portal's sign-in, a one-time
//! code, the origin's cookie), with no console errors.

use crate::apps::{client_for, wait_app_url};
use crate::pages_browser::browser_login;
use crate::support::browser::Browser;
use crate::support::cluster::free_port;
use crate::support::harness::{Backend, TestPortal};
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

const IMAGE: &str = "commons-jupyter:test";

pub fn image_is_built() {
    let out = std::process::Command::new("docker")
        .args(["image", "inspect", IMAGE, "--format", "{{.Id}}"])
        .output()
        .expect("docker");
    assert!(
        out.status.success(),
        "{IMAGE} is missing: run `bash deploy/images/build-jupyter.sh` (scripts/test.sh does)"
    );
}

/// JupyterLab on 8888, relying on the proxy for authentication (no token of its own),
/// writing only under /tmp (the image is read-only).
fn jupyter_job() -> Value {
    json!({
        "image": IMAGE,
        "command": ["python3", "-m", "jupyterlab", "--ip=127.0.0.1", "--port=8888",
                    "--no-browser", "--ServerApp.base_url=/", "--IdentityProvider.token=",
                    "--ServerApp.allow_remote_access=True", "--ServerApp.root_dir=/tmp",
                    "--ServerApp.disable_check_xsrf=True"],
        "env": {"HOME": "/tmp", "JUPYTER_RUNTIME_DIR": "/tmp/.jupyter-runtime"},
        "gpus": 1,
        "time_limit_minutes": 30,
        "kind": "interactive",
        "app": {"port": 8888},
    })
}

/// Sends `code` to the kernel over its WebSocket and returns what it printed.
async fn execute(host: &str, apps_port: u16, kernel: &str, token: &str, code: &str) -> String {
    let mut req = format!("ws://{host}:{apps_port}/api/kernels/{kernel}/channels")
        .into_client_request()
        .unwrap();
    req.headers_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", apps_port))
        .await
        .unwrap();
    let (mut ws, resp) = tokio_tungstenite::client_async(req, tcp)
        .await
        .expect("the kernel's WebSocket through the proxy");
    assert_eq!(resp.status(), 101);
    let msg_id = format!("exec-{}", rand::random::<u32>());
    let request = json!({
        "header": {"msg_id": msg_id, "username": "test", "session": "commons-test",
                   "msg_type": "execute_request", "version": "5.3"},
        "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
        "content": {"code": code, "silent": false, "store_history": false,
                    "user_expressions": {}, "allow_stdin": false, "stop_on_error": true},
    });
    ws.send(Message::Text(request.to_string().into()))
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut seen = Vec::new();
    let mut printed = String::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let next = tokio::time::timeout(left, ws.next()).await;
        let Ok(Some(Ok(Message::Text(t)))) = next else {
            match next {
                Ok(Some(Ok(_))) => continue,
                other => panic!("the kernel's socket ended or went quiet: {other:?}; saw {seen:?}"),
            }
        };
        let m: Value = serde_json::from_str(&t).unwrap();
        if m["parent_header"]["msg_id"] != msg_id.as_str() {
            continue;
        }
        let kind = m["msg_type"].as_str().unwrap_or_default().to_string();
        seen.push(kind.clone());
        match kind.as_str() {
            "stream" => printed.push_str(m["content"]["text"].as_str().unwrap_or_default()),
            "error" => panic!("the kernel failed: {}", m["content"]),
            "status" if m["content"]["execution_state"] == "idle" && !printed.is_empty() => {
                let _ = ws.close(None).await;
                return printed;
            }
            _ => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jupyter_runs_a_kernel_through_the_proxy_and_jupyterlab_loads_in_chromium() {
    image_is_built();
    let apps_port = free_port();
    let p = TestPortal::builder(Backend::Sqlite)
        .config(move |c| {
            c.apps.url = Some(format!("http://{{host}}.apps.localhost:{apps_port}"));
            c.apps.listen = Some(format!("127.0.0.1:{apps_port}"));
        })
        .start()
        .await;
    // On the campus allow-list, pinned to the local image's ID by the portal.
    let (status, body) = p
        .post_json(
            &p.olga,
            "/api/v1/images",
            &json!({"name_tag": IMAGE, "description": "JupyterLab for the tests"}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let _agent = p.agent("vision", "fake:1xA100-80GB").await;
    let id = p.submit(&p.alice, jupyter_job()).await;
    p.wait_state(&p.alice, id, &["running"], Duration::from_secs(180))
        .await;
    let url = wait_app_url(&p, id).await;
    let host = url
        .strip_prefix("http://")
        .and_then(|r| r.split(':').next())
        .unwrap()
        .to_string();
    let app = client_for(&host, apps_port);

    // REST: the server's contents and a kernel.
    let r = app
        .get(format!("{url}/api/contents"))
        .bearer_auth(&p.alice)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let contents: Value = r.json().await.unwrap();
    assert_eq!(contents["type"], "directory", "{contents}");
    let r = app
        .post(format!("{url}/api/kernels"))
        .bearer_auth(&p.alice)
        .json(&json!({"name": "python3"}))
        .send()
        .await
        .unwrap();
    let status = r.status();
    let kernel: Value = r.json().await.unwrap();
    assert_eq!(status, 201, "{kernel}");
    let kernel_id = kernel["id"].as_str().expect("a kernel id").to_string();
    let printed = execute(&host, apps_port, &kernel_id, &p.alice, "print(6*7)").await;
    assert_eq!(printed, "42\n");
    // A cell sees the job's GPUs (the agent's fake ones here).
    let code = "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])";
    let gpus = execute(&host, apps_port, &kernel_id, &p.alice, code).await;
    assert!(gpus.starts_with("GPU-fake-"), "the kernel's GPUs: {gpus:?}");
    // Bob's token does not pass.
    let r = app
        .get(format!("{url}/api/contents"))
        .bearer_auth(&p.bob)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);

    // JupyterLab in a browser: the portal's sign-in, then the app's URL, which takes the
    // browser to the portal for a code and back to the app's origin with its cookie.
    let b = Browser::start().await;
    browser_login(&b, &p, "alice").await;
    b.client.goto(&format!("{url}/lab")).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let shown: Value = b
            .client
            .execute(
                "return !!document.querySelector('.jp-LabShell .jp-LauncherCard');",
                vec![],
            )
            .await
            .unwrap();
        if shown == Value::Bool(true) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "JupyterLab's launcher never showed; at {}:\n{}",
            b.url().await,
            b.page_text().await
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(
        b.url().await.starts_with(&url),
        "the lab is served on the app's origin: {}",
        b.url().await
    );
    // The launcher shows once the lab has loaded its settings and kernel specs.
    let errors = b.console_errors().await;
    assert!(errors.is_empty(), "console errors: {errors:?}");
    b.close().await;
}

/// Writes the web apps' screenshots for the book (docs/screenshots/launch.png,
/// app-job.png, jupyterlab.png) by the way a user goes: a JupyterLab preset, the Launch
/// page, the job page's Open, the lab.
/// Run: `cargo test -p commons-portal --test it apps_jupyter::screenshots -- --ignored`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "writes docs/screenshots/; run by hand"]
async fn screenshots() {
    image_is_built();
    let out = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/screenshots");
    let apps_port = free_port();
    let p = TestPortal::builder(Backend::Sqlite)
        .config(move |c| {
            c.apps.url = Some(format!("http://{{host}}.apps.localhost:{apps_port}"));
            c.apps.listen = Some(format!("127.0.0.1:{apps_port}"));
        })
        .start()
        .await;
    let (status, body) = p
        .post_json(
            &p.olga,
            "/api/v1/images",
            &json!({"name_tag": IMAGE, "description": "JupyterLab 4.6"}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let command = jupyter_job()["command"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().replace("8888", "{port}"))
        .collect::<Vec<_>>();
    let (status, body) = p
        .post_json(
            &p.olga,
            "/api/v1/app-presets",
            &json!({"name": "jupyterlab", "title": "JupyterLab",
                    "description": "Notebooks on a campus GPU", "colour": "#f37726",
                    "image": IMAGE, "command": command, "port": 8888,
                    "gpus": 1, "max_gpus": 2, "hours": 2, "max_hours": 8,
                    "user_sets": ["gpus", "hours"], "idle_minutes": 60}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let preset = body["id"].as_i64().unwrap();
    let _agent = p.agent("vision", "fake:2xA100-80GB").await;
    let b = Browser::start().await;
    browser_login(&b, &p, "alice").await;
    b.client.set_window_size(1280, 900).await.unwrap();
    b.client.goto(&format!("{}/launch", p.url)).await.unwrap();
    let png = b.client.screenshot().await.unwrap();
    std::fs::write(out.join("launch.png"), png).unwrap();
    b.client
        .find(fantoccini::Locator::Id(&format!("launch-{preset}")))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let shown: Value = b
            .client
            .execute("return !!document.getElementById('app-open');", vec![])
            .await
            .unwrap();
        if shown == Value::Bool(true) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no Open button; at {}",
            b.url().await
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let png = b.client.screenshot().await.unwrap();
    std::fs::write(out.join("app-job.png"), png).unwrap();
    let url: Value = b
        .client
        .execute("return document.getElementById('app-open').href;", vec![])
        .await
        .unwrap();
    b.client
        .goto(&format!("{}lab", url.as_str().unwrap()))
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let shown: Value = b
            .client
            .execute(
                "return !!document.querySelector('.jp-LabShell .jp-LauncherCard');",
                vec![],
            )
            .await
            .unwrap();
        if shown == Value::Bool(true) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no JupyterLab at {}",
            b.url().await
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let png = b.client.screenshot().await.unwrap();
    std::fs::write(out.join("jupyterlab.png"), png).unwrap();
    b.close().await;
}
