//! What a queued job asks for, as the plan compares it: its tier inside its lab, the
//! shape identical requests share, whether a GPU matches it, and a description for
//! reasons.

use crate::model::*;
use crate::policy::Policy;

/// A queued job's tier inside its lab: 0 (first) for an interactive job of a lab that
/// boosts them, 1 for every other job.
pub(crate) fn boost_tier(job: &QueuedJob, lab_boosts: bool) -> u8 {
    u8::from(!(job.interactive && lab_boosts))
}

/// The key under which identical requests of one lab share a result (the eighth field:
/// whether the job may borrow only nodes safe after a take-back; the last: its share).
pub(crate) type Shape<'a> = (
    LabId,
    u32,
    &'a [String],
    u64,
    Option<&'a str>,
    i64,
    (u64, u64, u64),
    bool,
    (&'a [String], &'a [String]),
    Option<GpuShare>,
);

pub(crate) fn shape<'a>(job: &'a QueuedJob, policy: &Policy, now: Time) -> Shape<'a> {
    (
        job.lab,
        job.gpus,
        &job.models,
        job.min_memory_mb,
        job.mig_profile.as_deref(),
        job.time_limit_s,
        (job.cpus.to_bits(), job.memory_mb, job.disk_gb),
        crate::risk::taken_back_rule_applies(job, now, policy),
        (&job.needs_exports, &job.datasets),
        job.share,
    )
}

/// Whether a GPU is of the kind the job asks for (model, memory, MIG profile); a share
/// needs a whole GPU with at least the memory it asks for.
#[inline]
pub(crate) fn gpu_matches(job: &QueuedJob, gpu: &Gpu) -> bool {
    if let Some(s) = job.share {
        if gpu.mig_profile.is_some() || gpu.memory_mb < s.memory_mb || gpu.memory_mb == 0 {
            return false;
        }
    }
    gpu.memory_mb >= job.min_memory_mb
        && gpu.mig_profile.as_deref() == job.mig_profile.as_deref()
        && (job.models.is_empty() || job.models.contains(&gpu.model))
}

/// "model A100 or H100, with at least 80 GB": what the job asks for, for reasons.
pub(crate) fn describe_request(job: &QueuedJob) -> String {
    let mut parts = Vec::new();
    if let Some(p) = &job.mig_profile {
        parts.push(format!("MIG {p}"));
    }
    if let Some(s) = job.share {
        let ask = crate::share::GpuAsk::Share {
            milli: s.milli,
            memory_mb: s.memory_mb,
        };
        let wording = crate::share::waiting_reason(&ask);
        parts.push(wording.trim_start_matches("waiting for ").to_string());
    }
    if !job.models.is_empty() {
        parts.push(format!("model {}", job.models.join(" or ")));
    }
    if job.min_memory_mb > 0 {
        parts.push(format!(
            "with at least {} GB",
            job.min_memory_mb.div_ceil(1024)
        ));
    }
    if parts.is_empty() {
        parts.push("of any model".into());
    }
    parts.join(", ")
}
