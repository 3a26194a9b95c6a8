//! `commons login URL` through the browser (the device authorization grant): approved
//! and denied over HTTP with the development login on both backends, and through the
//! real campus SSO (LemonLDAP::NG) in headless Chromium. What keeps it from being abused
//! is in [`guards`].

#[path = "cli_login_guards.rs"]
mod guards;

use crate::cli::{refused, Cli};
use crate::support::browser::Browser;
use crate::support::harness::{Backend, TestPortal};
use crate::support::session::BrowserSession;
use fantoccini::Locator;
use guards::type_code;
use serde_json::{json, Value};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};

/// A `commons login URL` that runs on; `link` is the page it asked the user to open,
/// `code` the code it asked them to type there.
struct PendingLogin {
    child: tokio::process::Child,
    link: String,
    code: String,
}

async fn start_login(cli: &Cli, url: &str) -> PendingLogin {
    let mut child = cli
        .command(&["login", url, "--no-browser"])
        .stderr(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut said = String::new();
    let (link, code) = tokio::time::timeout(Duration::from_secs(30), async {
        let mut link = None;
        while let Some(line) = lines.next_line().await.unwrap() {
            said.push_str(&line);
            said.push('\n');
            if let Some(at) = line.find("http") {
                link = Some(line[at..].split_whitespace().next().unwrap().to_string());
            }
            if let Some((_, rest)) = line.split_once("the code ") {
                let code = rest.split_whitespace().next().unwrap().to_string();
                return (link.expect("the link comes first"), code);
            }
        }
        panic!("commons login printed no link and code: {said}")
    })
    .await
    .expect("commons login prints a link and a code within 30 s");
    // Keep reading stderr so the child never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    PendingLogin { child, link, code }
}

async fn finish(p: PendingLogin) -> i32 {
    let status = tokio::time::timeout(Duration::from_secs(30), p.child.wait_with_output())
        .await
        .expect("commons login ends after the decision")
        .unwrap();
    status.status.code().unwrap_or(-1)
}

/// Signs `user` in with the development login in a cookie-keeping HTTP client, starting
/// from `link` (which sends a visitor without a session to the login and back), types
/// `code` and decides.
async fn approve_over_http(
    p: &TestPortal,
    link: &str,
    code: &str,
    user: &str,
    decision: &str,
) -> reqwest::Response {
    let b = BrowserSession::anonymous(p);
    let r = b.get(link).send().await.unwrap();
    assert_eq!(r.status(), 303);
    assert_eq!(
        r.headers()["location"],
        "/login",
        "a visitor is sent to the login first"
    );
    let r = b.sign_in(user).await;
    assert_eq!(r.status(), 303);
    let back = r.headers()["location"].to_str().unwrap().to_string();
    assert_eq!(back, "/cli/device", "back to the approval page");
    let (status, page) = type_code(&b, code).await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains(code), "the page shows the code");
    b.post_form(
        "/cli/device",
        &[("user_code", code), ("decision", decision)],
    )
    .await
}

