//! Web apps through the portal (`app: {"port": N}`): each job's app on an origin of its
//! own (`http://{host}.apps.localhost:PORT`), relayed through the job's agent to the
//! port in its container, for the job's owner only. The apps here are busybox's: its
//! `httpd` (files and a CGI script), and two `nc` servers: one that answers with the
//! request's headers as the app saw them, one that switches protocols and echoes (what
//! a WebSocket needs of the proxy: the bytes after the switch, both ways, unchanged).

use crate::support::cluster::free_port;
use crate::support::harness::{Backend, TestPortal};
use crate::support::session::BrowserSession;
use reqwest::redirect::Policy;
use reqwest::StatusCode;
use serde_json::json;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Serves /tmp/www on 8888 (with a 32 MiB file; from 15 s after the start), on 8890 the
/// request's headers and the size of its body as the app saw them, and on 8899 the
/// switching echo.
pub const APP: &str = r#"mkdir -p /tmp/www
echo 'hello from the app' > /tmp/www/index.html
dd if=/dev/zero of=/tmp/www/big bs=1M count=32 2>/dev/null
cr=$(printf '\r')
cat > /tmp/headers.sh <<EOS
#!/bin/sh
printf 'HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nSet-Cookie: own=1; Path=/\r\n'
printf 'Set-Cookie: planted=1; Domain=apps.localhost\r\nSet-Cookie: commons_app=x\r\n'
printf 'Connection: close\r\n\r\n'
len=0
while read -r l; do
  case "\$l" in "$cr"|"") break;; esac
  echo "\$l"
  case "\$l" in [Cc]ontent-[Ll]ength:*) len=\$(echo "\$l" | tr -dc 0-9);; esac
done
echo "body: \$(head -c \$len | wc -c)"
EOS
cat > /tmp/switch.sh <<EOS
#!/bin/sh
while read -r l; do case "\$l" in "$cr"|"") break;; esac; done
printf 'HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n'
exec cat
EOS
nc -ll -p 8890 -e sh /tmp/headers.sh &
nc -ll -p 8899 -e sh /tmp/switch.sh &
sleep 15
exec httpd -f -p 127.0.0.1:8888 -h /tmp/www"#;

fn app_job(port: i64) -> serde_json::Value {
    json!({"image": "commons-demo:latest", "command": ["sh", "-c", APP], "gpus": 1,
           "time_limit_minutes": 30, "kind": "interactive", "app": {"port": port}})
}

/// A client that reaches `host` (an app origin) on the apps' listener, and follows no
/// redirect (each step is checked).
pub fn client_for(host: &str, port: u16) -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(Policy::none())
        .resolve(host, ([127, 0, 0, 1], port).into())
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

