//! The test harness: a real portal (in-process, on a free port, with a fresh database)
//! and a real agent (fake GPUs, the real Docker Engine), plus small HTTP helpers.
//!
//! SQLite: a file in a temp dir. PostgreSQL: a fresh database on the server named by
//! `TEST_DATABASE_URL` (scripts/test.sh starts a private one); a missing server is a test
//! failure that says how to get one, never a skip.

use commons_portal::db::models::Role;
use commons_portal::db::users;
use commons_portal::{Config, RunningPortal};
use serde_json::Value;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

pub const BACKENDS: [Backend; 2] = [Backend::Sqlite, Backend::Postgres];

/// A database for one test; dropped (PostgreSQL) when the value goes.
pub struct TestDb {
    pub url: String,
    admin_url: Option<String>,
    name: String,
    _dir: Option<tempfile::TempDir>,
}

impl TestDb {
    pub fn new(backend: Backend) -> TestDb {
        match backend {
            Backend::Sqlite => {
                let dir = tempfile::tempdir().unwrap();
                TestDb {
                    url: format!("sqlite://{}", dir.path().join("commons.db").display()),
                    admin_url: None,
                    name: String::new(),
                    _dir: Some(dir),
                }
            }
            Backend::Postgres => {
                use diesel::{Connection, RunQueryDsl};
                let admin = std::env::var("TEST_DATABASE_URL").expect(
                    "PostgreSQL tests need TEST_DATABASE_URL=postgres://USER@HOST:PORT/postgres \
                     (run scripts/test.sh, which starts a private PostgreSQL server)",
                );
                let name = format!("commons_t_{:016x}", rand::random::<u64>());
                let mut c = diesel::PgConnection::establish(&admin).unwrap_or_else(|e| {
                    panic!("cannot reach PostgreSQL at TEST_DATABASE_URL: {e}")
                });
                diesel::sql_query(format!("CREATE DATABASE {name}"))
                    .execute(&mut c)
                    .unwrap();
                let base = admin.rsplit_once('/').map(|(b, _)| b).unwrap_or(&admin);
                TestDb {
                    url: format!("{base}/{name}"),
                    admin_url: Some(admin),
                    name,
                    _dir: None,
                }
            }
        }
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if let Some(admin) = &self.admin_url {
            use diesel::{Connection, RunQueryDsl};
            if let Ok(mut c) = diesel::PgConnection::establish(admin) {
                let _ = diesel::sql_query(format!(
                    "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                    self.name
                ))
                .execute(&mut c);
            }
        }
    }
}

/// Builds the demo image once per test run.
pub fn demo_image() {
    static DONE: OnceLock<Mutex<bool>> = OnceLock::new();
    let mut done = DONE.get_or_init(|| Mutex::new(false)).lock().unwrap();
    if !*done {
        commons_portal::demo::ensure_demo_image()
            .expect("the demo image is needed: Docker and busybox-static must be installed");
        *done = true;
    }
}

pub struct TestPortal {
    pub backend: Backend,
    pub portal: RunningPortal,
    pub url: String,
    pub http: reqwest::Client,
    /// alice: member of lab vision.
    pub alice: String,
    /// bob: member of lab physics.
    pub bob: String,
    /// carol: admin of lab vision.
    pub carol: String,
    /// olga: operator.
    pub olga: String,
    /// Kept so the database lives (and is dropped) with the portal.
    _db: TestDb,
    _world: WorldCheck,
}

/// Fails the test, when its portal goes, if the scheduler's world ever differed from a
/// fresh read of the database (every round is checked: `world_check_s = 0`); the log
/// says what differed.
pub struct WorldCheck(std::sync::Arc<commons_portal::metrics::Metrics>);

impl WorldCheck {
    fn of(p: &RunningPortal) -> WorldCheck {
        WorldCheck(std::sync::Arc::clone(&p.state.metrics))
    }
}

impl Drop for WorldCheck {
    fn drop(&mut self) {
        let mismatches = self.0.world_mismatches.get();
        if mismatches > 0 && !std::thread::panicking() {
            panic!(
                "the scheduler's world differed from a fresh read {mismatches} time(s); \
                 see the log line 'the scheduler's world differed'"
            );
        }
    }
}

