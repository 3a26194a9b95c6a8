//! `commons-portal demo`: the whole system on one machine, for a first look.
//!
//! 1. A SQLite database under the data dir, with a demo lab and users.
//! 2. The demo image `commons-demo:latest`, built without any registry if missing.
//! 3. The portal with the (insecure) development login.
//! 4. A local agent with fake GPUs and the real Docker Engine, enrolled on first start: the
//!    `commons-agent` binary next to this executable, run as a child process (the portal
//!    does not link the agent).

use crate::db::models::Role;
use crate::db::{users, Db};
use crate::{start, Config};
use anyhow::Context;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use tokio::signal::unix::{signal, SignalKind};

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

/// The `commons.demo-version` label of the image `deploy/images/build-demo.sh` builds.
pub const DEMO_IMAGE_VERSION: &str = "2";

/// Builds `commons-demo:latest` unless the Docker Engine has it, of this version.
pub fn ensure_demo_image() -> anyhow::Result<()> {
    let have = std::process::Command::new("docker")
        .args([
            "image",
            "inspect",
            "--format",
            "{{ index .Config.Labels \"commons.demo-version\" }}",
            DEMO_IMAGE,
        ])
        .stderr(std::process::Stdio::null())
        .output()
        .context("cannot run `docker`: is Docker installed?")?;
    // An image from an older build script (without the label, or an older one) is
    // built again: tests rely on what the current one holds (sftp-server).
    if have.status.success() && String::from_utf8_lossy(&have.stdout).trim() == DEMO_IMAGE_VERSION {
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

/// Puts `commons-demo:latest` on the campus allow-list at its ID in the local Docker
/// Engine (again, at the new ID, when the image was rebuilt since). Returns the digest.
pub fn allow_demo_image(db: &Db) -> anyhow::Result<String> {
    use crate::service::images::{self, Adder, NewImage};
    let digest = images::local_digest(DEMO_IMAGE).map_err(|e| anyhow::anyhow!("{e}"))?;
    db.run_blocking(|c| {
        let current = crate::db::images::usable_by(c, &[])?
            .into_iter()
            .find(|e| e.name_tag == DEMO_IMAGE);
        match current {
            Some(e) if e.digest == digest => return Ok(()),
            Some(e) => {
                crate::db::images::delete(c, e.id)?;
            }
            None => {}
        }
        let req = NewImage {
            name_tag: DEMO_IMAGE.into(),
            digest: Some(digest.clone()),
            description: Some("GPU Commons demo image (busybox: sh, httpd, nc, sleep)".into()),
            ..Default::default()
        };
        images::store(c, Adder::Cli, &req, &[]).map(|_| ())
    })
    .map_err(|e| anyhow::anyhow!("allowing the demo image: {e}"))?;
    Ok(digest)
}

/// The agent's credential file in its state dir (`commons_agent::state`): present once the
/// node has enrolled, so later starts need no enrolment token.
const AGENT_CREDENTIAL_FILE: &str = "node.json";

/// The `commons-agent` executable next to this one (`target/debug/commons-portal` ->
/// `target/debug/commons-agent`).
fn sibling_agent() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("cannot find this executable's path")?;
    let dir = exe
        .parent()
        .context("this executable's path has no directory")?;
    Ok(dir.join("commons-agent"))
}

/// Finds the agent binary. Under `cargo run` (cargo sets `CARGO`), builds it first with the
/// same profile as this executable (a no-op when it is up to date): `cargo run -p
/// commons-portal` builds the portal only.
async fn agent_binary() -> anyhow::Result<PathBuf> {
    let bin = sibling_agent()?;
    if let Some(cargo) = std::env::var_os("CARGO") {
        let mut cmd = tokio::process::Command::new(cargo);
        cmd.args(["build", "-p", "commons-agent"]);
        // The profile is the name of the directory the executable lives in.
        match bin
            .parent()
            .and_then(|d| d.file_name())
            .and_then(|n| n.to_str())
        {
            Some("debug") | None => {}
            Some("release") => {
                cmd.arg("--release");
            }
            Some(other) => {
                cmd.args(["--profile", other]);
            }
        }
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        eprintln!("building the demo's agent (cargo build -p commons-agent) ...");
        let status = cmd
            .current_dir(&root)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .status()
            .await
            .context("cannot run cargo to build commons-agent")?;
        anyhow::ensure!(
            status.success(),
            "building commons-agent failed (see above)"
        );
    }
    anyhow::ensure!(
        bin.is_file(),
        "the demo runs the agent binary {} and it is missing: build it with \
         `cargo build -p commons-agent` (add `--release` for a release build of the portal), \
         or start the demo with `cargo run -p commons-portal -- demo`, which builds it",
        bin.display()
    );
    Ok(bin)
}

/// Starts `commons-agent run` for the demo node. The enrolment token, when there is one,
/// goes in the environment (`COMMONS_ENROL_TOKEN`), not in the process list. The child gets
/// a process group of its own, so a Ctrl-C at the terminal reaches the portal only, and
/// the portal stops the agent; it is also killed if the portal drops it.
fn spawn_agent(
    bin: &Path,
    url: &str,
    state_dir: &Path,
    gpus: &str,
    enrol_token: Option<String>,
) -> anyhow::Result<tokio::process::Child> {
    let mut cmd = tokio::process::Command::new(bin);
    cmd.arg("run")
        .arg("--portal")
        .arg(url)
        .arg("--state-dir")
        .arg(state_dir)
        .arg("--gpus")
        .arg(gpus)
        .args(["--name", "demo-server"])
        .env_remove("COMMONS_PORTAL")
        .env_remove("COMMONS_ENROL_TOKEN")
        .stdin(Stdio::null())
        .process_group(0)
        .kill_on_drop(true);
    if let Some(t) = enrol_token {
        cmd.env("COMMONS_ENROL_TOKEN", t);
    }
    cmd.spawn()
        .with_context(|| format!("cannot start {}", bin.display()))
}

/// Kills the agent (if it still runs) and waits for it.
async fn stop_agent(agent: &mut tokio::process::Child) {
    if let Err(e) = agent.kill().await {
        eprintln!("stopping the demo's agent: {e}");
    }
}

/// Resolves when this process is asked to stop: Ctrl-C (SIGINT), SIGTERM or SIGHUP. The
/// handlers are installed when this is called, so no signal after the call is missed.
fn stop_requested() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    let mut int = signal(SignalKind::interrupt())?;
    let mut term = signal(SignalKind::terminate())?;
    let mut hup = signal(SignalKind::hangup())?;
    Ok(async move {
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
            _ = hup.recv() => {}
        }
    })
}