per_backend! {
    async fn cli_login_by_the_device_grant_approved_or_denied(backend: Backend) {
        let p = TestPortal::start(backend).await;
        let cli = Cli::new();
        let pending = start_login(&cli, &p.url).await;
        assert_eq!(pending.link, format!("{}/cli/device", p.url));
        let link = pending.link.clone();
        let code = pending.code.clone();
        let r = approve_over_http(&p, &link, &code, "alice", "approve").await;
        assert_eq!(r.status(), 200);
        assert!(r.text().await.unwrap().contains("Signed in"));
        assert_eq!(finish(pending).await, 0, "[{backend:?}]");
        let me: Value = serde_json::from_str(&cli.ok(&["whoami", "--json"]).await.stdout).unwrap();
        assert_eq!(me["username"], "alice", "[{backend:?}]");
        let stored = std::fs::read_to_string(cli.credentials()).unwrap();
        assert!(
            stored.contains("expires_at"),
            "a browser sign-in's token expires: {stored}"
        );
        // The token is on alice's Tokens page (revocable), named after the computer.
        let db = p.portal.state.db.clone();
        let names: Vec<String> = db
            .run_blocking(|c| {
                let a = commons_portal::db::users::user_by_name(c, "alice")?.unwrap();
                commons_portal::db::users::tokens_of(c, a.id)
            })
            .unwrap()
            .into_iter()
            .map(|t| t.name)
            .collect();
        assert!(
            names.iter().any(|n| n.starts_with("commons CLI on")),
            "{names:?}"
        );

        // The code is spent: approving it again is refused, and so is a replayed poll.
        let b = BrowserSession::login(&p, "bob").await;
        let (status, page) = type_code(&b, &code).await;
        assert_eq!(status, 409);
        assert!(page.contains("already approved or denied"), "{page}");
        let r = b
            .post_form("/cli/device", &[
                ("user_code", code.as_str()),
                ("decision", "approve"),
            ])
            .await;
        assert_eq!(r.status(), 409);
        let r = p
            .http
            .post(format!("{}/api/v1/cli/token", p.url))
            .json(&json!({"device_code": "gcd_0000"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400);
        assert_eq!(r.json::<Value>().await.unwrap()["error"], "invalid_grant");

        // Denied in the browser: the CLI says so in one line and stores nothing.
        let other = Cli::new();
        let pending = start_login(&other, &p.url).await;
        let (link, code) = (pending.link.clone(), pending.code.clone());
        let r = approve_over_http(&p, &link, &code, "bob", "deny").await;
        assert!(r.text().await.unwrap().contains("Denied"));
        assert_eq!(finish(pending).await, 5, "[{backend:?}] denied");
        assert!(!other.credentials().exists());

        // Unknown fields and a bad code are refused.
        let r = p
            .http
            .post(format!("{}/api/v1/cli/device", p.url))
            .json(&json!({"client": "x"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 422);
        p.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_login_through_campus_sso_in_a_browser() {
    let (p, _provider) = crate::sso::sso(Backend::Sqlite, false).await;
    let cli = Cli::new();
    let pending = start_login(&cli, &p.url).await;
    let b = Browser::start().await;
    // Not signed in to the portal: the link leads through the campus login and back.
    b.client.goto(&pending.link).await.unwrap();
    b.client
        .find(Locator::Id("sso-login"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    b.login_at_provider("dana", "dana-pw").await;
    // Back on the portal: the page asks for the code the terminal shows.
    let field = match b
        .client
        .wait()
        .at_most(Duration::from_secs(20))
        .for_element(Locator::Id("code"))
        .await
    {
        Ok(e) => e,
        Err(e) => panic!(
            "no code field ({e}) at {}: {}",
            b.url().await,
            b.page_text().await
        ),
    };
    field.send_keys(&pending.code).await.unwrap();
    b.client
        .find(Locator::Id("cli-check"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let code = match b
        .client
        .wait()
        .at_most(Duration::from_secs(20))
        .for_element(Locator::Id("cli-code"))
        .await
    {
        Ok(e) => e,
        Err(e) => panic!(
            "no approval page ({e}) at {}: {}",
            b.url().await,
            b.page_text().await
        ),
    };
    assert_eq!(code.text().await.unwrap(), pending.code);
    b.client
        .find(Locator::Id("cli-approve"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    b.client
        .wait()
        .at_most(Duration::from_secs(20))
        .for_element(Locator::Id("cli-done"))
        .await
        .unwrap();
    assert_eq!(finish(pending).await, 0);
    let me: Value = serde_json::from_str(&cli.ok(&["whoami", "--json"]).await.stdout).unwrap();
    assert_eq!(me["username"], "dana");
    assert_eq!(
        me["labs"][0]["slug"], "vision",
        "the groups claim made dana a member"
    );
    // Without SSO or a token nothing else gets in.
    refused(&Cli::new(), &["whoami"], 4, "not signed in").await;
    b.close().await;
    p.stop().await;
}