/// A change to a test portal's configuration.
type Adjust<'a> = Box<dyn FnOnce(&mut Config) + 'a>;

/// How a [`TestPortal`] is set up before it starts.
pub struct TestPortalBuilder<'a> {
    backend: Backend,
    adjust: Vec<Adjust<'a>>,
}

impl<'a> TestPortalBuilder<'a> {
    /// Adjusts the configuration (SSO settings, limits, a store) after the test settings;
    /// several adjustments apply in order.
    pub fn config(mut self, adjust: impl FnOnce(&mut Config) + 'a) -> Self {
        self.adjust.push(Box::new(adjust));
        self
    }

    pub async fn start(self) -> TestPortal {
        let adjust = self.adjust;
        TestPortal::start_with(self.backend, move |c| {
            for a in adjust {
                a(c);
            }
        })
        .await
    }
}

impl TestPortal {
    /// A portal on `backend` with the test settings (fast ticks, short leases, the
    /// development login), four users in two labs, and the demo image allowed.
    pub async fn start(backend: Backend) -> TestPortal {
        Self::builder(backend).start().await
    }

    /// The same, set up step by step: `TestPortal::builder(b).config(|c| ...).start()`.
    pub fn builder<'a>(backend: Backend) -> TestPortalBuilder<'a> {
        TestPortalBuilder {
            backend,
            adjust: Vec::new(),
        }
    }

    async fn start_with(backend: Backend, adjust: impl FnOnce(&mut Config)) -> TestPortal {
        init_logging();
        let db = TestDb::new(backend);
        let mut config = Config {
            database_url: db.url.clone(),
            listen: "127.0.0.1:0".into(),
            insecure_dev_login: true,
            scheduler: commons_portal::config::SchedulerConfig {
                tick_ms: 200,
                heartbeat_s: 1,
                lease_ttl_s: 10,
                lease_margin_s: 2,
                // Every round checks the scheduler's world against a fresh read; a
                // mismatch fails the test when its portal is dropped.
                world_check_s: 0,
                ..Default::default()
            },
            ..Config::default()
        };
        // The store's free-space floor is a share of the whole disk, which other work on a
        // shared machine fills: only the floor's own test sets one.
        config.checkpoints.min_free_gb = 0.0;
        config.checkpoints.min_free_percent = 0.0;
        adjust(&mut config);
        let portal = commons_portal::start(config).await.expect("portal starts");
        // Every test's jobs name the demo image: it is on the campus allow-list, pinned
        // to its ID in the local engine, as `commons-portal demo` does.
        let dbh = portal.state.db.clone();
        tokio::task::spawn_blocking(move || {
            demo_image();
            commons_portal::demo::allow_demo_image(&dbh).expect("allow the demo image")
        })
        .await
        .unwrap();
        let dbh = portal.state.db.clone();
        let (alice, bob, carol, olga) = tokio::task::spawn_blocking(move || {
            dbh.run_blocking(|c| {
                let vision = users::create_lab(c, "vision", "Vision Lab")?;
                let physics = users::create_lab(c, "physics", "Physics Lab")?;
                let a = users::create_user(c, "alice", "alice@campus.test", false)?;
                users::set_membership(c, a.id, vision.id, Role::Member)?;
                let b = users::create_user(c, "bob", "bob@campus.test", false)?;
                users::set_membership(c, b.id, physics.id, Role::Member)?;
                let carol = users::create_user(c, "carol", "carol@campus.test", false)?;
                users::set_membership(c, carol.id, vision.id, Role::Admin)?;
                let olga = users::create_user(c, "olga", "olga@campus.test", true)?;
                Ok::<_, commons_portal::error::AppError>((
                    users::create_api_token(c, a.id, "test")?,
                    users::create_api_token(c, b.id, "test")?,
                    users::create_api_token(c, carol.id, "test")?,
                    users::create_api_token(c, olga.id, "test")?,
                ))
            })
            .unwrap()
        })
        .await
        .unwrap();
        TestPortal {
            backend,
            url: portal.url(),
            _world: WorldCheck::of(&portal),
            portal,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()
                .unwrap(),
            alice,
            bob,
            carol,
            olga,
            _db: db,
        }
    }

