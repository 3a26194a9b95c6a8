//! Figures for the apps' proxy (issue 29): the same job's app reached through the proxy
//! and through `ssh -L` over the gateway, side by side in one run on one machine: a small
//! `GET`'s p50 and p99, a 32 MiB download's throughput, and a WebSocket-like round trip
//! (64 bytes out and back over an upgraded connection). A benchmark, not a test:
//!
//! `cargo test -p commons-portal --test it -- --ignored apps_bench --nocapture`
//!
//! Both paths open one relay through the agent per TCP connection: the proxy per
//! request (busybox httpd closes after each answer), the tunnel per connection.

use crate::apps::APP;
use crate::ssh::Rig;
use serde_json::json;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const GETS: usize = 200;
const ROUND_TRIPS: usize = 500;
const DOWNLOADS: usize = 3;

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

struct Figures {
    get_p50_ms: f64,
    get_p99_ms: f64,
    download_mb_s: f64,
    rtt_p50_ms: f64,
    rtt_p99_ms: f64,
}

/// Measures one path: `client` reaches `base` (the web app on 8888), `connect` opens a
/// connection to the echo on 8899 and `upgrade` is the request head that switches it.
async fn measure<F, Fut>(
    client: &reqwest::Client,
    base: &str,
    token: Option<&str>,
    connect: F,
    upgrade: String,
) -> Figures
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = TcpStream>,
{
    let get = |path: String| {
        let mut r = client.get(format!("{base}{path}"));
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        r
    };
    let mut gets = Vec::new();
    for _ in 0..GETS {
        let t = Instant::now();
        let r = get("/index.html".into()).send().await.unwrap();
        assert_eq!(r.status(), 200);
        r.bytes().await.unwrap();
        gets.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let mut rates = Vec::new();
    for _ in 0..DOWNLOADS {
        let t = Instant::now();
        let r = get("/big".into()).send().await.unwrap();
        let n = r.bytes().await.unwrap().len();
        assert_eq!(n, 32 << 20);
        rates.push(n as f64 / 1e6 / t.elapsed().as_secs_f64());
    }
    let mut s = connect().await;
    s.write_all(upgrade.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut b).await.unwrap();
        head.push(b[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 101"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    let msg = [b'x'; 64];
    let mut back = [0u8; 64];
    let mut rtts = Vec::new();
    for _ in 0..ROUND_TRIPS {
        let t = Instant::now();
        s.write_all(&msg).await.unwrap();
        s.read_exact(&mut back).await.unwrap();
        rtts.push(t.elapsed().as_secs_f64() * 1e3);
    }
    Figures {
        get_p50_ms: percentile(&mut gets, 0.5),
        get_p99_ms: percentile(&mut gets, 0.99),
        download_mb_s: percentile(&mut rates, 0.5),
        rtt_p50_ms: percentile(&mut rtts, 0.5),
        rtt_p99_ms: percentile(&mut rtts, 0.99),
    }
}

async fn wait_port(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while TcpStream::connect(("127.0.0.1", port)).await.is_err() {
        assert!(Instant::now() < deadline, "ssh -L never listened on {port}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: cargo test -p commons-portal --test it -- --ignored apps_bench --nocapture"]
async fn apps_bench_proxy_against_an_ssh_tunnel() {
    let apps_port = crate::support::cluster::free_port();
    let toml = format!(
        "[apps]\nurl = \"http://{{host}}.apps.localhost:{apps_port}\"\nlisten = \"127.0.0.1:{apps_port}\"\n"
    );
    let rig = Rig::start_with_toml(248, "", &toml, "fake:2xA100-80GB").await;
    let job = rig
        .api
        .submit(
            json!({"image": "commons-demo:latest", "command": ["sh", "-c", APP],
                       "gpus": 1, "time_limit_minutes": 30, "kind": "interactive",
                       "app": {"port": 8888}}),
        )
        .await;
    let view = rig
        .api
        .wait_job(job, Duration::from_secs(240), "its app's URL", |j| {
            j["app_url"].is_string()
        })
        .await;
    let url = view["app_url"].as_str().unwrap().to_string();
    let host = url
        .strip_prefix("http://")
        .and_then(|r| r.split(':').next())
        .unwrap()
        .to_string();
    let proxy_client = crate::apps::client_for(&host, apps_port);
    let token = rig.api.token.clone();
    let upgrade_proxy = format!(
        "GET /ws HTTP/1.1\r\nHost: {host}:{apps_port}\r\nAuthorization: Bearer {token}\r\n\
         Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
         Sec-WebSocket-Version: 13\r\n\r\n"
    );
    // The proxy forwards 8888's answers; the round trips need the echo on 8899, which
    // has an app of its own only through the tunnel. So the proxy's round trip goes to a
    // second job serving the echo on its app port.
    let echo_job = rig
        .api
        .submit(
            json!({"image": "commons-demo:latest", "command": ["sh", "-c", APP],
                       "gpus": 1, "time_limit_minutes": 30, "kind": "interactive",
                       "app": {"port": 8899}}),
        )
        .await;
    let echo_view = rig
        .api
        .wait_job(echo_job, Duration::from_secs(240), "the echo's URL", |j| {
            j["app_url"].is_string()
        })
        .await;
    let echo_host = echo_view["app_url"]
        .as_str()
        .unwrap()
        .strip_prefix("http://")
        .and_then(|r| r.split(':').next())
        .unwrap()
        .to_string();
    let upgrade_proxy = upgrade_proxy.replace(&host, &echo_host);
    let proxy = measure(
        &proxy_client,
        &url,
        Some(&token),
        || async move { TcpStream::connect(("127.0.0.1", apps_port)).await.unwrap() },
        upgrade_proxy,
    )
    .await;

    let (web, echo) = (
        crate::support::cluster::free_port(),
        crate::support::cluster::free_port(),
    );
    let key = rig.key();
    let mut tunnel = rig
        .ssh_opts(
            &key,
            job,
            &[
                "-N",
                "-L",
                &format!("{web}:127.0.0.1:8888"),
                "-L",
                &format!("{echo}:127.0.0.1:8899"),
            ],
            &[],
        )
        .spawn()
        .expect("OpenSSH client");
    wait_port(web).await;
    wait_port(echo).await;
    let plain = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let upgrade_tunnel = "GET /ws HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\n\
         Connection: Upgrade\r\n\r\n"
        .to_string();
    let ssh = measure(
        &plain,
        &format!("http://127.0.0.1:{web}"),
        None,
        || async move { TcpStream::connect(("127.0.0.1", echo)).await.unwrap() },
        upgrade_tunnel,
    )
    .await;
    let _ = tunnel.kill();
    let _ = tunnel.wait();
    println!("| through | small GET p50 | p99 | 32 MiB download | round trip p50 | p99 |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: |");
    for (name, f) in [("the apps' proxy", &proxy), ("ssh -L (gateway)", &ssh)] {
        println!(
            "| {name} | {:.1} ms | {:.1} ms | {:.0} MB/s | {:.2} ms | {:.2} ms |",
            f.get_p50_ms, f.get_p99_ms, f.download_mb_s, f.rtt_p50_ms, f.rtt_p99_ms
        );
    }
    println!(
        "proxy / tunnel: GET p50 {:.2}x, download {:.2}x, round trip p50 {:.2}x",
        proxy.get_p50_ms / ssh.get_p50_ms,
        proxy.download_mb_s / ssh.download_mb_s,
        proxy.rtt_p50_ms / ssh.rtt_p50_ms
    );
    crate::support::cluster::remove_containers(&[job, echo_job]);
}
