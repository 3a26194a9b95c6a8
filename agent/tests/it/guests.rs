//! What a guest's real container can do, asked from inside it: who it runs as, its
//! capabilities, what it can reach on the network and what it can write. Every address
//! tried is one this test (or the agent under test) made: a listener of its own, or
//! another job's container. Where an address cannot be assumed to have a server (the
//! portal, 10.0.0.0/8, 169.254.169.254), the test puts one there ([`LabNet`]) and shows
//! that a container outside the guests' network reaches it, so what stops a guest is the
//! firewall and nothing else.

use super::{final_event, free_kib, guard_exe, lease_from_hello, new_agent_id, spec};
use commons_agent::executor::Executor;
use commons_agent::outbox::{self, OutboxRx};
use commons_agent::runtime::guest::{
    blocked_destinations, parse_block, GuestNetwork, Isolation, GUEST_BRIDGE, GUEST_NETWORK,
};
use commons_agent::runtime::DockerRuntime;
use commons_agent::store::Store;
use commons_proto::AttemptState;
use std::net::TcpListener;
use std::time::Duration;

async fn agent(dir: &std::path::Path, network: GuestNetwork) -> (Executor, OutboxRx) {
    isolated(
        dir,
        Isolation {
            network,
            ..Default::default()
        },
    )
    .await
}

async fn isolated(dir: &std::path::Path, iso: Isolation) -> (Executor, OutboxRx) {
    super::demo_image();
    let rt = DockerRuntime::connect(new_agent_id())
        .await
        .expect("the Docker Engine must run")
        .with_isolation(iso)
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

fn sh(args: &[&str]) {
    let out = std::process::Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("{args:?}: {e} (apt-get install iproute2)"));
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A stand-in for what lies beyond a lab server: a network namespace joined to this
/// machine by a veth pair, holding the portal (`198.18.N.2`), a range the operator lists
/// (`198.19.N.2`), a private address (`10.250.N.2`) and the cloud metadata address
/// (`169.254.169.254`), one TCP listener of the test's own serving them all. This machine
/// routes to 169.254.169.254 only the test's port (a policy rule), so its own metadata
/// service, if any, is untouched.
struct LabNet {
    ns: String,
    link: String,
    n: u32,
    port: u16,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    listener: Option<std::thread::JoinHandle<()>>,
}

impl LabNet {
    fn new() -> LabNet {
        use std::os::fd::AsRawFd;
        let id = std::process::id() % 100_000;
        let n = std::process::id() % 200 + 20;
        let (ns, link, peer) = (format!("gce{id}"), format!("gcx{id}"), format!("gcy{id}"));
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &ns])
            .output();
        let _ = std::process::Command::new("ip")
            .args(["link", "del", &link])
            .output();
        sh(&["ip", "netns", "add", &ns]);
        sh(&[
            "ip", "link", "add", &link, "type", "veth", "peer", "name", &peer,
        ]);
        sh(&["ip", "link", "set", &peer, "netns", &ns]);
        for net in ["198.18", "198.19", "10.250"] {
            sh(&[
                "ip",
                "addr",
                "add",
                &format!("{net}.{n}.1/24"),
                "dev",
                &link,
            ]);
            sh(&[
                "ip",
                "netns",
                "exec",
                &ns,
                "ip",
                "addr",
                "add",
                &format!("{net}.{n}.2/24"),
                "dev",
                &peer,
            ]);
        }
        sh(&[
            "ip",
            "netns",
            "exec",
            &ns,
            "ip",
            "addr",
            "add",
            "169.254.169.254/32",
            "dev",
            &peer,
        ]);
        sh(&["ip", "link", "set", &link, "up"]);
        sh(&["ip", "netns", "exec", &ns, "ip", "link", "set", &peer, "up"]);
        sh(&["ip", "netns", "exec", &ns, "ip", "link", "set", "lo", "up"]);
        // Replies from 169.254.169.254 come back on this link, whatever routes say.
        let _ = std::process::Command::new("sysctl")
            .args(["-qw", &format!("net.ipv4.conf.{link}.rp_filter=0")])
            .output();
        // The listener lives in the namespace: its thread enters it, then binds.
        let (tx, rx) = std::sync::mpsc::channel();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        let path = format!("/run/netns/{ns}");
        let listener = std::thread::spawn(move || {
            let f = std::fs::File::open(&path).unwrap();
            // SAFETY: a plain system call on a descriptor we hold; it moves only this
            // thread into the namespace.
            let rc = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "setns {path}");
            let l = TcpListener::bind("0.0.0.0:0").unwrap();
            tx.send(l.local_addr().unwrap().port()).unwrap();
            for c in l.incoming() {
                if stopped.load(std::sync::atomic::Ordering::SeqCst) {
                    break;
                }
                if let Ok(mut c) = c {
                    use std::io::Write;
                    let _ = c.write_all(b"hi\n");
                }
            }
        });
        let port = rx.recv().expect("the listener in the namespace");
        let table = (20_000 + n).to_string();
        sh(&[
            "ip",
            "route",
            "add",
            "169.254.169.254/32",
            "dev",
            &link,
            "table",
            &table,
        ]);
        sh(&[
            "ip",
            "rule",
            "add",
            "to",
            "169.254.169.254/32",
            "ipproto",
            "tcp",
            "dport",
            &port.to_string(),
            "lookup",
            &table,
            "pref",
            &table,
        ]);
        LabNet {
            ns,
            link,
            n,
            port,
            stop,
            listener: Some(listener),
        }
    }

    /// (name, address) of each target.
    fn targets(&self) -> Vec<(&'static str, String)> {
        let n = self.n;
        vec![
            ("portal", format!("198.18.{n}.2")),
            ("listed", format!("198.19.{n}.2")),
            ("private", format!("10.250.{n}.2")),
            ("metadata", "169.254.169.254".to_string()),
        ]
    }

    /// A shell script that tries each target and prints `reached-NAME` or `blocked-NAME`.
    fn probe_script(&self) -> String {
        self.targets()
            .iter()
            .map(|(name, addr)| {
                format!(
                    "nc -w 3 {addr} {} </dev/null >/dev/null 2>&1 && echo reached-{name} \
                     || echo blocked-{name}; ",
                    self.port
                )
            })
            .collect()
    }
}

