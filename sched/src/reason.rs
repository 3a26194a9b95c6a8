//! Why a job waits, in words a researcher understands.
//!
//! Every variant serializes with a stable snake_case `code` (the portal stores and
//! filters on it) and displays as one sentence that needs no scheduler knowledge.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Who a quota belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QuotaScope {
    /// The lab's borrowing quota (set by operators).
    Lab,
    /// The member's quota in the lab (set by the lab admin).
    Member,
}

impl fmt::Display for QuotaScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            QuotaScope::Lab => "lab quota",
            QuotaScope::Member => "your quota in this lab",
        })
    }
}

/// Why a queued job does not start now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "code", rename_all = "snake_case")]
pub enum Reason {
    /// No node on campus could ever satisfy the request (too many GPUs, unknown model).
    NoNodeFits {
        /// GPUs asked for.
        gpus: u32,
        /// What they must be, e.g. "model A100, at least 80 GB each".
        detail: String,
    },
    /// The servers that have the GPUs it needs have fewer CPUs or less memory than it
    /// asks for (it is never given less than it asked).
    NoNodeCapacity {
        /// What it asks for, e.g. "64 CPUs and 512 GB of memory".
        detail: String,
    },
    /// No server that could hold it exports a dataset it needs (a `node:` dataset).
    NeedsDataset {
        /// `LAB/NAME`.
        dataset: String,
        /// The servers that export it (none when no server does now).
        exporters: Vec<String>,
    },
    /// The servers that have the GPUs (and CPUs and memory) it needs give a job less disk
    /// than it asks for (`disk_gb`, above their agents' `--max-job-disk-gb`).
    NoNodeDisk {
        /// GiB it asks for.
        disk_gb: u64,
        /// The most any of those servers gives a job, in GiB.
        largest_gb: u64,
    },
    /// A node could run it, but its GPUs are busy now.
    WaitingForGpus {
        /// GPUs asked for.
        gpus: u32,
    },
    /// An earlier job in the queue holds the place it needs (its reserved start would be
    /// delayed, and this job would not end before it).
    BehindEarlierJob {
        /// The earlier job.
        job: i64,
    },
    /// Matching GPUs exist but none is free now.
    NoFreeMatchingGpu {
        /// GPUs asked for.
        gpus: u32,
        /// What they must be, e.g. "with 80 GB".
        detail: String,
    },
    /// A share job: the GPUs that take shares and match it have not that much free
    /// now ("waiting for 0.5 of a GPU with 20 GB free").
    WaitingForShare {
        /// Compute share asked for, in milli-GPU (0: in proportion to the memory).
        milli: u32,
        /// GPU memory asked for, in MiB (0: in proportion to the compute share).
        memory_mb: u64,
    },
    /// The owner of the node that would fit is waiting for these GPUs itself.
    OwnerReserved {
        /// Node name.
        node: String,
    },
    /// Owner job: guests on its lab's node are being stopped to make room.
    WaitingForGuestsToLeave {
        /// Node name.
        node: String,
        /// Their grace period.
        grace_s: u32,
    },
    /// Owner job: its lab's nodes are busy with the lab's own jobs.
    WaitingForOwnJobs {
        /// Node name.
        node: String,
    },
    /// Owner job: stopping the guests on its lab's node now would throw away much of
    /// their work (they have no recent checkpoint), so it waits a while for them or for
    /// the lab's own jobs before it stops them
    /// ([`crate::Policy::spare_costly_guests_gpu_hours`]).
    SparingGuests {
        /// Node name.
        node: String,
        /// GPU-hours of work the guests would lose, rounded.
        lost_gpu_hours: u64,
        /// Seconds it waits at most before it stops them.
        wait_s: i64,
    },
    /// Nodes that fit do not lend to this job now (lending rules).
    NotLent {
        /// Which rule, on which node.
        detail: String,
    },
    /// A GPU quota is full.
    QuotaGpus {
        /// Lab or member quota.
        scope: QuotaScope,
        /// GPUs held now.
        used: u32,
        /// The limit.
        limit: u32,
    },
    /// A GPU-hour quota would be exceeded by this job's time limit.
    QuotaGpuHours {
        /// Lab or member quota.
        scope: QuotaScope,
        /// GPU-hours used and committed to running jobs in this period (rounded).
        used: u64,
        /// The limit (rounded).
        limit: u64,
        /// GPU-hours this job may use, GPUs x time limit (rounded up).
        needs: u64,
    },
    /// The job's time limit is above the quota's longest job; it will not start until
    /// the limit is lowered or the quota raised.
    QuotaTimeLimit {
        /// Lab or member quota.
        scope: QuotaScope,
        /// The longest job allowed, in seconds.
        limit_s: i64,
    },
    /// A GPU-hour quota applies and the job has no time limit.
    QuotaNeedsTimeLimit {
        /// Lab or member quota.
        scope: QuotaScope,
    },
    /// The job waits for another job to end (its `after`). The portal keeps such jobs out
    /// of the snapshot until then; the reason is here so that every waiting reason reads
    /// alike and has a code.
    WaitingForJob {
        /// The job it waits for.
        job: i64,
        /// What that job must do: "succeed", "fail" or "end".
        to: String,
    },
}

