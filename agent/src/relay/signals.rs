//! Signals for one exec's process (an SSH user's Ctrl-C, the hang-up when they leave, the
//! kill after it): the process is found through the engine by its host pid.

/// Where an exec's signals go.
pub struct ExecSignals {
    exec: String,
    pid: Option<i64>,
}

impl ExecSignals {
    pub fn new(exec: &str) -> Self {
        Self {
            exec: exec.to_string(),
            pid: None,
        }
    }

    /// Sends `sig` to the exec's process (its host pid, looked up once).
    pub async fn send(&mut self, docker: &bollard::Docker, sig: i32) -> bool {
        if self.pid.is_none() {
            self.pid = docker
                .inspect_exec(&self.exec)
                .await
                .ok()
                .filter(|i| i.running == Some(true))
                .and_then(|i| i.pid)
                .filter(|p| *p > 1);
        }
        if let Some(p) = self.pid.and_then(|p| i32::try_from(p).ok()) {
            // SAFETY: kill(2) with a pid the engine gave for this exec's running process; it
            // touches no memory of ours.
            return unsafe { libc::kill(p, sig) } == 0;
        }
        false
    }
}
