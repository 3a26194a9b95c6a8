//! A browser's session with a portal, for tests of the pages: a cookie jar that follows
//! no redirects, the development login, and forms posted with the session's CSRF token
//! the way the pages post them, so no test copies the token by hand.
//!
//! The token is read from a page just before each post, as a browser posts the token of
//! the page it shows: the portal starts a fresh session with a fresh token at login and
//! at logout, and a session does not carry a stale one across them. Tests of the CSRF
//! check itself say what they send by the helper's name: [`BrowserSession::post_form_with_token`],
//! [`BrowserSession::post_form_without_token`], [`BrowserSession::token_of_page`] and
//! [`BrowserSession::post_json_as_page`].

use super::harness::TestPortal;
use reqwest::cookie::{CookieStore, Jar};
use std::sync::Arc;
use std::time::Duration;

/// The CSRF token of a page's forms, if the page has a form.
fn csrf_in(html: &str) -> Option<String> {
    const FIELD: &str = "name=\"csrf\" value=\"";
    let at = html.find(FIELD)? + FIELD.len();
    html[at..].split('"').next().map(str::to_string)
}

/// A browser without a session: it keeps cookies and shows redirects as they are.
pub fn browser() -> reqwest::Client {
    client(Arc::new(Jar::default()), reqwest::header::HeaderMap::new())
}

