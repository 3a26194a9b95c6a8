//! What the SSH gateway refuses, shown with the real OpenSSH client against a real portal,
//! agent and container: agent forwarding, X11, subsystems other than sftp; and what a
//! key query (`publickey` without a signature) tells and costs: the same answer for
//! every job, one failed attempt each, counted per source address and user name with a
//! higher cap per address (so one user's failures behind a NAT lock out no one else).

use crate::ssh::{add_key, keygen, Rig};
use crate::support::cluster::{remove_containers, Api};
use serde_json::json;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Runs an OpenSSH command to its end; one still running after 90 s is killed and fails
/// the test (a request the gateway wrongly accepted can leave a session open).
async fn run(c: Command) -> Output {
    let mut c = tokio::process::Command::from(c);
    c.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let child = c
        .spawn()
        .expect("OpenSSH client (apt-get install openssh-client)");
    match tokio::time::timeout(Duration::from_secs(90), child.wait_with_output()).await {
        Ok(out) => out.unwrap(),
        Err(_) => panic!("{c:?} did not end within 90 s"),
    }
}

/// The rig's options with OpenSSH's `INFO` messages kept (refused requests are logged at
/// that level) and no agent of the test runner's.
fn chatty(rig: &Rig, key: &Path) -> Vec<String> {
    logging(rig, key, "INFO")
}

/// The same at another log level (OpenSSH takes the first `-o` of a kind).
fn logging(rig: &Rig, key: &Path, level: &str) -> Vec<String> {
    let mut o = rig.options(key);
    for v in o.iter_mut() {
        if v == "LogLevel=ERROR" {
            *v = format!("LogLevel={level}");
        }
    }
    o.extend(["-o".into(), "IdentityAgent=none".into()]);
    o
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_forwarding_x11_and_other_subsystems_are_refused() {
    let rig = Rig::start(236).await;
    let job = rig.running_job().await;
    let key = rig.key();
    let target = format!("job-{job}@127.0.0.1");

    // Agent forwarding: a real ssh-agent holding the key, `ssh -A`. OpenSSH asks without
    // wanting a reply, so what shows is the session: no agent socket in it.
    let agent_dir = tempfile::tempdir().unwrap();
    let sock = agent_dir.path().join("agent.sock");
    let mut agent = Command::new("ssh-agent")
        .args(["-D", "-a"])
        .arg(&sock)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("ssh-agent (apt-get install openssh-client)");
    crate::support::harness::wait_for(Duration::from_secs(10), "ssh-agent's socket", || {
        std::future::ready(sock.exists())
    })
    .await;
    let added = Command::new("ssh-add")
        .arg(&key)
        .env("SSH_AUTH_SOCK", &sock)
        .output()
        .unwrap();
    assert!(added.status.success(), "{}", text(&added.stderr));
    let mut c = Command::new("ssh");
    c.args(rig.options(&key))
        .args(["-A", "-o", "ForwardAgent=yes", "-o"])
        .arg(format!("IdentityAgent={}", sock.display()))
        .arg(&target)
        .arg("echo sock=[$SSH_AUTH_SOCK]; ls /tmp")
        .stdin(Stdio::null());
    let out = run(c).await;
    let _ = agent.kill();
    let _ = agent.wait();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("sock=[]"),
        "no forwarded agent in the session: {}",
        text(&out.stdout)
    );
    assert!(
        !text(&out.stdout).contains("ssh-"),
        "no agent socket in /tmp: {}",
        text(&out.stdout)
    );
    let log = rig.portal.log();
    assert!(
        log.contains("SSH agent forwarding refused"),
        "the gateway saw the request and refused it:\n{log}"
    );

    // X11: OpenSSH wants a reply and says it failed; no DISPLAY in the session.
    let mut c = Command::new("ssh");
    c.args(chatty(&rig, &key))
        // Trusted: OpenSSH makes up the cookie itself when no xauth is installed.
        .args(["-Y", "-o", "ForwardX11=yes", "-o", "ForwardX11Trusted=yes"])
        .arg(&target)
        .arg("echo display=[$DISPLAY]")
        .env("DISPLAY", "127.0.0.1:37")
        .stdin(Stdio::null());
    let out = run(c).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("X11 forwarding request failed"),
        "{}",
        text(&out.stderr)
    );
    assert!(
        text(&out.stdout).contains("display=[]"),
        "{}",
        text(&out.stdout)
    );

    // A subsystem other than sftp: refused, and nothing runs.
    let mut c = Command::new("ssh");
    c.args(chatty(&rig, &key))
        .args(["-s", &target, "netconf"])
        .stdin(Stdio::null());
    let out = run(c).await;
    assert_ne!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("subsystem request failed"),
        "{}",
        text(&out.stderr)
    );
    assert!(
        rig.portal.log().contains("SSH subsystem refused"),
        "{}",
        rig.portal.log()
    );
    // ... while sftp, through the same subsystem request, works.
    let mut c = Command::new("ssh");
    c.args(rig.options(&key))
        .args(["-s", &target, "sftp"])
        .stdin(Stdio::null());
    let out = run(c).await;
    assert!(
        !text(&out.stderr).contains("subsystem request failed"),
        "{}",
        text(&out.stderr)
    );
    remove_containers(&[job]);
}