    /// Numbers this portal's jobs from a random point far from 1: tests that judge
    /// containers by their job label alone (the Docker Engine's timeline) then never
    /// see another test's job of the same number (every portal starts at 1). Call it
    /// before the first submission.
    pub async fn spread_job_ids(&self) {
        use diesel::RunQueryDsl;
        let first = 1_000_000 + u64::from(rand::random::<u32>() % 1_000_000) * 1000;
        let sql = match self.backend {
            Backend::Sqlite => {
                format!("INSERT INTO sqlite_sequence (name, seq) VALUES ('jobs', {first})")
            }
            Backend::Postgres => format!("SELECT setval('jobs_id_seq', {first})"),
        };
        self.portal
            .state
            .db
            .run(move |c| {
                diesel::sql_query(sql)
                    .execute(c)
                    .map_err(commons_portal::db::DbError::from)
            })
            .await
            .unwrap();
    }

    pub fn enrol_token(&self, lab: &str) -> String {
        let db = self.portal.state.db.clone();
        commons_portal::admin::enrol_token(&db, lab).unwrap()
    }

    /// Starts an agent for `lab` with the given fake GPUs.
    pub async fn agent(&self, lab: &str, gpus: &str) -> TestAgent {
        self.agent_at(&self.url, lab, gpus).await
    }

    /// The same, connected to the portal (replica) at `portal`.
    pub async fn agent_at(&self, portal: &str, lab: &str, gpus: &str) -> TestAgent {
        self.agent_with(portal, lab, gpus, |_| {}).await
    }

    /// An agent for `lab` whose configuration `set` changes first (`commons-agent run`
    /// flags such as `--max-job-disk-gb`).
    pub async fn agent_with(
        &self,
        portal: &str,
        lab: &str,
        gpus: &str,
        set: impl FnOnce(&mut commons_agent::AgentConfig),
    ) -> TestAgent {
        let token = self.enrol_token(lab);
        let dir = tempfile::tempdir().unwrap();
        self.agent_in(portal, lab, gpus, dir, Some(token), None, set)
            .await
    }

    /// The same, with the host id file `host_id_file`; `None`: a host of its own. Tests run
    /// many agents on one Docker Engine, and an agent stops the containers of every other
    /// agent id of its host (`commons_agent::host`): only a test of that shares a file.
    pub async fn agent_on_host(
        &self,
        portal: &str,
        lab: &str,
        gpus: &str,
        host_id_file: Option<std::path::PathBuf>,
    ) -> TestAgent {
        let token = self.enrol_token(lab);
        let dir = tempfile::tempdir().unwrap();
        self.agent_in(portal, lab, gpus, dir, Some(token), host_id_file, |_| {})
            .await
    }

    /// A second agent with the node credential of `of` (a cloned server or state dir):
    /// its own state dir holding a copy of that credential, under an agent id of its own
    /// (as its own Docker Engine would have it), and a host of its own. Not waited for.
    pub fn clone_of(&self, of: &TestAgent, gpus: &str) -> TestAgent {
        let dir = tempfile::tempdir().unwrap();
        let mut cred = commons_agent::state::load_credential(of.dir.path())
            .unwrap()
            .expect("the agent is enrolled");
        cred.agent_id = format!("{:016x}", rand::random::<u64>());
        commons_agent::state::save_credential(dir.path(), &cred).unwrap();
        let host_dir = tempfile::tempdir().unwrap();
        let config = agent_config(
            &of.config.portal,
            None,
            dir.path(),
            host_dir.path().join("host-id"),
            gpus,
            "clone",
        );
        TestAgent {
            task: tokio::spawn(commons_agent::run(config.clone())),
            dir,
            _host_dir: host_dir,
            token: String::new(),
            config,
        }
    }

