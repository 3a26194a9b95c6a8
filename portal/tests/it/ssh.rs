//! The SSH gateway with the real OpenSSH client (ssh, scp, sftp), the portal and the agent
//! as separate processes (the agent on a host of its own), and real containers of the demo
//! image (busybox plus OpenSSH's sftp-server).

use crate::support::cluster::{
    remove_containers, AgentProcess, Api, Host, PortalOpts, PortalProcess,
};
use serde_json::json;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

pub use crate::support::ssh_rig::{
    add_key, keygen, running_job, ssh_options, trust_gateway, Rig, GPUS,
};

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn run(mut c: Command) -> Output {
    c.output()
        .expect("OpenSSH client (apt-get install openssh-client)")
}

/// Runs a command through the gateway, blocking (in a thread of its own).
async fn run_async(c: Command) -> Output {
    tokio::task::spawn_blocking(move || run(c)).await.unwrap()
}

fn sha256_of(path: &Path) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(std::fs::read(path).unwrap()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_shells_files_and_forwards_go_through_the_gateway() {
    let rig = Rig::start(230).await;
    let job = rig.running_job().await;
    let key = rig.key();

    // A command: stdout, stderr and the exit status pass through.
    let out = run_async(rig.ssh(&key, job, &["echo hi; echo err >&2; exit 7"])).await;
    if std::env::var("SSH_DEBUG").is_ok() {
        let v = run_async(rig.ssh_opts(
            &key,
            job,
            &["-vvv", "-o", "LogLevel=DEBUG3"],
            &["echo hi; echo err >&2; exit 7"],
        ))
        .await;
        eprintln!("VERBOSE {:?}\n{}", v.status, text(&v.stderr));
        tokio::time::sleep(Duration::from_secs(1)).await;
        eprintln!("PORTAL\n{}\nAGENT\n{}", rig.portal.log(), rig._agent.log());
    }
    assert_eq!(text(&out.stdout), "hi\n");
    assert!(
        text(&out.stderr).contains("err"),
        "{:?}\nportal:\n{}\nagent:\n{}",
        out,
        rig.portal.log(),
        rig._agent.log()
    );
    assert_eq!(out.status.code(), Some(7));

    // The gateway offers AES-GCM (`[ssh] ciphers`), so OpenSSH, which would take
    // ChaCha20-Poly1305 first, uses it (aes128-gcm: OpenSSH lists it before aes256); a
    // client that offers nothing else is told so.
    let v = run_async(rig.ssh_opts(&key, job, &["-v"], &["true"])).await;
    assert!(
        text(&v.stderr).contains("client->server cipher: aes128-gcm@openssh.com"),
        "{}",
        text(&v.stderr)
    );
    let only = ["-v", "-o", "Ciphers=chacha20-poly1305@openssh.com"];
    let refused = run_async(rig.ssh_opts(&key, job, &only, &["true"])).await;
    assert_eq!(refused.status.code(), Some(255));
    assert!(
        text(&refused.stderr).contains("no matching cipher"),
        "{}",
        text(&refused.stderr)
    );

    // Input to the end, as the container's non-root user, with a sent variable.
    let mut c = rig.ssh_opts(
        &key,
        job,
        &["-o", "SendEnv=LANG"],
        &["cat; echo; id -u; echo $LANG"],
    );
    c.env("LANG", "C.UTF-8")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    let out = tokio::task::spawn_blocking(move || {
        use std::io::Write;
        let mut child = c.spawn().unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(b"from stdin")
            .unwrap();
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap();
    assert_eq!(text(&out.stdout), "from stdin\n65534\nC.UTF-8\n", "{out:?}");

    // Several sessions at once.
    let many: Vec<_> = (0..4)
        .map(|i| run_async(rig.ssh(&key, job, &[&format!("sleep 1; echo s{i}")])))
        .collect();
    let started = Instant::now();
    for (i, h) in many.into_iter().enumerate() {
        assert_eq!(text(&h.await.stdout), format!("s{i}\n"));
    }
    assert!(started.elapsed() < Duration::from_secs(20));

    // An interactive shell on a terminal, which follows a resize.
    interactive_shell_follows_resizes(&rig, job).await;

    // scp both ways (OpenSSH's scp speaks SFTP), 10 MiB, same checksum.
    let big = rig.dir.path().join("big.bin");
    let data: Vec<u8> = (0..10 * 1024 * 1024u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::write(&big, &data).unwrap();
    let back = rig.dir.path().join("back.bin");
    let opts = rig.options(&key);
    let port_opts: Vec<String> = opts
        .iter()
        .map(|o| {
            if o == "-p" {
                "-P".to_string()
            } else {
                o.clone()
            }
        })
        .collect();
    let mut up = Command::new("scp");
    up.args(&port_opts)
        .arg(&big)
        .arg(format!("job-{job}@127.0.0.1:/tmp/big.bin"));
    let out = run_async(up).await;
    assert!(out.status.success(), "scp up: {}", text(&out.stderr));
    let mut down = Command::new("scp");
    down.args(&port_opts)
        .arg(format!("job-{job}@127.0.0.1:/tmp/big.bin"))
        .arg(&back);
    let out = run_async(down).await;
    assert!(out.status.success(), "scp down: {}", text(&out.stderr));
    assert_eq!(sha256_of(&big), sha256_of(&back));

    // sftp lists and fetches.
    let batch = rig.dir.path().join("batch");
    let got = rig.dir.path().join("got.bin");
    std::fs::write(
        &batch,
        format!("ls -l /tmp\nget /tmp/big.bin {}\n", got.display()),
    )
    .unwrap();
    let mut sftp = Command::new("sftp");
    sftp.args(&port_opts)
        .arg("-b")
        .arg(&batch)
        .arg(format!("job-{job}@127.0.0.1"));
    let out = run_async(sftp).await;
    assert!(out.status.success(), "sftp: {}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("big.bin"),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(sha256_of(&got), sha256_of(&big));

    // -L reaches a server that listens on the container's own localhost only.
    let out = run_async(rig.ssh(
        &key,
        job,
        &["mkdir -p /tmp/www && echo hello-from-the-job > /tmp/www/index.html && httpd -p 127.0.0.1:8899 -h /tmp/www"],
    ))
    .await;
    assert!(out.status.success(), "httpd: {}", text(&out.stderr));
    let local = free_local_port();
    let mut fwd = rig.ssh_opts(
        &key,
        job,
        &["-N", "-L", &format!("{local}:localhost:8899")],
        &[],
    );
    fwd.stdout(Stdio::null()).stderr(Stdio::piped());
    let mut tunnel = fwd.spawn().unwrap();
    let body = http_get_retry(local).await;
    assert_eq!(body.trim(), "hello-from-the-job");
    let _ = tunnel.kill();
    let _ = tunnel.wait();

    // The ~/.ssh/config block from the job page works as it is (with the known_hosts line).
    let page = job_page(&rig, job).await;
    let block = between(&page, "Host commons-job-", "</code>");
    let config = rig.dir.path().join("ssh_config");
    std::fs::write(
        &config,
        format!(
            "Host commons-job-{}\n    IdentityFile {}\n    IdentitiesOnly yes\n    \
             UserKnownHostsFile {}\n    StrictHostKeyChecking yes\n    BatchMode yes\n",
            block,
            key.display(),
            rig.dir.path().join("known_hosts").display()
        ),
    )
    .unwrap();
    let mut c = Command::new("ssh");
    c.arg("-F")
        .arg(&config)
        .arg(format!("commons-job-{job}"))
        .arg("echo via-config");
    let out = run_async(c).await;
    assert_eq!(text(&out.stdout), "via-config\n", "{}", text(&out.stderr));
    assert!(page.contains("SHA256:"), "the fingerprint is on the page");

    // Cancelling the job ends a running session, with a message.
    let mut long = rig.ssh(&key, job, &["sleep 300"]);
    long.stderr(Stdio::piped()).stdout(Stdio::null());
    let child = long.spawn().unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let r = reqwest::Client::new()
        .post(format!("{}/api/v1/jobs/{job}/cancel", rig.api.url))
        .bearer_auth(&rig.api.token)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    let started = Instant::now();
    let out = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())
        .await
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(30));
    assert_ne!(out.status.code(), Some(0));
    assert!(
        text(&out.stderr).contains("cancelled"),
        "the session says why it ends: {}",
        text(&out.stderr)
    );
    remove_containers(&[job]);
}

async fn interactive_shell_follows_resizes(rig: &Rig, job: i64) {
    let session = format!("gcssh{}", std::process::id());
    let mut args = vec!["ssh".to_string(), "-tt".into()];
    args.extend(rig.options(&rig.key()));
    args.push(format!("job-{job}@127.0.0.1"));
    let cmd = args
        .iter()
        .map(|a| format!("'{a}'"))
        .collect::<Vec<_>>()
        .join(" ");
    let tmux = |a: &[&str]| {
        let out = Command::new("tmux")
            .args(a)
            .output()
            .expect("tmux (apt-get install tmux)");
        assert!(out.status.success(), "tmux {a:?}: {}", text(&out.stderr));
        text(&out.stdout)
    };
    tmux(&[
        "new-session",
        "-d",
        "-s",
        &session,
        "-x",
        "80",
        "-y",
        "24",
        &cmd,
    ]);
    let screen = |want: &'static str| {
        let session = session.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                let out = Command::new("tmux")
                    .args(["capture-pane", "-p", "-t", &session])
                    .output()
                    .unwrap();
                let s = text(&out.stdout);
                if s.contains(want) {
                    return s;
                }
                assert!(Instant::now() < deadline, "no {want:?} on the screen:\n{s}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    tmux(&[
        "send-keys",
        "-t",
        &session,
        "echo ready-$((6*7)); stty size",
        "Enter",
    ]);
    screen("ready-42").await;
    screen("24 80").await;
    tmux(&["resize-window", "-t", &session, "-x", "100", "-y", "30"]);
    tokio::time::sleep(Duration::from_millis(500)).await;
    tmux(&["send-keys", "-t", &session, "stty size", "Enter"]);
    screen("30 100").await;
    tmux(&["send-keys", "-t", &session, "exit", "Enter"]);
    let _ = Command::new("tmux")
        .args(["kill-session", "-t", &session])
        .output();
}

fn free_local_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn http_get_retry(port: u16) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(r) = reqwest::get(format!("http://127.0.0.1:{port}/index.html")).await {
            if let Ok(t) = r.text().await {
                if !t.is_empty() {
                    return t;
                }
            }
        }
        assert!(Instant::now() < deadline, "the forward never answered");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

async fn job_page(rig: &Rig, job: i64) -> String {
    let alice = crate::support::session::BrowserSession::login_at(&rig.api.url, "alice").await;
    alice
        .fetch(&format!("/jobs/{job}"))
        .await
        .text()
        .await
        .unwrap()
}

/// The text after `start` up to `end`, HTML entities of a `<pre>` undone.
fn between(page: &str, start: &str, end: &str) -> String {
    let from = page.find(start).expect("the SSH block is on the page") + start.len();
    let rest = &page[from..];
    let to = rest.find(end).unwrap();
    rest[..to]
        .replace("&#x2d;", "-")
        .replace("&amp;", "&")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_refuses_wrong_keys_other_jobs_ended_jobs_and_passwords() {
    let rig = Rig::start(231).await;
    let job = rig.running_job().await;
    let denied = |out: &Output| {
        assert_eq!(out.status.code(), Some(255), "{}", text(&out.stderr));
        assert!(
            text(&out.stderr).contains("Permission denied"),
            "{}",
            text(&out.stderr)
        );
    };
    // A key nobody registered.
    let stranger = keygen(rig.dir.path(), "stranger", "ed25519");
    denied(&run_async(rig.ssh(&stranger, job, &["true"])).await);
    // Bob's job with alice's key; a job that does not exist; a user name that names none:
    // the same answer each time.
    let bob = Api::new(rig.portal.url(), rig.portal.admin(&["api-token", "bob"]));
    let bobs = bob
        .submit(json!({"image": "commons-demo:latest", "command": ["sleep", "600"], "gpus": 1, "time_limit_minutes": 5}))
        .await;
    let not_bobs = run_async(rig.ssh(&rig.key(), bobs, &["true"])).await;
    denied(&not_bobs);
    let nobody = run_async(rig.ssh(&rig.key(), 999_999_999, &["true"])).await;
    denied(&nobody);
    assert_eq!(
        text(&not_bobs.stderr).replace(&bobs.to_string(), "N"),
        text(&nobody.stderr).replace("999999999", "N"),
        "a refusal tells nothing about which jobs exist"
    );
    let mut root = Command::new("ssh");
    root.args(rig.options(&rig.key()))
        .arg("root@127.0.0.1")
        .arg("true");
    denied(&run_async(root).await);
    // Passwords are not a way in.
    let mut pw = Command::new("ssh");
    pw.args(rig.options(&rig.key()))
        .args([
            "-o",
            "PubkeyAuthentication=no",
            "-o",
            "PreferredAuthentications=password,keyboard-interactive",
        ])
        .arg(format!("job-{job}@127.0.0.1"))
        .arg("true");
    denied(&run_async(pw).await);
    // Remote forwarding is refused; a forward to another host than the container's own.
    let out = run_async(rig.ssh_opts(
        &rig.key(),
        job,
        &["-o", "ExitOnForwardFailure=yes", "-R", "18999:localhost:22"],
        &["true"],
    ))
    .await;
    assert_eq!(out.status.code(), Some(255), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("forwarding failed"),
        "{}",
        text(&out.stderr)
    );
    let out = run_async(rig.ssh_opts(&rig.key(), job, &["-W", "10.0.0.1:80"], &[])).await;
    assert_ne!(out.status.code(), Some(0));
    assert!(
        text(&out.stderr).contains("forwarding failed"),
        "only the container's own localhost: {}",
        text(&out.stderr)
    );
    // A job that has ended: its owner is told so.
    let r = reqwest::Client::new()
        .post(format!("{}/api/v1/jobs/{job}/cancel", rig.api.url))
        .bearer_auth(&rig.api.token)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    rig.api
        .wait_job(job, Duration::from_secs(60), "cancelled", |j| {
            j["state"] == "cancelled"
        })
        .await;
    let out = run_async(rig.ssh(&rig.key(), job, &["true"])).await;
    assert_eq!(out.status.code(), Some(255));
    assert!(
        text(&out.stderr).contains("has ended"),
        "{}",
        text(&out.stderr)
    );
    // The logins that got in are audited: who, which job, from where.
    let audited = rig.portal.audit("ssh.login");
    assert!(
        audited.iter().any(|(actor, target, after)| actor == "alice"
            && target == &format!("job {job}")
            && after.contains("from 127.0.0.1")),
        "{audited:?}"
    );
    remove_containers(&[job, bobs]);
}

/// Two portal replicas on one PostgreSQL database: the agent holds its connection to the
/// first, the user reaches the second's gateway. The second asks the first (through the
/// agent mailbox) to have the agent dial it a relay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_reaches_a_job_whose_agent_another_replica_holds() {
    let db = crate::support::harness::TestDb::new(crate::support::harness::Backend::Postgres);
    let host = Host::new(233);
    let opts = PortalOpts {
        ssh: true,
        db_url: Some(db.url.clone()),
        ..Default::default()
    };
    let (first, alice) = PortalProcess::start_opts(opts.clone());
    let second = first.replica(&PortalOpts {
        relay_host: Some(host.gateway.clone()),
        ..opts
    });
    let api = Api::new(first.url(), alice);
    let agent = AgentProcess::start(&host, &first, "ssh-233", GPUS);
    agent.wait_online(&api, &host).await;
    let dir = tempfile::tempdir().unwrap();
    let key = keygen(dir.path(), "alice", "ed25519");
    add_key(&api, &key).await;
    // The replicas share the host key: what the first shows is what the second serves.
    let alias = trust_gateway(&Api::new(second.url(), api.token.clone()), dir.path()).await;
    let job = running_job(&api).await;
    let mut c = Command::new("ssh");
    c.args(ssh_options(
        dir.path(),
        &key,
        &alias,
        second.ssh_port.unwrap(),
    ))
    .arg(format!("job-{job}@127.0.0.1"))
    .arg("echo through-the-other-replica; exit 3")
    .stdin(Stdio::null());
    let out = run_async(c).await;
    assert_eq!(
        text(&out.stdout),
        "through-the-other-replica\n",
        "{}\nsecond replica:\n{}\nfirst:\n{}",
        text(&out.stderr),
        second.log(),
        first.log()
    );
    assert_eq!(out.status.code(), Some(3));
    remove_containers(&[job]);
}
