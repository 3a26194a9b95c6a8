//! What keeps the CLI's browser sign-in from being abused, over HTTP on both backends: no
//! link approves (the code is typed), the page says who asks (named by the portal), from
//! where and when; polls too fast are slowed down; starts are limited per address (behind
//! a trusted proxy, per forwarded address); and its tokens last 30 days and add SSH keys
//! or tokens only when the user ticked it, over the API and on the pages.

use crate::support::harness::{Backend, TestPortal, BACKENDS};
use crate::support::session::BrowserSession;
use serde_json::{json, Value};

/// `POST /api/v1/cli/device` as the CLI sends it, with more headers (a proxy's).
async fn start_raw(p: &TestPortal, body: Value, headers: &[(&str, &str)]) -> reqwest::Response {
    let mut r = p
        .http
        .post(format!("{}/api/v1/cli/device", p.url))
        .json(&body);
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    r.send().await.unwrap()
}

async fn started(p: &TestPortal, headers: &[(&str, &str)]) -> Value {
    let r = start_raw(p, json!({"client_name": "laptop"}), headers).await;
    assert_eq!(r.status(), 200);
    r.json().await.unwrap()
}

/// One poll of the token endpoint: (status, body).
async fn poll(p: &TestPortal, device_code: &str) -> (u16, Value) {
    let r = p
        .http
        .post(format!("{}/api/v1/cli/token", p.url))
        .json(&json!({ "device_code": device_code }))
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

/// The user types `code` into the form of `/cli/device`: (status, the page that answers).
pub async fn type_code(b: &BrowserSession, code: &str) -> (u16, String) {
    let r = b
        .post_form("/cli/device/check", &[("user_code", code)])
        .await;
    (r.status().as_u16(), r.text().await.unwrap())
}

/// The value of the attribute `attr` of the element with id `id`.
fn attr_of(page: &str, id: &str, attr: &str) -> String {
    let at = page
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no #{id}: {page}"));
    let tag_start = page[..at].rfind('<').unwrap();
    let tag = &page[tag_start..at + page[at..].find('>').unwrap()];
    let from = tag
        .find(&format!("{attr}=\""))
        .unwrap_or_else(|| panic!("#{id} has no {attr}: {tag}"))
        + attr.len()
        + 2;
    tag[from..].split('"').next().unwrap().to_string()
}

/// The text of the element with id `id`.
fn text_of(page: &str, id: &str) -> String {
    let at = page
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no #{id}: {page}"));
    let rest = &page[at..];
    let from = rest.find('>').unwrap() + 1;
    rest[from..].split('<').next().unwrap().trim().to_string()
}

per_backend! {
    async fn a_link_cannot_approve_and_the_page_says_where_the_request_came_from(backend: Backend) {
        let p = TestPortal::start(backend).await;
        // Someone starts a sign-in with a name meant to look official, and a forged
        // X-Forwarded-For (the portal has no trusted proxy: it is ignored).
        let r = start_raw(
            &p,
            json!({"client_name": "IT Security - approve to keep your account"}),
            &[("x-forwarded-for", "203.0.113.9")],
        )
        .await;
        assert_eq!(r.status(), 200);
        let s: Value = r.json().await.unwrap();
        assert!(
            s.get("verification_uri_complete").is_none(),
            "no link carries the code: {s}"
        );
        let code = s["user_code"].as_str().unwrap().to_string();
        let b = BrowserSession::login(&p, "alice").await;
        // A link with the code fills nothing in and offers no approval.
        let page = b
            .get(format!("{}/cli/device?code={code}", p.url))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(
            !page.contains("cli-approve") && !page.contains(&code),
            "[{backend:?}] a link with the code must not lead to an approval: {page}"
        );
        assert!(page.contains("id=\"code\""), "a field to type it: {page}");
        // Typed, the code shows the request: who asks (named by the portal), from where,
        // when.
        let (status, page) = type_code(&b, &code.to_lowercase()).await;
        assert_eq!(status, 200, "{page}");
        assert_eq!(
            text_of(&page, "cli-client"),
            "the commons command-line client"
        );
        assert!(
            !page.contains("IT Security"),
            "a name the request gives itself is not shown as who asks: {page}"
        );
        assert_eq!(text_of(&page, "cli-from"), "127.0.0.1", "{page}");
        let when = attr_of(&page, "cli-when", "datetime");
        let when = chrono::DateTime::parse_from_rfc3339(&when).unwrap();
        let age = chrono::Utc::now().signed_duration_since(when);
        assert!(
            age >= chrono::Duration::zero() && age < chrono::Duration::minutes(2),
            "asked just now: {when}"
        );
        assert_eq!(text_of(&page, "cli-code"), code);
        assert!(page.contains("id=\"cli-approve\""), "{page}");
        // A mistyped code: a clear refusal, nothing to approve.
        let (status, page) = type_code(&b, "BCDF-GHJK").await;
        assert_eq!(status, 400, "{page}");
        assert!(
            page.contains("no sign-in waits with the code") && !page.contains("cli-approve"),
            "{page}"
        );
        p.stop().await;
    }
}

per_backend! {
    async fn polling_too_fast_slows_down_and_starts_are_limited_per_address(backend: Backend) {
        // The default limit: 20 sign-ins per address in 10 minutes.
        let p = TestPortal::start(backend).await;
        let s = started(&p, &[]).await;
        let dc = s["device_code"].as_str().unwrap();
        let interval = s["interval"].as_i64().unwrap();
        let (status, v) = poll(&p, dc).await;
        assert_eq!(
            (status, v["error"].as_str()),
            (400, Some("authorization_pending")),
            "{v}"
        );
        // At once again: RFC 8628's slow_down, and the interval grows by 5 s each time.
        let (status, v) = poll(&p, dc).await;
        assert_eq!(
            (status, v["error"].as_str()),
            (400, Some("slow_down")),
            "{v}"
        );
        assert_eq!(v["interval"], interval + 5, "{v}");
        let (_, v) = poll(&p, dc).await;
        assert_eq!(v["error"], "slow_down");
        assert_eq!(v["interval"], interval + 10, "it keeps growing: {v}");
        // Twenty sign-ins per address (one made above); the 21st is refused ...
        for _ in 1..20 {
            started(&p, &[]).await;
        }
        let r = start_raw(&p, json!({}), &[]).await;
        assert_eq!(r.status(), 429, "[{backend:?}]");
        assert!(r.headers().contains_key("retry-after"));
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"], "too_many_sign_ins", "{v}");
        assert!(v["message"].as_str().unwrap().contains("127.0.0.1"), "{v}");
        // ... also with a forged X-Forwarded-For (no trusted proxy: the peer counts).
        let r = start_raw(&p, json!({}), &[("x-forwarded-for", "198.51.100.1")]).await;
        assert_eq!(r.status(), 429);
        p.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_trusted_proxy_the_forwarded_address_counts_and_shows() {
    // The test's client plays a reverse proxy on loopback that appends the address it
    // saw to X-Forwarded-For, after whatever the client sent.
    let p = TestPortal::builder(Backend::Sqlite)
        .config(|c| {
            c.cli_login.starts_per_address = 1;
            c.trusted_proxies = vec!["127.0.0.1".into()];
        })
        .start()
        .await;
    let xff = |v: &'static str| [("x-forwarded-for", v)];
    started(&p, &xff("198.51.100.1")).await;
    let r = start_raw(&p, json!({}), &xff("198.51.100.1")).await;
    assert_eq!(r.status(), 429, "198.51.100.1 had its one");
    // A client that forges the header gets its real address appended by the proxy.
    let r = start_raw(&p, json!({}), &xff("198.51.100.2, 198.51.100.1")).await;
    assert_eq!(r.status(), 429, "the address the proxy saw counts");
    let s = started(&p, &xff("198.51.100.2")).await;
    let b = BrowserSession::login(&p, "alice").await;
    let (_, page) = type_code(&b, s["user_code"].as_str().unwrap()).await;
    assert_eq!(text_of(&page, "cli-from"), "198.51.100.2", "{page}");
    p.stop().await;
}

/// Starts a sign-in, has `b` approve it (ticking "may add keys and tokens" or not), and
/// polls until the token comes: (token, expires_at).
async fn approved_token(
    p: &TestPortal,
    b: &BrowserSession,
    credentials: bool,
) -> (String, chrono::NaiveDateTime) {
    let s = started(p, &[]).await;
    let code = s["user_code"].as_str().unwrap();
    let (_, page) = type_code(b, code).await;
    assert!(
        page.contains("name=\"credentials\"") && !page.contains("checked"),
        "a box to tick, not ticked: {page}"
    );
    let mut form = vec![("user_code", code), ("decision", "approve")];
    if credentials {
        form.push(("credentials", "on"));
    }
    let r = b.post_form("/cli/device", &form).await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let (status, v) = poll(p, s["device_code"].as_str().unwrap()).await;
    assert_eq!(status, 200, "{v}");
    let until = chrono::NaiveDateTime::parse_from_str(
        v["expires_at"].as_str().unwrap(),
        "%Y-%m-%dT%H:%M:%S%.f",
    )
    .unwrap();
    (v["access_token"].as_str().unwrap().to_string(), until)
}

/// A page form at `path` sent with a bearer token (and the CSRF token its pages give):
/// refused with 403 and the reason on the page, or else the status.
async fn form_with_token(p: &TestPortal, token: &str, path: &str, fields: &[(&str, &str)]) -> u16 {
    let r = BrowserSession::with_bearer(p, token)
        .post_form(path, fields)
        .await;
    let status = r.status().as_u16();
    let page = r.text().await.unwrap();
    if status == 403 {
        assert!(
            page.contains("may not add SSH keys or access tokens"),
            "refused for the token's right, not the form: {page}"
        );
    }
    status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_sign_in_lasts_30_days_and_adds_keys_or_tokens_only_if_ticked() {
    let dir = tempfile::tempdir().unwrap();
    for backend in BACKENDS {
        let p = TestPortal::start(backend).await;
        let b = BrowserSession::login(&p, "alice").await;
        let (token, until) = approved_token(&p, &b, false).await;
        let days = (until - chrono::Utc::now().naive_utc()).num_hours() as f64 / 24.0;
        assert!(
            (29.9..=30.0).contains(&days),
            "[{backend:?}] valid 30 days: {days}"
        );
        let (public, _) =
            crate::ssh_keys::keygen(dir.path(), &format!("k{backend:?}"), &["-t", "ed25519"]);
        let add_key = |token: String| {
            let (url, public) = (p.url.clone(), public.clone());
            async move {
                let r = reqwest::Client::new()
                    .post(format!("{url}/api/v1/ssh-keys"))
                    .bearer_auth(token)
                    .json(&json!({ "public_key": public }))
                    .send()
                    .await
                    .unwrap();
                (r.status().as_u16(), r.json::<Value>().await.unwrap())
            }
        };
        let (status, v) = add_key(token.clone()).await;
        assert_eq!(status, 403, "[{backend:?}] {v}");
        assert!(
            v["message"].as_str().unwrap().contains("SSH keys")
                && v["message"].as_str().unwrap().contains("commons login"),
            "{v}"
        );
        // It works for everything else.
        let r = p
            .http
            .get(format!("{}/api/v1/me", p.url))
            .bearer_auth(&token)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        // Not through the pages either: a key, a new token, or approving another
        // sign-in that would have the right.
        let key_line = public.trim();
        assert_eq!(
            form_with_token(&p, &token, "/ssh-keys", &[("public_key", key_line)]).await,
            403
        );
        assert_eq!(
            form_with_token(&p, &token, "/tokens", &[("name", "more")]).await,
            403
        );
        let s = started(&p, &[]).await;
        let code = s["user_code"].as_str().unwrap();
        assert_eq!(
            form_with_token(
                &p,
                &token,
                "/cli/device",
                &[
                    ("user_code", code),
                    ("decision", "approve"),
                    ("credentials", "on")
                ]
            )
            .await,
            403
        );
        let alices_keys: Vec<Value> = p
            .http
            .get(format!("{}/api/v1/ssh-keys", p.url))
            .bearer_auth(&p.alice)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert!(alices_keys.is_empty(), "nothing was added: {alices_keys:?}");
        // Ticked: this one may.
        let (token, _) = approved_token(&p, &b, true).await;
        let (status, v) = add_key(token).await;
        assert_eq!(status, 201, "[{backend:?}] {v}");
        p.stop().await;
    }
}
