//! Lab datasets (issue 28): large, read-only trees a lab publishes once and its jobs
//! mount at `/datasets/<name>`, kept on each server in one shared [`cache::Cache`] so that
//! a second job needing the same version starts without downloading it again. A dataset
//! arrives as a `.tar.gz` (or `.tar`) archive from an HTTPS address with its SHA-256
//! ([`archive::fetch`]) and is unpacked into the cache ([`archive::unpack`]).
//!
//! Invariants:
//! - A dataset version is filled once per server: concurrent jobs wanting it wait for
//!   the one fill and share its directory; a half-filled one is never visible (it is
//!   filled aside and moved into place by one rename), and a crash leaves only leftovers
//!   that the next start removes.
//! - What is held stays within the server's cap: least recently used entries go first,
//!   never one a running job has mounted (pinned by the attempt's directory, a pin that
//!   holds exactly as long as that directory exists, across agent restarts).
//! - A dataset is what its publisher hashed: the archive's SHA-256 must match before
//!   any of it is unpacked, and it downloads to disk as it arrives, never held whole.
//! - Unpacking writes only inside the dataset's directory: absolute paths, `..`, hard
//!   links, devices and symlinks pointing out are refused, and the bytes and entries
//!   it writes are bounded as they arrive. What it writes is read-only (0444/0555).
//! - A failure says which dataset (or archive entry) and why, in words the job's owner
//!   reads in the job's log.

pub mod archive;
pub mod cache;
pub mod here;

#[cfg(test)]
mod tests;

pub use cache::{Cache, Held};
pub use here::{parse_export, DatasetsConfig, Here};

/// A size as people read it: `12.0 GB`, `3.1 MB`, `512 bytes` (powers of 1000).
pub fn size_text(n: u64) -> String {
    const UNITS: [(u64, &str); 4] = [
        (1_000_000_000_000, "TB"),
        (1_000_000_000, "GB"),
        (1_000_000, "MB"),
        (1_000, "kB"),
    ];
    for (scale, unit) in UNITS {
        if n >= scale {
            return format!("{:.1} {unit}", n as f64 / scale as f64);
        }
    }
    format!("{n} bytes")
}
