//! The free-space floor (`--min-free-disk`): below it, on the file system of the agent's
//! state dir (where every job's volume grows), the agent takes no new guests. The portal
//! hears it in every `Hello` and, when it changes, in heartbeats ([`report`]), places
//! no guest there and shows the reason on the node's page; a guest that was placed
//! before the portal heard it is not started and goes back to the queue ([`below`]).
//!
//! The default, 10 %, is the usual eviction threshold of a node's file system (the
//! kubelet's `nodefs.available<10%`): room for the owner's own work, the container
//! engine's logs and images, and the volumes of the jobs already running, which are
//! sparse and grow as they write (caps are limits, not reservations).

use super::{free_space, DiskPolicy};
use commons_proto::NodeDisk;
use std::path::Path;

const GIB: u64 = 1 << 30;

/// A floor: a share of the file system, or an amount.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Floor {
    /// Percent of the file system's size, 0 to 100.
    Percent(u8),
    /// GiB.
    Gb(u64),
}

impl Default for Floor {
    fn default() -> Self {
        Self::Percent(10)
    }
}

impl std::str::FromStr for Floor {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || {
            format!("--min-free-disk: expected a share like 10% or an amount like 50GB, got {s:?}")
        };
        let t = s.trim();
        if let Some(p) = t.strip_suffix('%') {
            let p: u8 = p.trim().parse().map_err(|_| bad())?;
            return if p <= 100 {
                Ok(Self::Percent(p))
            } else {
                Err(bad())
            };
        }
        let n = t
            .strip_suffix("GB")
            .or_else(|| t.strip_suffix("G"))
            .unwrap_or(t);
        n.trim().parse().map(Self::Gb).map_err(|_| bad())
    }
}

impl Floor {
    /// The floor in bytes on a file system of `total` bytes.
    pub fn bytes(self, total: u64) -> u64 {
        match self {
            Self::Percent(p) => total / 100 * u64::from(p),
            Self::Gb(g) => g.saturating_mul(GIB),
        }
    }
}

/// What the portal is told about this node's disk: the largest job, the free space and
/// the floor on the state dir's file system, and whether it is below. A file system that
/// cannot be read counts as below the floor (no guests while the agent cannot tell).
pub fn report(policy: &DiskPolicy, state_dir: &Path) -> NodeDisk {
    let (free, floor) = match free_space(state_dir) {
        Ok((free, total)) => (free, policy.floor.bytes(total)),
        Err(e) => {
            tracing::warn!("free space of {}: {e}", state_dir.display());
            (0, 1)
        }
    };
    NodeDisk {
        max_job_gb: policy.max_job_gb,
        free_gb: free / GIB,
        floor_gb: floor.div_ceil(GIB),
        below_floor: free < floor,
    }
}

/// Why the node takes no new guests now, in words for the job's owner; `None` while it
/// is above its floor.
pub fn below(policy: &DiskPolicy, state_dir: &Path) -> Option<String> {
    let r = report(policy, state_dir);
    r.below_floor.then(|| {
        format!(
            "this server has {} GB of disk free, under its floor of {} GB: it takes no new \
             guests",
            r.free_gb, r.floor_gb
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floors_parse_as_shares_or_amounts() {
        assert_eq!("10%".parse(), Ok(Floor::Percent(10)));
        assert_eq!("50GB".parse(), Ok(Floor::Gb(50)));
        assert_eq!("50".parse(), Ok(Floor::Gb(50)));
        for bad in ["101%", "x", "-1", "5TB"] {
            assert!(
                bad.parse::<Floor>()
                    .unwrap_err()
                    .contains("--min-free-disk"),
                "{bad}"
            );
        }
        assert_eq!(Floor::Percent(10).bytes(1000), 100);
        assert_eq!(Floor::Gb(2).bytes(0), 2 * GIB);
    }

    #[test]
    fn a_floor_above_the_free_space_says_so() {
        let tmp = tempfile::tempdir().unwrap();
        let mut p = DiskPolicy {
            floor: Floor::Gb(1 << 40),
            ..Default::default()
        };
        let r = report(&p, tmp.path());
        assert!(r.below_floor, "{r:?}");
        assert!(below(&p, tmp.path()).unwrap().contains("no new guests"));
        p.floor = Floor::Percent(0);
        assert!(!report(&p, tmp.path()).below_floor);
        assert_eq!(below(&p, tmp.path()), None);
    }
}
