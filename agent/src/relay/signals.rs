//! Signals for one exec's process (an SSH user's Ctrl-C, the hang-up when they leave, the
//! kill after it), through a pidfd (Linux 5.3 and later).
//!
//! Invariants: a signal reaches the exec's own process or nothing. The engine gives the
//! process's host pid; a pidfd opened on it is kept only if the engine still reports the
//! exec running with that pid afterwards (so the pidfd was opened while the process
//! lived, and names it). Once the process has ended, its pidfd answers ESRCH, whatever
//! process has the number since; a plain `kill(pid)` would reach that one.

use crate::runtime::{ContainerRuntime, ExecState};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// A handle on one process: signals through it reach that process while it lives, and
/// nothing after.
#[derive(Debug)]
pub struct ProcessHandle(OwnedFd);

impl ProcessHandle {
    /// A handle on the process that has `pid` now.
    pub fn open(pid: i32) -> io::Result<Self> {
        // SAFETY: pidfd_open(2) takes a pid and flags and returns a new descriptor or -1;
        // it touches no memory of ours.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let fd = RawFd::try_from(fd).map_err(|_| io::Error::other("pidfd out of range"))?;
        // SAFETY: a descriptor the kernel just made for us; nothing else owns it.
        Ok(Self(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Sends `sig`; an error (ESRCH) once the process has ended.
    pub fn signal(&self, sig: i32) -> io::Result<()> {
        // SAFETY: pidfd_send_signal(2) with our own descriptor and no siginfo (a null
        // pointer is the documented "as kill(2) would"); no memory of ours is touched.
        let r = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.0.as_raw_fd(),
                sig,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

/// Where an exec's signals go.
#[derive(Debug)]
enum Target {
    /// Not looked up yet (the first signal does).
    Unknown,
    Process(ProcessHandle),
    /// The process has ended (or could not be named safely): signals go nowhere.
    Gone,
}

/// The signals of one exec.
#[derive(Debug)]
pub struct ExecSignals {
    exec: String,
    target: Target,
}

impl ExecSignals {
    pub fn new(exec: &str) -> Self {
        Self {
            exec: exec.to_string(),
            target: Target::Unknown,
        }
    }

    /// Sends `sig` to the exec's process while it runs; whether it was delivered.
    pub async fn send(&mut self, rt: &impl ContainerRuntime, sig: i32) -> bool {
        if matches!(self.target, Target::Unknown) {
            self.target = self.find(rt).await;
        }
        let Target::Process(p) = &self.target else {
            return false;
        };
        match p.signal(sig) {
            Ok(()) => true,
            Err(e) => {
                if e.raw_os_error() == Some(libc::ESRCH) {
                    self.target = Target::Gone;
                } else {
                    tracing::debug!(exec = %self.exec, "signal {sig}: {e}");
                }
                false
            }
        }
    }

    /// The exec's process, if it runs: its pid from the engine, a pidfd on that pid, and
    /// the engine asked again, so the pidfd is known to name the exec's process. An exec
    /// not started yet is looked up again at the next signal.
    async fn find(&self, rt: &impl ContainerRuntime) -> Target {
        let Ok(first) = rt.exec_inspect(&self.exec).await else {
            return Target::Unknown;
        };
        let pid = match running_pid(&first) {
            Some(p) => p,
            None if first.exit_code.is_some() => return Target::Gone,
            None => return Target::Unknown,
        };
        let handle = match ProcessHandle::open(pid) {
            Ok(h) => h,
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return Target::Gone,
            Err(e) => {
                tracing::warn!(
                    exec = %self.exec,
                    pid,
                    "no pidfd for an SSH session's process, so no signals to it (Linux 5.3 \
                     or later needed): {e}"
                );
                return Target::Gone;
            }
        };
        let again = rt.exec_inspect(&self.exec).await.ok();
        if again.as_ref().and_then(running_pid) == Some(pid) {
            Target::Process(handle)
        } else {
            Target::Gone
        }
    }
}

/// The host pid of an exec that runs.
fn running_pid(i: &ExecState) -> Option<i32> {
    i.pid
        .filter(|p| *p > 1 && i.running == Some(true))
        .and_then(|p| i32::try_from(p).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handle_reaches_its_process_and_nothing_after_it_ended() {
        let mut child = std::process::Command::new("sleep")
            .arg("600")
            .spawn()
            .unwrap();
        let h = ProcessHandle::open(child.id() as i32).unwrap();
        h.signal(0).unwrap();
        h.signal(libc::SIGKILL).unwrap();
        child.wait().unwrap();
        let err = h.signal(libc::SIGKILL).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ESRCH), "{err}");
    }

    #[test]
    fn no_process_no_handle() {
        // Past the largest pid Linux hands out (2^22).
        let err = ProcessHandle::open(1 << 23).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ESRCH), "{err}");
    }
}
