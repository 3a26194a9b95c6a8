//! The demo's campus: three labs, their people, and one server per lab, each served by a
//! `commons-agent` process of its own with fake GPUs and the real Docker Engine.
//!
//! Invariant: [`Servers::stop`] leaves nothing behind that the agents started: the agent
//! processes, every container labelled with one of their agent ids, and the attempt
//! guards (`commons-agent guard --state-dir ...`, detached, so not the agents' children).

use crate::db::models::Role;
use crate::db::users;
use crate::service::Ctx;
use anyhow::Context;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

/// A lab of the demo campus and its server.
pub struct Lab {
    pub slug: &'static str,
    pub name: &'static str,
    /// Its people: (username, role).
    pub people: &'static [(&'static str, Role)],
    /// The lab's server: its name and fake GPUs (`commons-agent run --gpus`).
    pub server: &'static str,
    pub gpus: &'static str,
}

/// The campus. The script (`script.rs`) is written against these names.
pub const LABS: [Lab; 3] = [
    Lab {
        slug: "vision",
        name: "Vision Lab",
        people: &[("alice", Role::Admin), ("victor", Role::Member)],
        server: "vision-gpu1",
        gpus: "fake:2xA100-80GB",
    },
    Lab {
        slug: "physics",
        name: "Physics Lab",
        people: &[("pat", Role::Admin), ("bob", Role::Member)],
        server: "physics-gpu1",
        gpus: "fake:2xRTX4090-24GB",
    },
    Lab {
        slug: "bio",
        name: "Bio Lab",
        people: &[("carol", Role::Admin)],
        server: "bio-gpu1",
        gpus: "fake:1xL40S-48GB",
    },
];

/// The operator: sees every lab's jobs on the lab pages.
pub const OPERATOR: &str = "admin";

/// The lab that owns the server called `server`.
pub fn owner_of(server: &str) -> Option<&'static str> {
    LABS.iter().find(|l| l.server == server).map(|l| l.slug)
}

/// Creates the labs and people that are missing (a second start changes nothing).
pub async fn seed(ctx: &Ctx) -> anyhow::Result<()> {
    ctx.db
        .run(|c| {
            for lab in &LABS {
                let row = match users::find_lab(c, lab.slug)? {
                    Some(l) => l,
                    None => users::create_lab(c, lab.slug, lab.name)?,
                };
                for (name, role) in lab.people {
                    let u = match users::user_by_name(c, name)? {
                        Some(u) => u,
                        None => {
                            users::create_user(c, name, &format!("{name}@demo.invalid"), false)?
                        }
                    };
                    // Also for users of an older demo's data dir (its single lab `demo`).
                    if users::membership(c, row.id, u.id)?.is_none() {
                        users::set_membership(c, u.id, row.id, *role)?;
                    }
                }
            }
            if users::user_by_name(c, OPERATOR)?.is_none() {
                users::create_user(c, OPERATOR, "admin@demo.invalid", true)?;
            }
            Ok::<_, crate::error::AppError>(())
        })
        .await
        .map_err(|e| anyhow::anyhow!("seeding the demo database: {e}"))
}

