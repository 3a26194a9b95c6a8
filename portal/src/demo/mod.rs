//! `commons-portal demo`: a small campus on one machine, for a first look.
//!
//! 1. A SQLite database under the data dir with three labs, their people and an operator
//!    (`campus.rs`).
//! 2. The demo image `commons-demo:latest`, built without any registry if missing.
//! 3. The portal with the (insecure) development login, a short grace period and a fast
//!    scheduler tick.
//! 4. One `commons-agent` process per lab's server, with fake GPUs and the real Docker
//!    Engine, enrolled for its lab on first start: the binary next to this executable,
//!    run as a child process (the portal does not link the agent).
//! 5. Unless `--quiet`, the scripted workload and its narration (`script.rs`).
//! 6. On Ctrl-C (SIGINT), SIGTERM or SIGHUP, or when a part fails: the script stops, the
//!    agents stop, their containers are removed and their attempt guards end, and the
//!    portal stops. Whichever way `run` ends, nothing it started is left running.

mod campus;
mod script;

use crate::config::SchedulerConfig;
use crate::{start, Config};
use anyhow::Context;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use tokio::signal::unix::{signal, SignalKind};

pub const DEMO_IMAGE: &str = "commons-demo:latest";

/// `commons-portal demo` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// Address the portal listens on.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: String,
    /// Where the database, the checkpoints and the servers' state live (kept between runs).
    #[arg(long, default_value = ".dev/demo")]
    pub data_dir: PathBuf,
    /// Start the campus without the scripted workload.
    #[arg(long)]
    pub quiet: bool,
    /// Tell the scripted story faster (a 3 s grace period, shorter jobs); for tests.
    #[arg(long)]
    pub fast: bool,
    /// Address the jobs' web apps are served on (each app at
    /// `http://<label>.apps.localhost:<port>`); default: the portal's port plus one.
    #[arg(long)]
    pub apps_listen: Option<String>,
}

/// Where the demo serves web apps: `--apps-listen`, or the portal's host at its port + 1.
fn apps_listen(args: &DemoArgs) -> anyhow::Result<String> {
    if let Some(a) = &args.apps_listen {
        return Ok(a.clone());
    }
    let addr: std::net::SocketAddr = args
        .listen
        .parse()
        .with_context(|| format!("--listen {}: give HOST:PORT", args.listen))?;
    Ok(std::net::SocketAddr::new(addr.ip(), addr.port().wrapping_add(1)).to_string())
}

/// A web-app preset anyone can launch in the demo: busybox's httpd serving a page that
/// names the job's GPUs (the demo image has no Jupyter).
async fn add_demo_preset(ctx: &crate::service::Ctx) -> anyhow::Result<()> {
    use crate::service::{app_presets, identity};
    let op = ctx
        .db
        .run(|c| crate::db::users::user_by_name(c, campus::OPERATOR))
        .await?
        .context("the demo's operator is missing")?;
    let (actor, _) = identity::caller(ctx, None, Some(op.id)).await?;
    if app_presets::list(ctx, &actor)
        .await?
        .iter()
        .any(|p| p.spec.name == "hello-web")
    {
        return Ok(());
    }
    let script = "mkdir -p /tmp/www && echo \"<h1>Hello from a campus GPU</h1><p>GPUs:                   $CUDA_VISIBLE_DEVICES</p>\" > /tmp/www/index.html && exec httpd -f -p                   127.0.0.1:{port} -h /tmp/www";
    let req: commons_api::app_preset::PresetRequest = serde_json::from_value(serde_json::json!({
        "name": "hello-web", "title": "Hello web",
        "description": "A tiny web page served from your job (busybox httpd)",
        "image": DEMO_IMAGE, "command": ["sh", "-c", script], "port": 8888,
        "gpus": 1, "max_gpus": 2, "hours": 1, "max_hours": 4, "cpus": 0.5, "memory_gb": 0.25,
        "user_sets": ["gpus", "hours"], "idle_minutes": 30
    }))?;
    app_presets::create(ctx, &actor, req).await?;
    Ok(())
}

