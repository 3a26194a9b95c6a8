//! The per-attempt guard: a fence that outlives the agent.
//!
//! While the agent runs, its executor enforces leases and time limits. When the agent is
//! down (crash, `kill -9`, `systemctl stop`, an upgrade), its containers keep running on
//! purpose, and nothing in the agent can stop them. So every running attempt also has a
//! guard: this same executable, started detached (own session, stdin/stdout closed, stderr
//! to `guard.log`) as `commons-agent guard --state-dir DIR --job J --attempt A
//! --container ID`.
//!
//! The guard polls the attempt's `lease.json` every [`POLL`]. When the lease or the time
//! limit runs out it writes `stopped.json` (the reason, so whoever sees the container end
//! reports it right), then stops the container through the agent's `ContainerRuntime`
//! exactly as the agent does (`ContainerRuntime::stop`: SIGTERM, the grace, SIGKILL; the
//! Docker Engine's in production). When the agent has begun a
//! stop itself (`lease.json` says so), the guard leaves it alone and only kills the
//! container if it still runs [`BACKSTOP`] after that stop's grace. The guard exits when
//! the container is no longer running or gone.
//!
//! It fails safe: whatever keeps it from proving the lease valid stops the container. A
//! `lease.json` that is missing or unreadable, or an attempt directory that is gone (the
//! state dir was lost or wiped), count as an expired lease: the container it knows (from
//! `--container`, or the last `lease.json` it read) is stopped with the last grace it read
//! (else [`ENFORCE_GRACE`]). A `stopped.json` that cannot be read or written never keeps
//! it from stopping the container; only the reason is lost. A guard that dies (killed,
//! crashed) is started again by the running agent within a tick (`Executor`'s
//! `keep_guards`), so only a guard that dies while the agent is down leaves a gap, and the
//! agent closes it when it starts.
//!
//! Why a process on the host and not an init inside the container: an init would have to
//! be a static binary that works in any image the labs allow, be mounted into every
//! container, and trust a clock and files the job itself can reach; the guard reuses the
//! agent's container runtime, its stop-with-grace logic and its file formats, sits outside the
//! job's reach, and is the same binary, so it is always the agent's version.
//!
//! Invariants: at most one guard per attempt while its directory exists (it holds an
//! exclusive `flock` on `guard.pid` while it runs; a second one exits at once, and the
//! agent starts one only when nobody holds the lock); the guard never stops a container
//! before a deadline in a `lease.json` it can read, and never cuts short the grace of a
//! stop the agent began.

use crate::clock::{self, from_ms, to_ms};
use crate::deadline;
use crate::reconcile::{Key, ENFORCE_GRACE};
use crate::runtime::{ContainerRuntime, ContainerStatus, RuntimeError};
use crate::store::{
    self, LeaseFile, StoppedFile, Store, GUARD_LOG_FILE, GUARD_PID_FILE, LEASE_FILE, STOPPED_FILE,
};
use anyhow::Context;
use commons_proto::{Attempt, JobId, StopReason};
use std::fs::File;
use std::future::Future;
use std::io::{Seek, Write};
use std::os::unix::io::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// How often the guard reads `lease.json`.
pub const POLL: Duration = Duration::from_millis(500);
/// How long after the grace of the agent's own stop the guard kills a container that still
/// runs (the agent died in the middle of that stop).
pub const BACKSTOP: Duration = Duration::from_secs(5);
/// Overrides the executable run as the guard (tests, unusual installs).
pub const GUARD_EXE_ENV: &str = "COMMONS_AGENT_EXE";

/// What the guard does now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuardAct {
    /// Stop the container for `reason`: SIGTERM, `grace`, SIGKILL.
    Stop { reason: StopReason, grace: Duration },
    /// The agent's stop did not finish: SIGKILL now.
    Kill,
}

/// Pure: what the guard does at `now` (boot clock) given `lease.json`. Its deadlines are
/// judged by the rule the agent's reconcile loop follows (`deadline`).
pub fn decide(lease: &LeaseFile, boot_id: &str, now: Duration) -> Option<GuardAct> {
    let grace = Duration::from_secs(lease.grace_s);
    if lease.boot_id != boot_id {
        // Deadlines of another boot mean nothing on this clock.
        return Some(GuardAct::Stop {
            reason: StopReason::LeaseExpired,
            grace,
        });
    }
    if let Some(m) = &lease.stop {
        let finished_by = from_ms(m.since_ms)
            .saturating_add(from_ms(m.grace_ms))
            .saturating_add(BACKSTOP);
        return (now >= finished_by).then_some(GuardAct::Kill);
    }
    let lease_until = from_ms(lease.lease_deadline_ms);
    let time_limit = lease.time_limit_deadline_ms.map(from_ms);
    deadline::passed(Some(lease_until), time_limit, now)
        .map(|reason| GuardAct::Stop { reason, grace })
}

