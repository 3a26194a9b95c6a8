//! The checkpoint model with failures (`--no-checkpoint-share`, `--checkpoint-gbps`):
//! not every job checkpoints, and a checkpoint takes time to write.
//!
//! Without it (the default) the simulator keeps its older, kinder model: every job
//! stores a periodic checkpoint every `checkpoint_interval` of each attempt, and a
//! stopped job keeps its GPUs for the whole grace period, saving everything in it only
//! where `checkpoint_on_stop` (or the policy) says so.
//!
//! With it, for every policy alike:
//! 1. A share of the jobs, drawn from the seed by trace id (so a job keeps its draw in
//!    every window and campus), never checkpoints: no periodic snapshot and no save when
//!    told to stop. Such a job dies at once on SIGTERM and restarts from scratch.
//! 2. Every other job stores periodic snapshots and, told to stop, writes a checkpoint
//!    of its memory: `gpus x GPU memory x fill`, with `fill` drawn per job from
//!    [`FILL_MIN`]..1, at `gbps` GB/s. If the write fits the grace period the job keeps
//!    all its work up to the signal and leaves when the write is done; otherwise it is
//!    killed at the end of the grace period and keeps only its last periodic snapshot.
//! 3. Work is what a job computed; the time spent writing or waiting to be killed is
//!    not work, so lost work is the progress at the signal minus what was saved.
//!
//! What the portal would know, the scheduler gets: the write time of a job's latest
//! checkpoint, in any attempt (`RunningJob::checkpoint_write_s`), and its latest
//! periodic checkpoint in this attempt (`RunningJob::last_checkpoint_at`).
//!
//! Invariants: every draw is a pure function of (seed, trace id), and a job's write
//! time depends only on its draw, its GPUs and the memory of its node's GPUs.

use serde::{Deserialize, Serialize};

/// The smallest share of its GPUs' memory a job's checkpoint holds.
pub const FILL_MIN: f64 = 0.25;

/// The checkpoint model of a run.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CheckpointModel {
    /// Share of the jobs that never checkpoint (0 to 1).
    pub no_checkpoint_share: f64,
    /// Bandwidth of a checkpoint write in GB/s; `None`: writes take no time.
    pub gbps: Option<f64>,
    /// Seed of the per-job draws.
    pub seed: u64,
}

/// A model that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("--no-checkpoint-share must be between 0 and 1, not {0}")]
    Share(f64),
    #[error("--checkpoint-gbps must be a positive number of GB/s, not {0}")]
    Bandwidth(f64),
}

impl CheckpointModel {
    /// The model of the flags: on when either is given.
    pub fn from_flags(
        share: Option<f64>,
        gbps: Option<f64>,
        seed: u64,
    ) -> Result<Option<CheckpointModel>, ModelError> {
        if share.is_none() && gbps.is_none() {
            return Ok(None);
        }
        let share = share.unwrap_or(0.0);
        if !(0.0..=1.0).contains(&share) {
            return Err(ModelError::Share(share));
        }
        if let Some(b) = gbps.filter(|b| !(b.is_finite() && *b > 0.0)) {
            return Err(ModelError::Bandwidth(b));
        }
        Ok(Some(CheckpointModel {
            no_checkpoint_share: share,
            gbps,
            seed,
        }))
    }

    /// Whether the job with this trace id never checkpoints.
    pub fn never_checkpoints(&self, trace_id: i64) -> bool {
        unit(self.seed, trace_id, 1) < self.no_checkpoint_share
    }

    /// The share of its GPUs' memory the job's checkpoint holds.
    pub fn fill(&self, trace_id: i64) -> f64 {
        FILL_MIN + (1.0 - FILL_MIN) * unit(self.seed, trace_id, 2)
    }

    /// Seconds to write the checkpoint of a job of `fill` on `gpus` GPUs of
    /// `memory_mb` MiB each (rounded up; 0 without a bandwidth or a known memory).
    pub fn write_s(&self, fill: f64, gpus: usize, memory_mb: u64) -> i64 {
        let Some(gbps) = self.gbps else { return 0 };
        let gb = fill * gpus as f64 * memory_mb as f64 / 1024.0;
        (gb / gbps).ceil() as i64
    }
}

/// A well-mixed 64-bit hash (splitmix64's finaliser).
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A number in [0, 1) drawn from (seed, id, salt).
pub fn unit(seed: u64, id: i64, salt: u64) -> f64 {
    let h = mix(mix(seed ^ salt.wrapping_mul(0x1000_0000_01b3)) ^ id as u64);
    (h >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_turn_the_model_on_and_are_checked() {
        assert_eq!(CheckpointModel::from_flags(None, None, 1).unwrap(), None);
        let m = CheckpointModel::from_flags(Some(0.3), None, 1)
            .unwrap()
            .unwrap();
        assert_eq!(m.gbps, None);
        assert_eq!(m.write_s(1.0, 8, 80 * 1024), 0);
        assert!(CheckpointModel::from_flags(Some(1.5), None, 1).is_err());
        assert!(CheckpointModel::from_flags(None, Some(0.0), 1).is_err());
        let m = CheckpointModel::from_flags(None, Some(1.0), 1)
            .unwrap()
            .unwrap();
        assert_eq!(m.no_checkpoint_share, 0.0);
        // 8 GPUs of 80 GB, all of it: 640 s at 1 GB/s; half of one GPU: 40 s.
        assert_eq!(m.write_s(1.0, 8, 80 * 1024), 640);
        assert_eq!(m.write_s(0.5, 1, 80 * 1024), 40);
    }

    #[test]
    fn the_share_of_jobs_that_never_checkpoint_is_about_right() {
        let m = CheckpointModel {
            no_checkpoint_share: 0.3,
            gbps: Some(1.0),
            seed: 7,
        };
        let never = (0..10_000).filter(|&id| m.never_checkpoints(id)).count();
        assert!((2_800..3_200).contains(&never), "{never}");
        assert!((0..1000).all(|id| (FILL_MIN..1.0).contains(&m.fill(id))));
        // Pure: the same draw every time, another seed another draw.
        let other = CheckpointModel { seed: 8, ..m };
        let same = (0..1000).filter(|&id| m.never_checkpoints(id)).count();
        assert_eq!(
            same,
            (0..1000).filter(|&id| m.never_checkpoints(id)).count()
        );
        assert!((0..1000).any(|id| m.never_checkpoints(id) != other.never_checkpoints(id)));
    }
}
