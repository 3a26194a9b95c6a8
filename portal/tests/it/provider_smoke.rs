//! Proves the test infrastructure without the portal's OIDC code: LemonLDAP::NG answers
//! discovery, an authorization-code flow with PKCE done by hand, and Chromium logging in
//! at the provider.

use std::time::Duration;

use serde_json::Value;
use sha2::Digest;

use crate::support::browser::Browser;
use crate::support::oidc_provider::{free_port, OidcProvider, TestUser};

fn alice() -> TestUser {
    TestUser {
        login: "alice".into(),
        password: "wonderland".into(),
        name: "Alice Liddell".into(),
        mail: "alice@campus.test".into(),
        groups: vec!["vision".into(), "gpu-users".into()],
    }
}

/// A client without cookies, as a relying party's back channel is.
fn back_channel() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// A client with a cookie jar, as a browser is.
fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .cookie_store(true)
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_discovery() {
    let redirect = format!("http://127.0.0.1:{}/auth/callback", free_port());
    let p = OidcProvider::start(free_port(), &[redirect], &[], &[alice()]).await;
    let d: Value = http()
        .get(format!("{}/.well-known/openid-configuration", p.issuer))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(d["issuer"], p.issuer.as_str());
    assert!(!p.issuer.ends_with('/'));
    for endpoint in [
        "authorization_endpoint",
        "token_endpoint",
        "jwks_uri",
        "userinfo_endpoint",
        "end_session_endpoint",
    ] {
        let url = d[endpoint]
            .as_str()
            .unwrap_or_else(|| panic!("{endpoint}: {d}"));
        assert!(url.starts_with(&p.issuer), "{endpoint}: {url}");
    }
    let methods = d["token_endpoint_auth_methods_supported"].to_string();
    assert!(methods.contains("client_secret_basic"), "{methods}");
    assert!(methods.contains("client_secret_post"), "{methods}");
    assert!(d["code_challenge_methods_supported"]
        .to_string()
        .contains("S256"));
    let jwks: Value = http()
        .get(d["jwks_uri"].as_str().unwrap())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(jwks["keys"][0]["kty"], "RSA", "{jwks}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_code_flow_with_pkce() {
    let redirect = format!("http://127.0.0.1:{}/auth/callback", free_port());
    let user = alice();
    let p = OidcProvider::start(
        free_port(),
        std::slice::from_ref(&redirect),
        &[],
        std::slice::from_ref(&user),
    )
    .await;

    // A login, and a token request with the right verifier.
    let flow = Flow::new(&p, &redirect);
    let code = flow.login(&user.login, &user.password).await;
    let tokens = flow.exchange(&code, &flow.verifier, Auth::Basic).await;
    let claims = jwt_payload(tokens["id_token"].as_str().unwrap());
    assert_eq!(claims["iss"], p.issuer.as_str(), "{claims}");
    assert!(claims["aud"].to_string().contains(&p.client_id), "{claims}");
    assert_eq!(claims["nonce"], flow.nonce.as_str(), "{claims}");
    assert_eq!(claims["sub"], "alice", "{claims}");
    assert_eq!(claims["preferred_username"], "alice", "{claims}");
    assert_eq!(claims["email"], "alice@campus.test", "{claims}");
    assert_eq!(claims["name"], "Alice Liddell", "{claims}");
    assert_eq!(
        claims["groups"],
        serde_json::json!(["vision", "gpu-users"]),
        "{claims}"
    );
    // The userinfo endpoint answers the same claims.
    let info: Value = back_channel()
        .get(format!("{}/oauth2/userinfo", p.issuer))
        .bearer_auth(tokens["access_token"].as_str().unwrap())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(info["groups"], claims["groups"], "{info}");
    assert_eq!(info["email"], claims["email"], "{info}");

    // A wrong verifier is refused.
    let flow = Flow::new(&p, &redirect);
    let code = flow.login(&user.login, &user.password).await;
    let (status, body) = flow
        .try_exchange(
            &code,
            "wrong-verifier-wrong-verifier-wrong-verifier",
            Auth::Post,
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"], "invalid_grant", "{body}");

    // New groups are seen by the next login (client_secret_post this time).
    p.set_groups("alice", &["physics"]);
    let flow = Flow::new(&p, &redirect);
    let code = flow.login(&user.login, &user.password).await;
    let tokens = flow.exchange(&code, &flow.verifier, Auth::Post).await;
    let claims = jwt_payload(tokens["id_token"].as_str().unwrap());
    assert_eq!(claims["groups"], serde_json::json!(["physics"]), "{claims}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_browser_login() {
    let site = HtmlSite::start().await;
    let redirect = format!("{}/auth/callback", site.url);
    let after_logout = format!("{}/bye", site.url);
    let user = alice();
    let p = OidcProvider::start(
        free_port(),
        std::slice::from_ref(&redirect),
        std::slice::from_ref(&after_logout),
        std::slice::from_ref(&user),
    )
    .await;
    let browser = Browser::start().await;
    let flow = Flow::new(&p, &redirect);
    browser.client.goto(&flow.authorize_url()).await.unwrap();
    browser.login_at_provider(&user.login, &user.password).await;
    let url = browser.client.current_url().await.unwrap();
    assert!(url.as_str().starts_with(&redirect), "{url}\n{}", p.log());
    let param = |k: &str| {
        url.query_pairs()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.into_owned())
    };
    assert_eq!(
        param("state").as_deref(),
        Some(flow.state.as_str()),
        "{url}"
    );
    // The code the browser brought back is good.
    flow.exchange(&code_in(&url), &flow.verifier, Auth::Basic)
        .await;

    // The browser keeps an SSO session at the provider: a new authorization request
    // comes straight back with a code, without the login form.
    let again = Flow::new(&p, &redirect);
    browser.client.goto(&again.authorize_url()).await.unwrap();
    let url = browser.client.current_url().await.unwrap();
    assert!(
        url.as_str().starts_with(&redirect),
        "no SSO: {url}\n{}",
        p.log()
    );
    assert!(
        url.as_str().contains(&format!("state={}", again.state)),
        "{url}"
    );
    let tokens = again
        .exchange(&code_in(&url), &again.verifier, Auth::Basic)
        .await;
    let id_token = tokens["id_token"].as_str().unwrap().to_string();

    // RP-initiated logout: straight back to the registered URI with the state.
    let logout = url::Url::parse_with_params(
        &format!("{}/oauth2/logout", p.issuer),
        &[
            ("id_token_hint", id_token.as_str()),
            ("post_logout_redirect_uri", after_logout.as_str()),
            ("state", "bye-state"),
        ],
    )
    .unwrap();
    browser.client.goto(logout.as_str()).await.unwrap();
    let url = browser.client.current_url().await.unwrap();
    assert_eq!(
        url.as_str(),
        format!("{after_logout}?state=bye-state"),
        "{}",
        p.log()
    );
    // Logged out at the provider: a new authorization asks for the password again, and
    // that login sees the new groups.
    p.set_groups("alice", &["physics"]);
    let flow = Flow::new(&p, &redirect);
    browser.client.goto(&flow.authorize_url()).await.unwrap();
    browser.login_at_provider(&user.login, &user.password).await;
    let url = browser.client.current_url().await.unwrap();
    assert!(url.as_str().starts_with(&redirect), "{url}");
    let tokens = flow
        .exchange(&code_in(&url), &flow.verifier, Auth::Basic)
        .await;
    let claims = jwt_payload(tokens["id_token"].as_str().unwrap());
    assert_eq!(claims["groups"], serde_json::json!(["physics"]), "{claims}");
    browser.close().await;
}

/// The `code` parameter of a URL the provider redirected to.
fn code_in(url: &url::Url) -> String {
    url.query_pairs()
        .find(|(n, _)| n == "code")
        .map(|(_, v)| v.into_owned())
        .unwrap_or_else(|| panic!("no code in {url}"))
}

enum Auth {
    Basic,
    Post,
}

/// One authorization request with PKCE, state and nonce, done by hand.
struct Flow<'a> {
    p: &'a OidcProvider,
    redirect: String,
    verifier: String,
    state: String,
    nonce: String,
    http: reqwest::Client,
}

impl<'a> Flow<'a> {
    fn new(p: &'a OidcProvider, redirect: &str) -> Flow<'a> {
        let r = || {
            format!(
                "{:016x}{:016x}",
                rand::random::<u64>(),
                rand::random::<u64>()
            )
        };
        Flow {
            p,
            redirect: redirect.to_string(),
            verifier: format!("{}{}", r(), r()),
            state: r(),
            nonce: r(),
            http: http(),
        }
    }

    fn authorize_url(&self) -> String {
        let challenge = base64url(&sha2::Sha256::digest(self.verifier.as_bytes()));
        url::Url::parse_with_params(
            &format!("{}/oauth2/authorize", self.p.issuer),
            &[
                ("response_type", "code"),
                ("client_id", self.p.client_id.as_str()),
                ("redirect_uri", self.redirect.as_str()),
                ("scope", "openid profile email"),
                ("state", self.state.as_str()),
                ("nonce", self.nonce.as_str()),
                ("code_challenge", challenge.as_str()),
                ("code_challenge_method", "S256"),
            ],
        )
        .unwrap()
        .to_string()
    }

    /// GET authorize → the login form → POST the credentials → the code.
    async fn login(&self, login: &str, password: &str) -> String {
        let url = self.authorize_url();
        let r = self.http.get(&url).send().await.unwrap();
        assert_eq!(r.status(), 200, "{}", self.p.log());
        let page = r.text().await.unwrap();
        let mut form: Vec<(String, String)> = vec![
            ("user".into(), login.into()),
            ("password".into(), password.into()),
        ];
        for name in ["url", "token", "skin"] {
            if let Some(v) = hidden_input(&page, name) {
                form.push((name.into(), v));
            }
        }
        assert!(
            form.iter().any(|(n, _)| n == "token"),
            "no hidden token field in the login form:\n{page}"
        );
        let r = self.http.post(&url).form(&form).send().await.unwrap();
        assert_eq!(r.status(), 302, "login: {}\n{}", r.status(), self.p.log());
        let location = r.headers()["location"].to_str().unwrap().to_string();
        assert!(location.starts_with(&self.redirect), "{location}");
        let to = url::Url::parse(&location).unwrap();
        let param = |k: &str| {
            to.query_pairs()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.into_owned())
        };
        assert_eq!(
            param("state").as_deref(),
            Some(self.state.as_str()),
            "{location}"
        );
        param("code").unwrap_or_else(|| panic!("no code in {location}"))
    }

    async fn try_exchange(&self, code: &str, verifier: &str, auth: Auth) -> (u16, Value) {
        let mut form = vec![
            ("grant_type", "authorization_code"),
            ("code", code),
            ("redirect_uri", self.redirect.as_str()),
            ("code_verifier", verifier),
        ];
        // The back channel has no cookies: LLNG refuses a token request that carries its
        // session cookie ("not supposed to be called by authenticated users").
        let mut req = back_channel().post(format!("{}/oauth2/token", self.p.issuer));
        match auth {
            Auth::Basic => req = req.basic_auth(&self.p.client_id, Some(&self.p.client_secret)),
            Auth::Post => {
                form.push(("client_id", self.p.client_id.as_str()));
                form.push(("client_secret", self.p.client_secret.as_str()));
            }
        }
        let r = req.form(&form).send().await.unwrap();
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    async fn exchange(&self, code: &str, verifier: &str, auth: Auth) -> Value {
        let (status, body) = self.try_exchange(code, verifier, auth).await;
        assert_eq!(status, 200, "token: {body}\n{}", self.p.log());
        assert!(body["access_token"].is_string(), "{body}");
        assert!(body["id_token"].is_string(), "{body}");
        body
    }
}

/// The value of `<input ... name="NAME" value="...">` in an LLNG page.
fn hidden_input(page: &str, name: &str) -> Option<String> {
    let tag_start = page.find(&format!("name=\"{name}\""))?;
    let tag = &page[page[..tag_start].rfind('<')?..];
    let tag = &tag[..tag.find('>')?];
    let v = &tag[tag.find("value=\"")? + 7..];
    Some(v[..v.find('"')?].to_string())
}

const B64URL: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

fn base64url(bytes: &[u8]) -> String {
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | (*b as u32) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            out.push(B64URL[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
    }
    out
}

fn base64url_decode(text: &str) -> Vec<u8> {
    let mut out = Vec::new();
    let (mut acc, mut bits) = (0u32, 0);
    for c in text.bytes().filter(|c| *c != b'=') {
        let v = B64URL.iter().position(|x| *x == c).expect("base64url") as u32;
        acc = acc << 6 | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits & 0xff) as u8);
        }
    }
    out
}

