//! The proxy under weight (issue 29): a Tornado app (Tornado comes with Jupyter Server in
//! `commons-jupyter:test`) behind the proxy, reached with the owner's token. A 1 GiB
//! download and a 1 GiB upload stream through without the portal holding them (its
//! process's peak memory grows by far less), a WebSocket echoes 10,000 messages in order
//! and its close code and reason reach the client, and an app that sends nothing for
//! 60 s is waited for.

use crate::apps::wait_app_url;
use crate::support::cluster::free_port;
use crate::support::harness::{Backend, TestPortal};
use futures_util::{SinkExt, StreamExt};
use serde_json::json;
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::Message;

const IMAGE: &str = "commons-jupyter:test";
const GIB: u64 = 1 << 30;

/// On 9000: `/ws` echoes (and closes with 4001 "asked to" when asked), `/slow` answers
/// after 60 s, `/big?mib=N` streams N MiB, `PUT /upload` counts a streamed body.
const APP: &str = r#"
import asyncio, tornado.web, tornado.websocket
class Echo(tornado.websocket.WebSocketHandler):
    def on_message(self, m):
        if m == "close please":
            self.close(4001, "asked to")
        else:
            self.write_message(m, binary=isinstance(m, bytes))
class Slow(tornado.web.RequestHandler):
    async def get(self):
        await asyncio.sleep(60)
        self.write("slow done")
class Big(tornado.web.RequestHandler):
    async def get(self):
        n = int(self.get_argument("mib"))
        chunk = b"\0" * (1 << 20)
        self.set_header("Content-Length", str(n << 20))
        for _ in range(n):
            self.write(chunk)
            await self.flush()
@tornado.web.stream_request_body
class Upload(tornado.web.RequestHandler):
    def prepare(self):
        self.n = 0
    def data_received(self, d):
        self.n += len(d)
    def put(self):
        self.write(str(self.n))
async def main():
    app = tornado.web.Application([("/ws", Echo), ("/slow", Slow), ("/big", Big), ("/upload", Upload)])
    app.listen(9000, "127.0.0.1", max_body_size=2 << 30)
    await asyncio.Event().wait()
asyncio.run(main())
"#;

/// This process's peak resident memory (`VmHWM`), in bytes.
fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb * 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gib_each_way_ten_thousand_messages_a_close_code_and_a_slow_app() {
    crate::apps_jupyter::image_is_built();
    let apps_port = free_port();
    let p = TestPortal::builder(Backend::Sqlite)
        .config(move |c| {
            c.apps.url = Some(format!("http://{{host}}.apps.localhost:{apps_port}"));
            c.apps.listen = Some(format!("127.0.0.1:{apps_port}"));
        })
        .start()
        .await;
    let (status, body) = p
        .post_json(&p.olga, "/api/v1/images", &json!({"name_tag": IMAGE}))
        .await;
    assert_eq!(status, 201, "{body}");
    let _agent = p.agent("vision", "fake:1xA100-80GB").await;
    let id = p
        .submit(
            &p.alice,
            json!({"image": IMAGE, "command": ["python3", "-c", APP], "gpus": 1,
                   "time_limit_minutes": 30, "kind": "interactive", "app": {"port": 9000}}),
        )
        .await;
    let url = wait_app_url(&p, id).await;
    let host = url
        .strip_prefix("http://")
        .and_then(|r| r.split(':').next())
        .unwrap()
        .to_string();
    let app = reqwest::Client::builder()
        .resolve(&host, ([127, 0, 0, 1], apps_port).into())
        .build()
        .unwrap();
    let token = p.alice.clone();

    // The slow app, meanwhile: nothing for 60 s, then its answer.
    let slow = {
        let (app, url, token) = (app.clone(), url.clone(), token.clone());
        tokio::spawn(async move {
            let t = Instant::now();
            let r = app
                .get(format!("{url}/slow"))
                .bearer_auth(&token)
                .send()
                .await
                .unwrap();
            (r.status(), r.text().await.unwrap(), t.elapsed())
        })
    };

    let before = peak_rss();
    // 1 GiB down, counted as it arrives.
    let t = Instant::now();
    let r = app
        .get(format!("{url}/big?mib=1024"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let mut down = 0u64;
    let mut body = r.bytes_stream();
    while let Some(chunk) = body.next().await {
        down += chunk.expect("the download's bytes").len() as u64;
    }
    assert_eq!(down, GIB);
    let down_s = t.elapsed().as_secs_f64();
    // 1 GiB up, made as it is sent.
    let t = Instant::now();
    let chunks = futures_util::stream::iter(
        (0..1024).map(|_| Ok::<_, std::io::Error>(bytes::Bytes::from(vec![7u8; 1 << 20]))),
    );
    let r = app
        .put(format!("{url}/upload"))
        .bearer_auth(&token)
        .header("content-length", GIB.to_string())
        .body(reqwest::Body::wrap_stream(chunks))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), GIB.to_string());
    let up_s = t.elapsed().as_secs_f64();
    let grew = peak_rss().saturating_sub(before);
    eprintln!(
        "1 GiB down in {down_s:.1} s, up in {up_s:.1} s; the test process's peak memory grew {} MiB",
        grew >> 20
    );
    assert!(
        grew < 256 << 20,
        "the portal held the bodies: its process's peak grew {} MiB",
        grew >> 20
    );

    // A WebSocket: 10,000 messages back in order, then the app's close code.
    let mut req = format!("ws://{host}:{apps_port}/ws")
        .into_client_request()
        .unwrap();
    req.headers_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", apps_port))
        .await
        .unwrap();
    let (mut ws, _) = tokio_tungstenite::client_async(req, tcp).await.unwrap();
    for i in 0..10_000 {
        let m = format!("message {i}");
        ws.send(Message::Text(m.clone().into())).await.unwrap();
        match ws.next().await {
            Some(Ok(Message::Text(t))) => assert_eq!(t.as_str(), m),
            other => panic!("message {i} came back as {other:?}"),
        }
    }
    ws.send(Message::Text("close please".into())).await.unwrap();
    match ws.next().await {
        Some(Ok(Message::Close(Some(f)))) => {
            assert_eq!(f.code, CloseCode::from(4001));
            assert_eq!(f.reason.as_str(), "asked to");
        }
        other => panic!("no close frame with the app's code: {other:?}"),
    }

    let (status, text, took) = slow.await.unwrap();
    assert_eq!(status, 200, "{text}");
    assert_eq!(text, "slow done");
    assert!(took >= Duration::from_secs(59), "{took:?}");
}