fn agent_exited(status: std::io::Result<ExitStatus>) -> anyhow::Error {
    match status {
        Ok(s) => anyhow::anyhow!(
            "the demo's agent (commons-agent) exited unexpectedly ({s}); see its output above"
        ),
        Err(e) => anyhow::anyhow!("waiting for the demo's agent (commons-agent): {e}"),
    }
}

pub async fn run(opts: DemoOptions) -> anyhow::Result<()> {
    std::fs::create_dir_all(&opts.data_dir)?;
    let data_dir = std::fs::canonicalize(&opts.data_dir)?;
    let agent_bin = agent_binary().await?;
    tokio::task::spawn_blocking(ensure_demo_image).await??;
    let config = Config {
        database_url: format!("sqlite://{}", data_dir.join("commons.db").display()),
        listen: opts.listen.clone(),
        insecure_dev_login: true,
        ..Config::default()
    };
    // Installed before anything runs that must be stopped, so no signal is missed.
    let stop = stop_requested()?;
    let portal = start(config).await?;
    let db = portal.state.db.clone();
    let seeded = db.clone();
    tokio::task::spawn_blocking(move || seed(&seeded)).await??;
    tokio::task::spawn_blocking(move || allow_demo_image(&db)).await??;

    let agent_dir = data_dir.join("agent");
    let enrolled = agent_dir
        .join(AGENT_CREDENTIAL_FILE)
        .try_exists()
        .with_context(|| format!("cannot read {}", agent_dir.display()))?;
    let enrol_token = if enrolled {
        None
    } else {
        let db = portal.state.db.clone();
        Some(tokio::task::spawn_blocking(move || crate::admin::enrol_token(&db, "demo")).await??)
    };
    let url = portal.url();
    let mut agent = spawn_agent(&agent_bin, &url, &agent_dir, &opts.gpus, enrol_token)?;
    println!();
    println!("GPU Commons demo is running: {url}/");
    println!("Log in as alice (development login: INSECURE, for this machine only).");
    println!("Data in {}. Stop with Ctrl-C.", data_dir.display());
    println!();
    let handle = portal.handle.clone();
    tokio::select! {
        r = portal.server => {
            stop_agent(&mut agent).await;
            Ok(r??)
        }
        s = agent.wait() => {
            handle.stop(true).await;
            Err(agent_exited(s))
        }
        () = stop => {
            stop_agent(&mut agent).await;
            handle.stop(true).await;
            Ok(())
        }
    }
}
