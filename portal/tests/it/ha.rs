//! High availability, with every part a separate process: two portal replicas on one
//! PostgreSQL database behind a real nginx (WebSocket upgrade included), an agent on a
//! virtual host dialing nginx. The leader is killed with jobs running and queued: the other
//! replica takes the scheduler over, the agent reconnects, no job is lost or run twice,
//! and a user logged in through the proxy stays logged in. And PostgreSQL restarting under
//! load: the portal reconnects, and nothing it accepted is lost.
//!
//! Needs nginx and the PostgreSQL server binaries (`.ci/run` installs both), root for the
//! network namespaces, and the Docker Engine.

use crate::policy::leader_locks;
use crate::support::cluster::{free_port, AgentProcess, Api, Host, PortalOpts, PortalProcess};
use crate::support::harness::{Backend, TestDb};
use crate::support::session::BrowserSession;
use crate::support::timeline::Timeline;
use serde_json::{json, Value};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// nginx in front of the replicas: round robin, the next replica when one refuses the
/// connection, WebSocket upgrades passed through.
struct Nginx {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Nginx {
    fn start(upstreams: &[u16]) -> Nginx {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let d = dir.path().display();
        let servers: String = upstreams
            .iter()
            .map(|p| format!("server 127.0.0.1:{p} max_fails=1 fail_timeout=10s;\n"))
            .collect();
        // As root, nginx's workers would become `nobody`, who cannot write the temp dirs.
        let user = if is_root() { "user root;" } else { "" };
        let conf = format!(
            "{user}\ndaemon off;\nworker_processes 1;\npid {d}/nginx.pid;\n\
             error_log {d}/error.log info;\nevents {{ worker_connections 1024; }}\n\
             http {{\n  access_log {d}/access.log;\n  client_body_temp_path {d}/body;\n\
             proxy_temp_path {d}/proxy;\n  fastcgi_temp_path {d}/fcgi;\n\
             uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n\
             map $http_upgrade $connection_upgrade {{ default upgrade; '' close; }}\n\
             upstream portal {{\n{servers}}}\n\
             server {{\n  listen 0.0.0.0:{port};\n  client_max_body_size 1m;\n\
             location / {{\n    proxy_pass http://portal;\n    proxy_http_version 1.1;\n\
             proxy_set_header Upgrade $http_upgrade;\n\
             proxy_set_header Connection $connection_upgrade;\n\
             proxy_set_header Host $http_host;\n\
             proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;\n\
             proxy_connect_timeout 2s;\n    proxy_read_timeout 3600s;\n\
             proxy_next_upstream error timeout http_502;\n  }}\n}}\n}}\n"
        );
        let path = dir.path().join("nginx.conf");
        std::fs::write(&path, conf).unwrap();
        let child = Command::new("nginx")
            .args(["-e", &format!("{d}/error.log"), "-p"])
            .arg(dir.path())
            .arg("-c")
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run nginx ({e}): apt-get install nginx"));
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "nginx did not start: {}",
                std::fs::read_to_string(dir.path().join("error.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Nginx {
            child,
            port,
            _dir: dir,
        }
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn is_root() -> bool {
    // /proc tells the effective uid (the third field of `Uid:`).
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .and_then(|l| l.split_whitespace().nth(2).map(|u| u == "0"))
        .unwrap_or(false)
}

fn job(cmd: &str) -> Value {
    json!({"image": "commons-demo:latest", "command": ["sh", "-c", cmd], "gpus": 1,
           "time_limit_minutes": 10, "lab": "vision"})
}

/// Waits for a condition of blocking checks (database queries); how long it took.
async fn wait_until(within: Duration, what: &str, check: impl Fn() -> bool) -> Duration {
    let t0 = Instant::now();
    crate::support::harness::wait_for(within, what, || std::future::ready(check())).await;
    t0.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_leader_behind_nginx_loses_and_doubles_nothing() {
    let db = TestDb::new(Backend::Postgres);
    let opts = PortalOpts {
        lease_ttl_s: 20,
        margin_s: 5,
        db_url: Some(db.url.clone()),
        // alice signs in through the proxy's pages; nginx reaches the replicas on loopback.
        dev_login: true,
        ..Default::default()
    };
    let (mut leader, token) = PortalProcess::start_opts(opts.clone());
    let url = db.url.clone();
    wait_until(Duration::from_secs(20), "the first replica to lead", || {
        leader_locks(&url) == 1
    })
    .await;
    let mut other = leader.replica(&opts);
    let proxy = Nginx::start(&[leader.port(), other.port()]);
    let host = Host::new(130);
    let front = format!("http://127.0.0.1:{}", proxy.port);
    let _agent = AgentProcess::start_via(
        &host,
        &leader,
        format!("http://{}:{}", host.gateway, proxy.port),
        "vision",
        "ha-1",
        "fake:4xA100-80GB",
    );
    let api = Api::new(front.clone(), token);
    let t0 = Instant::now();
    while api.nodes_online().await < 1 {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the agent never came online through nginx"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Signed in through the proxy's pages.
    let alice = BrowserSession::login_at(&front, "alice").await;

    // Four jobs run (four GPUs), two wait.
    let timeline = Timeline::start();
    let mut jobs = Vec::new();
    for i in 0..6 {
        jobs.push(api.submit(job(&format!("sleep 12; echo done-{i}"))).await);
    }
    let t0 = Instant::now();
    loop {
        let mut running = 0;
        for j in &jobs {
            if let Some(v) = api.get(&format!("/api/v1/jobs/{j}")).await {
                running += usize::from(v["state"] == "running");
            }
        }
        if running == 4 {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(90),
            "four jobs never ran"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The leader dies as in a crash.
    leader.kill9();
    let killed = Instant::now();
    let takeover = wait_until(Duration::from_secs(30), "the other replica to lead", || {
        leader_locks(&url) == 1
    })
    .await;
    let mut done = Vec::new();
    for j in &jobs {
        let v = api
            .wait_job(*j, Duration::from_secs(120), "the job to end", |v| {
                ["succeeded", "failed", "cancelled"].contains(&v["state"].as_str().unwrap_or(""))
            })
            .await;
        done.push(v);
    }
    let all_done = killed.elapsed();
    for (j, v) in jobs.iter().zip(&done) {
        assert_eq!(v["state"], "succeeded", "job {j}: {v}");
        assert_eq!(v["attempts"], 1, "job {j} ran once: {v}");
        let logs = api.logs(*j).await;
        let i = jobs.iter().position(|x| x == j).unwrap();
        assert_eq!(
            logs.matches(&format!("done-{i}")).count(),
            1,
            "job {j}: {logs:?}"
        );
    }
    // Each ran in exactly one container (watched from before its submission).
    for j in &jobs {
        timeline.assert_no_overlap(*j, 1).await;
    }
    // Still logged in, now served by the survivor.
    let r = alice.fetch("/jobs").await;
    assert_eq!(r.status(), 200, "the session survives the replica");
    assert!(r.text().await.unwrap().contains("alice"));
    println!(
        "HA figures: scheduler taken over {:.1} s after the leader was killed; \
         all six jobs done {:.1} s after it",
        takeover.as_secs_f64(),
        all_done.as_secs_f64()
    );
    other.stop();
    crate::support::cluster::remove_containers(&jobs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_whose_clocks_disagree_never_requeue_a_valid_lease() {
    // The leader's clock runs 3 s ahead, the replica the agent talks to 3 s behind: judged
    // on each replica's clock, every lease the agent renews would look 6 s older to the
    // leader, past its 4 s and the 1 s margin (while the agent, heard every second, still
    // looks alive: the skew is the leases' alone). The database has one clock.
    let db = TestDb::new(Backend::Postgres);
    let (lease_ttl_s, margin_s) = (4, 1);
    let opts = PortalOpts {
        lease_ttl_s,
        margin_s,
        db_url: Some(db.url.clone()),
        clock_offset_s: 3,
        ..Default::default()
    };
    let (leader, token) = PortalProcess::start_opts(opts.clone());
    let url = db.url.clone();
    wait_until(Duration::from_secs(20), "the first replica to lead", || {
        leader_locks(&url) == 1
    })
    .await;
    let leading = Instant::now();
    let behind = leader.replica(&PortalOpts {
        clock_offset_s: -3,
        ..opts.clone()
    });
    let host = Host::new(133);
    let agent = AgentProcess::start(&host, &behind, "skew-1", "fake:1xA100-80GB");
    let api = Api::new(behind.url(), token);
    let t0 = Instant::now();
    while api.nodes_online().await < 1 {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the agent never came online"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let timeline = Timeline::start();
    let j = api.submit(job("sleep 600")).await;
    api.wait_job(j, Duration::from_secs(60), "running", |v| {
        v["state"] == "running"
    })
    .await;
    // The leader judges leases once it has led for a whole lease and the margin; watched
    // until well past that, the job runs on, its first attempt.
    let until = (leading + Duration::from_secs(lease_ttl_s + margin_s + 20))
        .max(Instant::now() + Duration::from_secs(10));
    let mut polls = 0;
    while Instant::now() < until {
        let v = api.get(&format!("/api/v1/jobs/{j}")).await.unwrap();
        assert!(
            v["state"] == "running" && v["attempts"] == 1,
            "a valid lease was requeued: {v}\n{}",
            leader.log()
        );
        polls += 1;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(polls > 10);
    timeline.assert_no_overlap(j, 1).await;
    assert!(
        !leader.log().contains("lost with their servers"),
        "{}",
        leader.log()
    );
    drop(agent);
    crate::support::cluster::remove_containers(&[j]);
}

/// A PostgreSQL server of the test's own (the shared one serves other tests): initdb,
/// start, restart.
struct OwnPostgres {
    bin: std::path::PathBuf,
    data: std::path::PathBuf,
    port: u16,
    _dir: tempfile::TempDir,
}

impl OwnPostgres {
    fn start() -> OwnPostgres {
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .expect("PostgreSQL server binaries (apt-get install postgresql)")
            .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
            .filter(|b| b.join("initdb").exists())
            .max()
            .expect("PostgreSQL server binaries (apt-get install postgresql)");
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        if is_root() {
            Command::new("chown")
                .args(["-R", "postgres"])
                .arg(dir.path())
                .status()
                .unwrap();
        }
        let pg = OwnPostgres {
            bin,
            data,
            port: free_port(),
            _dir: dir,
        };
        pg.ctl(&["initdb", "-D"], true);
        pg.pg_ctl("start");
        pg
    }

    fn command(&self, exe: &str) -> Command {
        let mut c = if is_root() {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(self.bin.join(exe));
            c
        } else {
            Command::new(self.bin.join(exe))
        };
        c.stdout(Stdio::null()).stderr(Stdio::null());
        c
    }

    fn ctl(&self, args: &[&str], init: bool) {
        let mut c = self.command(args[0]);
        c.args(&args[1..]).arg(&self.data);
        if init {
            c.args(["-U", "postgres", "-A", "trust"]);
        }
        assert!(c.status().unwrap().success(), "{args:?}");
    }

    fn pg_ctl(&self, what: &str) {
        let sock = self.data.parent().unwrap();
        let opts = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off",
            self.port,
            sock.display()
        );
        let log = sock.join("log");
        let ok = self
            .command("pg_ctl")
            .args(["-D"])
            .arg(&self.data)
            .args(["-w", "-m", "fast", "-l"])
            .arg(&log)
            .args(["-o", &opts, what])
            .status()
            .unwrap()
            .success();
        assert!(ok, "pg_ctl {what}");
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for OwnPostgres {
    fn drop(&mut self) {
        let _ = self
            .command("pg_ctl")
            .args(["-D"])
            .arg(&self.data)
            .args(["-m", "immediate", "stop"])
            .status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restarting_under_load_loses_nothing_the_portal_accepted() {
    let pg = std::sync::Arc::new(OwnPostgres::start());
    let (mut portal, token) = PortalProcess::start_opts(PortalOpts {
        lease_ttl_s: 20,
        margin_s: 5,
        db_url: Some(pg.url()),
        ..Default::default()
    });
    let host = Host::new(131);
    let _agent = AgentProcess::start(&host, &portal, "pg-1", "fake:4xA100-80GB");
    let api = Api::new(portal.url(), token.clone());
    let t0 = Instant::now();
    while api.nodes_online().await < 1 {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the agent never came online"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let running = api.submit(job("sleep 10; echo long-one")).await;

    // Submissions every 100 ms, from before the restart to after it.
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let submitter = {
        let url = portal.url();
        tokio::spawn(async move {
            let (mut accepted, mut refused) = (Vec::new(), Vec::new());
            let t0 = Instant::now();
            let mut i = 0;
            while t0.elapsed() < Duration::from_secs(12) {
                let r = http
                    .post(format!("{url}/api/v1/jobs"))
                    .bearer_auth(&token)
                    .json(&job(&format!("echo submitted-{i}")))
                    .send()
                    .await;
                match r {
                    Ok(r) if r.status() == 201 => {
                        let v: Value = r.json().await.unwrap();
                        accepted.push(v["id"].as_i64().unwrap());
                    }
                    Ok(r) => refused.push(r.status().as_u16()),
                    Err(_) => refused.push(0),
                }
                i += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            (accepted, refused)
        })
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    let restart = Instant::now();
    let p = pg.clone();
    tokio::task::spawn_blocking(move || p.pg_ctl("restart"))
        .await
        .unwrap();
    let down = restart.elapsed();
    let (accepted, refused) = submitter.await.unwrap();
    assert!(
        refused.iter().all(|s| *s == 503),
        "a submission during the outage is refused with 503 (try again): {refused:?}"
    );
    assert!(
        accepted.len() >= 20,
        "most submissions were accepted: {}",
        accepted.len()
    );
    // Everything accepted runs, once; the long job lives through the restart.
    for j in accepted.iter().chain([&running]) {
        let v = api
            .wait_job(*j, Duration::from_secs(180), "the job to end", |v| {
                ["succeeded", "failed", "cancelled"].contains(&v["state"].as_str().unwrap_or(""))
            })
            .await;
        assert_eq!(v["state"], "succeeded", "job {j}: {v}");
        assert_eq!(v["attempts"], 1, "job {j}: {v}");
    }
    println!(
        "PostgreSQL restart: {:.1} s down; {} submissions accepted, {} refused during it ({:?})",
        down.as_secs_f64(),
        accepted.len(),
        refused.len(),
        refused
    );
    portal.stop();
    let mut all = accepted.clone();
    all.push(running);
    crate::support::cluster::remove_containers(&all);
}