/// The agent's credential file in its state dir (`commons_agent::state`): present once
/// the server has enrolled, so later starts need no enrolment token.
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
pub async fn agent_binary() -> anyhow::Result<PathBuf> {
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

/// One running agent: its server's name, state dir and process.
struct Agent {
    server: &'static str,
    state_dir: PathBuf,
    child: tokio::process::Child,
}

/// The agents of the campus's servers.
pub struct Servers {
    agents: Vec<Agent>,
}

impl Servers {
    /// Starts `commons-agent run` for each lab's server, its state in
    /// `DATA_DIR/agents/SERVER` and its output in `agent.log` there. A server that has not
    /// enrolled yet gets a one-time token of its lab in the environment
    /// (`COMMONS_ENROL_TOKEN`), not in the process list. Each agent gets a process group
    /// of its own, so a Ctrl-C at the terminal reaches the portal only and the demo stops
    /// the agents itself; they are also killed if the demo drops them.
    pub async fn start(
        bin: &Path,
        ctx: &Ctx,
        url: &str,
        data_dir: &Path,
    ) -> anyhow::Result<Servers> {
        let mut servers = Servers { agents: Vec::new() };
        for lab in &LABS {
            let state_dir = data_dir.join("agents").join(lab.server);
            std::fs::create_dir_all(&state_dir)
                .with_context(|| format!("cannot create {}", state_dir.display()))?;
            let enrolled = state_dir
                .join(AGENT_CREDENTIAL_FILE)
                .try_exists()
                .with_context(|| format!("cannot read {}", state_dir.display()))?;
            let token = if enrolled {
                None
            } else {
                let db = ctx.db.clone();
                let slug = lab.slug;
                Some(
                    tokio::task::spawn_blocking(move || crate::admin::enrol_token(&db, slug))
                        .await??,
                )
            };
            let log = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(state_dir.join("agent.log"))
                .with_context(|| format!("cannot open {}/agent.log", state_dir.display()))?;
            let mut cmd = tokio::process::Command::new(bin);
            cmd.arg("run")
                .arg("--portal")
                .arg(url)
                .arg("--state-dir")
                .arg(&state_dir)
                // Each demo server is a host of its own on this one Docker Engine (an
                // agent stops the containers of other agent ids of its host).
                .arg("--host-id-file")
                .arg(state_dir.join("host-id"))
                .args(["--gpus", lab.gpus, "--name", lab.server])
                // Jobs' GPUs look busy, so their pages' utilisation charts show a run.
                .args(["--fake-busy-util", "70"])
                // Pretend servers sharing one machine: its disk's floor is not theirs to
                // keep (a full laptop would lend nothing), and watched volumes leave no
                // mount behind when the demo ends.
                .args(["--min-free-disk", "0%", "--job-disk", "watch"])
                .env_remove("COMMONS_PORTAL")
                .env_remove("COMMONS_ENROL_TOKEN")
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .process_group(0)
                .kill_on_drop(true);
            if let Some(t) = token {
                cmd.env("COMMONS_ENROL_TOKEN", t);
            }
            let child = cmd
                .spawn()
                .with_context(|| format!("cannot start {}", bin.display()))?;
            servers.agents.push(Agent {
                server: lab.server,
                state_dir,
                child,
            });
        }
        Ok(servers)
    }

    /// Resolves when an agent ends by itself: its server's name and exit status.
    pub async fn exited(&mut self) -> (&'static str, std::io::Result<ExitStatus>) {
        if self.agents.is_empty() {
            return std::future::pending().await;
        }
        let waits = self
            .agents
            .iter_mut()
            .map(|a| Box::pin(async { (a.server, a.child.wait().await) }));
        futures_util::future::select_all(waits).await.0
    }

    /// Stops the agents, removes every container they ran and waits for the attempt
    /// guards to end (killing any that outstay [`GUARD_WAIT`]).
    pub async fn stop(mut self) {
        for a in &mut self.agents {
            if let Err(e) = a.child.kill().await {
                eprintln!("stopping the agent of {}: {e}", a.server);
            }
        }
        for a in &self.agents {
            if let Err(e) = remove_containers(&a.state_dir).await {
                eprintln!("removing the containers of {}: {e:#}", a.server);
            }
        }
        let dirs: Vec<PathBuf> = self.agents.iter().map(|a| a.state_dir.clone()).collect();
        let deadline = tokio::time::Instant::now() + GUARD_WAIT;
        loop {
            let left = guards_of(&dirs);
            if left.is_empty() {
                break;
            }
            if tokio::time::Instant::now() >= deadline {
                for pid in left {
                    // A guard that ended meanwhile makes `kill` fail, which is fine.
                    let _ = std::process::Command::new("kill")
                        .args(["-KILL", &pid.to_string()])
                        .status();
                }
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// How long [`Servers::stop`] lets the guards notice their containers are gone (they
/// look every 0.5 s).
const GUARD_WAIT: Duration = Duration::from_secs(5);

/// The agent id in a state dir's credential (the `commons.agent` label of its containers).
fn agent_id(state_dir: &Path) -> anyhow::Result<Option<String>> {
    let path = state_dir.join(AGENT_CREDENTIAL_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    let v: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
    Ok(v["agent_id"].as_str().map(str::to_string))
}

/// Removes (`docker rm -f`) every container labelled with this state dir's agent id.
async fn remove_containers(state_dir: &Path) -> anyhow::Result<()> {
    let Some(id) = agent_id(state_dir)? else {
        return Ok(());
    };
    let out = tokio::process::Command::new("docker")
        .args([
            "ps",
            "-aq",
            "--filter",
            &format!("label=commons.agent={id}"),
        ])
        .output()
        .await
        .context("cannot run `docker ps`")?;
    anyhow::ensure!(
        out.status.success(),
        "docker ps: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    let ids: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(str::to_string)
        .collect();
    if ids.is_empty() {
        return Ok(());
    }
    let rm = tokio::process::Command::new("docker")
        .args(["rm", "-f"])
        .args(&ids)
        .output()
        .await
        .context("cannot run `docker rm`")?;
    anyhow::ensure!(
        rm.status.success(),
        "docker rm: {}",
        String::from_utf8_lossy(&rm.stderr).trim()
    );
    Ok(())
}

/// Processes (by pid) whose command line names one of `dirs` after `--state-dir`: the
/// attempt guards of the demo's agents.
fn guards_of(dirs: &[PathBuf]) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let wanted: Vec<&std::ffi::OsStr> = dirs.iter().map(|d| d.as_os_str()).collect();
    let mut found = Vec::new();
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let names_dir = args.windows(2).any(|w| {
            w[0] == b"--state-dir"
                && wanted
                    .iter()
                    .any(|d| std::os::unix::ffi::OsStrExt::as_bytes(*d) == w[1])
        });
        if names_dir && pid != std::process::id() {
            found.push(pid);
        }
    }
    found
}
