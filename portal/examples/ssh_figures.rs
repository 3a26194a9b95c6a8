//! Figures of the SSH gateway, measured side by side in one run on one machine: the
//! portal and an agent as separate processes (the agent on a network-namespace host, as
//! in the integration tests' `cluster`), a running job of the demo image, and the real
//! OpenSSH client.
//!
//! - the time from nothing to a command's first output: `ssh job-N@gateway 'echo ready'`
//!   (a new connection each time: handshake, login, relay, exec) against `docker exec
//!   CONTAINER echo ready` on the same machine, to the first byte and to the end;
//! - the time of a 100 MiB copy into the container's `/tmp`: `scp` through the gateway
//!   (SFTP underneath) against the same bytes streamed by `docker exec -i CONTAINER sh -c
//!   'cat > FILE'` into the same folder (`docker cp` cannot write into a read-only root);
//!   with AES-GCM (the gateway's default offer) and with ChaCha20-Poly1305 (what OpenSSH
//!   takes wherever it is offered), alternating.
//!
//! `SSH_FIGURES_COPY_DETAIL=N` first makes N copies as one stream through the gateway
//! (`ssh ... 'cat > FILE'`, no SFTP), for a profile of the path without SFTP's replies;
//! `SSH_FIGURES_SCP_DETAIL=N` N more `scp` copies, for a profile of the copy itself (with
//! `SSH_FIGURES_SCP_EXTRA`'s arguments, e.g. `-X nrequests=256`).
//!
//! ```sh
//! cargo run --release -p commons-portal --example ssh_figures -- --runs 10 [--host 240]
//! ```
//! Needs root (network namespaces), Docker, OpenSSH's client, the demo image (built if
//! missing).
//!
//! `--profile N` measures nothing: it runs the portal and the agent with their `SSH
//! step` debug events on, makes N new connections with `ssh -v`, and prints each one's
//! timeline: the client's steps, the portal's and the agent's, in milliseconds from the
//! client's start (one clock: all three run on this machine).

#![allow(clippy::unwrap_used, clippy::expect_used)] // a measuring program: a failure is a crash

#[path = "../tests/it/support/cluster.rs"]
#[allow(dead_code)] // the tests' helpers; this program uses some of them
mod cluster;

use cluster::{remove_containers, AgentProcess, Api, Host, PortalOpts, PortalProcess};
use serde_json::json;
use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|v| v.parse().expect("a number"))
        .unwrap_or(default)
}

fn timed(mut c: Command) -> Duration {
    c.stdin(Stdio::null());
    timed_with_stdin(c)
}

