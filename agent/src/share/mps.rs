//! NVIDIA MPS control daemons, one per shared GPU, supervised by the agent (`mps` mode).
//!
//! Each GPU that carries a share attempt gets its own daemon, run in the foreground as
//! the configured command with `CUDA_VISIBLE_DEVICES=<uuid>`, its own pipe directory
//! (`<dir>/<uuid>/pipe`, mounted into each of the GPU's share containers at
//! `commons_proto::share::MPS_PIPE_DIR`) and its own log directory (`<dir>/<uuid>/log`); its
//! stdout and stderr go to `<dir>/<uuid>/daemon.log`.
//!
//! Invariants: at most one daemon per GPU; a daemon that ends by itself is started again
//! (after 1 s, doubling up to 30 s while it keeps dying young), and the log says so;
//! [`Mps::retain`] stops the daemons of GPUs no share attempt uses any more (SIGTERM,
//! then SIGKILL after [`STOP_GRACE`]); dropping the [`Mps`] stops them all.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::oneshot;

/// How long a daemon asked to stop has after SIGTERM before SIGKILL.
pub const STOP_GRACE: Duration = Duration::from_secs(5);
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// A daemon that ran this long before it ended is started again after the first backoff.
const HEALTHY_RUN: Duration = Duration::from_secs(10);

/// The supervised daemons, by GPU.
pub struct Mps {
    command: Vec<String>,
    dir: PathBuf,
    daemons: Mutex<BTreeMap<String, Daemon>>,
}

struct Daemon {
    stop: Option<oneshot::Sender<()>>,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

impl Mps {
    /// Daemons run as `command` (program, then arguments), their directories under `dir`.
    pub fn new(command: Vec<String>, dir: PathBuf) -> Self {
        Self {
            command,
            dir,
            daemons: Mutex::new(BTreeMap::new()),
        }
    }

    /// The directory of one GPU's daemon (its pipes, logs and output are inside).
    pub fn gpu_dir(&self, gpu: &str) -> PathBuf {
        // UUIDs are `GPU-…`/`MIG-…`: letters, digits and dashes; anything else is kept
        // out of the path.
        let name: String = gpu
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        self.dir.join(name)
    }

    /// The pipe directory of one GPU's daemon, as share containers get it mounted.
    pub fn pipe_dir(&self, gpu: &str) -> PathBuf {
        self.gpu_dir(gpu).join("pipe")
    }

    /// Makes sure the GPU's daemon is supervised (started when it is not); returns its
    /// pipe directory, made if missing. Call it inside a Tokio runtime.
    pub fn ensure(&self, gpu: &str) -> std::io::Result<PathBuf> {
        let gpu_dir = self.gpu_dir(gpu);
        let pipe = gpu_dir.join("pipe");
        let log = gpu_dir.join("log");
        let mut daemons = self.daemons.lock().unwrap_or_else(PoisonError::into_inner);
        if daemons.contains_key(gpu) {
            return Ok(pipe);
        }
        for d in [&pipe, &log] {
            std::fs::create_dir_all(d)?;
            // The jobs (uid 65534) talk to the daemon through these pipes.
            set_mode(d, 0o755)?;
        }
        let (tx, rx) = oneshot::channel();
        tokio::spawn(supervise(
            gpu.to_string(),
            self.command.clone(),
            gpu_dir,
            rx,
        ));
        daemons.insert(gpu.to_string(), Daemon { stop: Some(tx) });
        Ok(pipe)
    }

    /// Stops the daemons of every GPU not in `gpus`; returns the GPUs whose daemon it
    /// stopped.
    pub fn retain(&self, gpus: &BTreeSet<String>) -> Vec<String> {
        let mut daemons = self.daemons.lock().unwrap_or_else(PoisonError::into_inner);
        let gone: Vec<String> = daemons
            .keys()
            .filter(|g| !gpus.contains(*g))
            .cloned()
            .collect();
        for g in &gone {
            tracing::info!(gpu = %g, "no share uses the GPU any more: stopping its MPS control daemon");
            daemons.remove(g);
        }
        gone
    }

    /// The GPUs whose daemon is supervised now.
    pub fn supervised(&self) -> BTreeSet<String> {
        self.daemons
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .keys()
            .cloned()
            .collect()
    }
}

fn set_mode(path: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

/// Runs one GPU's daemon until `stop`, starting it again whenever it ends.
async fn supervise(
    gpu: String,
    command: Vec<String>,
    dir: PathBuf,
    mut stop: oneshot::Receiver<()>,
) {
    let mut backoff = FIRST_BACKOFF;
    loop {
        let started = tokio::time::Instant::now();
        match spawn(&gpu, &command, &dir) {
            Err(e) => tracing::error!(
                gpu = %gpu,
                "cannot start the MPS control daemon ({}): {e}; trying again in {}s",
                command.join(" "),
                backoff.as_secs()
            ),
            Ok(mut child) => {
                tracing::info!(gpu = %gpu, pid = child.id(), "MPS control daemon started");
                tokio::select! {
                    status = child.wait() => {
                        if started.elapsed() >= HEALTHY_RUN {
                            backoff = FIRST_BACKOFF;
                        }
                        tracing::warn!(
                            gpu = %gpu,
                            status = %status.map_or_else(|e| e.to_string(), |s| s.to_string()),
                            "the MPS control daemon ended: starting it again in {}s",
                            backoff.as_secs()
                        );
                    }
                    _ = &mut stop => {
                        terminate(&mut child).await;
                        tracing::info!(gpu = %gpu, "MPS control daemon stopped");
                        return;
                    }
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = &mut stop => return,
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

fn spawn(gpu: &str, command: &[String], dir: &Path) -> std::io::Result<tokio::process::Child> {
    let (program, args) = command
        .split_first()
        .ok_or_else(|| std::io::Error::other("the MPS control command is empty"))?;
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("daemon.log"))?;
    tokio::process::Command::new(program)
        .args(args)
        .env("CUDA_VISIBLE_DEVICES", gpu)
        .env("CUDA_MPS_PIPE_DIRECTORY", dir.join("pipe"))
        .env("CUDA_MPS_LOG_DIRECTORY", dir.join("log"))
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .kill_on_drop(true)
        .spawn()
}

/// SIGTERM, then SIGKILL after [`STOP_GRACE`].
async fn terminate(child: &mut tokio::process::Child) {
    if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
        // SAFETY: kill(2) with our own child's pid and a valid signal has no memory effects.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
    }
    if tokio::time::timeout(STOP_GRACE, child.wait())
        .await
        .is_err()
    {
        let _ = child.kill().await;
    }
}
