//! A campus of separate processes on separate (virtual) hosts: the portal as its own
//! process on this machine, each agent as its own process inside a network namespace of
//! its own, joined to this machine by a veth pair, so a test can kill a process or cut a
//! host's network. Every address is one the test made (10.251.N.0/30, inside this
//! machine); nothing else is ever contacted. All hosts share this machine's Docker
//! Engine (through its Unix socket, which a cut does not touch).
//!
//! Needs root (network namespaces), iproute2 and the Docker Engine; a missing piece fails
//! the test with what to install.

#[path = "forwarder.rs"]
mod forwarder;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn run(cmd: &[&str]) {
    let out = Command::new(cmd[0])
        .args(&cmd[1..])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?} ({e}): apt-get install iproute2"));
    assert!(
        out.status.success(),
        "{cmd:?} failed (the cluster tests need root for network namespaces): {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A workspace binary of the same profile as this test, built (once) if needed.
fn workspace_binary(package: &str) -> PathBuf {
    workspace_binary_named(package, package)
}

/// The same for a binary named otherwise than its package.
fn workspace_binary_named(package: &str, name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    // target/<profile>/deps/it-<hash> or target/<profile>/examples/soak -> target/<profile>
    let dir = exe.parent().and_then(Path::parent).unwrap().to_path_buf();
    let bin = dir.join(name);
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    // Not the variables `cargo test` sets for this test: ring's build script reruns when
    // CARGO_MANIFEST_DIR changes, so the build would flip between this environment and a
    // shell's, relinking the binary while other tests start it.
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy().into_owned();
        let set_for_tests = [
            "CARGO_MANIFEST_",
            "CARGO_PKG_",
            "CARGO_CRATE_",
            "CARGO_BIN_",
        ]
        .iter()
        .any(|p| key.starts_with(p))
            || key == "CARGO_PRIMARY_PACKAGE"
            || key == "CARGO_TARGET_TMPDIR";
        if set_for_tests {
            cmd.env_remove(&key);
        }
    }
    cmd.args(["build", "-p", package, "--bin", name])
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
    if dir.ends_with("release") {
        cmd.arg("--release");
    }
    let status = cmd.status().expect("cargo builds the workspace binary");
    assert!(
        status.success() && bin.exists(),
        "cannot build {}",
        bin.display()
    );
    bin
}

/// The `commons-agent` binary, built if missing (the portal's tests do not build it).
pub fn agent_binary() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| workspace_binary("commons-agent"))
        .clone()
}

/// The `commons` CLI binary (package `commons-cli`), built if missing.
pub fn cli_binary() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| workspace_binary_named("commons-cli", "commons"))
        .clone()
}

/// The `commons-portal` binary.
pub fn portal_binary() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| match option_env!("CARGO_BIN_EXE_commons-portal") {
            Some(p) => PathBuf::from(p),
            None => workspace_binary("commons-portal"),
        })
        .clone()
}