fn client(jar: Arc<Jar>, headers: reqwest::header::HeaderMap) -> reqwest::Client {
    reqwest::Client::builder()
        .cookie_provider(jar)
        .default_headers(headers)
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// A browser at one portal: its cookie jar, and what its pages let it post.
pub struct BrowserSession {
    pub http: reqwest::Client,
    pub url: String,
    jar: Arc<Jar>,
}

impl BrowserSession {
    /// `user`, signed in through the development login of `p`.
    pub async fn login(p: &TestPortal, user: &str) -> BrowserSession {
        BrowserSession::login_at(&p.url, user).await
    }

    /// The same, for the portal at `url` (a portal process, or a proxy in front of one).
    pub async fn login_at(url: &str, user: &str) -> BrowserSession {
        let s = BrowserSession::anonymous_at(url);
        let r = s.sign_in(user).await;
        assert_eq!(r.status(), 303, "the development login of {user} at {url}");
        s
    }

    /// A browser at `p` that has not signed in (nor asked for a page yet).
    pub fn anonymous(p: &TestPortal) -> BrowserSession {
        BrowserSession::anonymous_at(&p.url)
    }

    /// The same, for the portal at `url`.
    pub fn anonymous_at(url: &str) -> BrowserSession {
        BrowserSession::with_headers(url, reqwest::header::HeaderMap::new())
    }

    /// A browser that sends the access token `token` with every request, as a script
    /// holding a token might load the pages and post their forms.
    pub fn with_bearer(p: &TestPortal, token: &str) -> BrowserSession {
        let mut headers = reqwest::header::HeaderMap::new();
        let value = format!("Bearer {token}").parse().unwrap();
        headers.insert(reqwest::header::AUTHORIZATION, value);
        BrowserSession::with_headers(&p.url, headers)
    }

    /// Another browser that holds `cookie` (as [`BrowserSession::cookie`] gave it),
    /// copied from a session as a thief would copy it.
    pub fn with_copied_cookie(p: &TestPortal, cookie: &str) -> BrowserSession {
        let s = BrowserSession::anonymous(p);
        let at = s.base();
        for one in cookie.split("; ") {
            s.jar.add_cookie_str(one, &at);
        }
        s
    }

    fn with_headers(url: &str, headers: reqwest::header::HeaderMap) -> BrowserSession {
        let jar = Arc::new(Jar::default());
        BrowserSession {
            http: client(jar.clone(), headers),
            url: url.trim_end_matches('/').to_string(),
            jar,
        }
    }

    fn base(&self) -> reqwest::Url {
        reqwest::Url::parse(&self.url).unwrap()
    }

    /// Fills in the development login form as `user`: the portal's answer (303 when
    /// signed in). The session starts afresh, with a new cookie and token.
    pub async fn sign_in(&self, user: &str) -> reqwest::Response {
        self.post_form("/login", &[("username", user)]).await
    }

    /// The session cookie as the browser sends it now (`commons_session=...`), to copy.
    pub fn cookie(&self) -> String {
        let value = self
            .jar
            .cookies(&self.base())
            .expect("the browser holds a cookie");
        value.to_str().unwrap().to_string()
    }

    /// GET `path`, as the browser.
    pub async fn fetch(&self, path: &str) -> reqwest::Response {
        self.http
            .get(format!("{}{path}", self.url))
            .send()
            .await
            .unwrap()
    }

    /// The HTML of page `path`, which must answer 200.
    pub async fn page(&self, path: &str) -> String {
        let r = self.fetch(path).await;
        assert_eq!(r.status(), 200, "GET {path}");
        r.text().await.unwrap()
    }

    /// The CSRF token that page `path` carries in its forms (200 or not). For tests of
    /// the check itself; a form is posted with [`BrowserSession::post_form`].
    pub async fn token_of_page(&self, path: &str) -> String {
        let html = self.fetch(path).await.text().await.unwrap();
        csrf_in(&html).unwrap_or_else(|| panic!("no CSRF field on {path}: {html}"))
    }

    /// The session's token as its pages show it now: on the login page (which every
    /// session may see, signed in or not) or, where the development login is off, on
    /// the tokens page of a signed-in session.
    async fn token(&self) -> String {
        for path in ["/login", "/tokens"] {
            let r = self.fetch(path).await;
            if r.status() == 200 {
                if let Some(t) = csrf_in(&r.text().await.unwrap()) {
                    return t;
                }
            }
        }
        panic!(
            "neither /login nor /tokens of {} shows a CSRF token",
            self.url
        )
    }

    /// Posts the form `fields` to `path` as its page does, with the session's token.
    pub async fn post_form(&self, path: &str, fields: &[(&str, &str)]) -> reqwest::Response {
        let token = self.token().await;
        self.post_form_with_token(path, &token, fields).await
    }

    /// Posts the form `fields` with `token` in its CSRF field, whatever the session's
    /// own token is: a wrong, empty or stale one, or another session's.
    pub async fn post_form_with_token(
        &self,
        path: &str,
        token: &str,
        fields: &[(&str, &str)],
    ) -> reqwest::Response {
        let mut all = vec![("csrf", token)];
        all.extend_from_slice(fields);
        self.send_form(path, &all).await
    }

    /// Posts the form `fields` with no CSRF field at all, as another site's form would.
    pub async fn post_form_without_token(
        &self,
        path: &str,
        fields: &[(&str, &str)],
    ) -> reqwest::Response {
        self.send_form(path, fields).await
    }

    async fn send_form(&self, path: &str, fields: &[(&str, &str)]) -> reqwest::Response {
        self.http
            .post(format!("{}{path}", self.url))
            .form(fields)
            .send()
            .await
            .unwrap()
    }

    /// Posts `body` as JSON to the API at `path` as the portal's own page scripts do:
    /// the session's cookie with its token in the `X-CSRF-Token` header.
    pub async fn post_json_as_page(
        &self,
        path: &str,
        body: &serde_json::Value,
    ) -> reqwest::Response {
        let token = self.token().await;
        self.http
            .post(format!("{}{path}", self.url))
            .header("x-csrf-token", token)
            .json(body)
            .send()
            .await
            .unwrap()
    }
}

/// The browser itself, for requests the helpers do not cover (a JSON body with the
/// cookie alone, a header of its own).
impl std::ops::Deref for BrowserSession {
    type Target = reqwest::Client;
    fn deref(&self) -> &reqwest::Client {
        &self.http
    }
}
