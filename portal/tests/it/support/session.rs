//! A browser's session with a portal, for tests of the pages: a cookie jar that follows
//! no redirects, the development login, and forms posted with the session's CSRF token
//! the way the pages post them, so no test copies the token by hand.

use super::harness::TestPortal;

/// The CSRF token of a page's forms.
pub fn hidden_csrf(html: &str) -> String {
    let at =
        html.find("name=\"csrf\" value=\"").expect("a CSRF field") + "name=\"csrf\" value=\"".len();
    html[at..].split('"').next().unwrap().to_string()
}

/// A browser without a session: it keeps cookies and shows redirects as they are.
pub fn browser() -> reqwest::Client {
    reqwest::Client::builder()
        .cookie_store(true)
        .redirect(reqwest::redirect::Policy::none())
        .timeout(std::time::Duration::from_secs(30))
        .build()
        .unwrap()
}

/// A browser signed in as `user` through the development login of `p`.
pub async fn logged_in(p: &TestPortal, user: &str) -> reqwest::Client {
    logged_in_at(&p.url, user).await
}

/// The same, for the portal at `url` (a portal process, say).
pub async fn logged_in_at(url: &str, user: &str) -> reqwest::Client {
    let b = browser();
    let login = b
        .get(format!("{url}/login"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let csrf = hidden_csrf(&login);
    let r = b
        .post(format!("{url}/login"))
        .form(&[("username", user), ("csrf", &csrf)])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    b
}

/// A signed-in browser and the CSRF token of its session.
pub struct BrowserSession {
    pub http: reqwest::Client,
    pub url: String,
    csrf: String,
}

impl BrowserSession {
    /// `user`, signed in through the development login of `p`.
    pub async fn login(p: &TestPortal, user: &str) -> BrowserSession {
        BrowserSession::login_at(&p.url, user).await
    }

    /// The same, for the portal at `url`.
    pub async fn login_at(url: &str, user: &str) -> BrowserSession {
        let http = logged_in_at(url, user).await;
        let mut s = BrowserSession {
            http,
            url: url.to_string(),
            csrf: String::new(),
        };
        let home = s.page("/tokens").await;
        s.csrf = hidden_csrf(&home);
        s
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

    /// Posts the form `fields` to `path` with the session's CSRF token.
    pub async fn post_form(&self, path: &str, fields: &[(&str, &str)]) -> reqwest::Response {
        let mut all: Vec<(&str, &str)> = fields.to_vec();
        all.push(("csrf", &self.csrf));
        self.http
            .post(format!("{}{path}", self.url))
            .form(&all)
            .send()
            .await
            .unwrap()
    }
}

/// The browser itself, for requests the helpers do not cover (a form posted without the
/// token, on purpose).
impl std::ops::Deref for BrowserSession {
    type Target = reqwest::Client;
    fn deref(&self) -> &reqwest::Client {
        &self.http
    }
}