/// The executable to run as the guard: [`GUARD_EXE_ENV`] if set; this process's own
/// executable when it is `commons-agent` (as `/proc/self/exe`, which still works after the
/// file was replaced by an upgrade); else a `commons-agent` beside it or one folder up
/// (the agent run in-process by another crate's tests). `None`: no guards.
pub fn default_program() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(GUARD_EXE_ENV) {
        return Some(p.into());
    }
    let exe = std::env::current_exe().ok()?;
    let name = exe.file_name()?.to_string_lossy();
    if name.starts_with("commons-agent") {
        return Some("/proc/self/exe".into());
    }
    let dir = exe.parent()?;
    [
        dir.join("commons-agent"),
        dir.parent()?.join("commons-agent"),
    ]
    .into_iter()
    .find(|p| p.is_file())
}

/// Tries to take the exclusive lock on `f`: true if taken, false if another holds it.
fn try_lock(f: &File) -> std::io::Result<bool> {
    // SAFETY: the descriptor is owned by `f` and open for the duration of the call.
    let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(false)
    } else {
        Err(e)
    }
}

/// Whether a guard holds the attempt directory's `guard.pid` lock.
pub fn is_running(dir: &Path) -> bool {
    let Ok(f) = File::open(dir.join(GUARD_PID_FILE)) else {
        return false;
    };
    // Taking the lock means nobody held it; closing the file releases it again.
    matches!(try_lock(&f), Ok(false))
}

/// Starts the attempt's guard unless one runs (or no guard program is configured); the
/// guard watches `container`. Returns whether it started one.
pub fn ensure(store: &Store, key: Key, container: &str) -> bool {
    let Some(program) = store.guard_program() else {
        return false;
    };
    let dir = store.dir(key);
    if is_running(&dir) {
        return false;
    }
    match spawn(program, store.state_dir(), key, container, &dir) {
        Ok(pid) => {
            tracing::info!(job = key.0, attempt = key.1, pid, "guard started");
            true
        }
        Err(e) => {
            tracing::error!(
                job = key.0,
                attempt = key.1,
                "cannot start the attempt's guard ({}): {e:#}; nothing enforces its lease \
                 while the agent is down",
                program.display()
            );
            false
        }
    }
}

fn spawn(
    program: &Path,
    state_dir: &Path,
    (job, attempt): Key,
    container: &str,
    dir: &Path,
) -> anyhow::Result<u32> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(GUARD_LOG_FILE))
        .context("opening guard.log")?;
    let mut cmd = Command::new(program);
    cmd.arg0("commons-agent")
        .arg("guard")
        .arg("--state-dir")
        .arg(state_dir)
        .arg("--job")
        .arg(job.to_string())
        .arg("--attempt")
        .arg(attempt.to_string())
        // Known from the start: the guard can stop it even if it never reads lease.json.
        .arg("--container")
        .arg(container)
        // The guard needs no enrolment token; keep it out of one more process.
        .env_remove("COMMONS_ENROL_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(log));
    // SAFETY: setsid is async-signal-safe and touches no memory of the parent; detached in
    // its own session, the guard gets no terminal's signals and outlives the agent.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().context("spawning")?;
    let pid = child.id();
    // Reap it when it exits, so no zombie is left while the agent runs.
    std::thread::Builder::new()
        .name(format!("guard-{job}-{attempt}"))
        .spawn(move || {
            let _ = child.wait();
        })
        .context("starting the reaper thread")?;
    Ok(pid)
}

/// Whether this guard got the attempt's `guard.pid`.
enum PidFile {
    /// Taken (lock, then this pid); held while the guard runs.
    Taken(File),
    /// Another guard holds it.
    Held,
    /// The attempt's directory is gone.
    NoDir,
}

