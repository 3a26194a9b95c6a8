//! Forwarding one request to a job's app: a relay to the app's port through the job's
//! agent (as for `ssh -L`), HTTP/1.1 over it, bodies streamed both ways, and a WebSocket
//! passed through byte for byte once the app agrees to switch (frames, pings and close
//! codes are the app's and the browser's business).

use super::pipe;
use crate::service::apps::COOKIE;
use crate::service::relays;
use crate::state::AppState;
use actix_web::http::header::HeaderMap;
use actix_web::{web, HttpRequest, HttpResponse};
use bytes::Bytes;
use commons_proto::relay::RelayTarget;
use commons_proto::Attempt;
use futures_util::StreamExt;
use http_body_util::{BodyExt, Either, Empty, StreamBody};
use hyper::body::Frame;
use hyper_util::rt::TokioIo;
use tokio::io::AsyncWriteExt;

/// Where a request goes.
pub struct Target {
    pub job: i64,
    pub port: u16,
    pub node: i64,
    pub attempt: Attempt,
    /// The request's `Authorization` was the owner's token (for us, not the app).
    pub strip_authorization: bool,
    /// The scheme users reach the app with (`X-Forwarded-Proto`).
    pub scheme: &'static str,
}

/// Headers of one hop only (RFC 9110 7.6.1), never forwarded as they are.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
];

fn bad_gateway(job: i64, why: impl std::fmt::Display) -> HttpResponse {
    tracing::info!(job, "app request failed: {why}");
    HttpResponse::BadGateway()
        .content_type("text/plain; charset=utf-8")
        .body(format!(
            "GPU Commons: job {job}'s app did not answer: {why}\n(is it listening on the \
             port it asked for, on the container's localhost? Reload once it is.)\n"
        ))
}

/// Forwards `req` (and its body) to the app and streams the answer back.
pub async fn forward(
    state: &AppState,
    req: HttpRequest,
    body: web::Payload,
    t: Target,
) -> HttpResponse {
    let relay_url = state.config.ssh.relay_url.clone();
    let target = RelayTarget::Forward { port: t.port };
    let pipe = match relays::open(state, t.node, t.job, t.attempt, relay_url, target).await {
        Ok(p) => p,
        Err(e) => return bad_gateway(t.job, e),
    };
    let io = TokioIo::new(pipe::into_stream(pipe));
    let (mut sender, conn) = match hyper::client::conn::http1::handshake(io).await {
        Ok(x) => x,
        Err(e) => return bad_gateway(t.job, e),
    };
    // The body is actix's (not `Send`): the connection runs on this worker's thread.
    actix_web::rt::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!("app connection ended: {e}");
        }
    });
    let upgrade = is_upgrade(req.headers());
    let head = request_head(&req, &t, upgrade);
    // A body when the request says it has one; an upgrade's stays here: after the switch
    // it carries the new protocol's bytes.
    let has_body = !upgrade
        && (req.headers().contains_key("content-length")
            || req.headers().contains_key("transfer-encoding"));
    let (sent, mut body) = if has_body {
        let stream = body.map(|r| {
            r.map(Frame::data)
                .map_err(|e| std::io::Error::other(e.to_string()))
        });
        (head.body(Either::Right(StreamBody::new(stream))), None)
    } else {
        (head.body(Either::Left(Empty::new())), Some(body))
    };
    let out = match sent {
        Ok(r) => r,
        Err(e) => return bad_gateway(t.job, e),
    };
    let mut resp = match sender.send_request(out).await {
        Ok(r) => r,
        Err(e) => return bad_gateway(t.job, e),
    };
    let status = resp.status().as_u16();
    let mut answer = HttpResponse::build(
        actix_web::http::StatusCode::from_u16(status)
            .unwrap_or(actix_web::http::StatusCode::BAD_GATEWAY),
    );
    for (name, value) in resp.headers() {
        let keep = status == 101 || !is_hop_by_hop(name.as_str());
        let cookie_ok = name.as_str() != "set-cookie" || app_cookie_allowed(value.as_bytes());
        if keep && cookie_ok {
            answer.append_header((name.as_str(), value.as_bytes()));
        }
    }
    if status == 101 {
        let upgraded = match hyper::upgrade::on(&mut resp).await {
            Ok(u) => u,
            Err(e) => return bad_gateway(t.job, e),
        };
        let (read, mut write) = tokio::io::split(TokioIo::new(upgraded));
        if let Some(mut from_client) = body.take() {
            actix_web::rt::spawn(async move {
                while let Some(Ok(chunk)) = from_client.next().await {
                    if write.write_all(&chunk).await.is_err() {
                        break;
                    }
                }
                let _ = write.shutdown().await;
            });
        }
        // actix writes `Connection` itself: say it is an upgrade, or the browser sees a
        // 101 without `Connection: Upgrade` and drops the socket.
        answer.upgrade("websocket");
        // An open WebSocket is use of the app for as long as it stays open (the idle
        // rule): the guard lives as long as the stream to the client.
        let in_use = crate::service::apps::in_use(state, t.job);
        let stream = tokio_util_stream(read).map(move |chunk| {
            let _ = &in_use;
            chunk
        });
        return answer.streaming(stream);
    }
    let stream = resp
        .into_body()
        .into_data_stream()
        .map(|r| r.map_err(|e| std::io::Error::other(e.to_string())));
    answer.streaming(stream)
}