/// The script that builds the demo image, from the source tree.
pub fn build_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/images/build-demo.sh")
}

/// The `commons.demo-version` label of the image `deploy/images/build-demo.sh` builds
/// from a static busybox: what the tests need (sh, nc, httpd, sftp-server).
pub const DEMO_IMAGE_VERSION: &str = "2";
/// The label of the smaller image the script builds from the host's own shell and
/// coreutils when there is no static busybox: enough for the demo's jobs.
const DEMO_IMAGE_VERSION_HOST: &str = "2-host";

/// The `commons.demo-version` label of the local `commons-demo:latest`, if there is one.
fn demo_image_version() -> anyhow::Result<Option<String>> {
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
    Ok(have
        .status
        .success()
        .then(|| String::from_utf8_lossy(&have.stdout).trim().to_string()))
}

fn build_demo_image(allow_host: bool) -> anyhow::Result<()> {
    eprintln!("building {DEMO_IMAGE} (once) ...");
    let mut cmd = std::process::Command::new("bash");
    cmd.arg(build_script());
    if allow_host {
        cmd.env("DEMO_IMAGE_ALLOW_HOST", "1");
    }
    let built = cmd
        .status()
        .context("cannot run the demo image build script")?;
    anyhow::ensure!(built.success(), "building {DEMO_IMAGE} failed (see above)");
    Ok(())
}

/// Builds `commons-demo:latest` from a static busybox unless the Docker Engine has it,
/// of this version (what the tests need). Without busybox-static it fails, saying how to
/// install it.
pub fn ensure_demo_image() -> anyhow::Result<()> {
    // An image from an older build script (without the label, or an older one), or the
    // smaller one from the host's binaries, is built again: tests rely on what the
    // current one holds (sftp-server, nc, httpd).
    if demo_image_version()?.as_deref() == Some(DEMO_IMAGE_VERSION) {
        return Ok(());
    }
    build_demo_image(false)
}

/// The demo's image: the full one when it is there or can be built, else the smaller one
/// from this machine's own binaries, so the demo needs no package beyond Docker.
fn ensure_demo_image_for_demo() -> anyhow::Result<()> {
    match demo_image_version()?.as_deref() {
        Some(DEMO_IMAGE_VERSION | DEMO_IMAGE_VERSION_HOST) => Ok(()),
        _ => build_demo_image(true),
    }
}

/// Puts `commons-demo:latest` on the campus allow-list at its ID in the local Docker
/// Engine (again, at the new ID, when the image was rebuilt since). Returns the digest.
pub fn allow_demo_image(db: &crate::db::Db) -> anyhow::Result<String> {
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
            description: Some(
                "GPU Commons demo image (sh, sleep, and with busybox: httpd, nc)".into(),
            ),
            ..Default::default()
        };
        images::store(c, Adder::Cli, &req, &[]).map(|_| ())
    })
    .map_err(|e| anyhow::anyhow!("allowing the demo image: {e}"))?;
    Ok(digest)
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

fn agent_exited(server: &str, status: std::io::Result<ExitStatus>, dir: &Path) -> anyhow::Error {
    let log = dir.join("agents").join(server).join("agent.log");
    match status {
        Ok(s) => anyhow::anyhow!(
            "the agent of {server} exited unexpectedly ({s}); see {}",
            log.display()
        ),
        Err(e) => anyhow::anyhow!("waiting for the agent of {server}: {e}"),
    }
}

