//! Campus SSO against a real OpenID Connect provider (LemonLDAP::NG from Debian), driven
//! by headless Chromium and, for the refusals, by hand over HTTP.

use crate::support::browser::Browser;
use crate::support::harness::{Backend, TestPortal};
use crate::support::oidc_provider::{free_port, OidcProvider, TestUser};
use crate::support::session::BrowserSession;
use commons_portal::config::Secret;
use commons_portal::db::models::Role;
use commons_portal::identity::GroupRules;
use fantoccini::Locator;
use std::time::Duration;

fn person(login: &str, groups: &[&str]) -> TestUser {
    TestUser {
        login: login.into(),
        password: format!("{login}-pw"),
        name: format!("{} Example", login.to_uppercase()),
        mail: format!("{login}@campus.test"),
        groups: groups.iter().map(|g| g.to_string()).collect(),
    }
}

/// A provider with dana (lab-vision) and erin (lab-vision-admins, gpu-operators), and
/// a portal that trusts it.
pub(crate) async fn sso(backend: Backend, other_issuer_name: bool) -> (TestPortal, OidcProvider) {
    let (pport, wport) = (free_port(), free_port());
    let portal_url = format!("http://127.0.0.1:{wport}");
    let provider = OidcProvider::start(
        pport,
        &[format!("{portal_url}/auth/callback")],
        &[format!("{portal_url}/login")],
        &[
            person("dana", &["lab-vision"]),
            person("erin", &["lab-vision-admins", "gpu-operators"]),
        ],
    )
    .await;
    let issuer = if other_issuer_name {
        provider.issuer.replace("127.0.0.1", "localhost")
    } else {
        provider.issuer.clone()
    };
    let (issuer, id, secret) = (
        issuer,
        provider.client_id.clone(),
        provider.client_secret.clone(),
    );
    let p = TestPortal::builder(backend)
        .config(move |c| {
            c.listen = format!("127.0.0.1:{wport}");
            c.public_url = Some(portal_url);
            c.insecure_dev_login = false;
            c.oidc.issuer = Some(issuer);
            c.oidc.client_id = Some(id);
            c.oidc.client_secret = Some(Secret(secret));
            c.oidc.groups = GroupRules {
                lab_group_prefix: Some("lab-".into()),
                lab_admin_suffix: Some("-admins".into()),
                operator_group: Some("gpu-operators".into()),
                group_rules: vec![],
            };
        })
        .start()
        .await;
    (p, provider)
}

fn labs_of(p: &TestPortal, username: &str) -> Vec<(String, Role)> {
    let db = p.portal.state.db.clone();
    let name = username.to_string();
    db.run_blocking(|c| {
        let u = commons_portal::db::users::user_by_name(c, &name)?.expect("the user exists");
        commons_portal::db::users::labs_of(c, u.id)
    })
    .unwrap()
    .into_iter()
    .map(|(l, r)| (l.slug, r))
    .collect()
}

