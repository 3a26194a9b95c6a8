//! SSH into jobs through the portal's gateway with the user's own OpenSSH client:
//! `commons ssh`, `commons ssh-config`, `commons notebook`, and the user's keys.
//!
//! Invariant: no "trust this host?" question and no entry in the user's own
//! `~/.ssh/known_hosts`: the gateway's host key comes from the API (over the signed-in
//! HTTPS connection) into `known_hosts` in this program's folder, and ssh is told to
//! use it (`HostKeyAlias`, `UserKnownHostsFile`) and to refuse any other key
//! (`StrictHostKeyChecking yes`).

use crate::args::{NotebookArgs, SshArgs, SshConfigArgs, SshKeyCommand};
use crate::client::Client;
use crate::config;
use crate::error::{CliError, Result};
use crate::output::{self, Cell};
use commons_api::ssh::{GatewayInfo, NewSshKey, SshKey};
use commons_api::{JobState, JobView};
use serde_json::Value;
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn gateway(client: &Client) -> Result<GatewayInfo> {
    client.get("/api/v1/ssh-gateway").map_err(|e| match e {
        CliError::Api { status: 404, .. } => CliError::Usage(format!(
            "the portal at {} runs no SSH gateway (its operators start it with --ssh-listen)",
            client.url
        )),
        e => e,
    })
}

/// Writes the gateway's `known_hosts` line into this program's folder; returns the file.
fn known_hosts(gw: &GatewayInfo) -> Result<PathBuf> {
    let path = config::dir()?.join("known_hosts");
    let line = format!("{}\n", gw.known_hosts.trim());
    if std::fs::read_to_string(&path).ok().as_deref() != Some(line.as_str()) {
        config::write_private(&path, line.as_bytes())?;
    }
    Ok(path)
}

/// The options every connection to the gateway needs.
fn options(gw: &GatewayInfo, known_hosts: &std::path::Path) -> Vec<String> {
    vec![
        "-p".into(),
        gw.port.to_string(),
        "-o".into(),
        format!("HostKeyAlias={}", gw.host_key_alias),
        "-o".into(),
        format!("UserKnownHostsFile={}", known_hosts.display()),
        "-o".into(),
        "StrictHostKeyChecking=yes".into(),
    ]
}

/// The job, if it runs; else why SSH cannot reach it now.
pub(crate) fn running_job(client: &Client, id: i64) -> Result<JobView> {
    let job: JobView = client.get(&format!("/api/v1/jobs/{id}"))?;
    match job.state {
        JobState::Running => Ok(job),
        s @ (JobState::Queued | JobState::Starting | JobState::Preempting) => Err(CliError::Api {
            status: 409,
            code: "not_running".into(),
            message: format!(
                "job {id} is {s}{}: SSH works while it runs (`commons logs -f {id}` waits for it)",
                job.reason.map(|r| format!(" ({r})")).unwrap_or_default()
            ),
        }),
        s @ (JobState::Succeeded | JobState::Failed | JobState::Cancelled) => Err(CliError::Api {
            status: 409,
            code: "not_running".into(),
            message: format!("job {id} has ended ({s})"),
        }),
    }
}

fn ssh_program() -> String {
    std::env::var("COMMONS_SSH").unwrap_or_else(|_| "ssh".into())
}

fn no_ssh(e: std::io::Error) -> CliError {
    CliError::Other(anyhow::anyhow!(
        "cannot run {} ({e}): install the OpenSSH client (apt-get install openssh-client)",
        ssh_program()
    ))
}

pub fn ssh(a: SshArgs) -> Result<u8> {
    let client = Client::signed_in()?;
    running_job(&client, a.id)?;
    let gw = gateway(&client)?;
    let kh = known_hosts(&gw)?;
    let mut cmd = Command::new(ssh_program());
    cmd.args(options(&gw, &kh));
    for o in &a.options {
        cmd.arg("-o").arg(o);
    }
    cmd.arg(format!("job-{}@{}", a.id, gw.host));
    cmd.args(&a.command);
    // ssh takes this process's place: the terminal, signals and the exit status are its.
    use std::os::unix::process::CommandExt;
    Err(no_ssh(cmd.exec()))
}

pub fn ssh_config(a: SshConfigArgs) -> Result<u8> {
    let client = Client::signed_in()?;
    let gw = gateway(&client)?;
    let kh = known_hosts(&gw)?;
    let common = format!(
        "    HostName {}\n    Port {}\n    HostKeyAlias {}\n    UserKnownHostsFile {}\n    StrictHostKeyChecking yes\n",
        gw.host,
        gw.port,
        gw.host_key_alias,
        kh.display()
    );
    println!(
        "# GPU Commons at {}: `ssh job-ID@gpu-commons` opens a shell in your job ID.\n\
         # The gateway's host key ({}) is in {}.\nHost gpu-commons\n{common}",
        client.url,
        gw.fingerprint,
        kh.display()
    );
    if let Some(id) = a.id {
        println!("Host commons-job-{id}\n    User job-{id}\n{common}");
    }
    Ok(0)
}