/// "30 s", "1 min 30 s", "90 min", "4 h", "1.5 h": a duration as researchers write it.
pub(crate) fn hours(seconds: i64) -> String {
    if seconds < 60 {
        format!("{} s", seconds.max(0))
    } else if seconds < 600 && seconds % 60 != 0 {
        format!("{} min {} s", seconds / 60, seconds % 60)
    } else if seconds < 2 * 3600 && seconds % 3600 != 0 {
        format!("{} min", seconds / 60)
    } else if seconds % 3600 == 0 {
        format!("{} h", seconds / 3600)
    } else {
        format!("{:.1} h", seconds as f64 / 3600.0)
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::NoNodeFits { gpus, detail } => {
                write!(f, "no server on campus has {gpus} matching GPUs ({detail})")
            }
            Reason::NoNodeCapacity { detail } => write!(
                f,
                "no server on campus with the GPUs it needs has {detail}; ask for fewer CPUs or less memory"
            ),
            Reason::NeedsDataset { dataset, exporters } if exporters.is_empty() => write!(
                f,
                "needs dataset {dataset}, which no server exports now (its lab's servers \
                 export it with commons-agent run --data)"
            ),
            Reason::NeedsDataset { dataset, exporters } => write!(
                f,
                "needs dataset {dataset}, exported by {} only",
                exporters.join(", ")
            ),
            Reason::NoNodeDisk {
                disk_gb,
                largest_gb,
            } => write!(
                f,
                "no server on campus with the GPUs it needs gives a job {disk_gb} GiB of \
                 disk (the most any gives is {largest_gb} GiB); ask for less (disk_gb)"
            ),
            Reason::WaitingForGpus { gpus } => write!(f, "waiting for {gpus} free GPUs"),
            Reason::BehindEarlierJob { job } => {
                write!(f, "waiting behind job {job}, which needs the same GPUs")
            }
            Reason::NoFreeMatchingGpu { gpus, detail } => {
                let s = if *gpus == 1 { "" } else { "s" };
                write!(f, "waiting: no {gpus} free GPU{s} {detail}")
            }
            Reason::WaitingForShare { milli, memory_mb } => f.write_str(
                &crate::share::waiting_reason(&crate::share::GpuAsk::Share {
                    milli: *milli,
                    memory_mb: *memory_mb,
                }),
            ),
            Reason::OwnerReserved { node } => {
                write!(f, "the owner of node {node} reserved its free GPUs")
            }
            Reason::WaitingForGuestsToLeave { node, grace_s } => write!(
                f,
                "guest jobs on your lab's node {node} are being stopped (grace period {})",
                hours(i64::from(*grace_s))
            ),
            Reason::WaitingForOwnJobs { node } => {
                write!(f, "waiting for your lab's jobs on node {node} to finish")
            }
            Reason::SparingGuests {
                node,
                lost_gpu_hours,
                wait_s,
            } => write!(
                f,
                "stopping the guest jobs on your lab's node {node} now would throw away \
                 {lost_gpu_hours} GPU-hours of their work; waiting up to {} for them or \
                 your lab's jobs before stopping them",
                hours(*wait_s)
            ),
            Reason::NotLent { detail } => write!(f, "not lent: {detail}"),
            Reason::QuotaGpus { scope, used, limit } => {
                write!(f, "{scope}: {used} of {limit} GPUs in use")
            }
            Reason::QuotaGpuHours {
                scope,
                used,
                limit,
                needs,
            } => write!(
                f,
                "{scope}: {used} of {limit} GPU-hours used or committed this period, \
                 and this job may need {needs}"
            ),
            Reason::QuotaTimeLimit { scope, limit_s } => write!(
                f,
                "{scope}: jobs may run at most {}; lower the time limit",
                hours(*limit_s)
            ),
            Reason::QuotaNeedsTimeLimit { scope } => {
                write!(f, "{scope} counts GPU-hours: set a time limit")
            }
            Reason::WaitingForJob { job, to } => write!(f, "waiting for job {job} to {to}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_durations_are_not_rounded_to_nothing() {
        // A 30 s grace period used to read "grace period 0 min".
        let cases = [
            (0, "0 s"),
            (30, "30 s"),
            (60, "1 min"),
            (90, "1 min 30 s"),
            (1800, "30 min"),
            (5400, "90 min"),
            (7200, "2 h"),
            (9000, "2.5 h"),
        ];
        for (s, want) in cases {
            assert_eq!(hours(s), want, "{s} s");
        }
        let r = Reason::WaitingForGuestsToLeave {
            node: "n1".into(),
            grace_s: 30,
        };
        assert!(r.to_string().ends_with("(grace period 30 s)"), "{r}");
    }

    #[test]
    fn display_and_code() {
        let cases = [
            (
                Reason::QuotaGpus {
                    scope: QuotaScope::Lab,
                    used: 4,
                    limit: 4,
                },
                "lab quota: 4 of 4 GPUs in use",
                "quota_gpus",
            ),
            (
                Reason::NoFreeMatchingGpu {
                    gpus: 1,
                    detail: "with at least 80 GB".into(),
                },
                "waiting: no 1 free GPU with at least 80 GB",
                "no_free_matching_gpu",
            ),
            (
                Reason::OwnerReserved {
                    node: "gpu7".into(),
                },
                "the owner of node gpu7 reserved its free GPUs",
                "owner_reserved",
            ),
            (
                Reason::WaitingForShare {
                    milli: 500,
                    memory_mb: 20 * 1024,
                },
                "waiting for 0.5 of a GPU with 20 GB free",
                "waiting_for_share",
            ),
            (
                Reason::WaitingForJob {
                    job: 41,
                    to: "succeed".into(),
                },
                "waiting for job 41 to succeed",
                "waiting_for_job",
            ),
            (
                Reason::QuotaTimeLimit {
                    scope: QuotaScope::Member,
                    limit_s: 86_400,
                },
                "your quota in this lab: jobs may run at most 24 h; lower the time limit",
                "quota_time_limit",
            ),
        ];
        for (reason, text, code) in cases {
            assert_eq!(reason.to_string(), text);
            let json = serde_json::to_value(&reason).unwrap();
            assert_eq!(json["code"], code);
            let back: Reason = serde_json::from_value(json).unwrap();
            assert_eq!(back, reason);
        }
    }

    #[test]
    fn durations() {
        assert_eq!(hours(90 * 60), "90 min");
        assert_eq!(hours(4 * 3600), "4 h");
        assert_eq!(hours(9000), "2.5 h");
    }
}