/// The demo image the jobs run, built once.
pub fn demo_image() {
    static DONE: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    DONE.get_or_init(|| {
        commons_portal::demo::ensure_demo_image()
            .expect("the demo image is needed: Docker and busybox-static must be installed")
    });
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The numbers of the hosts that exist now, in this process.
static HOSTS_IN_USE: std::sync::Mutex<std::collections::BTreeSet<u8>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

/// A virtual host: a network namespace with a veth pair to this machine, its addresses
/// `10.251.N.1` (this machine) and `10.251.N.2` (the host). Each test takes its own N.
pub struct Host {
    n: u8,
    pub ns: String,
    link: String,
    /// This machine's address as the host sees it (where the portal listens).
    pub gateway: String,
}

impl Host {
    pub fn new(n: u8) -> Host {
        // Two tests on one number would delete each other's namespace and share addresses.
        assert!(
            HOSTS_IN_USE.lock().unwrap().insert(n),
            "host {n} is already some other running test's: give each test a number of its own"
        );
        let tag = format!("{:x}{n}", std::process::id() % 0xffff);
        let ns = format!("gc{tag}");
        let link = format!("gch{tag}");
        let peer = format!("gcp{tag}");
        let _ = Command::new("ip").args(["netns", "del", &ns]).output();
        let _ = Command::new("ip").args(["link", "del", &link]).output();
        run(&["ip", "netns", "add", &ns]);
        run(&[
            "ip", "link", "add", &link, "type", "veth", "peer", "name", &peer,
        ]);
        run(&["ip", "link", "set", &peer, "netns", &ns]);
        let gateway = format!("10.251.{n}.1");
        run(&["ip", "addr", "add", &format!("{gateway}/30"), "dev", &link]);
        run(&["ip", "link", "set", &link, "up"]);
        let inside = format!("10.251.{n}.2/30");
        run(&[
            "ip", "netns", "exec", &ns, "ip", "addr", "add", &inside, "dev", &peer,
        ]);
        run(&["ip", "netns", "exec", &ns, "ip", "link", "set", &peer, "up"]);
        run(&["ip", "netns", "exec", &ns, "ip", "link", "set", "lo", "up"]);
        Host {
            n,
            ns,
            link,
            gateway,
        }
    }

    /// Cuts the host off the network (its processes keep running).
    pub fn cut(&self) {
        run(&["ip", "link", "set", &self.link, "down"]);
    }

    pub fn restore(&self) {
        run(&["ip", "link", "set", &self.link, "up"]);
    }

    /// What the network between this machine and the host looks like now (both ends'
    /// addresses and neighbours, this machine's listening sockets): for a failure's message.
    pub fn network(&self) -> String {
        let show = |args: &[&str]| {
            let out = Command::new(args[0]).args(&args[1..]).output();
            let text = match out {
                Ok(o) => format!(
                    "{}{}",
                    String::from_utf8_lossy(&o.stdout),
                    String::from_utf8_lossy(&o.stderr)
                ),
                Err(e) => format!("cannot run: {e}\n"),
            };
            format!("$ {}\n{text}", args.join(" "))
        };
        [
            show(&["ip", "addr", "show", "dev", &self.link]),
            show(&["ip", "neigh", "show", "dev", &self.link]),
            show(&["ip", "-n", &self.ns, "addr"]),
            show(&["ip", "-n", &self.ns, "neigh"]),
            show(&["ip", "-n", &self.ns, "route"]),
            show(&["ss", "-ltn"]),
        ]
        .concat()
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).output();
        let _ = Command::new("ip")
            .args(["link", "del", &self.link])
            .output();
        if let Ok(mut in_use) = HOSTS_IN_USE.lock() {
            in_use.remove(&self.n);
        }
    }
}

/// The portal as a separate process (`commons-portal serve`), on a SQLite file or a
/// test's PostgreSQL database.
pub struct PortalProcess {
    pub dir: tempfile::TempDir,
    pub port: u16,
    /// The SSH gateway's port, when it runs.
    pub ssh_port: Option<u16>,
    child: Option<Child>,
    config: PathBuf,
    db_url: String,
    json_logs: bool,
    clock_offset_s: i64,
    /// What scrapers of its `/metrics` send (`Authorization: Bearer ...`).
    pub metrics_token: String,
    /// With the development login: what passes agents' connections to its loopback.
    forwarder: Option<forwarder::Forwarder>,
}

/// How to start a portal process.
#[derive(Debug, Clone)]
pub struct PortalOpts {
    pub lease_ttl_s: u64,
    pub margin_s: u64,
    /// The database (a test's PostgreSQL database, for replicas); none: a SQLite file.
    pub db_url: Option<String>,
    /// Run the SSH gateway on a port of its own.
    pub ssh: bool,
    /// This machine's address as the agents' host sees it: the replica tells agents to
    /// dial it there for SSH relays (`[ssh] relay_url`). None: agents dial their portal.
    pub relay_host: Option<String>,
    /// `--log-format json`.
    pub json_logs: bool,
    /// More TOML for the configuration file (whole sections: `[utilization]\n...`).
    pub extra_toml: String,
    /// Skews the process's clock by this many seconds (`COMMONS_TEST_CLOCK_OFFSET_S`,
    /// honoured by debug builds only).
    pub clock_offset_s: i64,
    /// More settings of the `[ssh]` section, one `key = value` a line (with `ssh`).
    pub ssh_settings: String,
    /// The insecure development login (for tests that sign in through pages). The portal
    /// allows it on loopback only, so it listens on 127.0.0.1 and agents reach it through
    /// a [`forwarder::Forwarder`]; without it, the portal listens on every address.
    pub dev_login: bool,
}