/// A free local port: `wanted` if it is free, else one the system picks.
fn local_port(wanted: u16) -> Result<u16> {
    if TcpListener::bind(("127.0.0.1", wanted)).is_ok() {
        return Ok(wanted);
    }
    let l = TcpListener::bind(("127.0.0.1", 0))
        .map_err(|e| CliError::Other(anyhow::anyhow!("no free local port: {e}")))?;
    Ok(l.local_addr()
        .map_err(|e| CliError::Other(anyhow::anyhow!("no free local port: {e}")))?
        .port())
}

/// The URL Jupyter printed in the job's output for `port` (the last one: a restarted
/// server prints a new token), moved to `localhost:local`.
pub fn notebook_url(logs: &str, port: u16, local: u16) -> String {
    let local_base = format!("http://localhost:{local}");
    let found = logs
        .split(|c: char| c.is_whitespace() || c == '"' || c == '\'')
        .filter_map(|w| {
            let rest = w
                .strip_prefix("http://")
                .or_else(|| w.strip_prefix("https://"))?;
            let (hostport, path) = match rest.find('/') {
                Some(i) => (&rest[..i], &rest[i..]),
                None => (rest, "/"),
            };
            let p: u16 = hostport.rsplit_once(':')?.1.parse().ok()?;
            (p == port).then(|| path.to_string())
        })
        .next_back();
    format!("{local_base}{}", found.unwrap_or_else(|| "/".into()))
}

pub fn notebook(a: NotebookArgs) -> Result<u8> {
    let client = Client::signed_in()?;
    running_job(&client, a.id)?;
    let gw = gateway(&client)?;
    let kh = known_hosts(&gw)?;
    let local = match a.local_port {
        Some(p) => p,
        None => local_port(a.port)?,
    };
    let extra: Vec<String> = a
        .options
        .iter()
        .flat_map(|o| ["-o".to_string(), o.clone()])
        .collect();
    let mut child = Command::new(ssh_program())
        .args(options(&gw, &kh))
        .args(extra)
        .args(["-N", "-o", "ExitOnForwardFailure=yes", "-L"])
        .arg(format!("127.0.0.1:{local}:localhost:{}", a.port))
        .arg(format!("job-{}@{}", a.id, gw.host))
        .stdin(Stdio::null())
        .spawn()
        .map_err(no_ssh)?;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = child.try_wait().map_err(|e| CliError::Other(e.into()))? {
            return Err(CliError::Other(anyhow::anyhow!(
                "ssh ended ({status}) before the port was forwarded"
            )));
        }
        if TcpStream::connect(("127.0.0.1", local)).is_ok() {
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            return Err(CliError::Other(anyhow::anyhow!(
                "the forwarding did not come up within 20 s"
            )));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let (logs, _) = client.text(&format!("/api/v1/jobs/{}/logs", a.id))?;
    println!("{}", notebook_url(&logs, a.port, local));
    eprintln!(
        "job {}'s port {} is at localhost:{local}; Ctrl-C ends the forwarding",
        a.id, a.port
    );
    let status = child.wait().map_err(|e| CliError::Other(e.into()))?;
    Ok(status.code().map(|c| c.clamp(0, 255) as u8).unwrap_or(0))
}

pub fn ssh_key(c: SshKeyCommand) -> Result<u8> {
    let client = Client::signed_in()?;
    match c {
        SshKeyCommand::Ls(a) => {
            let v: Value = client.get("/api/v1/ssh-keys")?;
            if a.json {
                println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
                return Ok(0);
            }
            let keys: Vec<SshKey> = client.parse(v)?;
            if keys.is_empty() {
                eprintln!("no SSH keys: add one with `commons ssh-key add ~/.ssh/id_ed25519.pub`");
                return Ok(0);
            }
            let rows = keys
                .into_iter()
                .map(|k| {
                    vec![
                        Cell::from(k.id.to_string()),
                        k.name.into(),
                        k.algorithm.into(),
                        k.fingerprint.into(),
                        output::when(k.created_at).into(),
                        k.last_used_at
                            .map(output::ago)
                            .unwrap_or_else(|| "never".into())
                            .into(),
                    ]
                })
                .collect();
            print!(
                "{}",
                output::table(
                    &["ID", "NAME", "TYPE", "FINGERPRINT", "ADDED", "LAST USED"],
                    rows,
                    output::colour_stdout()
                )
            );
        }
        SshKeyCommand::Add { file, name } => {
            let text = std::fs::read_to_string(&file)
                .map_err(|e| CliError::Usage(format!("cannot read {}: {e}", file.display())))?;
            let body = NewSshKey {
                public_key: text.trim().to_string(),
                name,
            };
            let k: SshKey = client.post("/api/v1/ssh-keys", &body)?;
            println!("added key {} ({} {})", k.id, k.algorithm, k.fingerprint);
        }
        SshKeyCommand::Rm { id } => {
            client.delete(&format!("/api/v1/ssh-keys/{id}"))?;
            println!("removed key {id}");
        }
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_notebook_url_is_jupyters_last_moved_to_the_local_port() {
        let logs = "[I] Jupyter Server is running at:\n\
                    [I] http://abc123:8888/lab?token=old\n\
                    [I]     http://127.0.0.1:8888/lab?token=new\n\
                    other http://127.0.0.1:9999/x\n";
        assert_eq!(
            notebook_url(logs, 8888, 18888),
            "http://localhost:18888/lab?token=new"
        );
        assert_eq!(
            notebook_url("nothing", 8888, 8888),
            "http://localhost:8888/"
        );
    }
}
