//! `commons ssh`, `ssh-config`, `notebook` and `ssh-key` with the real OpenSSH client,
//! through the portal's gateway (portal and agent as separate processes, see `ssh.rs`).

use crate::cli::{refused, Cli};
use crate::ssh::{keygen, Rig};
use serde_json::Value;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_ssh_ssh_config_and_notebook_reach_the_job() {
    let rig = Rig::start(232).await;
    let url = rig.portal.url();
    let cli = Cli::new();
    cli.ok(&["login", &url, "--token", &rig.api.token]).await;
    let key = rig.key();
    let key_opt = format!("IdentityFile={}", key.display());
    let client_opts = [
        "-o",
        &key_opt,
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        "BatchMode=yes",
        "-o",
        "LogLevel=ERROR",
    ];

    // Keys: the rig's key is listed; one added and removed through the CLI.
    let keys: Value =
        serde_json::from_str(&cli.ok(&["ssh-key", "ls", "--json"]).await.stdout).unwrap();
    assert_eq!(keys.as_array().unwrap().len(), 1);
    let spare = keygen(rig.dir.path(), "spare", "ed25519");
    let r = cli
        .ok(&[
            "ssh-key",
            "add",
            spare.with_extension("pub").to_str().unwrap(),
            "--name",
            "spare",
        ])
        .await;
    let id = r.stdout.split_whitespace().nth(2).unwrap().to_string();
    assert!(cli.ok(&["ssh-key", "ls"]).await.stdout.contains("spare"));
    cli.ok(&["ssh-key", "rm", &id]).await;
    refused(
        &cli,
        &["ssh-key", "add", "/nonexistent.pub"],
        2,
        "cannot read /nonexistent.pub",
    )
    .await;

    // A job that serves a page on its own localhost and prints a Jupyter-like URL.
    let job: i64 = cli
        .ok(&[
            "run",
            "commons-demo:latest",
            "--time",
            "30m",
            "--",
            "sh",
            "-c",
            "echo 'http://127.0.0.1:8888/lab?token=abc123'; mkdir -p /tmp/www; \
             echo notebook-ok > /tmp/www/index.html; exec httpd -f -p 127.0.0.1:8888 -h /tmp/www",
        ])
        .await
        .stdout
        .trim()
        .parse()
        .unwrap();
    rig.api
        .wait_job(job, Duration::from_secs(60), "running", |j| {
            j["state"] == "running"
        })
        .await;
    let id = job.to_string();

    // commons ssh: no host-key question (BatchMode would fail on one), the exit status
    // and both streams pass through.
    let mut args = vec!["ssh", id.as_str()];
    args.extend(client_opts);
    args.extend(["--", "echo hi; echo err >&2; exit 7"]);
    let r = cli.run(&args).await;
    assert_eq!(r.code, 7, "{r}");
    assert_eq!(r.stdout, "hi\n", "{r}");
    assert!(r.stderr.contains("err"), "{r}");
    let kh = cli.config.path().join("gpu-commons").join("known_hosts");
    assert!(std::fs::read_to_string(&kh)
        .unwrap()
        .contains("ssh-ed25519"));

    // ssh-config: the printed block works as pasted, by the job's name and by user@alias.
    let block = cli.ok(&["ssh-config", &id]).await.stdout;
    assert!(
        block.contains("Host gpu-commons") && block.contains(&format!("Host commons-job-{job}"))
    );
    let conf = rig.dir.path().join("config");
    std::fs::write(&conf, &block).unwrap();
    for target in [
        format!("commons-job-{job}"),
        format!("job-{job}@gpu-commons"),
    ] {
        let out = tokio::process::Command::new("ssh")
            .arg("-F")
            .arg(&conf)
            .args(client_opts)
            .arg(&target)
            .arg("echo via-config")
            .stdin(Stdio::null())
            .output()
            .await
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "via-config\n",
            "{target}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // notebook: the job's port forwarded here; the URL printed is Jupyter's, moved.
    let local = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let local_s = local.to_string();
    let mut args = vec!["notebook", id.as_str(), "--local-port", local_s.as_str()];
    args.extend(client_opts);
    let mut child = cli
        .command(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let printed = tokio::time::timeout(Duration::from_secs(40), lines.next_line())
        .await
        .expect("the notebook URL within 40 s")
        .unwrap()
        .unwrap_or_default();
    assert_eq!(
        printed,
        format!("http://localhost:{local}/lab?token=abc123")
    );
    let page = reqwest::get(format!("http://127.0.0.1:{local}/"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(page, "notebook-ok\n");
    child.kill().await.unwrap();

    // A job that has ended is refused before ssh runs, in one line.
    cli.ok(&["cancel", &id]).await;
    rig.api
        .wait_job(job, Duration::from_secs(60), "cancelled", |j| {
            j["state"] == "cancelled"
        })
        .await;
    refused(&cli, &["ssh", &id], 1, "has ended (cancelled)").await;
}
