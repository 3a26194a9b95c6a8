//! A job's GPU utilisation over time (`GET /api/v1/jobs/{id}/utilization`, and the job
//! page's chart), per attempt, from the agents' heartbeats.

use chrono::NaiveDateTime;
use serde::{Deserialize, Serialize};

/// One sample: the attempt's GPUs' mean utilisation over a sample interval (percent) and
/// the most memory they used together in it (MB).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Point {
    /// The end of the interval (UTC).
    pub at: NaiveDateTime,
    pub utilization_pct: f64,
    pub memory_used_mb: i64,
}

/// The samples of one attempt, oldest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AttemptSeries {
    pub attempt: i32,
    /// The server it ran on.
    pub node: Option<String>,
    pub samples: Vec<Point>,
}

/// Over every sample of the job; all `null` without samples.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Summary {
    pub samples: usize,
    pub mean_pct: Option<f64>,
    pub peak_pct: Option<f64>,
    pub peak_memory_mb: Option<i64>,
}

impl Summary {
    /// In words, for everyone (and screen readers): "mean 73 %, peak 100 %, memory up
    /// to 58.6 GB", or "no samples yet".
    pub fn words(&self) -> String {
        match (self.mean_pct, self.peak_pct, self.peak_memory_mb) {
            (Some(mean), Some(peak), Some(mem)) => format!(
                "mean {mean:.0} %, peak {peak:.0} %, memory up to {}",
                memory(mem)
            ),
            _ => "no samples yet".to_string(),
        }
    }
}

/// MB as people read them: "512 MB", "58.6 GB".
pub fn memory(mb: i64) -> String {
    if mb < 1024 {
        format!("{mb} MB")
    } else {
        format!("{:.1} GB", mb as f64 / 1024.0)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Utilization {
    pub job: i64,
    /// At most one sample per attempt this often (seconds).
    pub sample_interval_s: u64,
    /// Samples older than this are deleted.
    pub retention_days: u64,
    pub summary: Summary,
    /// Attempts with samples, oldest first.
    pub attempts: Vec<AttemptSeries>,
}