/// What the demo prints once the campus runs: where, and whom to log in as.
fn banner(url: &str, data_dir: &Path, quiet: bool) {
    println!();
    println!("GPU Commons demo is running: {url}/");
    println!("Development login (INSECURE, for this machine only): pick a user on the login page.");
    println!("  vision (2x A100): alice (admin), victor");
    println!("  physics (2x RTX 4090): bob, pat (admin)");
    println!("  bio (1x L40S): carol (admin)");
    println!("  admin: operator, sees every lab's jobs on the lab pages");
    if quiet {
        println!("No scripted workload (--quiet): submit jobs yourself.");
    } else {
        println!("Log in as bob to see his jobs borrow vision's idle GPUs, get preempted when");
        println!("alice needs them, wait (and why), and resume from their checkpoints;");
        println!("as alice to see her job get her lab's GPUs back; as admin for every lab.");
    }
    println!("Web apps: the Launch page has a Hello web preset; its Open button goes to");
    println!(
        "  http://<label>.apps.localhost:<port>/ (browsers send *.localhost to this machine)."
    );
    println!("Data in {}. Stop with Ctrl-C.", data_dir.display());
    println!();
}

/// Runs the demo until Ctrl-C (or a part fails), then stops everything it started.
pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.data_dir)
        .with_context(|| format!("cannot create {}", args.data_dir.display()))?;
    let data_dir = std::fs::canonicalize(&args.data_dir)?;
    let agent_bin = campus::agent_binary().await?;
    tokio::task::spawn_blocking(ensure_demo_image_for_demo).await??;
    let pace = if args.fast {
        script::FAST
    } else {
        script::NORMAL
    };
    let mut config = Config {
        database_url: format!("sqlite://{}", data_dir.join("commons.db").display()),
        listen: args.listen.clone(),
        insecure_dev_login: true,
        scheduler: SchedulerConfig {
            tick_ms: 500,
            heartbeat_s: 2,
            ..SchedulerConfig::default()
        },
        ..Config::default()
    };
    config.policy.default_grace_s = pace.grace_s;
    let apps_at = apps_listen(&args)?;
    let apps_port = apps_at
        .rsplit_once(':')
        .map(|(_, p)| p.to_string())
        .unwrap_or_default();
    config.apps.url = Some(format!("http://{{host}}.apps.localhost:{apps_port}"));
    config.apps.listen = Some(apps_at);
    // Installed before anything runs that must be stopped, so no signal is missed.
    let stop = stop_requested()?;
    tokio::pin!(stop);
    let mut portal = start(config).await?;
    campus::seed(&portal.state).await?;
    let db = portal.state.db.clone();
    tokio::task::spawn_blocking(move || allow_demo_image(&db)).await??;
    add_demo_preset(&portal.state).await?;
    let url = portal.url();
    let mut servers = campus::Servers::start(&agent_bin, &portal.state, &url, &data_dir).await?;
    banner(&url, &data_dir, args.quiet);
    let mut story = (!args.quiet).then(|| tokio::spawn(script::run((*portal.state).clone(), pace)));
    let ended = loop {
        tokio::select! {
            r = &mut portal.server => break match r {
                Ok(Ok(())) => Err(anyhow::anyhow!("the portal stopped by itself")),
                Ok(Err(e)) => Err(anyhow::Error::from(e).context("the portal failed")),
                Err(e) => Err(anyhow::Error::from(e).context("the portal failed")),
            },
            (server, s) = servers.exited() => break Err(agent_exited(server, s, &data_dir)),
            r = async {
                match &mut story {
                    Some(s) => s.await,
                    None => std::future::pending().await,
                }
            } => {
                story = None;
                match r {
                    Ok(Ok(())) => continue,
                    Ok(Err(e)) => break Err(e.context("the demo script failed")),
                    Err(e) => break Err(anyhow::Error::from(e).context("the demo script failed")),
                }
            }
            () = &mut stop => break Ok(()),
        }
    };
    println!("stopping the demo: the script, the agents and their containers, the portal ...");
    if let Some(s) = story {
        s.abort();
    }
    servers.stop().await;
    portal.handle.stop(true).await;
    portal.scheduler.abort();
    if ended.is_ok() {
        println!("stopped");
    }
    ended
}
