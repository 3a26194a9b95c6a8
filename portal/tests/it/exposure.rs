//! What the portal refuses to offer to the network, checked by starting the real binary:
//! the insecure development login anywhere but loopback or next to campus SSO, and
//! `/metrics` without its scrape token on an address beyond loopback. Each refusal is a
//! clear error at start, before anything listens.

use crate::support::cluster::{free_port, portal_binary};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// What `commons-portal serve --config` did with `config` (TOML lines after the database
/// and session key): `Err(stderr)` when it exited, or `Ok(child)` once it listens on
/// `port` (kill it when done).
fn serve(dir: &Path, port: u16, config: &str) -> Result<std::process::Child, String> {
    let key = dir.join("session.key");
    std::fs::write(&key, [7u8; 64]).unwrap();
    let file = dir.join(format!("portal-{port}.toml"));
    std::fs::write(
        &file,
        format!(
            "database_url = \"sqlite://{}\"\nsession_key_file = \"{}\"\n{config}",
            dir.join("commons.db").display(),
            key.display()
        ),
    )
    .unwrap();
    let err = dir.join(format!("stderr-{port}"));
    let mut child = Command::new(portal_binary())
        .args(["serve", "--config"])
        .arg(&file)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let said = std::fs::read_to_string(&err).unwrap();
            assert!(!status.success(), "it exited 0: {said}");
            return Err(said);
        }
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(child);
        }
        assert!(
            Instant::now() < deadline,
            "the portal neither listened nor exited within 60 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn refused(dir: &Path, port: u16, config: &str, says: &[&str]) {
    match serve(dir, port, config) {
        Ok(mut child) => {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the portal started and listens on {port} with:\n{config}");
        }
        Err(e) => {
            for s in says {
                assert!(e.contains(s), "the error names {s:?}: {e}");
            }
        }
    }
}

#[test]
fn the_dev_login_and_open_metrics_are_refused_beyond_loopback() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let port = free_port();
    // The development login on every address.
    refused(
        d,
        port,
        &format!(
            "listen = \"0.0.0.0:{port}\"\ninsecure_dev_login = true\n[metrics]\nenabled = false\n"
        ),
        &["insecure_dev_login", "loopback", "0.0.0.0"],
    );
    // ... or beside campus SSO, even on loopback.
    let secret = d.join("oidc-secret");
    std::fs::write(&secret, "s").unwrap();
    refused(
        d,
        port,
        &format!(
            "listen = \"127.0.0.1:{port}\"\ninsecure_dev_login = true\n\
             public_url = \"http://127.0.0.1:{port}\"\n[oidc]\n\
             issuer = \"http://127.0.0.1:9\"\nclient_id = \"gpu\"\n\
             client_secret_file = \"{}\"\n",
            secret.display()
        ),
        &["insecure_dev_login", "SSO"],
    );
    // /metrics without a token on every address.
    refused(
        d,
        port,
        &format!("listen = \"0.0.0.0:{port}\"\n"),
        &["/metrics", "bearer_token_file"],
    );
    // With its token it starts, and /metrics answers only the token.
    let token = d.join("metrics.token");
    std::fs::write(&token, "scrape-me\n").unwrap();
    let mut child = serve(
        d,
        port,
        &format!(
            "listen = \"0.0.0.0:{port}\"\n[metrics]\nbearer_token_file = \"{}\"\n",
            token.display()
        ),
    )
    .expect("it starts with the token");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let url = format!("http://127.0.0.1:{port}/metrics");
    let (without, with) = rt.block_on(async {
        let http = reqwest::Client::new();
        let without = http.get(&url).send().await.unwrap().status();
        let with = http
            .get(&url)
            .bearer_auth("scrape-me")
            .send()
            .await
            .unwrap()
            .status();
        (without, with)
    });
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!((without.as_u16(), with.as_u16()), (401, 200));
    // The development login on loopback is what demos use: it starts.
    let port = free_port();
    let mut child = serve(
        d,
        port,
        &format!("listen = \"127.0.0.1:{port}\"\ninsecure_dev_login = true\n"),
    )
    .expect("the dev login on loopback starts");
    let _ = child.kill();
    let _ = child.wait();
}