    /// Starts an agent on state dir `dir` (enrolling with `token` if given), its
    /// configuration changed by `set` first, and waits until a node of `lab` is online
    /// with its GPUs.
    #[allow(clippy::too_many_arguments)]
    async fn agent_in(
        &self,
        portal: &str,
        lab: &str,
        gpus: &str,
        dir: tempfile::TempDir,
        token: Option<String>,
        host_id_file: Option<std::path::PathBuf>,
        set: impl FnOnce(&mut commons_agent::AgentConfig),
    ) -> TestAgent {
        demo_image();
        let host_dir = tempfile::tempdir().unwrap();
        let host_id_file = host_id_file.unwrap_or_else(|| host_dir.path().join("host-id"));
        let hostname = format!("{lab}-server");
        let mut config = agent_config(
            portal,
            token.clone(),
            dir.path(),
            host_id_file,
            gpus,
            &hostname,
        );
        set(&mut config);
        let task = tokio::spawn(commons_agent::run(config.clone()));
        let agent = TestAgent {
            task,
            dir,
            _host_dir: host_dir,
            token: token.unwrap_or_default(),
            config,
        };
        self.wait_online(lab, config_gpus(&agent.config).max(1))
            .await;
        agent
    }

    /// Waits until a node of `lab` is online with `gpus` GPUs.
    pub async fn wait_online(&self, lab: &str, gpus: usize) {
        let me = self;
        wait_for(Duration::from_secs(30), "agent online", || async move {
            let nodes = me.get_json(&me.alice, "/api/v1/nodes").await;
            nodes.as_array().unwrap().iter().any(|n| {
                n["online"] == true
                    && n["lab"] == lab
                    && n["gpus"].as_array().map(|g| g.len()) == Some(gpus)
            })
        })
        .await;
    }

