//! `commons-portal demo`: the whole system on one machine, for a first look.
//!
//! 1. A SQLite database under the data dir, with a demo lab and users.
//! 2. The demo image `commons-demo:latest`, built without any registry if missing.
//! 3. The portal with the (insecure) development login.
//! 4. A local agent with fake GPUs and the real Docker Engine, enrolled on first start.

use crate::db::models::Role;
use crate::db::{users, Db};
use crate::{start, Config};
use anyhow::Context;
use std::path::{Path, PathBuf};

pub const DEMO_IMAGE: &str = "commons-demo:latest";
pub const DEMO_GPUS: &str = "fake:2xA100-80GB,1xRTX4090-24GB";

pub struct DemoOptions {
    pub data_dir: PathBuf,
    pub listen: String,
    pub gpus: String,
}

/// The script that builds the demo image, from the source tree.
pub fn build_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/images/build-demo.sh")
}

/// Builds `commons-demo:latest` unless the Docker Engine has it.
pub fn ensure_demo_image() -> anyhow::Result<()> {
    let have = std::process::Command::new("docker")
        .args(["image", "inspect", DEMO_IMAGE])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .context("cannot run `docker`: is Docker installed?")?;
    if have.success() {
        return Ok(());
    }
    eprintln!("building {DEMO_IMAGE} (once) ...");
    let built = std::process::Command::new("bash")
        .arg(build_script())
        .status()
        .context("cannot run the demo image build script")?;
    anyhow::ensure!(built.success(), "building {DEMO_IMAGE} failed (see above)");
    Ok(())
}

/// Creates the demo lab and users if they are missing.
fn seed(db: &Db) -> anyhow::Result<()> {
    db.run_blocking(|c| {
        let lab = match users::lab_by_slug(c, "demo") {
            Ok(l) => l,
            Err(_) => users::create_lab(c, "demo", "Demo Lab")?,
        };
        for (name, role, operator) in [
            ("alice", Role::Member, false),
            ("bob", Role::Member, false),
            ("admin", Role::Admin, true),
        ] {
            if users::user_by_name(c, name)?.is_none() {
                let u = users::create_user(c, name, &format!("{name}@demo.invalid"), operator)?;
                users::set_membership(c, u.id, lab.id, role)?;
            }
        }
        Ok::<_, crate::error::AppError>(())
    })
    .map_err(|e| anyhow::anyhow!("seeding the demo database: {e}"))
}

pub async fn run(opts: DemoOptions) -> anyhow::Result<()> {
    std::fs::create_dir_all(&opts.data_dir)?;
    let data_dir = std::fs::canonicalize(&opts.data_dir)?;
    let gpus: commons_agent::GpuMode = opts.gpus.parse()?;
    tokio::task::spawn_blocking(ensure_demo_image).await??;
    let config = Config {
        database_url: format!("sqlite://{}", data_dir.join("commons.db").display()),
        listen: opts.listen.clone(),
        insecure_dev_login: true,
        ..Config::default()
    };
    let portal = start(config).await?;
    let db = portal.state.db.clone();
    tokio::task::spawn_blocking(move || seed(&db)).await??;

    let agent_dir = data_dir.join("agent");
    let enrol_token = if commons_agent::state::load_credential(&agent_dir)?.is_none() {
        let db = portal.state.db.clone();
        Some(tokio::task::spawn_blocking(move || crate::admin::enrol_token(&db, "demo")).await??)
    } else {
        None
    };
    let url = portal.url();
    let agent = tokio::spawn(commons_agent::run(commons_agent::AgentConfig {
        portal: url.clone(),
        enrol_token,
        state_dir: agent_dir,
        gpus,
        hostname: "demo-server".into(),
    }));
    println!();
    println!("GPU Commons demo is running: {url}/");
    println!("Log in as alice (development login: INSECURE, for this machine only).");
    println!("Data in {}. Stop with Ctrl-C.", data_dir.display());
    println!();
    tokio::select! {
        r = portal.server => r??,
        r = agent => r??,
        _ = tokio::signal::ctrl_c() => portal.handle.stop(true).await,
    }
    Ok(())
}