/// What `ssh -v` with only a public key says about job `job`: whether the gateway
/// answered the query with "would be accepted" (`PK_OK`), and the whole of stderr.
async fn query(rig: &Rig, public: &Path, job: i64) -> (bool, String) {
    let mut c = Command::new("ssh");
    c.args(chatty(rig, public))
        .args(["-v", "-o", "PreferredAuthentications=publickey"])
        .arg(format!("job-{job}@127.0.0.1"))
        .arg("true")
        .stdin(Stdio::null());
    let out = run(c).await;
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(255), "a query never logs in: {err}");
    (err.contains("Server accepts key"), err)
}

/// An OpenSSH login with the private key: `Ok(stderr)` once the gateway let it in (it
/// then runs `true`, or says why the job cannot be reached), `Err(stderr)` when refused
/// (at the login, or at the connection when the address is blocked).
async fn login(rig: &Rig, key: &Path, job: i64) -> Result<String, String> {
    let mut c = Command::new("ssh");
    // VERBOSE: OpenSSH says "Authenticated to" once in.
    c.args(logging(rig, key, "VERBOSE"))
        .arg(format!("job-{job}@127.0.0.1"))
        .arg("true")
        .stdin(Stdio::null());
    let out = run(c).await;
    let err = text(&out.stderr);
    if err.contains("Authenticated to") {
        Ok(err)
    } else {
        Err(err)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_query_answers_the_same_for_every_job_and_counts_as_a_failure() {
    // Three failures per address and user name, eight per address.
    let rig = Rig::start_with(
        237,
        "auth_failures_per_minute = 3\nauth_failures_per_address_per_minute = 8\n",
    )
    .await;
    let alices = rig.running_job().await;
    let bob = Api::new(rig.portal.url(), rig.portal.admin(&["api-token", "bob"]));
    let bob_key = keygen(rig.dir.path(), "bob", "ed25519");
    add_key(&bob, &bob_key).await;
    let bobs = bob
        .submit(
            json!({"image": "commons-demo:latest", "command": ["sleep", "600"],
                       "gpus": 1, "time_limit_minutes": 5}),
        )
        .await;
    // Someone who has alice's public key (it is public: `github.com/alice.keys`), and
    // not her private key.
    let probe = rig.dir.path().join("probe");
    std::fs::create_dir(&probe).unwrap();
    let public = probe.join("alice.pub");
    std::fs::copy(rig.key().with_extension("pub"), &public).unwrap();

    let (on_hers, said) = query(&rig, &public, alices).await;
    let (on_bobs, _) = query(&rig, &public, bobs).await;
    let (on_none, _) = query(&rig, &public, 999_999_999).await;
    assert_eq!(
        (on_hers, on_bobs),
        (on_none, on_none),
        "the answer to a key query names no job: hers {on_hers}, bob's {on_bobs}, \
         none {on_none}\n{said}"
    );

    // Each query was a failed attempt: two more on alice's job make three for
    // (127.0.0.1, job-<alice's>), and alice herself is refused there for a minute ...
    query(&rig, &public, alices).await;
    query(&rig, &public, alices).await;
    let refused = login(&rig, &rig.key(), alices).await;
    assert!(
        refused.is_err(),
        "three queries are three failures: the next login on that job is refused: {refused:?}"
    );
    // ... while bob, behind the same address (a NAT), still gets in to his job (it is
    // queued: the gateway lets him in and says so).
    let bob_in = login(&rig, &bob_key, bobs).await;
    assert!(
        bob_in.as_ref().is_ok_and(|e| e.contains("queued")),
        "another user behind the same address: {bob_in:?}"
    );
    // Past the cap of the address (eight failures in all: five so far, bob's login
    // counted none), no one gets in from it.
    for other in [999_999_901, 999_999_902, 999_999_903] {
        query(&rig, &public, other).await;
    }
    let bob_out = login(&rig, &bob_key, bobs).await;
    assert!(
        bob_out.is_err(),
        "the address's own cap: everyone from it is refused: {bob_out:?}"
    );
    let log = rig.portal.log();
    assert!(log.contains("SSH key query"), "queries are logged:\n{log}");
    remove_containers(&[alices, bobs]);
}
