//! A headless Chromium (Debian's `chromium`) driven through `chromedriver`
//! (`chromium-driver`) with fantoccini. Each `Browser` has its own chromedriver on a free
//! port and its own fresh profile; dropping it kills chromedriver and Chromium, also when
//! the test panics.
//!
//! A page the browser is sent to must answer HTML: Chromium treats any other answer to a
//! navigation (JSON, an empty body without a content type) as a download.

use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::Locator;

use crate::support::oidc_provider::free_port;

/// The flags Chromium needs headless, as root, on a machine without network access.
const CHROMIUM_ARGS: &[&str] = &[
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1280,900",
];

pub struct Browser {
    pub client: fantoccini::Client,
    /// chromedriver's base URL (for the commands fantoccini does not wrap).
    webdriver: String,
    chromedriver: Child,
    profile: tempfile::TempDir,
}

impl Browser {
    /// Starts chromedriver on a free port and a headless Chromium session with a fresh
    /// `--user-data-dir`.
    pub async fn start() -> Browser {
        Self::start_with_env(&[]).await
    }

    /// The same, with Chromium in time zone `tz` (an IANA name, `Asia/Kolkata`): the
    /// browser reads `TZ` from the environment chromedriver passes on.
    pub async fn start_in_zone(tz: &str) -> Browser {
        Self::start_with_env(&[("TZ", tz)]).await
    }