    pub async fn get_json(&self, token: &str, path: &str) -> Value {
        let r = self
            .http
            .get(format!("{}{path}", self.url))
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "GET {path}: {}", r.status());
        r.json().await.unwrap()
    }

    pub async fn put_json(&self, token: &str, path: &str, body: &Value) -> (u16, Value) {
        self.send_json(self.http.put(format!("{}{path}", self.url)), token, body)
            .await
    }

    pub async fn post_json(&self, token: &str, path: &str, body: &Value) -> (u16, Value) {
        self.send_json(self.http.post(format!("{}{path}", self.url)), token, body)
            .await
    }

    /// Sends `body` as JSON with `token`: the status and the answer (JSON, or its text).
    async fn send_json(
        &self,
        req: reqwest::RequestBuilder,
        token: &str,
        body: &Value,
    ) -> (u16, Value) {
        let r = req.bearer_auth(token).json(body).send().await.unwrap();
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    pub async fn submit(&self, token: &str, body: Value) -> i64 {
        let (status, v) = self.post_json(token, "/api/v1/jobs", &body).await;
        assert_eq!(status, 201, "submit: {v}");
        v["id"].as_i64().unwrap()
    }

    pub async fn job(&self, token: &str, id: i64) -> Value {
        self.get_json(token, &format!("/api/v1/jobs/{id}")).await
    }

    /// Waits until the job is in one of `states`; returns it.
    pub async fn wait_state(
        &self,
        token: &str,
        id: i64,
        states: &[&str],
        within: Duration,
    ) -> Value {
        let deadline = Instant::now() + within;
        loop {
            let j = self.job(token, id).await;
            if states.iter().any(|s| j["state"] == *s) {
                return j;
            }
            assert!(
                Instant::now() < deadline,
                "[{:?}] job {id} did not reach {states:?} in {within:?}; it is {j}",
                self.backend
            );
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
    }

    pub async fn logs(&self, token: &str, id: i64) -> String {
        self.http
            .get(format!("{}/api/v1/jobs/{id}/logs", self.url))
            .bearer_auth(token)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// A second portal (replica) on the same database.
    pub async fn replica(&self) -> RunningPortal {
        let mut config = (*self.portal.state.config).clone();
        config.listen = "127.0.0.1:0".into();
        commons_portal::start(config).await.expect("replica starts")
    }

    /// Stops the portal cleanly (as SIGTERM would: running leases are extended), keeps
    /// it down for `down`, and starts it again on the same address and database.
    pub async fn restart_after(self, down: Duration) -> TestPortal {
        let config = (*self.portal.state.config).clone();
        let mut config = config;
        config.listen = self.portal.addr.to_string();
        self.portal.shutdown().await;
        tokio::time::sleep(down).await;
        let portal = commons_portal::start(config)
            .await
            .expect("portal restarts");
        TestPortal {
            url: portal.url(),
            _world: WorldCheck::of(&portal),
            portal,
            ..self
        }
    }

    pub async fn stop(self) {
        self.portal.scheduler.abort();
        self.portal.handle.stop(false).await;
    }
}

/// An agent's configuration for the tests (fake GPUs, everything else default).
fn agent_config(
    portal: &str,
    enrol_token: Option<String>,
    state_dir: &std::path::Path,
    host_id_file: std::path::PathBuf,
    gpus: &str,
    hostname: &str,
) -> commons_agent::AgentConfig {
    commons_agent::AgentConfig {
        enrol_token,
        host_id_file,
        gpus: gpus.parse().unwrap(),
        hostname: hostname.to_string(),
        // Watched volumes (no mounts: in-process agents are aborted, not stopped), and no
        // floor: this machine's disk, shared by every session, is often fuller than the
        // default 10 %; `disk.rs` tests the floor on purpose.
        disk: commons_agent::disk::DiskPolicy {
            floor: commons_agent::disk::Floor::Percent(0),
            ..Default::default()
        },
        ..commons_agent::AgentConfig::new(portal, state_dir)
    }
}

fn config_gpus(c: &commons_agent::AgentConfig) -> usize {
    match &c.gpus {
        commons_agent::GpuMode::Fake(g) => g.len(),
        _ => 0,
    }
}

pub struct TestAgent {
    pub task: tokio::task::JoinHandle<anyhow::Result<()>>,
    pub dir: tempfile::TempDir,
    /// Where its own host id file lives (unless the test gave one).
    _host_dir: tempfile::TempDir,
    pub token: String,
    pub config: commons_agent::AgentConfig,
}

impl TestAgent {
    /// Stops the agent as a crash would (its containers and guards stay), and starts it
    /// again on the same state dir with `gpus`.
    pub async fn restart(&mut self, gpus: &str) {
        self.task.abort();
        let _ = (&mut self.task).await;
        // The agent's own tasks (its control socket's server) end at their next poll, not
        // with it: until then the socket answers, and a new agent on this state dir would
        // rightly refuse to start beside it.
        let socket = commons_agent::owner::socket::socket_path(self.dir.path());
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::os::unix::net::UnixStream::connect(&socket).is_ok() {
            assert!(
                Instant::now() < deadline,
                "the aborted agent's control socket still answers after 30 s"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.config.gpus = gpus.parse().unwrap();
        self.config.enrol_token = None;
        self.task = tokio::spawn(commons_agent::run(self.config.clone()));
    }

    pub fn agent_id(&self) -> String {
        commons_agent::state::load_credential(self.dir.path())
            .unwrap()
            .unwrap()
            .agent_id
    }

    /// Ids of this agent's containers for a job (running or not).
    pub fn containers(&self, job: i64) -> Vec<String> {
        let out = std::process::Command::new("docker")
            .args([
                "ps",
                "-a",
                "-q",
                "--filter",
                &format!("label=commons.job={job}"),
                "--filter",
                &format!("label=commons.agent={}", self.agent_id()),
            ])
            .output()
            .expect("docker CLI");
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .map(String::from)
            .collect()
    }
}

impl Drop for TestAgent {
    fn drop(&mut self) {
        self.task.abort();
        // Leave no containers behind on the shared engine.
        if let Ok(Some(c)) = commons_agent::state::load_credential(self.dir.path()) {
            remove_agent_containers(&c.agent_id);
        }
        commons_agent::disk::release_all(self.dir.path());
    }
}

/// Removes every container of agent id `agent_id` (only ever a test's own agent's).
pub fn remove_agent_containers(agent_id: &str) {
    let out = std::process::Command::new("docker")
        .args([
            "ps",
            "-a",
            "-q",
            "--filter",
            &format!("label=commons.agent={agent_id}"),
        ])
        .output();
    if let Ok(out) = out {
        for id in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            let _ = std::process::Command::new("docker")
                .args(["rm", "-f", id])
                .output();
        }
    }
}

/// Logs to the test's captured output (shown for failing tests); `RUST_LOG` filters.
fn init_logging() {
    // fantoccini's TLS connector needs a process-wide rustls provider, even for http.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,actix_server=warn".into()),
        )
        .with_test_writer()
        .try_init();
}

/// Polls `check` until it is true, or fails the test after `within`.
pub async fn wait_for<F, Fut>(within: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
}