fn timed_with_stdin(mut c: Command) -> Duration {
    let t = Instant::now();
    let out = c.output().unwrap();
    let d = t.elapsed();
    assert!(
        out.status.success(),
        "{c:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    d
}

/// The time to the command's first output byte, and to its end.
fn first_output(mut c: Command) -> (Duration, Duration) {
    let t = Instant::now();
    let mut child = c
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut byte = [0u8; 1];
    let n = child.stdout.as_mut().unwrap().read(&mut byte).unwrap();
    let first = t.elapsed();
    let out = child.wait_with_output().unwrap();
    let end = t.elapsed();
    assert!(
        n == 1 && out.status.success(),
        "{c:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (first, end)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

#[tokio::main]
async fn main() {
    let runs = arg("--runs", 10).max(1);
    let profile = arg("--profile", 0);
    if profile > 0 {
        // Read by the portal and the agent, which inherit this environment.
        std::env::set_var(
            "RUST_LOG",
            "info,commons_portal::ssh=debug,commons_portal::service::relays=debug,\
             commons_portal::broker::relay=debug,commons_agent::relay=debug",
        );
    }
    // The gateway offers ChaCha20-Poly1305 too here, after its default AES-GCM, so that
    // one run can copy with each: every measure below names AES-GCM (what the default
    // offer gets from OpenSSH), and one copy row ChaCha20 (what it got before).
    let (portal, alice) = PortalProcess::start_opts(PortalOpts {
        ssh: true,
        ssh_settings: "ciphers = [\"aes256-gcm@openssh.com\", \"aes128-gcm@openssh.com\", \
                       \"chacha20-poly1305@openssh.com\"]\n"
            .into(),
        lease_ttl_s: 30,
        margin_s: 10,
        ..Default::default()
    });
    let api = Api::new(portal.url(), alice);
    let host = Host::new(arg("--host", 240) as u8);
    let agent = AgentProcess::start(&host, &portal, "figures-1", "fake:1xA100-80GB");
    for _ in 0..600 {
        if api.nodes_online().await > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        api.nodes_online().await > 0,
        "the agent is not online:\n{}",
        agent.log()
    );
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("id");
    let ok = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(&key)
        .status()
        .unwrap();
    assert!(ok.success());
    let public = std::fs::read_to_string(key.with_extension("pub")).unwrap();
    let r = reqwest::Client::new()
        .post(format!("{}/api/v1/ssh-keys", api.url))
        .bearer_auth(&api.token)
        .json(&json!({ "public_key": public }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let g = api.get("/api/v1/ssh-gateway").await.unwrap();
    std::fs::write(
        dir.path().join("known_hosts"),
        format!("{}\n", g["known_hosts"].as_str().unwrap()),
    )
    .unwrap();
    let alias = g["host_key_alias"].as_str().unwrap().to_string();
    let job = api
        .submit(
            json!({"image": "commons-demo:latest", "command": ["sleep", "3600"],
                       "gpus": 1, "time_limit_minutes": 60}),
        )
        .await;
    api.wait_job(job, Duration::from_secs(120), "running", |j| {
        j["state"] == "running"
    })
    .await;
    let container = container_of(job);
    let port = portal.ssh_port.unwrap().to_string();
    let opts = |port_flag: &str| -> Vec<String> {
        vec![
            "-F".into(),
            "/dev/null".into(),
            "-o".into(),
            "BatchMode=yes".into(),
            "-o".into(),
            "IdentitiesOnly=yes".into(),
            "-o".into(),
            format!(
                "UserKnownHostsFile={}",
                dir.path().join("known_hosts").display()
            ),
            "-o".into(),
            format!("HostKeyAlias={alias}"),
            "-o".into(),
            // What OpenSSH takes from the gateway's default offer (it lists aes128-gcm
            // before aes256-gcm).
            "Ciphers=aes128-gcm@openssh.com".into(),
            "-i".into(),
            key.display().to_string(),
            port_flag.into(),
            port.clone(),
        ]
    };

    // Warm both paths once (page cache, the engine's exec path).
    let ssh_echo_v = |verbose: bool| {
        let mut c = Command::new("ssh");
        if verbose {
            c.arg("-v");
        }
        c.args(opts("-p"))
            .arg(format!("job-{job}@127.0.0.1"))
            .arg("echo ready");
        c
    };
    let ssh_echo = || ssh_echo_v(false);
    let docker_echo = || {
        let mut c = Command::new("docker");
        c.args(["exec", &container, "echo", "ready"]);
        c
    };
    timed(ssh_echo());
    timed(docker_echo());
    if profile > 0 {
        for _ in 0..profile {
            let c = ssh_echo_v(true);
            print_timeline(c, &[portal.log(), agent.log()].concat(), || {
                [portal.log(), agent.log()].concat()
            });
        }
        remove_containers(&[job]);
        return;
    }
    let (mut gw, mut gw_end) = (Vec::new(), Vec::new());
    let (mut de, mut de_end) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        let (first, end) = first_output(ssh_echo());
        gw.push(first);
        gw_end.push(end);
        let (first, end) = first_output(docker_echo());
        de.push(first);
        de_end.push(end);
    }
    let (gw, de) = (median(gw), median(de));
    let (gw_end, de_end) = (median(gw_end), median(de_end));

    let file = dir.path().join("100m.bin");
    let data: Vec<u8> = (0..100 * 1024 * 1024u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(&file, &data).unwrap();
    let copies = runs.min(3);
    // `scp` of the file to `name` in the container's /tmp, `first` going before the
    // common options (a later -o does not override an earlier one).
    let scp_to = |first: &[&str], name: &str| {
        let mut c = Command::new("scp");
        c.args(first)
            .args(opts("-P"))
            .arg(&file)
            .arg(format!("job-{job}@127.0.0.1:/tmp/{name}"))
            .stdin(Stdio::null());
        c
    };
    let mut scp = Vec::new();
    let mut chacha = Vec::new();
    let mut cp = Vec::new();
    let mut cpu = CpuUse {
        watched: vec![
            ("the portal", portal.pid().unwrap()),
            ("the agent", agent.pid().unwrap()),
        ],
        ..Default::default()
    };
    for _ in 0..copies {
        scp.push(cpu.timed("scp", scp_to(&[], "100m.bin")));
        let chacha_first = ["-o", "Ciphers=chacha20-poly1305@openssh.com"];
        chacha.push(cpu.timed("scp-chacha", scp_to(&chacha_first, "100m-chacha.bin")));
        let mut c = Command::new("docker");
        c.args([
            "exec",
            "-i",
            &container,
            "sh",
            "-c",
            "cat > /tmp/100m-exec.bin",
        ])
        .stdin(std::fs::File::open(&file).unwrap());
        cp.push(cpu.timed("exec", c));
    }
    // Where the copy's time goes: the same bytes as one stream through the gateway
    // (`ssh ... 'cat > FILE'`: no SFTP requests and replies).
    // SSH_FIGURES_COPY_DETAIL=N: N such copies (for a profile of the stream alone).
    let detail = env_count("SSH_FIGURES_COPY_DETAIL");
    // SSH_FIGURES_SCP_DETAIL=N: N more `scp` copies with the default cipher (for a profile
    // of the copy as users make it).
    let scp_detail = env_count("SSH_FIGURES_SCP_DETAIL");
    // SSH_FIGURES_SCP_EXTRA: more arguments for those copies (`-X nrequests=256`, say).
    let scp_extra = std::env::var("SSH_FIGURES_SCP_EXTRA").unwrap_or_default();
    if scp_detail > 0 {
        let extra: Vec<&str> = scp_extra.split_whitespace().collect();
        let mut more = Vec::new();
        for _ in 0..scp_detail {
            more.push(cpu.timed("scp-detail", scp_to(&extra, "100m.bin")));
        }
        println!(
            "copy detail: scp {scp_extra} {:.2} s",
            median(more).as_secs_f64()
        );
    }
    if detail > 0 {
        let mut stream = Vec::new();
        for _ in 0..detail {
            let mut c = Command::new("ssh");
            c.args(opts("-p"))
                .arg(format!("job-{job}@127.0.0.1"))
                .arg("cat > /tmp/100m-ssh.bin")
                .stdin(std::fs::File::open(&file).unwrap());
            stream.push(cpu.timed("ssh-cat", c));
        }
        println!("copy detail: ssh cat {:.2} s", median(stream).as_secs_f64());
    }
    let (scp, chacha, cp) = (median(scp), median(chacha), median(cp));
    let mibps = |d: Duration| 100.0 / d.as_secs_f64();

    println!("SSH gateway figures ({runs} runs, medians; one machine, side by side)");
    println!("| measure | through the gateway | direct | ratio |");
    println!("| --- | ---: | ---: | ---: |");
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "| new connection to a command's first output (`echo ready`) | {:.0} ms | {:.0} ms (`docker exec`) | {:.2}x |",
        ms(gw),
        ms(de),
        ms(gw) / ms(de)
    );
    println!(
        "| the same, to the command's end | {:.0} ms | {:.0} ms (`docker exec`) | {:.2}x |",
        ms(gw_end),
        ms(de_end),
        ms(gw_end) / ms(de_end)
    );
    println!(
        "| 100 MiB into the container's /tmp ({copies} copies) | {:.0} MiB/s, {:.2} s (`scp`) | {:.0} MiB/s, {:.2} s (`docker exec -i ... cat`) | {:.2}x the time |",
        mibps(scp),
        scp.as_secs_f64(),
        mibps(cp),
        cp.as_secs_f64(),
        scp.as_secs_f64() / cp.as_secs_f64()
    );
    println!(
        "| the same with ChaCha20-Poly1305 (OpenSSH's choice where offered) | {:.0} MiB/s, {:.2} s (`scp`) | {:.0} MiB/s, {:.2} s (`docker exec -i ... cat`) | {:.2}x the time |",
        mibps(chacha),
        chacha.as_secs_f64(),
        mibps(cp),
        cp.as_secs_f64(),
        chacha.as_secs_f64() / cp.as_secs_f64()
    );
    cpu.print();
    remove_containers(&[job]);
    drop(portal);
}

/// The machine's CPU time (all cores, every process) spent during each kind of copy: on
/// a machine otherwise quiet, what a copy costs in CPU besides how long it takes, so a
/// copy bound by CPU shows as such.
#[derive(Default)]
struct CpuUse {
    /// Processes whose own share is shown too: (name, pid).
    watched: Vec<(&'static str, u32)>,
    /// Each kind of copy, in the order first seen.
    kinds: Vec<Kind>,
}

/// What the copies of one kind took, summed.
struct Kind {
    name: &'static str,
    copies: usize,
    wall_s: f64,
    /// The whole machine's busy CPU time.
    busy_s: f64,
    /// Each watched process's CPU time.
    each_s: Vec<f64>,
}

impl CpuUse {
    fn timed(&mut self, kind: &'static str, c: Command) -> Duration {
        let before = busy_s();
        let before_each: Vec<f64> = self.watched.iter().map(|w| process_s(w.1)).collect();
        // The caller set stdin where the copy reads it; `timed` would null it.
        let d = timed_with_stdin(c);
        let busy = busy_s() - before;
        let each: Vec<f64> = self
            .watched
            .iter()
            .zip(before_each)
            .map(|(w, b)| process_s(w.1) - b)
            .collect();
        let i = match self.kinds.iter().position(|k| k.name == kind) {
            Some(i) => i,
            None => {
                self.kinds.push(Kind {
                    name: kind,
                    copies: 0,
                    wall_s: 0.0,
                    busy_s: 0.0,
                    each_s: vec![0.0; each.len()],
                });
                self.kinds.len() - 1
            }
        };
        let k = &mut self.kinds[i];
        k.copies += 1;
        k.wall_s += d.as_secs_f64();
        k.busy_s += busy;
        k.each_s.iter_mut().zip(each).for_each(|(a, b)| *a += b);
        d
    }

    fn print(&self) {
        println!(
            "CPU time of the whole machine per copy (mean; {} cores):",
            cores()
        );
        for k in &self.kinds {
            let n = k.copies as f64;
            let watched: Vec<String> = self
                .watched
                .iter()
                .zip(&k.each_s)
                .map(|(w, s)| format!("{} {:.2}", w.0, s / n))
                .collect();
            println!(
                "  {:12} {:.2} CPU-s in {:.2} s ({:.0} % of the cores busy; of it {})",
                k.name,
                k.busy_s / n,
                k.wall_s / n,
                100.0 * k.busy_s / k.wall_s / cores() as f64,
                watched.join(", ")
            );
        }
    }
}

/// The CPU time a process and its threads used so far (`/proc/PID/stat`), in seconds.
fn process_s(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // After the command's closing parenthesis: state is field 3, utime 14, stime 15.
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0.0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        f.get(i - 3)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    (ticks(14) + ticks(15)) as f64 / clock_ticks()
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf only reads a constant of the system.
    unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64
}

/// A count from the environment variable `name` (0 when unset or not a number).
fn env_count(name: &str) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Busy CPU time of the whole machine so far (`/proc/stat`), in seconds.
fn busy_s() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap();
    let first = stat.lines().next().unwrap();
    // cpu user nice system idle iowait irq softirq steal ...
    let f: Vec<u64> = first
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().unwrap())
        .collect();
    let busy = f[0] + f[1] + f[2] + f[5] + f[6] + f[7];
    busy as f64 / clock_ticks()
}

/// Runs `c` (an `ssh -v`), then prints its stderr's lines and the new lines of `logs`
/// (the portal's and the agent's, `before` being what they held already), by time.
fn print_timeline(mut c: Command, before: &str, logs: impl Fn() -> String) {
    use std::io::BufRead;
    use std::time::SystemTime;
    let start = SystemTime::now();
    let mut child = c
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let lines = std::thread::spawn(move || {
        std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
            .map(|l| (SystemTime::now(), format!("ssh    {l}")))
            .collect::<Vec<_>>()
    });
    let mut byte = [0u8; 1];
    child
        .stdout
        .as_mut()
        .unwrap()
        .read_exact(&mut byte)
        .unwrap();
    let first = SystemTime::now();
    child.wait().unwrap();
    let mut events = lines.join().unwrap();
    events.push((first, "ssh    << the command's first output byte".into()));
    std::thread::sleep(Duration::from_millis(300)); // the logs' last lines
    let all = logs();
    for line in all.lines().filter(|l| !before.contains(*l)) {
        let plain = strip_ansi(line);
        let Some((stamp, rest)) = plain.split_once(' ') else {
            continue;
        };
        let Ok(t) = chrono::DateTime::parse_from_rfc3339(stamp) else {
            continue;
        };
        let who = if rest.contains("commons_agent") {
            "agent "
        } else {
            "portal"
        };
        events.push((
            t.with_timezone(&chrono::Utc).into(),
            format!("{who} {}", rest.trim()),
        ));
    }
    events.sort_by_key(|(t, _)| *t);
    println!("--- a new connection, ms from the client's start");
    for (t, what) in events {
        let ms = match t.duration_since(start) {
            Ok(d) => d.as_secs_f64() * 1e3,
            Err(e) => -e.duration().as_secs_f64() * 1e3,
        };
        println!("{ms:8.1}  {what}");
    }
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn container_of(job: i64) -> String {
    let out = Command::new("docker")
        .args(["ps", "-q", "--filter", &format!("label=commons.job={job}")])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .expect("the job's container")
        .to_string()
}