async fn wait_url(b: &Browser, suffix: &str) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let url = b.client.current_url().await.unwrap().to_string();
        if url.ends_with(suffix) {
            return url;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the browser is at {url}, not at …{suffix}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn browser_login(p: &TestPortal, b: &Browser, login: &str) {
    b.client.goto(&format!("{}/login", p.url)).await.unwrap();
    b.client
        .find(Locator::Id("sso-login"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    b.login_at_provider(login, &format!("{login}-pw")).await;
    wait_url(b, "/").await;
}

per_backend! {
    async fn sso_login_creates_users_and_memberships_from_groups(backend: Backend) {
        let (p, provider) = sso(backend, false).await;
        let b = Browser::start().await;

        // First login: the user and the membership come from the groups claim.
        browser_login(&p, &b, "dana").await;
        let page = b.client.source().await.unwrap();
        assert!(
            page.contains("dana") && page.contains("Campus overview"),
            "[{backend:?}]"
        );
        assert!(!page.contains("INSECURE"), "no dev-login banner with SSO");
        assert_eq!(
            labs_of(&p, "dana"),
            vec![("vision".to_string(), Role::Member)]
        );
        // Dana is no admin: the lab's console is closed to her.
        b.client
            .goto(&format!("{}/labs/vision/admin", p.url))
            .await
            .unwrap();
        assert!(
            b.client.source().await.unwrap().contains("403"),
            "[{backend:?}] members get 403"
        );

        // A membership granted by hand survives logins; rule-granted ones follow the groups.
        {
            let db = p.portal.state.db.clone();
            db.run_blocking(|c| {
                let u = commons_portal::db::users::user_by_name(c, "dana")?.unwrap();
                let physics = commons_portal::db::users::lab_by_slug(c, "physics")?;
                commons_portal::db::users::set_membership(c, u.id, physics.id, Role::Member)
            })
            .unwrap();
        }
        provider.set_groups("dana", &["lab-nlp"]);

        // Logout ends the portal session (and the provider's).
        b.client.goto(&format!("{}/jobs", p.url)).await.unwrap();
        b.client
            .find(Locator::Css("form[action='/logout'] button"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        b.client.goto(&format!("{}/jobs", p.url)).await.unwrap();
        wait_url(&b, "/login").await;

        // Second login: memberships updated from the new groups.
        browser_login(&p, &b, "dana").await;
        let mut labs = labs_of(&p, "dana");
        labs.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            labs,
            vec![
                ("nlp".to_string(), Role::Member),
                ("physics".to_string(), Role::Member)
            ],
            "[{backend:?}] vision gone with its group, nlp new, the manual physics kept"
        );

        // An admin by group reaches the console and the audit log; her edit is audited.
        let erin = Browser::start().await;
        browser_login(&p, &erin, "erin").await;
        erin.client
            .goto(&format!("{}/labs/vision/admin", p.url))
            .await
            .unwrap();
        let quota = erin
            .client
            .find(Locator::Css(
                "form[action='/labs/vision/quota'] input[name='max_gpus']",
            ))
            .await
            .unwrap();
        quota.send_keys("6").await.unwrap();
        erin.client
            .find(Locator::Css("form[action='/labs/vision/quota'] button"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        // The form posts and comes back to the same page: poll the log for the entry.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        loop {
            erin.client.goto(&format!("{}/audit", p.url)).await.unwrap();
            let audit = erin.client.source().await.unwrap();
            if audit.contains("set_lab_quota") && audit.contains("erin") {
                assert!(
                    audit.contains("max_gpus&#34;:6") || audit.contains("max_gpus\":6"),
                    "[{backend:?}] after value: {audit}"
                );
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "[{backend:?}] the audit log shows no quota edit: {audit}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        erin.close().await;
        b.close().await;
        p.stop().await;
    }
}

/// Hidden inputs and the action of the first form of a page.
fn form_of(html: &str) -> (String, Vec<(String, String)>) {
    let attr = |tag: &str, name: &str| -> Option<String> {
        let key = format!("{name}=\"");
        let at = tag.find(&key)? + key.len();
        Some(tag[at..].split('"').next()?.replace("&amp;", "&"))
    };
    let form_at = html.find("<form").expect("a login form");
    let form_tag = &html[form_at..html[form_at..].find('>').unwrap() + form_at];
    let action = attr(form_tag, "action").unwrap_or_default();
    let mut fields = Vec::new();
    let mut rest = &html[form_at..];
    while let Some(i) = rest.find("<input") {
        let tag = &rest[i..i + rest[i..].find('>').unwrap()];
        if tag.contains("type=\"hidden\"") {
            if let Some(n) = attr(tag, "name") {
                fields.push((n, attr(tag, "value").unwrap_or_default()));
            }
        }
        rest = &rest[i + 6..];
    }
    (action, fields)
}

/// Logs in at the provider over plain HTTP; returns the callback URL it redirects to.
async fn provider_login(client: &reqwest::Client, portal: &str, login: &str) -> String {
    let r = client
        .get(format!("{portal}/auth/login"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    let authorize = r.headers()["location"].to_str().unwrap().to_string();
    let page = client
        .get(&authorize)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let (action, mut fields) = form_of(&page);
    let target = if action.is_empty() || action == "#" {
        authorize.clone()
    } else if action.starts_with("http") {
        action
    } else {
        let base = url::Url::parse(&authorize).unwrap();
        base.join(&action).unwrap().to_string()
    };
    fields.push(("user".into(), login.into()));
    fields.push(("password".into(), format!("{login}-pw")));
    let mut r = client.post(&target).form(&fields).send().await.unwrap();
    for _ in 0..5 {
        let Some(loc) = r
            .headers()
            .get("location")
            .map(|l| l.to_str().unwrap().to_string())
        else {
            break;
        };
        if loc.starts_with(portal) {
            return loc;
        }
        r = client.get(&loc).send().await.unwrap();
    }
    panic!(
        "the provider did not send the browser back: {} {}",
        r.status(),
        r.text().await.unwrap_or_default()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_missing_and_replayed_logins_are_refused() {
    let (p, _provider) = sso(Backend::Sqlite, false).await;
    let c = BrowserSession::anonymous(&p);
    let callback = provider_login(&c, &p.url, "dana").await;

    // A forged state (the real code, someone else's state): refused, no session.
    let forged = url::Url::parse(&callback).unwrap();
    let code: String = forged
        .query_pairs()
        .find(|(k, _)| k == "code")
        .unwrap()
        .1
        .into_owned();
    let attacker = BrowserSession::anonymous(&p);
    attacker
        .get(format!("{}/auth/login", p.url))
        .send()
        .await
        .unwrap();
    let r = attacker
        .get(format!("{}/auth/callback?code={code}&state=forged", p.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert!(r.text().await.unwrap().contains("Login refused"));
    assert_eq!(
        attacker
            .get(format!("{}/jobs", p.url))
            .send()
            .await
            .unwrap()
            .status(),
        303,
        "no session"
    );

    // Missing state, missing code, an error from the provider: refused.
    for q in [
        "code=abc",
        "state=abc",
        "error=access_denied&error_description=denied",
    ] {
        let r = c
            .get(format!("{}/auth/callback?{q}", p.url))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401, "{q}");
    }

    // The real callback works once ...
    let fresh = BrowserSession::anonymous(&p);
    let callback = provider_login(&fresh, &p.url, "dana").await;
    let r = fresh.get(&callback).send().await.unwrap();
    assert_eq!(r.status(), 303, "{}", r.text().await.unwrap());
    assert_eq!(
        fresh
            .get(format!("{}/jobs", p.url))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    // ... and a replay is refused: in the same browser (the login is spent) ...
    let r = fresh.get(&callback).send().await.unwrap();
    assert_eq!(r.status(), 401);
    // ... and in another that started its own login (state differs; the code is spent).
    let other = BrowserSession::anonymous(&p);
    other
        .get(format!("{}/auth/login", p.url))
        .send()
        .await
        .unwrap();
    let r = other.get(&callback).send().await.unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(
        other
            .get(format!("{}/jobs", p.url))
            .send()
            .await
            .unwrap()
            .status(),
        303
    );

    // A POST without the CSRF token changes nothing.
    let r = fresh
        .post_form_without_token("/logout", &[("x", "1")])
        .await;
    assert_eq!(r.status(), 403);
    assert_eq!(
        fresh
            .get(format!("{}/jobs", p.url))
            .send()
            .await
            .unwrap()
            .status(),
        200,
        "still logged in"
    );
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_that_is_not_the_configured_issuer_is_refused() {
    // The same server under another name: its discovery names a different issuer.
    let (p, _provider) = sso(Backend::Sqlite, true).await;
    let r = BrowserSession::anonymous(&p).fetch("/auth/login").await;
    assert_eq!(r.status(), 503);
    assert!(r.text().await.unwrap().contains("campus login service"));
    p.stop().await;
}