/// Takes `guard.pid` (lock, then this pid).
fn take_pid_file(dir: &Path) -> anyhow::Result<PidFile> {
    if !dir.is_dir() {
        return Ok(PidFile::NoDir);
    }
    let path = dir.join(GUARD_PID_FILE);
    let mut f = match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
    {
        Ok(f) => f,
        // Removed in between.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(PidFile::NoDir),
        Err(e) => return Err(e).with_context(|| format!("opening {}", path.display())),
    };
    if !try_lock(&f).with_context(|| format!("locking {}", path.display()))? {
        return Ok(PidFile::Held);
    }
    f.set_len(0)?;
    f.rewind()?;
    writeln!(f, "{}", std::process::id())?;
    Ok(PidFile::Taken(f))
}

enum Next {
    Watch,
    Done(&'static str),
}

/// What the guard knows beyond this poll's reading: the container (from `--container` or
/// the last `lease.json` read) and the grace of the last `lease.json` read.
#[derive(Debug, Default)]
struct Memo {
    container: Option<String>,
    grace: Option<Duration>,
}

/// What one poll found of the attempt's lease.
enum Seen {
    Lease(LeaseFile),
    /// The attempt's directory is gone.
    DirGone,
    /// `lease.json` is missing or unreadable: why.
    Unreadable(String),
}

fn read_lease(dir: &Path) -> Seen {
    if !dir.is_dir() {
        return Seen::DirGone;
    }
    match store::read_json::<LeaseFile>(&dir.join(LEASE_FILE)) {
        Ok(Some(l)) => Seen::Lease(l),
        Ok(None) if !dir.is_dir() => Seen::DirGone,
        Ok(None) => Seen::Unreadable("lease.json is missing".into()),
        Err(e) => Seen::Unreadable(e.to_string()),
    }
}

/// The guard process: runs until the attempt's container is no longer running.
/// `container`: the container to guard, when the agent named it; `connect`: reaches the
/// container runtime (tried again until it answers, unless there is nothing to guard).
pub async fn run<R, F, Fut>(
    connect: F,
    state_dir: &Path,
    job: JobId,
    attempt: Attempt,
    container: Option<String>,
) -> anyhow::Result<()>
where
    R: ContainerRuntime,
    F: Fn() -> Fut,
    Fut: Future<Output = Result<R, RuntimeError>>,
{
    let dir = store::attempt_dir(state_dir, job, attempt);
    let _pid_file = match take_pid_file(&dir)? {
        PidFile::Taken(f) => Some(f),
        PidFile::Held => {
            tracing::info!(job, attempt, "another guard watches this attempt");
            return Ok(());
        }
        // Nothing to lock; the container (if named) is stopped below, fail-safe.
        PidFile::NoDir if container.is_some() => None,
        PidFile::NoDir => {
            tracing::info!(job, attempt, "the attempt is gone, with no container named");
            return Ok(());
        }
    };
    tracing::info!(job, attempt, "guarding {}", dir.display());
    let mut memo = Memo {
        container,
        grace: None,
    };
    let runtime = loop {
        match connect().await {
            Ok(r) => break r,
            Err(_) if memo.container.is_none() && !dir.is_dir() => return Ok(()),
            Err(e) => {
                tracing::warn!("cannot reach the container engine ({e}); trying again");
                tokio::time::sleep(POLL * 4).await;
            }
        }
    };
    let boot_id = clock::boot_id();
    loop {
        match check(&runtime, &dir, &boot_id, &mut memo).await {
            Ok(Next::Done(why)) => {
                tracing::info!(job, attempt, "{why}: done");
                return Ok(());
            }
            Ok(Next::Watch) => {}
            Err(e) => tracing::warn!(job, attempt, "{e:#}"),
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Records why the guard stops the container in `stopped.json`, unless a reason is
/// already there (the first one stands). An unreadable file counts as none.
fn record_stop(
    dir: &Path,
    reason: StopReason,
    now: Duration,
    grace: Duration,
) -> Result<(), crate::state::StateError> {
    let path = dir.join(STOPPED_FILE);
    if matches!(store::read_json::<StoppedFile>(&path), Ok(Some(_))) {
        return Ok(());
    }
    let stopped = StoppedFile {
        reason,
        at_ms: to_ms(now),
        grace_s: grace.as_secs(),
    };
    store::write_json(&path, &stopped)
}

async fn check<R: ContainerRuntime>(
    rt: &R,
    dir: &Path,
    boot_id: &str,
    memo: &mut Memo,
) -> anyhow::Result<Next> {
    let seen = read_lease(dir);
    if let Seen::Lease(l) = &seen {
        if let Some(c) = &l.container {
            memo.container = Some(c.clone());
        }
        memo.grace = Some(Duration::from_secs(l.grace_s));
    }
    let Some(container) = memo.container.clone() else {
        return Ok(match seen {
            Seen::DirGone => Next::Done("the attempt's directory is gone, with no container"),
            _ => Next::Watch,
        });
    };
    match rt.inspect(&container).await? {
        ContainerStatus::Gone => return Ok(Next::Done("the container is gone")),
        ContainerStatus::Exited(_) => return Ok(Next::Done("the container has ended")),
        ContainerStatus::Running => {}
    }
    let now = clock::now();
    // What cannot be read cannot prove the lease valid: it counts as expired.
    let doubt = |why: &str| {
        tracing::warn!("{why}: the lease cannot be proven valid, so it counts as expired");
        Some(GuardAct::Stop {
            reason: StopReason::LeaseExpired,
            grace: memo.grace.unwrap_or(ENFORCE_GRACE),
        })
    };
    let act = match &seen {
        Seen::Lease(l) => decide(l, boot_id, now),
        Seen::DirGone => doubt("the attempt's directory is gone"),
        Seen::Unreadable(why) => doubt(why),
    };
    match act {
        None => {}
        Some(GuardAct::Stop { reason, grace }) => {
            // Written before the stop, so the end is explained; a file that cannot be
            // written loses the reason, never the stop.
            if dir.is_dir() {
                if let Err(e) = record_stop(dir, reason, now, grace) {
                    tracing::warn!(
                        "cannot record the reason in stopped.json ({e}); stopping all the same"
                    );
                }
            }
            tracing::warn!(%reason, "stopping container {container} (grace {grace:?})");
            rt.stop(&container, grace).await?;
        }
        Some(GuardAct::Kill) => {
            tracing::warn!(
                "the agent's stop of {container} did not finish in its grace: killing it"
            );
            rt.stop(&container, Duration::ZERO).await?;
        }
    }
    Ok(Next::Watch)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StopMark;

    fn lease() -> LeaseFile {
        LeaseFile {
            container: Some("c".into()),
            boot_id: "b".into(),
            lease_deadline_ms: 10_000,
            time_limit_deadline_ms: Some(20_000),
            time_limit_s: None,
            grace_s: 10,
            stop: None,
        }
    }

    fn at(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    const GRACE: Duration = Duration::from_secs(10);

    #[test]
    fn the_guard_acts_on_deadlines_only() {
        let l = lease();
        assert_eq!(
            decide(&l, "b", at(10_000)),
            None,
            "the lease ends after its deadline"
        );
        assert_eq!(
            decide(&l, "b", at(10_001)),
            Some(GuardAct::Stop {
                reason: StopReason::LeaseExpired,
                grace: GRACE
            })
        );
        let mut l = lease();
        l.lease_deadline_ms = 99_000;
        assert_eq!(decide(&l, "b", at(19_999)), None);
        assert_eq!(
            decide(&l, "b", at(20_000)),
            Some(GuardAct::Stop {
                reason: StopReason::TimeLimit,
                grace: GRACE
            })
        );
        assert_eq!(
            decide(&l, "other-boot", at(0)),
            Some(GuardAct::Stop {
                reason: StopReason::LeaseExpired,
                grace: GRACE
            }),
            "another boot's deadlines are void"
        );
    }

    #[test]
    fn the_guard_never_cuts_short_the_agents_own_stop() {
        let mut l = lease();
        l.stop = Some(StopMark {
            reason: StopReason::Preempted,
            text: "preempted".into(),
            fails: false,
            grace_ms: 30_000,
            since_ms: 5_000,
        });
        assert_eq!(
            decide(&l, "b", at(25_000)),
            None,
            "past the lease, within the grace"
        );
        assert_eq!(decide(&l, "b", at(39_999)), None);
        assert_eq!(decide(&l, "b", at(40_000)), Some(GuardAct::Kill));
    }

    #[test]
    fn one_guard_per_attempt() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!is_running(dir.path()));
        let PidFile::Taken(held) = take_pid_file(dir.path()).unwrap() else {
            panic!("the first guard takes guard.pid")
        };
        assert!(is_running(dir.path()));
        assert!(
            matches!(take_pid_file(dir.path()).unwrap(), PidFile::Held),
            "a second guard stands down"
        );
        assert!(matches!(
            take_pid_file(&dir.path().join("gone")).unwrap(),
            PidFile::NoDir
        ));
        let pid = std::fs::read_to_string(dir.path().join(GUARD_PID_FILE)).unwrap();
        assert_eq!(pid.trim(), std::process::id().to_string());
        drop(held);
        assert!(!is_running(dir.path()));
    }
}
