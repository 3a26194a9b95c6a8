//! The server's CPUs, memory and free disk, for `Hello` and heartbeats: the scheduler
//! places jobs' `cpus` and `memory_gb` against them.

use commons_proto::NodeCapacity;
use std::path::Path;

/// `MemTotal` of a `/proc/meminfo` text, in MiB.
pub fn mem_total_mb(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024)
}

/// Free space of the file system holding `path`, in GiB (0 when it cannot be read).
fn free_disk_gb(path: &Path) -> u64 {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return 0;
    };
    // SAFETY: `c` is a valid NUL-terminated path and `st` a properly sized out-parameter.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return 0;
    }
    (st.f_bavail as u64).saturating_mul(st.f_frsize as u64) >> 30
}

/// What to report under `mode` (`None`: nothing, see [`crate::config::CapacityMode`]).
pub fn report(
    mode: crate::config::CapacityMode,
    fake_gpus: bool,
    state_dir: &Path,
) -> Option<NodeCapacity> {
    match mode {
        crate::config::CapacityMode::Given { cpus, memory_gb } => Some(NodeCapacity {
            cpus,
            memory_mb: memory_gb * 1024,
            disk_gb: measure(state_dir).disk_gb,
        }),
        crate::config::CapacityMode::Auto if fake_gpus => None,
        crate::config::CapacityMode::Auto => Some(measure(state_dir)),
    }
}

/// What this server has now. Disk is measured where Docker keeps containers when that
/// exists, else where the agent keeps its state.
pub fn measure(state_dir: &Path) -> NodeCapacity {
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get() as f64)
        .unwrap_or(0.0);
    let memory_mb = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| mem_total_mb(&m))
        .unwrap_or(0);
    let docker = Path::new("/var/lib/docker");
    let disk_gb = free_disk_gb(if docker.exists() { docker } else { state_dir });
    NodeCapacity {
        cpus,
        memory_mb,
        disk_gb,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_meminfo_and_measures_this_machine() {
        let text = "MemTotal:       131891804 kB\nMemFree:         1000 kB\n";
        assert_eq!(mem_total_mb(text), Some(128800));
        assert_eq!(mem_total_mb("nothing"), None);
        let c = measure(Path::new("/tmp"));
        assert!(c.cpus >= 1.0 && c.memory_mb > 0, "{c:?}");
    }
}