/// Waits until the app answers through the proxy (502 until it listens).
async fn wait_app(c: &reqwest::Client, url: &str, token: &str) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let r = c.get(url).bearer_auth(token).send().await;
        let seen = match r {
            Ok(r) if r.status() == StatusCode::OK => return,
            Ok(r) => format!("{} {}", r.status(), r.text().await.unwrap_or_default()),
            Err(e) => e.to_string(),
        };
        assert!(Instant::now() < deadline, "the app never answered: {seen}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Waits until the job shows its app's URL (once the portal's probe got an answer).
pub async fn wait_app_url(p: &TestPortal, id: i64) -> String {
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let view = p.job(&p.alice, id).await;
        if let Some(u) = view["app_url"].as_str() {
            return u.to_string();
        }
        assert!(
            Instant::now() < deadline,
            "job {id}'s app URL never showed: {view}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jobs_app_is_served_to_its_owner_alone_on_an_origin_of_its_own() {
    let apps_port = free_port();
    let p = TestPortal::builder(Backend::Sqlite)
        .config(move |c| {
            c.apps.url = Some(format!("http://{{host}}.apps.localhost:{apps_port}"));
            c.apps.listen = Some(format!("127.0.0.1:{apps_port}"));
        })
        .start()
        .await;
    // Bad input first: a port outside the range, named.
    let (status, body) = p.post_json(&p.alice, "/api/v1/jobs", &app_job(80)).await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["field"], "app", "{body}");
    let _agent = p.agent("vision", "fake:3xA100-80GB").await;
    // Three jobs, each serving one of the three apps.
    let mut served = Vec::new();
    let mut served_ids = Vec::new();
    for port in [8888, 8890, 8899] {
        let id = p.submit(&p.alice, app_job(port)).await;
        served_ids.push(id);
        p.wait_state(&p.alice, id, &["running"], Duration::from_secs(120))
            .await;
        if port == 8888 {
            // Its server starts 15 s late: no link to a 502 meanwhile.
            let view = p.job(&p.alice, id).await;
            assert!(
                view["app_url"].is_null(),
                "an app URL before the app answered: {view}"
            );
        }
        let url = wait_app_url(&p, id).await;
        let host = url
            .strip_prefix("http://")
            .and_then(|r| r.split(':').next())
            .unwrap()
            .to_string();
        served.push((url, host));
    }
    let (url, host) = served[0].clone();
    let label = host.strip_suffix(".apps.localhost").unwrap().to_string();
    assert_eq!(label.len(), 16, "{url}");
    assert!(
        served[1].1 != host && served[2].1 != host,
        "every app has an origin of its own: {served:?}"
    );
    let app = client_for(&host, apps_port);
    wait_app(&app, &format!("{url}/"), &p.alice).await;
    // `commons open` prints the address (and starts no browser here).
    let cli = crate::cli::signed_in(&p, &p.alice).await;
    let r = cli.ok(&["open", &served_ids[0].to_string()]).await;
    assert_eq!(r.stdout.trim(), url, "{r}");

    // The owner's token passes; bob's does not; no credential goes to the portal.
    let r = app
        .get(format!("{url}/"))
        .bearer_auth(&p.alice)
        .send()
        .await
        .unwrap();
    assert_eq!(r.text().await.unwrap(), "hello from the app\n");
    let r = app
        .get(format!("{url}/"))
        .bearer_auth(&p.bob)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let r = app.get(format!("{url}/x?y=1")).send().await.unwrap();
    assert_eq!(r.status(), 302);
    let to = r.headers()["location"].to_str().unwrap().to_string();
    assert_eq!(
        to,
        format!("{}/apps/open?host={label}&next=%2Fx%3Fy%3D1", p.url)
    );
    // The portal's own session cookie means nothing on the app's origin.
    let alice = BrowserSession::login(&p, "alice").await;
    // The job list has an Open button for each app that answered.
    let list = alice.page("/jobs").await;
    let overview = alice.page("/").await;
    for (u, _) in &served {
        let open = format!("class=\"button app-open\" href=\"{u}\"");
        assert!(list.contains(&open), "no Open for {u} in the job list");
        assert!(overview.contains(&open), "no Open for {u} on the overview");
    }
    let bobs = BrowserSession::login(&p, "bob").await.page("/").await;
    assert!(
        !bobs.contains("app-open"),
        "bob's overview shows alice's apps"
    );
    let r = app
        .get(format!("{url}/"))
        .header("cookie", alice.cookie())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 302, "the portal's cookie is not the app's");

    // The browser's way in: the portal gives the owner a one-time code for the origin.
    let portal = reqwest::Client::builder()
        .redirect(Policy::none())
        .build()
        .unwrap();
    let open = format!("{}/apps/open?host={label}&next=%2Fcgi-bin%2Fcount", p.url);
    let r = portal
        .get(&open)
        .header("cookie", alice.cookie())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 302);
    let to = r.headers()["location"].to_str().unwrap().to_string();
    assert!(
        to.starts_with(&format!("{url}/_commons/auth?code=")),
        "{to}"
    );
    let bob = BrowserSession::login(&p, "bob").await;
    let r = portal
        .get(&open)
        .header("cookie", bob.cookie())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403, "bob gets no code for alice's app");
    let r = app.get(&to).send().await.unwrap();
    assert_eq!(r.status(), 302);
    assert_eq!(r.headers()["location"], "/cgi-bin/count");
    let set = r.headers()["set-cookie"].to_str().unwrap().to_string();
    assert!(set.contains("HttpOnly") && set.contains("Path=/"), "{set}");
    assert!(
        !set.to_ascii_lowercase().contains("domain="),
        "host-only: {set}"
    );
    let session = set.split(';').next().unwrap().to_string();
    let r = app.get(&to).send().await.unwrap();
    assert_eq!(r.status(), 403, "a code works once");

    // A cookie planted for the whole apps domain (by a script on another app's origin)
    // does not shadow the real one.
    let r = app
        .get(format!("{url}/"))
        .header("cookie", format!("commons_app=planted; {session}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // Through the origin's cookie: a 32 MiB download, streamed.
    let r = app
        .get(format!("{url}/big"))
        .header("cookie", &session)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.bytes().await.unwrap().len(), 32 * 1024 * 1024);
    let r = app
        .get(format!("{url}/big"))
        .header("cookie", &session)
        .header("range", "bytes=1048576-1048585")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 206, "a range of it");
    assert_eq!(r.bytes().await.unwrap().len(), 10);

    // What the app sees of a request: its own cookies and headers, not ours.
    let (url, host) = served[1].clone();
    let echo = client_for(&host, apps_port);
    wait_app(&echo, &format!("{url}/"), &p.alice).await;
    let r = echo
        .get(format!("{url}/h"))
        .bearer_auth(&p.alice)
        .header("cookie", "theme=dark; commons_app=whatever")
        .header("x-app", "1")
        .send()
        .await
        .unwrap();
    let set: Vec<String> = r
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().to_string())
        .collect();
    assert_eq!(
        set,
        vec!["own=1; Path=/".to_string()],
        "an app sets cookies for its own origin only"
    );
    let seen = r
        .text()
        .await
        .unwrap()
        .to_ascii_lowercase()
        .replace('\r', "");
    assert!(seen.starts_with("get /h http/1.1"), "{seen}");
    assert!(seen.contains("cookie: theme=dark\n"), "{seen}");
    assert!(seen.contains("x-app: 1"), "{seen}");
    assert!(
        seen.contains(&format!("host: {host}:{apps_port}")),
        "{seen}"
    );
    assert!(seen.contains("x-forwarded-proto: http"), "{seen}");
    assert!(seen.contains("body: 0"), "{seen}");
    assert!(
        !seen.contains("authorization"),
        "our token stays here: {seen}"
    );
    assert!(!seen.contains("commons_app"), "{seen}");
    // The session of one app's origin opens no other app.
    let r = echo
        .get(format!("{url}/h"))
        .header("cookie", &session)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 302, "another origin's session");
    // An 8 MiB upload, streamed to the app.
    let seen = echo
        .post(format!("{url}/upload"))
        .bearer_auth(&p.alice)
        .body(vec![7u8; 8 * 1024 * 1024])
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        seen.contains(&format!("body: {}", 8 * 1024 * 1024)),
        "{seen}"
    );

    // A switch to a WebSocket: the bytes after it pass both ways, unchanged (the frames
    // are the app's and the client's business).
    let (url, host) = served[2].clone();
    let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", apps_port))
        .await
        .unwrap();
    let _ = url;
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
    assert!(text.starts_with("HTTP/1.1 101"), "{text}");
    let at = got.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    let mut echoed = got[at..].to_vec();
    let message: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    tcp.write_all(&message).await.unwrap();
    while echoed.len() < message.len() {
        let n = tokio::time::timeout(Duration::from_secs(60), tcp.read(&mut buf))
            .await
            .expect("the echo comes back")
            .unwrap();
        assert!(n > 0, "closed after {} bytes", echoed.len());
        echoed.extend_from_slice(&buf[..n]);
    }
    assert!(echoed == message, "the bytes came back unchanged");
    p.stop().await;
}