impl Default for PortalOpts {
    fn default() -> Self {
        Self {
            json_logs: false,
            lease_ttl_s: 8,
            margin_s: 3,
            db_url: None,
            ssh: false,
            relay_host: None,
            extra_toml: String::new(),
            clock_offset_s: 0,
            ssh_settings: String::new(),
            dev_login: false,
        }
    }
}

impl PortalProcess {
    /// The portal's process id, while it runs (for `ssh_figures`' CPU counts).
    #[allow(dead_code)]
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Seeds lab `vision` with user alice and starts the portal with short leases.
    pub fn start(lease_ttl_s: u64, margin_s: u64) -> (PortalProcess, String) {
        Self::start_opts(PortalOpts {
            lease_ttl_s,
            margin_s,
            ..Default::default()
        })
    }

    /// Like [`PortalProcess::start`], with options.
    pub fn start_opts(o: PortalOpts) -> (PortalProcess, String) {
        let mut p = Self::configure(&o, None);
        p.admin(&["create-lab", "vision", "--name", "Vision"]);
        // Job ids of their own: tests run side by side on one Docker Engine, and the
        // containers' labels name jobs by id.
        {
            use diesel::{Connection, RunQueryDsl};
            let first = 1_000_000 + u64::from(rand::random::<u32>() % 1_000_000) * 1000;
            if let Some(path) = p.db_url.strip_prefix("sqlite://") {
                let mut c = diesel::SqliteConnection::establish(path).unwrap();
                diesel::sql_query(format!(
                    "INSERT INTO sqlite_sequence (name, seq) VALUES ('jobs', {first})"
                ))
                .execute(&mut c)
                .unwrap();
            } else {
                let mut c = diesel::PgConnection::establish(&p.db_url).unwrap();
                diesel::sql_query(format!("SELECT setval('jobs_id_seq', {first})"))
                    .execute(&mut c)
                    .unwrap();
            }
        }
        p.admin(&[
            "create-user",
            "alice",
            "--email",
            "alice@x.test",
            "--lab",
            "vision",
            "--role",
            "admin",
        ]);
        p.admin(&["create-lab", "physics", "--name", "Physics"]);
        // The jobs' image, on the campus allow-list at its local ID (the operator CLI).
        demo_image();
        p.admin(&["images", "allow", "commons-demo:latest"]);
        p.admin(&[
            "create-user",
            "bob",
            "--email",
            "bob@x.test",
            "--lab",
            "physics",
        ]);
        let token = p.admin(&["api-token", "alice"]);
        p.spawn();
        (p, token)
    }

    /// A second replica on the same (PostgreSQL) database, sharing the SSH host key; it
    /// tells agents to dial it for relays.
    pub fn replica(&self, o: &PortalOpts) -> PortalProcess {
        let o = PortalOpts {
            db_url: Some(self.db_url.clone()),
            ..o.clone()
        };
        let key = self.dir.path().join("ssh_host_key");
        let mut p = Self::configure(&o, Some(&key));
        // The same session key: a user logged in through one replica is logged in on all.
        std::fs::copy(
            self.dir.path().join("session.key"),
            p.dir.path().join("session.key"),
        )
        .unwrap();
        p.spawn();
        p
    }