impl Drop for LabNet {
    fn drop(&mut self) {
        let table = (20_000 + self.n).to_string();
        let _ = std::process::Command::new("ip")
            .args(["rule", "del", "pref", &table])
            .output();
        let _ = std::process::Command::new("ip")
            .args(["route", "flush", "table", &table])
            .output();
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let _ = std::net::TcpStream::connect((format!("198.18.{}.2", self.n), self.port));
        if let Some(t) = self.listener.take() {
            let _ = t.join();
        }
        let _ = std::process::Command::new("ip")
            .args(["link", "del", &self.link])
            .output();
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &self.ns])
            .output();
        // The blocks the agent added for this test's own addresses.
        for d in [
            format!("198.18.{}.2/32", self.n),
            format!("198.19.{}.0/24", self.n),
        ] {
            let _ = std::process::Command::new("iptables")
                .args([
                    "-D",
                    "DOCKER-USER",
                    "-i",
                    GUEST_BRIDGE,
                    "-d",
                    &d,
                    "-j",
                    "DROP",
                ])
                .output();
        }
    }
}

/// What `script` prints in a container on Docker's default bridge (not the guests').
fn on_the_default_bridge(script: &str) -> String {
    let out = std::process::Command::new("docker")
        .args([
            "run",
            "--rm",
            "--network",
            "bridge",
            "--label",
            "commons.test=guests",
            "commons-demo:latest",
            "sh",
            "-c",
            script,
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "docker run: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_with_egress_reaches_neither_the_portal_listed_ranges_private_nor_metadata_addresses(
) {
    super::demo_image();
    let lab = LabNet::new();
    // Every target answers: from this machine ...
    for (name, addr) in lab.targets() {
        assert!(
            std::net::TcpStream::connect_timeout(
                &format!("{addr}:{}", lab.port).parse().unwrap(),
                Duration::from_secs(5)
            )
            .is_ok(),
            "the test's listener at {name} ({addr}) answers this machine"
        );
    }
    // ... and from a container outside the guests' network: the way out works, so only
    // the guests' firewall rules can stop a guest.
    let outside = on_the_default_bridge(&lab.probe_script());
    for (name, _) in lab.targets() {
        assert!(
            outside.contains(&format!("reached-{name}")),
            "a container on the default bridge reaches {name}: {outside}"
        );
    }
    // An agent of the portal at 198.18.N.2 whose operator lists 198.19.N.0/24.
    let dir = tempfile::tempdir().unwrap();
    let portal = format!("http://198.18.{}.2:8080", lab.n);
    let listed = parse_block(&format!("198.19.{}.0/24", lab.n)).unwrap();
    let blocked = blocked_destinations(&portal, &[listed]).await.unwrap();
    let (exec, mut rx) = isolated(
        dir.path(),
        Isolation {
            network: GuestNetwork::Egress,
            blocked,
        },
    )
    .await;
    exec.start(
        15,
        1,
        spec(&lab.probe_script(), 60),
        vec![],
        lease_from_hello(&exec, 3600),
    );
    let end = final_event(&mut rx).await;
    for (name, addr) in lab.targets() {
        assert!(
            end.logs.contains(&format!("blocked-{name}")),
            "a guest must not reach {name} ({addr}): {}",
            end.logs
        );
    }
}
