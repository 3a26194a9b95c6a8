//! A small campus in a fresh SQLite file (or PostgreSQL database), for the database
//! layer's unit tests and the portal's (the `testkit` feature).

// Test code: a failed step is a failed test, said where it happened.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::models::{AgentClock, Job, Node};
use super::{establish, run_migrations, DbConn};
use crate as db;
use crate::domain::ValidJob;
use diesel::connection::{Connection, InstrumentationEvent};
use std::sync::{Arc, Mutex};

pub struct Campus {
    pub node: Node,
    /// Jobs that each run attempt 1 on `node` (state `starting`).
    pub jobs: Vec<Job>,
}

pub fn sqlite() -> (tempfile::TempDir, DbConn) {
    let dir = tempfile::tempdir().unwrap();
    let mut c = establish(&format!("sqlite://{}/t.db", dir.path().display())).unwrap();
    run_migrations(&mut c).unwrap();
    (dir, c)
}

/// A fresh database on the PostgreSQL server named by `TEST_DATABASE_URL` (scripts/test.sh
/// starts a private one), dropped with the guard. A missing server fails the test that
/// asked for it, with how to get one; it never skips it.
pub struct PgGuard {
    admin: String,
    name: String,
}

impl Drop for PgGuard {
    fn drop(&mut self) {
        use diesel::{Connection, RunQueryDsl};
        if let Ok(mut c) = diesel::PgConnection::establish(&self.admin) {
            let _ = diesel::sql_query(format!("DROP DATABASE {} WITH (FORCE)", self.name))
                .execute(&mut c);
        }
    }
}

impl PgGuard {
    /// The URL of the guard's database (to open a [`crate::Db`] on it).
    pub fn url(&self) -> String {
        let base = self
            .admin
            .rsplit_once('/')
            .map_or(self.admin.as_str(), |(b, _)| b);
        format!("{base}/{}", self.name)
    }
}

pub fn postgres() -> (PgGuard, DbConn) {
    use diesel::{Connection, RunQueryDsl};
    let admin = std::env::var("TEST_DATABASE_URL").expect(
        "this test needs TEST_DATABASE_URL=postgres://USER@HOST:PORT/postgres \
         (run scripts/test.sh, which starts a private PostgreSQL server)",
    );
    let name = format!("commons_u_{:016x}", rand::random::<u64>());
    let mut a = diesel::PgConnection::establish(&admin)
        .unwrap_or_else(|e| panic!("cannot reach PostgreSQL at TEST_DATABASE_URL: {e}"));
    diesel::sql_query(format!("CREATE DATABASE {name}"))
        .execute(&mut a)
        .unwrap();
    let base = admin.rsplit_once('/').map_or(admin.as_str(), |(b, _)| b);
    let guard = PgGuard {
        admin: admin.clone(),
        name: name.clone(),
    };
    let mut c = establish(&format!("{base}/{name}")).unwrap();
    run_migrations(&mut c).unwrap();
    (guard, c)
}

/// Every statement the connection runs from now on (read them with [`take`]).
pub fn statements(c: &mut DbConn) -> Arc<Mutex<Vec<String>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    c.set_instrumentation(move |e: InstrumentationEvent<'_>| {
        if let InstrumentationEvent::StartQuery { query, .. } = e {
            s.lock().unwrap().push(query.to_string());
        }
    });
    seen
}

/// The statements seen since the last call.
pub fn take(seen: &Arc<Mutex<Vec<String>>>) -> Vec<String> {
    std::mem::take(&mut *seen.lock().unwrap())
}

/// One lab, one node with one GPU that has said hello, and `n` jobs placed on it.
pub fn campus(c: &mut DbConn, n: usize) -> Campus {
    let lab = db::users::create_lab(c, "vision", "Vision").unwrap();
    let user = db::users::create_user(c, "alice", "alice@x.test", false).unwrap();
    let token = db::users::create_enrol_token(c, lab.id).unwrap();
    let (node, _, _) = db::nodes::enrol(c, &token, "n1", "0").unwrap();
    let gpu = commons_proto::GpuInfo {
        uuid: "GPU-1".into(),
        index: 0,
        model: "A100".into(),
        memory_mb: 80_000,
        fake: true,
    };
    db::nodes::upsert_gpus(c, node.id, "0", &[gpu]).unwrap();
    let clock = AgentClock {
        session: 7,
        seq: 1,
        received_at: db::now(),
    };
    db::nodes::set_agent_clock(c, node.id, &clock).unwrap();
    let gpu_id = db::nodes::list_with_gpus(c).unwrap()[0].2[0].id;
    let jobs = (0..n)
        .map(|_| {
            let job = db::jobs::insert(c, user.id, &demo_job(lab.id)).unwrap();
            let t = db::now();
            db::attempts::insert(c, job.id, 1, node.id, &[gpu_id], t, t).unwrap();
            db::jobs::set_placed(c, job.id, 1, node.id).unwrap();
            db::jobs::set_state(c, job.id, super::models::JobState::Starting, "starting").unwrap();
            db::jobs::get(c, job.id).unwrap()
        })
        .collect();
    let node = db::nodes::node_by_id(c, node.id).unwrap();
    Campus { node, jobs }
}

/// What the rules make of `{"image": "commons-demo:latest", "gpus": 1,
/// "time_limit_minutes": 5}` in lab `lab_id`: the defaults filled in.
pub fn demo_job(lab_id: i64) -> ValidJob {
    use commons_api::job::{DEFAULT_CPUS, DEFAULT_MEMORY_GB};
    ValidJob {
        image: "commons-demo:latest".into(),
        command: Vec::new(),
        env: Default::default(),
        gpus: 1,
        gpu_models: Vec::new(),
        min_gpu_memory_mb: 0,
        cpus: DEFAULT_CPUS,
        memory_mb: (DEFAULT_MEMORY_GB * 1024.0).round() as i64,
        time_limit_s: 5 * 60,
        kind: super::models::JobKind::Batch,
        lab_id,
        checkpoint_interval_s: None,
        shm_mb: None,
        disk_gb: None,
        image_digest: None,
        image_signature: None,
        image_campus: false,
        name: None,
        tags: Default::default(),
        after: Vec::new(),
        inputs: Vec::new(),
        datasets: Vec::new(),
        gpu_share: None,
    }
}