    fn configure(o: &PortalOpts, host_key: Option<&Path>) -> PortalProcess {
        let dir = tempfile::tempdir().unwrap();
        let db_url = o
            .db_url
            .clone()
            .unwrap_or_else(|| format!("sqlite://{}", dir.path().join("commons.db").display()));
        let port = free_port();
        let config = dir.path().join("portal.toml");
        let session_key = dir.path().join("session.key");
        std::fs::write(
            &session_key,
            [rand::random::<[u8; 32]>(), rand::random::<[u8; 32]>()].concat(),
        )
        .unwrap();
        // Beyond loopback, /metrics needs its scrape token (the portal refuses to start
        // without one).
        let metrics_token = hex::encode(rand::random::<[u8; 16]>());
        let token_file = dir.path().join("metrics.token");
        std::fs::write(&token_file, &metrics_token).unwrap();
        let (listen, forwarder) = if o.dev_login {
            ("127.0.0.1", Some(forwarder::Forwarder::start(port)))
        } else {
            ("0.0.0.0", None)
        };
        let mut text = format!(
            "database_url = \"{db_url}\"\nlisten = \"{listen}:{port}\"\n\
             insecure_dev_login = {}\nsession_key_file = \"{}\"\n\
             [scheduler]\ntick_ms = 200\nheartbeat_s = 1\nlease_ttl_s = {}\n\
             lease_margin_s = {}\nworld_check_s = 0\n[policy]\ndefault_grace_s = 5\n\
             [metrics]\nbearer_token_file = \"{}\"\n",
            o.dev_login,
            session_key.display(),
            o.lease_ttl_s,
            o.margin_s,
            token_file.display(),
        );
        let agent_port = forwarder.as_ref().map_or(port, |f| f.port);
        let mut ssh_port = None;
        if o.ssh {
            let sp = free_port();
            ssh_port = Some(sp);
            let key = host_key
                .map(Path::to_path_buf)
                .unwrap_or_else(|| dir.path().join("ssh_host_key"));
            text.push_str(&format!(
                "[ssh]\nlisten = \"127.0.0.1:{sp}\"\nhost_key_file = \"{}\"\n",
                key.display()
            ));
            if let Some(h) = &o.relay_host {
                text.push_str(&format!("relay_url = \"http://{h}:{agent_port}\"\n"));
            }
            text.push_str(&o.ssh_settings);
        }
        text.push_str(&o.extra_toml);
        std::fs::write(&config, text).unwrap();
        PortalProcess {
            dir,
            port,
            ssh_port,
            child: None,
            config,
            db_url,
            json_logs: o.json_logs,
            clock_offset_s: o.clock_offset_s,
            metrics_token,
            forwarder,
        }
    }

    pub fn admin(&self, args: &[&str]) -> String {
        let out = Command::new(portal_binary())
            .args(["admin", "--database-url", &self.db_url])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "admin {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    fn spawn(&mut self) {
        let log = std::fs::File::create(self.dir.path().join("portal.log")).unwrap();
        let format = if self.json_logs { "json" } else { "text" };
        let child = Command::new(portal_binary())
            .args(["--log-format", format, "serve", "--config"])
            .arg(&self.config)
            .env(
                commons_portal::db::TEST_CLOCK_OFFSET_ENV,
                self.clock_offset_s.to_string(),
            )
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "the portal did not start");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// What the portal process logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("portal.log")).unwrap_or_default()
    }

    /// The audit log's entries of `action`: (actor, target, after).
    pub fn audit(&self, action: &str) -> Vec<(String, String, String)> {
        use diesel::{Connection, RunQueryDsl};
        #[derive(diesel::QueryableByName)]
        struct Row {
            #[diesel(sql_type = diesel::sql_types::Text)]
            actor: String,
            #[diesel(sql_type = diesel::sql_types::Text)]
            target: String,
            #[diesel(sql_type = diesel::sql_types::Text)]
            after: String,
        }
        let q = |p: &str| {
            diesel::sql_query(format!(
                "SELECT actor, target, after FROM audit_log WHERE action = {p} ORDER BY id"
            ))
            .bind::<diesel::sql_types::Text, _>(action.to_string())
        };
        let rows: Vec<Row> = match self.db_url.strip_prefix("sqlite://") {
            Some(path) => q("?")
                .load(&mut diesel::SqliteConnection::establish(path).unwrap())
                .unwrap(),
            None => q("$1")
                .load(&mut diesel::PgConnection::establish(&self.db_url).unwrap())
                .unwrap(),
        };
        rows.into_iter()
            .map(|r| (r.actor, r.target, r.after))
            .collect()
    }

    /// A clean stop (SIGTERM), as systemd does it.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            run(&["kill", "-TERM", &c.id().to_string()]);
            let _ = c.wait();
        }
    }

    /// kill -9: the process dies at once, as in a crash or a lost machine.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The port agents on virtual hosts dial (the forwarder's, with the dev login).
    pub fn agent_port(&self) -> u16 {
        self.forwarder.as_ref().map_or(self.port, |f| f.port)
    }

    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }
}

impl Drop for PortalProcess {
    /// Stops the portal; its scheduler's world must have equalled a fresh read after
    /// every round (`world_check_s = 0`): a mismatch in its log fails the test.
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let log = self.log();
        if let Some(line) = log.lines().find(|l| l.contains("world differed")) {
            if !std::thread::panicking() {
                panic!("the portal's scheduler world differed from a fresh read: {line}");
            }
        }
    }
}