    async fn start_with_env(env: &[(&str, &str)]) -> Browser {
        let missing: Vec<&str> = [
            ("chromium", "chromium"),
            ("chromedriver", "chromium-driver"),
        ]
        .into_iter()
        .filter(|(binary, _)| !on_path(binary))
        .map(|(_, package)| package)
        .collect();
        assert!(
            missing.is_empty(),
            "browser tests need Chromium and its driver; install with: \
             apt-get install -y --no-install-recommends {}",
            missing.join(" ")
        );
        let profile = tempfile::Builder::new()
            .prefix("chromium-")
            .tempdir()
            .unwrap();
        let port = free_port();
        let log = std::fs::File::create(profile.path().join("chromedriver.log")).unwrap();
        let chromedriver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .envs(env.iter().copied())
            // Chromium inherits this process group: Drop kills both at once.
            .process_group(0)
            .spawn()
            .expect("chromedriver starts");
        let mut browser_dir = profile.path().to_path_buf();
        browser_dir.push("profile");
        let webdriver = format!("http://127.0.0.1:{port}");

        // Kill chromedriver if anything below fails.
        let mut guard = ProcessGroup(Some(chromedriver));
        let http = reqwest::Client::new();
        let started = Instant::now();
        loop {
            let ready = match http.get(format!("{webdriver}/status")).send().await {
                Ok(r) => r
                    .json::<serde_json::Value>()
                    .await
                    .map(|v| v["value"]["ready"] == true)
                    .unwrap_or(false),
                Err(_) => false,
            };
            if ready {
                break;
            }
            if let Some(status) = guard.0.as_mut().unwrap().try_wait().unwrap() {
                panic!(
                    "chromedriver exited with {status}: {}",
                    read_log(&profile.path().join("chromedriver.log"))
                );
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "chromedriver did not answer within 20 s: {}",
                read_log(&profile.path().join("chromedriver.log"))
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }

        let mut args: Vec<String> = CHROMIUM_ARGS.iter().map(|a| a.to_string()).collect();
        args.push(format!("--user-data-dir={}", browser_dir.display()));
        let mut caps = serde_json::Map::new();
        caps.insert("browserName".into(), "chrome".into());
        caps.insert(
            "goog:chromeOptions".into(),
            serde_json::json!({ "args": args }),
        );
        // Keeps the page's console messages for `console_errors`.
        caps.insert(
            "goog:loggingPrefs".into(),
            serde_json::json!({ "browser": "ALL" }),
        );
        // Both of rustls' crypto providers are compiled in here (ring from reqwest,
        // aws-lc-rs from hyper-rustls): without a process-wide choice it panics.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut builder = fantoccini::ClientBuilder::rustls().expect("rustls connector");
        let client = builder
            .capabilities(caps)
            .connect(&webdriver)
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start a Chromium session: {e}\n{}",
                    read_log(&profile.path().join("chromedriver.log"))
                )
            });
        Browser {
            client,
            webdriver,
            chromedriver: guard.0.take().unwrap(),
            profile,
        }
    }

    /// On an LLNG login page: fills `user` and `password` and submits (after confirming
    /// the "renew session" page that `prompt=login` brings); returns when the browser has
    /// left the provider (or panics with the page text and URL after 30 s, or
    /// at once when the provider rejects the credentials).
    pub async fn login_at_provider(&self, login: &str, password: &str) {
        let c = &self.client;
        // `prompt=login` with an SSO session first shows a "renew session" page.
        let started = Instant::now();
        let user = loop {
            if let Ok(e) = c.find(Locator::Css("input[name=user]")).await {
                break e;
            }
            if let Ok(renew) = c.find(Locator::Css("form#upgrd button[type=submit]")).await {
                renew.click().await.unwrap();
                tokio::time::sleep(Duration::from_millis(400)).await;
            }
            if started.elapsed() > Duration::from_secs(20) {
                panic!(
                    "no provider login form within 20 s; at {}:\n{}",
                    self.url().await,
                    self.page_text().await
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let provider = c.current_url().await.expect("current URL");
        let provider_origin = provider.origin();
        user.clear().await.unwrap();
        user.send_keys(login).await.unwrap();
        let pw = c.find(Locator::Css("input[name=password]")).await.unwrap();
        pw.clear().await.unwrap();
        pw.send_keys(password).await.unwrap();
        let form = c.form(Locator::Css("form#lform")).await.unwrap();
        form.submit_with(Locator::Css("button[type=submit]"))
            .await
            .unwrap();

        let started = Instant::now();
        loop {
            if let Ok(url) = c.current_url().await {
                if url.origin() != provider_origin {
                    return;
                }
                // The provider answered the form: a refusal shows a negative message.
                if let Ok(m) = c.find(Locator::Css(".message-negative")).await {
                    // The text is filled in by scripts; the code is in `trmsg`
                    // (5: bad credentials, see Lemonldap::NG::Portal::Main::Constants).
                    panic!(
                        "the provider refused the login of {login:?}: {:?} ({}); at {url}:\n{}",
                        m.text().await.unwrap_or_default(),
                        m.html(false).await.unwrap_or_default(),
                        self.page_text().await
                    );
                }
            }
            if started.elapsed() > Duration::from_secs(30) {
                panic!(
                    "the browser did not leave the provider within 30 s; at {}:\n{}",
                    self.url().await,
                    self.page_text().await
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The current URL, as text (for messages).
    #[allow(dead_code)]
    pub async fn url(&self) -> String {
        self.client
            .current_url()
            .await
            .map(|u| u.to_string())
            .unwrap_or_else(|e| format!("(no URL: {e})"))
    }

    /// The visible text of the current page (for messages and simple checks).
    #[allow(dead_code)]
    pub async fn page_text(&self) -> String {
        match self
            .client
            .execute(
                "return document.body ? document.body.innerText : ''",
                vec![],
            )
            .await
        {
            Ok(v) => v.as_str().unwrap_or_default().to_string(),
            Err(e) => format!("(no page text: {e})"),
        }
    }

    /// The console messages of level SEVERE (script errors, refused resources, failed
    /// loads) since the last call, through chromedriver's log endpoint.
    #[allow(dead_code)]
    pub async fn console_errors(&self) -> Vec<String> {
        let id = self
            .client
            .session_id()
            .await
            .unwrap()
            .expect("a WebDriver session");
        let r: serde_json::Value = reqwest::Client::new()
            .post(format!("{}/session/{id}/se/log", self.webdriver))
            .json(&serde_json::json!({ "type": "browser" }))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        r["value"]
            .as_array()
            .unwrap_or_else(|| panic!("no console log from chromedriver: {r}"))
            .iter()
            .filter(|e| e["level"] == "SEVERE")
            .map(|e| e["message"].as_str().unwrap_or_default().to_string())
            .collect()
    }

    /// Ends the WebDriver session (Chromium quits), then stops chromedriver.
    pub async fn close(self) {
        let _ = tokio::time::timeout(Duration::from_secs(10), self.client.clone().close()).await;
        // Drop kills chromedriver and whatever is left of Chromium.
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        kill_group(&mut self.chromedriver);
        let _ = &self.profile;
    }
}

/// Kills a child that leads its own process group, with the whole group.
struct ProcessGroup(Option<Child>);

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        if let Some(child) = self.0.as_mut() {
            kill_group(child);
        }
    }
}

fn kill_group(child: &mut Child) {
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{}", child.id())])
        .stderr(Stdio::null())
        .status();
    let _ = child.wait();
}

fn on_path(binary: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(binary).is_file()))
        .unwrap_or(false)
}

fn read_log(path: &std::path::Path) -> String {
    String::from_utf8_lossy(&std::fs::read(path).unwrap_or_default()).into_owned()
}
