//! What a guest's real container can do, asked from inside it: who it runs as, its
//! capabilities, what it can reach on the network and what it can write. Every address
//! tried is one this test (or the agent under test) made: a listener of its own, or
//! another job's container.

use super::{final_event, free_kib, guard_exe, lease_from_hello, new_agent_id, spec};
use commons_agent::executor::Executor;
use commons_agent::outbox::{self, OutboxRx};
use commons_agent::runtime::guest::{GuestNetwork, Isolation, GUEST_NETWORK};
use commons_agent::runtime::DockerRuntime;
use commons_agent::store::Store;
use commons_proto::AttemptState;
use std::net::TcpListener;
use std::time::Duration;

async fn agent(dir: &std::path::Path, network: GuestNetwork) -> (Executor, OutboxRx) {
    super::demo_image();
    let rt = DockerRuntime::connect(new_agent_id())
        .await
        .expect("the Docker Engine must run")
        .with_isolation(Isolation { network })
        .await
        .expect("the guests' network (needs root and iptables)");
    let (tx, rx) = outbox::channel(Default::default());
    let store = Store::new(dir).with_guard(Some(guard_exe()));
    (Executor::new(rt, tx, store), rx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_runs_unprivileged_with_no_network_and_a_read_only_image() {
    let dir = tempfile::tempdir().unwrap();
    let (exec, mut rx) = agent(dir.path(), GuestNetwork::None).await;
    let script = "id -u; grep -E '^(CapEff|CapBnd|NoNewPrivs)' /proc/self/status; \
        echo ifaces $(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | sort | tr '\\n' ' '); \
        touch /etc/x 2>/dev/null && echo root-writable || echo root-read-only; \
        touch /tmp/x && echo tmp-writable; \
        [ -e /var/run/docker.sock ] || [ -e /run/docker.sock ] && echo docker-socket || echo no-docker-socket; \
        echo mounts $(grep -c ' /checkpoint ' /proc/self/mounts); \
        echo nofile $(ulimit -n); \
        echo shm $(df -k /dev/shm | tail -1 | awk '{print $2}'); \
        echo home $HOME";
    exec.start(
        11,
        1,
        spec(script, 60),
        vec![],
        lease_from_hello(&exec, 3600),
    );
    let end = final_event(&mut rx).await;
    assert_eq!(
        end.state,
        AttemptState::Exited,
        "{:?} {}",
        end.reason,
        end.logs
    );
    let out = end.logs;
    let has = |s: &str| out.lines().any(|l| l.trim() == s);
    assert!(has("65534"), "uid 65534: {out}");
    assert!(
        has("CapEff:\t0000000000000000"),
        "no effective capability: {out}"
    );
    assert!(
        has("CapBnd:\t0000000000000000"),
        "none to gain either: {out}"
    );
    assert!(has("NoNewPrivs:\t1"), "{out}");
    assert!(has("ifaces lo"), "the loopback only: {out}");
    assert!(has("root-read-only"), "{out}");
    assert!(has("tmp-writable"), "{out}");
    assert!(has("no-docker-socket"), "{out}");
    assert!(has("mounts 1"), "the attempt's /checkpoint: {out}");
    assert!(has("nofile 16384"), "{out}");
    assert!(has("shm 65536"), "64 MiB of /dev/shm: {out}");
    assert!(has("home /tmp"), "a home it can write: {out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_writing_past_its_scratch_fails_and_the_disk_is_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let (exec, mut rx) = agent(dir.path(), GuestNetwork::None).await;
    // The file systems a write could land on: the engine's (the image's writable layer)
    // and the one that backs the attempt's directory. `/tmp` in the container is memory.
    let docker = std::path::Path::new("/var/lib/docker");
    let before = (free_kib(docker), free_kib(dir.path()));
    let mut s = spec(
        "dd if=/dev/zero of=/tmp/big bs=1M count=1300 2>&1; echo dd=$?; \
         dd if=/dev/zero of=/big bs=1M count=10 2>&1; echo root=$?; rm -f /tmp/big; exit 3",
        120,
    );
    s.memory_mb = 2048;
    exec.start(12, 1, s, vec![], lease_from_hello(&exec, 3600));
    let end = final_event(&mut rx).await;
    let out = end.logs;
    assert!(out.contains("No space left on device"), "{out}");
    assert!(
        !out.contains("dd=0"),
        "the scratch is capped at 1 GiB: {out}"
    );
    assert!(out.contains("Read-only file system"), "{out}");
    assert!(!out.contains("root=0"), "{out}");
    let after = (free_kib(docker), free_kib(dir.path()));
    for (what, b, a) in [
        ("the engine's", before.0, after.0),
        ("the state dir's", before.1, after.1),
    ] {
        assert!(
            b.saturating_sub(a) < 200 * 1024,
            "{what} file system lost {} MiB",
            b.saturating_sub(a) / 1024
        );
    }
}

/// The IP of a job's container on the guests' bridge.
fn ip_on_guest_network(job: i64) -> String {
    let out = std::process::Command::new("docker")
        .args(["ps", "-q", "--filter", &format!("label=commons.job={job}")])
        .output()
        .unwrap();
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let out = std::process::Command::new("docker")
        .args([
            "inspect",
            "--format",
            &format!("{{{{ (index .NetworkSettings.Networks \"{GUEST_NETWORK}\").IPAddress }}}}"),
            &id,
        ])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn gateway_of_guest_network() -> String {
    let out = std::process::Command::new("docker")
        .args([
            "network",
            "inspect",
            "--format",
            "{{ (index .IPAM.Config 0).Gateway }}",
            GUEST_NETWORK,
        ])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_with_egress_reaches_neither_the_host_nor_another_job() {
    let dir = tempfile::tempdir().unwrap();
    let (exec, mut rx) = agent(dir.path(), GuestNetwork::Egress).await;
    let lease = lease_from_hello(&exec, 3600);
    // Job B listens; the host (this test) can reach it, which shows the listener works.
    exec.start(
        13,
        1,
        spec("while true; do echo hi-from-b | nc -l -p 8080; done", 120),
        vec![],
        lease,
    );
    let mut b_ip = String::new();
    for _ in 0..100 {
        b_ip = ip_on_guest_network(13);
        if !b_ip.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!b_ip.is_empty(), "job B runs on the guests' bridge");
    let mut reached = false;
    for _ in 0..50 {
        if std::net::TcpStream::connect_timeout(
            &format!("{b_ip}:8080").parse().unwrap(),
            Duration::from_secs(1),
        )
        .is_ok()
        {
            reached = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(reached, "the host reaches job B: the listener works");
    // A service of the host's own, on every address; the host reaches it itself.
    let host = TcpListener::bind("0.0.0.0:0").unwrap();
    let port = host.local_addr().unwrap().port();
    let gw = gateway_of_guest_network();
    assert!(std::net::TcpStream::connect((gw.as_str(), port)).is_ok());
    let script = format!(
        "nc -w 3 {b_ip} 8080 </dev/null && echo reached-b || echo blocked-b; \
         nc -w 3 {gw} {port} </dev/null && echo reached-host || echo blocked-host"
    );
    exec.start(14, 1, spec(&script, 60), vec![], lease);
    let end = loop {
        let e = final_event(&mut rx).await;
        if e.logs.contains("-b") {
            break e;
        }
    };
    assert!(end.logs.contains("blocked-b"), "another job: {}", end.logs);
    assert!(end.logs.contains("blocked-host"), "the host: {}", end.logs);
    exec.stop(13, 1, 1, commons_proto::StopReason::Cancelled, None);
}