/// An agent process on a virtual host.
pub struct AgentProcess {
    pub state: tempfile::TempDir,
    portal: String,
    ns: String,
    name: String,
    child: Option<Child>,
    /// More arguments for `commons-agent run` (`--idle-guest 10s`).
    extra: Vec<String>,
}

impl AgentProcess {
    /// An agent of `lab`'s server with more `run` flags.
    pub fn start_with(
        host: &Host,
        portal: &PortalProcess,
        lab: &str,
        name: &str,
        gpus: &str,
        extra: &[&str],
    ) -> AgentProcess {
        demo_image();
        let mut a = AgentProcess {
            state: tempfile::tempdir().unwrap(),
            portal: format!("http://{}:{}", host.gateway, portal.agent_port()),
            ns: host.ns.clone(),
            name: name.to_string(),
            child: None,
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        let token = portal.admin(&["enrol-token", lab]);
        a.spawn(Some(&token), gpus);
        a
    }

    /// An agent that dials `url` (a reverse proxy in front of the replicas) instead of
    /// the portal process itself; enrolled with a token of `portal`.
    pub fn start_via(
        host: &Host,
        portal: &PortalProcess,
        url: String,
        lab: &str,
        name: &str,
        gpus: &str,
    ) -> AgentProcess {
        demo_image();
        let mut a = AgentProcess {
            state: tempfile::tempdir().unwrap(),
            portal: url,
            ns: host.ns.clone(),
            name: name.to_string(),
            child: None,
            extra: Vec::new(),
        };
        let token = portal.admin(&["enrol-token", lab]);
        a.spawn(Some(&token), gpus);
        a
    }

    /// Waits up to `within` for the process to end by itself; its exit status.
    pub fn exited_within(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + within;
        let child = self.child.as_mut()?;
        loop {
            if let Ok(Some(s)) = child.try_wait() {
                return Some(s);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn start(host: &Host, portal: &PortalProcess, name: &str, gpus: &str) -> AgentProcess {
        Self::start_for(host, portal, "vision", name, gpus)
    }

    /// An agent of another lab's server.
    pub fn start_for(
        host: &Host,
        portal: &PortalProcess,
        lab: &str,
        name: &str,
        gpus: &str,
    ) -> AgentProcess {
        Self::start_with(host, portal, lab, name, gpus, &[])
    }

    fn spawn(&mut self, token: Option<&str>, gpus: &str) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.state.path().join("agent.log"))
            .unwrap();
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.ns])
            .arg(agent_binary())
            .args(["run", "--portal", &self.portal, "--state-dir"])
            .arg(self.state.path())
            // A host of its own: agents of every test share this Docker Engine, and an
            // agent stops the containers of other agent ids with its host id.
            .arg("--host-id-file")
            .arg(self.state.path().join("host-id"))
            .args(["--gpus", gpus, "--name", &self.name])
            // This shared machine's disk is often fuller than the default floor (10 %),
            // which would keep every guest out; `disk.rs` tests the floor.
            .args(["--min-free-disk", "0%"])
            .args(&self.extra)
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        if let Some(t) = token {
            cmd.env("COMMONS_ENROL_TOKEN", t);
        }
        self.child = Some(cmd.spawn().unwrap());
    }

