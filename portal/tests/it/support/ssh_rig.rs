//! The SSH test rig: a portal with its gateway as a separate process, one agent on a host
//! of its own, alice's key, and the OpenSSH options that trust the gateway's host key
//! (used by the gateway's tests in `ssh.rs` and by the tests of what runs over it).

use crate::support::cluster::{AgentProcess, Api, Host, PortalOpts, PortalProcess};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// The rig's agent: one fake GPU.
pub const GPUS: &str = "fake:1xA100-80GB";

/// A portal with its gateway, one agent, alice's key, and what `ssh` needs.
pub struct Rig {
    pub portal: PortalProcess,
    pub api: Api,
    pub dir: tempfile::TempDir,
    _host: Host,
    pub _agent: AgentProcess,
    pub alias: String,
}

pub fn keygen(dir: &Path, name: &str, kind: &str) -> PathBuf {
    let key = dir.join(name);
    let out = Command::new("ssh-keygen")
        .args(["-q", "-t", kind, "-N", "", "-C", name, "-f"])
        .arg(&key)
        .output()
        .expect("ssh-keygen (apt-get install openssh-client)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    key
}

pub async fn add_key(api: &Api, key: &Path) {
    let public = std::fs::read_to_string(key.with_extension("pub")).unwrap();
    let r = reqwest::Client::new()
        .post(format!("{}/api/v1/ssh-keys", api.url))
        .bearer_auth(&api.token)
        .json(&json!({ "public_key": public }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
}

/// Writes the gateway's `known_hosts` line where `ssh` will read it; returns the alias.
pub async fn trust_gateway(api: &Api, dir: &Path) -> String {
    let g = api
        .get("/api/v1/ssh-gateway")
        .await
        .expect("the gateway is on");
    std::fs::write(
        dir.join("known_hosts"),
        format!("{}\n", g["known_hosts"].as_str().unwrap()),
    )
    .unwrap();
    g["host_key_alias"].as_str().unwrap().to_string()
}

impl Rig {
    pub async fn start(n: u8) -> Rig {
        Self::start_with(n, "").await
    }

    /// The same with more `[ssh]` settings (`key = value` lines).
    pub async fn start_with(n: u8, ssh_settings: &str) -> Rig {
        Self::start_with_toml(n, ssh_settings, "", GPUS).await
    }

    /// The same with more sections of configuration (`extra_toml`, e.g. `[apps]`) and
    /// the agent's GPUs.
    pub async fn start_with_toml(n: u8, ssh_settings: &str, extra_toml: &str, gpus: &str) -> Rig {
        let (portal, alice) = PortalProcess::start_opts(PortalOpts {
            ssh: true,
            extra_toml: extra_toml.to_string(),
            ssh_settings: ssh_settings.to_string(),
            // `job_page` signs in through the page.
            dev_login: true,
            ..Default::default()
        });
        let api = Api::new(portal.url(), alice);
        let host = Host::new(n);
        let agent = AgentProcess::start(&host, &portal, &format!("ssh-{n}"), gpus);
        agent.wait_online(&api, &host).await;
        let dir = tempfile::tempdir().unwrap();
        let key = keygen(dir.path(), "alice", "ed25519");
        add_key(&api, &key).await;
        let alias = trust_gateway(&api, dir.path()).await;
        Rig {
            portal,
            api,
            dir,
            _host: host,
            _agent: agent,
            alias,
        }
    }

    pub fn key(&self) -> PathBuf {
        self.dir.path().join("alice")
    }

    /// A running job of alice's that sleeps until cancelled.
    pub async fn running_job(&self) -> i64 {
        running_job(&self.api).await
    }

    /// OpenSSH options for this gateway, strict about its host key.
    pub fn options(&self, key: &Path) -> Vec<String> {
        ssh_options(
            self.dir.path(),
            key,
            &self.alias,
            self.portal.ssh_port.unwrap(),
        )
    }

    /// `ssh` to `job-<job>` with `key`, running `remote` there.
    pub fn ssh(&self, key: &Path, job: i64, remote: &[&str]) -> Command {
        self.ssh_opts(key, job, &[], remote)
    }

    /// `ssh` with more client options.
    pub fn ssh_opts(&self, key: &Path, job: i64, opts: &[&str], remote: &[&str]) -> Command {
        let mut c = Command::new("ssh");
        c.args(self.options(key))
            .args(opts)
            .arg(format!("job-{job}@127.0.0.1"))
            .args(remote)
            .stdin(Stdio::null());
        c
    }
}

pub fn ssh_options(dir: &Path, key: &Path, alias: &str, port: u16) -> Vec<String> {
    [
        "-F",
        "/dev/null",
        "-o",
        "BatchMode=yes",
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "LogLevel=ERROR",
        "-o",
        "ConnectTimeout=20",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([
        "-o".into(),
        format!("UserKnownHostsFile={}", dir.join("known_hosts").display()),
        "-o".into(),
        format!("HostKeyAlias={alias}"),
        "-i".into(),
        key.display().to_string(),
        "-p".into(),
        port.to_string(),
    ])
    .collect()
}

pub async fn running_job(api: &Api) -> i64 {
    let job = api
        .submit(json!({
            "image": "commons-demo:latest",
            "command": ["sh", "-c", "echo started; sleep 3600"],
            "gpus": 1,
            "time_limit_minutes": 30,
        }))
        .await;
    api.wait_job(job, Duration::from_secs(60), "running", |j| {
        j["state"] == "running"
    })
    .await;
    job
}