/// The bytes of `read` as a stream of chunks.
fn tokio_util_stream<R: tokio::io::AsyncRead + Unpin + 'static>(
    read: R,
) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> {
    futures_util::stream::unfold(
        (read, vec![0u8; 64 * 1024]),
        |(mut read, mut buf)| async move {
            use tokio::io::AsyncReadExt;
            match read.read(&mut buf).await {
                Ok(0) => None,
                Ok(n) => {
                    let chunk = Bytes::copy_from_slice(&buf[..n]);
                    Some((Ok(chunk), (read, buf)))
                }
                Err(e) => Some((Err(e), (read, buf))),
            }
        },
    )
}

fn is_hop_by_hop(name: &str) -> bool {
    HOP_BY_HOP.contains(&name) || name == "upgrade"
}

/// The request asks to switch to a WebSocket. (Only then does the server hand on the
/// bytes after the request's head; other `Upgrade`s go as plain requests, the header
/// dropped.)
fn is_upgrade(headers: &HeaderMap) -> bool {
    headers
        .get("upgrade")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("websocket"))
        && headers
            .get_all("connection")
            .filter_map(|v| v.to_str().ok())
            .any(|v| {
                v.split(',')
                    .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
            })
}

/// The request's head as the app gets it: the same method, path and headers, less ours
/// and the hop-by-hop ones.
fn request_head(req: &HttpRequest, t: &Target, upgrade: bool) -> hyper::http::request::Builder {
    let path = req.uri().path_and_query().map_or("/", |p| p.as_str());
    let mut out = hyper::Request::builder()
        .method(req.method().as_str())
        .uri(path);
    for (name, value) in req.headers() {
        let n = name.as_str();
        if n == "cookie" {
            if let Some(rest) = without_our_cookie(value.to_str().unwrap_or_default()) {
                out = out.header("cookie", rest);
            }
            continue;
        }
        if n == "authorization" && t.strip_authorization {
            continue;
        }
        let hop = is_hop_by_hop(n);
        // A WebSocket handshake needs its `Connection: Upgrade` and `Upgrade`.
        if hop && !(upgrade && (n == "connection" || n == "upgrade")) {
            continue;
        }
        out = out.header(n, value.as_bytes());
    }
    out = out.header("x-forwarded-proto", t.scheme);
    if let Some(host) = req.headers().get("host") {
        out = out.header("x-forwarded-host", host.as_bytes());
    }
    out
}

/// Whether an app's `Set-Cookie` may reach the browser: not one named like the origin's
/// session cookie, and none with a `Domain` (which would reach every app's origin under
/// the apps' domain: a way for one app to plant cookies on the others).
fn app_cookie_allowed(set_cookie: &[u8]) -> bool {
    let text = String::from_utf8_lossy(set_cookie);
    let mut parts = text.split(';');
    let name = parts
        .next()
        .and_then(|p| p.split('=').next())
        .unwrap_or_default()
        .trim();
    let domain = parts.any(|a| {
        a.trim()
            .split('=')
            .next()
            .is_some_and(|k| k.trim().eq_ignore_ascii_case("domain"))
    });
    name != COOKIE && !domain
}

/// The `Cookie` header without this origin's own session cookie (the app never sees it).
fn without_our_cookie(header: &str) -> Option<String> {
    let kept: Vec<&str> = header
        .split(';')
        .map(str::trim)
        .filter(|c| !c.is_empty() && c.split('=').next() != Some(COOKIE))
        .collect();
    (!kept.is_empty()).then(|| kept.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_app_sets_cookies_for_its_own_origin_only() {
        assert!(app_cookie_allowed(b"_xsrf=1; Path=/; HttpOnly"));
        assert!(app_cookie_allowed(b"theme=dark"));
        assert!(!app_cookie_allowed(b"commons_app=planted; Path=/"));
        assert!(!app_cookie_allowed(b"x=1; Path=/; Domain=apps.campus.edu"));
        assert!(!app_cookie_allowed(b"x=1; domain = .apps.localhost"));
    }

    #[test]
    fn the_origin_cookie_never_reaches_the_app() {
        assert_eq!(without_our_cookie("commons_app=s3cret"), None);
        assert_eq!(
            without_our_cookie("_xsrf=1; commons_app=s3cret; theme=dark").as_deref(),
            Some("_xsrf=1; theme=dark")
        );
        assert_eq!(
            without_our_cookie("commons_app_x=1").as_deref(),
            Some("commons_app_x=1")
        );
    }
}