    /// kill -9: the process dies, its containers (and their guards) stay.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn start_again(&mut self, gpus: &str) {
        self.kill9();
        self.spawn(None, gpus);
    }

    /// The server vanishes: the agent and every container it ran are gone at once.
    pub fn vanish(&mut self) {
        self.kill9();
        if let Ok(Some(c)) = commons_agent::state::load_credential(self.state.path()) {
            let out = Command::new("docker")
                .args([
                    "ps",
                    "-aq",
                    "--filter",
                    &format!("label=commons.agent={}", c.agent_id),
                ])
                .output()
                .unwrap();
            for id in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                let _ = Command::new("docker").args(["rm", "-f", id]).output();
            }
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.state.path().join("agent.log")).unwrap_or_default()
    }

    /// Waits until the portal shows this agent's server online. The deadline leaves room
    /// for a second enrolment: the agent's first try may hang on a connect for tens of
    /// seconds on a busy machine. The failure message holds the agent's log and the
    /// host's network.
    pub async fn wait_online(&self, api: &Api, host: &Host) {
        let within = Duration::from_secs(150);
        let deadline = Instant::now() + within;
        while !api
            .get("/api/v1/nodes")
            .await
            .and_then(|n| n.as_array().cloned())
            .unwrap_or_default()
            .iter()
            .any(|n| n["name"] == self.name.as_str() && n["online"] == true)
        {
            assert!(
                Instant::now() < deadline,
                "{} not online after {within:?}; its log:\n{}\nthe network:\n{}",
                self.name,
                self.log(),
                host.network()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The agent's process id (`ip netns exec` becomes the agent), while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        self.kill9();
        // Job volumes an agent mounted as images (none under `ip netns exec`, whose
        // mounts the engine cannot see: such an agent watches its volumes instead).
        commons_agent::disk::release_all(self.state.path());
    }
}

/// Removes every container of the given jobs (the tests' cleanup).
pub fn remove_containers(jobs: &[i64]) {
    for job in jobs {
        let out = Command::new("docker")
            .args(["ps", "-aq", "--filter", &format!("label=commons.job={job}")])
            .output()
            .unwrap();
        for id in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            let _ = Command::new("docker").args(["rm", "-f", id]).output();
        }
    }
}

/// A small API client for the portal process.
pub struct Api {
    pub url: String,
    pub token: String,
    http: reqwest::Client,
}

impl Api {
    pub fn new(url: String, token: String) -> Api {
        Api {
            url,
            token,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .unwrap(),
        }
    }

    pub async fn get(&self, path: &str) -> Option<Value> {
        let r = self
            .http
            .get(format!("{}{path}", self.url))
            .bearer_auth(&self.token)
            .send()
            .await
            .ok()?;
        r.json().await.ok()
    }

    pub async fn submit(&self, body: Value) -> i64 {
        let r: Value = self
            .http
            .post(format!("{}/api/v1/jobs", self.url))
            .bearer_auth(&self.token)
            .json(&body)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        r["id"].as_i64().unwrap_or_else(|| panic!("submit: {r}"))
    }

    /// Waits until `check` holds for the job's JSON.
    pub async fn wait_job(
        &self,
        job: i64,
        within: Duration,
        what: &str,
        check: impl Fn(&Value) -> bool,
    ) -> Value {
        self.wait_job_telling(job, within, what, check, String::new)
            .await
    }

    /// [`Api::wait_job`], saying what `tell` returns (logs, say) if it times out.
    pub async fn wait_job_telling(
        &self,
        job: i64,
        within: Duration,
        what: &str,
        check: impl Fn(&Value) -> bool,
        tell: impl Fn() -> String,
    ) -> Value {
        let deadline = Instant::now() + within;
        loop {
            let j = self.get(&format!("/api/v1/jobs/{job}")).await;
            if let Some(j) = &j {
                if check(j) {
                    return j.clone();
                }
            }
            if Instant::now() >= deadline {
                let events = self
                    .get(&format!("/api/v1/jobs/{job}/events"))
                    .await
                    .unwrap_or_default();
                panic!(
                    "timed out after {within:?} waiting for {what}: {}\nevents: {events}\n{}",
                    j.unwrap_or_default(),
                    tell()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub async fn put(&self, path: &str, body: Value) -> u16 {
        self.http
            .put(format!("{}{path}", self.url))
            .bearer_auth(&self.token)
            .json(&body)
            .send()
            .await
            .map(|r| r.status().as_u16())
            .unwrap_or(0)
    }

    pub async fn logs(&self, job: i64) -> String {
        match self
            .http
            .get(format!("{}/api/v1/jobs/{job}/logs", self.url))
            .bearer_auth(&self.token)
            .send()
            .await
        {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        }
    }

    /// Waits until `n` servers are online.
    pub async fn wait_online(&self, n: usize, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let online = self.nodes_online().await;
            if online >= n {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{online} of {n} servers online after {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub async fn nodes_online(&self) -> usize {
        self.get("/api/v1/nodes")
            .await
            .and_then(|n| {
                n.as_array()
                    .map(|a| a.iter().filter(|n| n["online"] == true).count())
            })
            .unwrap_or(0)
    }
}
