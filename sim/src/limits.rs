//! Users' time limits. The trace has true run times only, and no user knows those: a
//! replay with `--limits overestimate` gives each job the limit a user would have
//! asked for, its run time times a random factor.
//!
//! The model is the "f-model" of Mu'alem & Feitelson ("Utilization, predictability,
//! workloads, and user runtime estimates in scheduling the IBM SP2 with backfilling",
//! IEEE TPDS 12(6), 2001): each estimate is the run time times a factor drawn
//! uniformly at random, here from `[1, F]` with `F` = [`OVERESTIMATE_MAX_FACTOR`],
//! then rounded up to whole minutes as users write them. A factor of 1 (the default,
//! no seed) is the exact run time.
//!
//! Invariants: a limit is never below the run time (no job is killed), and the limits
//! are a pure function of the workload and the seed.

use crate::trace::Workload;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The largest overestimate factor.
pub const OVERESTIMATE_MAX_FACTOR: f64 = 10.0;

/// Each job's time limit, by job index: the run time without a seed, an overestimate
/// drawn from `seed` with one.
pub fn time_limits(work: &Workload, seed: Option<u64>) -> Vec<i64> {
    let Some(seed) = seed else {
        return work.jobs.iter().map(|j| j.duration).collect();
    };
    let mut rng = StdRng::seed_from_u64(seed);
    work.jobs
        .iter()
        .map(|j| {
            let f: f64 = rng.random_range(1.0..=OVERESTIMATE_MAX_FACTOR);
            let limit = (j.duration as f64 * f).ceil() as i64;
            (limit.div_euclid(60) + i64::from(limit % 60 != 0)) * 60
        })
        .map(|l| l.max(60))
        .zip(&work.jobs)
        .map(|(l, j)| l.max(j.duration))
        .collect()
}