/// The payload of a JWT, unverified.
fn jwt_payload(jwt: &str) -> Value {
    let part = jwt.split('.').nth(1).expect("a JWT");
    serde_json::from_slice(&base64url_decode(part)).expect("JSON payload")
}

#[test]
fn base64url_round_trip() {
    for s in ["", "f", "fo", "foo", "foob", "fooba", "foobar"] {
        assert_eq!(base64url_decode(&base64url(s.as_bytes())), s.as_bytes());
    }
    assert_eq!(base64url(b"foobar"), "Zm9vYmFy");
    assert_eq!(base64url(&[0xfb, 0xff]), "-_8");
}

/// A tiny web site that answers every request with an HTML page (a redirect target for
/// the browser).
struct HtmlSite {
    url: String,
    task: tokio::task::JoinHandle<()>,
}

impl HtmlSite {
    async fn start() -> HtmlSite {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut s, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 16384];
                    let mut got = 0;
                    while let Ok(n) = s.read(&mut buf[got..]).await {
                        got += n;
                        if n == 0
                            || buf[..got].windows(4).any(|w| w == b"\r\n\r\n")
                            || got == buf.len()
                        {
                            break;
                        }
                    }
                    let body = "<!doctype html><html><head><title>site</title></head><body>ok</body></html>";
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\n\
                         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = s.write_all(answer.as_bytes()).await;
                    let _ = s.shutdown().await;
                });
            }
        });
        HtmlSite { url, task }
    }
}

impl Drop for HtmlSite {
    fn drop(&mut self) {
        self.task.abort();
    }
}
