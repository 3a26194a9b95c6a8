//! Signing in and out. `commons login URL` signs in through the browser by the device
//! authorization grant (see the portal's `service::cli_login`): it shows a page and a
//! code, the user types the code on that page in any browser (campus SSO) and approves,
//! and the portal hands this program a personal access token. `--token` takes a token made on the Tokens page
//! instead. Either way the token is checked against the portal before it is stored.

use crate::args::LoginArgs;
use crate::client::Client;
use crate::config::{self, Credentials};
use crate::error::{CliError, Result};
use commons_api::account::Account;
use commons_api::cli_login::{DeviceRequest, DeviceStart, TokenGranted, TokenRequest};
use std::io::BufRead;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub fn login(a: LoginArgs) -> Result<u8> {
    let url = config::normalise_url(&a.url)?;
    let creds = match a.token {
        Some(t) => with_token(&url, t)?,
        None => through_browser(&url, !a.no_browser)?,
    };
    let path = config::save(&creds)?;
    eprintln!(
        "signed in to {} as {}; the token is in {} (readable by you only)",
        creds.url,
        creds.username.as_deref().unwrap_or("?"),
        path.display()
    );
    Ok(0)
}

fn with_token(url: &str, token: String) -> Result<Credentials> {
    let token = if token == "-" {
        let mut line = String::new();
        std::io::stdin().lock().read_line(&mut line).map_err(|e| {
            CliError::Usage(format!("cannot read the token from standard input: {e}"))
        })?;
        line.trim().to_string()
    } else {
        token.trim().to_string()
    };
    if token.is_empty() || token.contains(char::is_whitespace) {
        return Err(CliError::Usage(
            "--token: paste the token exactly as the Tokens page showed it".into(),
        ));
    }
    let client = Client::new(url, Some(token.clone()))?;
    let me: Account = client.get("/api/v1/me")?;
    Ok(Credentials {
        url: client.url.clone(),
        token,
        username: Some(me.username),
        expires_at: None,
    })
}

/// `user@host`, as the approval page shows the computer asking.
fn client_name() -> String {
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .unwrap_or_default();
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map(|h| h.trim().to_string())
        .unwrap_or_default();
    match (user.is_empty(), host.is_empty()) {
        (false, false) => format!("{user}@{host}"),
        (true, false) => host,
        (false, true) => user,
        (true, true) => String::new(),
    }
}

/// Opens `url` in the user's browser if this looks like a desktop; never fails.
fn open_browser(url: &str) -> bool {
    let desktop = std::env::var_os("DISPLAY").is_some()
        || std::env::var_os("WAYLAND_DISPLAY").is_some()
        || cfg!(target_os = "macos");
    let program = match std::env::var("BROWSER") {
        Ok(b) if !b.is_empty() => b,
        _ if !desktop => return false,
        _ if cfg!(target_os = "macos") => "open".to_string(),
        _ => "xdg-open".to_string(),
    };
    Command::new(program)
        .arg(url)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .is_ok()
}

fn through_browser(url: &str, browser: bool) -> Result<Credentials> {
    let client = Client::new(url, None)?;
    let start: DeviceStart = client
        .post(
            "/api/v1/cli/device",
            &DeviceRequest {
                client_name: Some(client_name()),
            },
        )
        .map_err(|e| match e {
            CliError::Api { status: 404, .. } => CliError::Usage(format!(
                "{url} offers no browser sign-in; make a token on its Tokens page and run: commons login {url} --token TOKEN"
            )),
            e => e,
        })?;
    let opened = browser && open_browser(&start.verification_uri);
    eprintln!(
        "To sign in, {} {}\nand type the code {} there (it expires in {} minutes).",
        if opened { "your browser opens" } else { "open" },
        start.verification_uri,
        start.user_code,
        start.expires_in / 60
    );
    let deadline = Instant::now() + Duration::from_secs(start.expires_in.max(0) as u64);
    let mut interval = Duration::from_secs(start.interval.max(1) as u64);
    let body = TokenRequest {
        device_code: start.device_code,
    };
    loop {
        std::thread::sleep(interval);
        let (status, text) = client.post_raw("/api/v1/cli/token", &body)?;
        if status == 200 {
            let g: TokenGranted = serde_json::from_str(&text).map_err(|e| {
                CliError::Other(anyhow::anyhow!(
                    "the portal's token answer does not parse: {e}"
                ))
            })?;
            return Ok(Credentials {
                url: client.url.clone(),
                token: g.access_token,
                username: Some(g.username),
                expires_at: Some(g.expires_at.format("%Y-%m-%dT%H:%M:%S%.f").to_string()),
            });
        }
        let refusal: crate::client::ErrorBody = serde_json::from_str(&text).unwrap_or_default();
        match refusal.error.as_str() {
            "authorization_pending" if Instant::now() < deadline => continue,
            "authorization_pending" => {
                return Err(CliError::Api {
                    status,
                    code: "expired_token".into(),
                    message: "the sign-in was not approved in time; run commons login again".into(),
                })
            }
            // The portal says the interval it wants; RFC 8628's 5 s more otherwise.
            "slow_down" => {
                interval = match refusal.interval {
                    Some(s) => Duration::from_secs(s.max(1) as u64),
                    None => interval + Duration::from_secs(5),
                }
            }
            "access_denied" => {
                return Err(CliError::Forbidden(
                    "the sign-in was denied in the browser".into(),
                ))
            }
            _ => return Err(client.error_from(status, &text)),
        }
    }
}

pub fn logout() -> Result<u8> {
    if config::remove()? {
        eprintln!(
            "signed out: the stored token is deleted here (revoke it on the portal's Tokens page to end it everywhere)"
        );
    } else {
        eprintln!("not signed in: nothing to remove");
    }
    Ok(0)
}
