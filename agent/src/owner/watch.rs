//! What the agent does on its own to keep the owner in charge, decided by one pure
//! function over the GPUs' numbers and the attempts that run ([`decide`]), every second:
//!
//! 1. A guest on a GPU that shows local use (a process in none of our containers) is
//!    stopped at once with the node's grace and requeued: the owner takes the GPU back.
//! 2. Every attempt on a GPU that shows a fault is stopped and requeued (elsewhere).
//! 3. While the owner has reclaimed the server (`reclaim --now`), every guest is stopped.
//! 4. A guest whose GPUs all stay under [`IDLE_PCT`] is warned in its log once it has
//!    been idle for the idle time less the warning time, and stopped when idle for the
//!    whole idle time: requeued, or cancelled if interactive (nobody is at the screen).
//!
//! Stopping an attempt that is already stopping changes nothing (the executor keeps the
//! first order), so deciding again every second is harmless.

use crate::executor::ActiveAttempt;
use commons_proto::{Attempt, GpuStat, JobId, StopReason};
use std::collections::BTreeMap;
use std::time::Duration;

/// Under this utilisation a guest's GPU counts as idle.
pub const IDLE_PCT: u32 = 5;
/// Grace for an agent's own stop when the portal gave none.
pub const DEFAULT_GRACE_S: u64 = 30;

/// The idle-guest rule of this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdleRule {
    /// Stop a guest idle this long; `None`: never.
    pub after: Option<Duration>,
}

impl IdleRule {
    /// The warning comes this long before the stop: a sixth of the idle time, at most
    /// ten minutes (60 min idle: warned at 50, stopped at 60).
    pub fn warn_before(&self) -> Duration {
        self.after
            .map(|a| (a / 6).min(Duration::from_secs(600)))
            .unwrap_or_default()
    }
}

/// What the watch does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Stop {
        job: JobId,
        attempt: Attempt,
        grace_s: u64,
        reason: StopReason,
        detail: String,
    },
    Warn {
        job: JobId,
        attempt: Attempt,
        line: String,
    },
}

/// Since when each guest has been idle, and whether it was warned.
#[derive(Debug, Default)]
pub struct IdleTrack {
    since: BTreeMap<(JobId, Attempt), (Duration, bool)>,
}

fn minutes(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 60 {
        format!("{} min", s / 60)
    } else {
        format!("{s} s")
    }
}

/// The decisions for this second (see the module docs); `now` is the boot clock.
pub fn decide(
    now: Duration,
    attempts: &[ActiveAttempt],
    stats: &[GpuStat],
    reclaimed: bool,
    idle: IdleRule,
    track: &mut IdleTrack,
) -> Vec<Decision> {
    let by_uuid: BTreeMap<&str, &GpuStat> = stats.iter().map(|s| (s.uuid.as_str(), s)).collect();
    let mut out = Vec::new();
    let mut seen = Vec::new();
    for a in attempts {
        let key = (a.job, a.attempt);
        seen.push(key);
        if a.stopping {
            track.since.remove(&key);
            continue;
        }
        let gpus: Vec<&GpuStat> = a
            .gpus
            .iter()
            .filter_map(|u| by_uuid.get(u.as_str()).copied())
            .collect();
        out.extend(decide_one(now, a, &gpus, reclaimed, idle, track));
    }
    track.since.retain(|k, _| seen.contains(k));
    out
}

/// One running attempt's decision, the first that applies: a failed GPU (any job), then
/// for guests the owner's own use, a reclaim, and idleness.
fn decide_one(
    now: Duration,
    a: &ActiveAttempt,
    gpus: &[&GpuStat],
    reclaimed: bool,
    idle: IdleRule,
    track: &mut IdleTrack,
) -> Option<Decision> {
    if let Some((g, f)) = gpus.iter().find_map(|g| g.fault.as_ref().map(|f| (g, f))) {
        return Some(stop(
            a,
            StopReason::Preempted,
            format!("its GPU {} failed ({f}); it resumes on another GPU", g.uuid),
        ));
    }
    if !a.guest() {
        return None;
    }
    if gpus.iter().any(|g| g.local_use) {
        return Some(stop(
            a,
            StopReason::Preempted,
            "the owner lab is using this GPU directly".into(),
        ));
    }
    if reclaimed {
        return Some(stop(
            a,
            StopReason::Preempted,
            "the owner took the server back (reclaim --now)".into(),
        ));
    }
    let after = idle.after?;
    idle_decision(now, a, gpus, after, idle, track)
}

/// A guest's idleness: a warning once it nears `after`, a stop when it reaches it.
fn idle_decision(
    now: Duration,
    a: &ActiveAttempt,
    gpus: &[&GpuStat],
    after: Duration,
    idle: IdleRule,
    track: &mut IdleTrack,
) -> Option<Decision> {
    let key = (a.job, a.attempt);
    // Only a guest whose container has started and whose GPUs we can read is judged.
    let idle_now = a.started.is_some()
        && !gpus.is_empty()
        && gpus.iter().all(|g| g.utilization_pct < IDLE_PCT);
    if !idle_now {
        track.since.remove(&key);
        return None;
    }
    let (since, warned) = track.since.entry(key).or_insert((now, false));
    let idle_for = now.saturating_sub(*since);
    let interactive = a.spec.as_ref().is_some_and(|s| s.interactive);
    if idle_for >= after {
        let what = if interactive { "cancelled" } else { "requeued" };
        return Some(stop(
            a,
            if interactive {
                StopReason::Cancelled
            } else {
                StopReason::Preempted
            },
            format!(
                "its GPUs stayed under {IDLE_PCT}% for {}: stopped and {what} so others can use them",
                minutes(after)
            ),
        ));
    }
    if !*warned && idle_for + idle.warn_before() >= after {
        *warned = true;
        return Some(Decision::Warn {
            job: a.job,
            attempt: a.attempt,
            line: format!(
                "GPU Commons: this job's GPUs have been under {IDLE_PCT}% for {}; it will be stopped in {} unless it uses them",
                minutes(idle_for),
                minutes(after.saturating_sub(idle_for))
            ),
        });
    }
    None
}

/// A stop of `a` with its own grace.
fn stop(a: &ActiveAttempt, reason: StopReason, detail: String) -> Decision {
    let grace_s = a
        .spec
        .as_ref()
        .and_then(|s| s.grace_s)
        .unwrap_or(DEFAULT_GRACE_S);
    Decision::Stop {
        job: a.job,
        attempt: a.attempt,
        grace_s,
        reason,
        detail,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use commons_proto::JobSpec;

    fn spec(guest: bool, interactive: bool) -> JobSpec {
        JobSpec {
            inputs: Vec::new(),
            datasets: Vec::new(),
            image: "i".into(),
            command: vec![],
            env: Default::default(),
            cpus: 1.0,
            memory_mb: 1,
            time_limit_s: 3600,
            user: "u".into(),
            shm_mb: None,
            checkpoint_interval_s: None,
            interactive,
            guest,
            lab: Some("physics".into()),
            grace_s: Some(20),
            image_digest: None,
            image_signature: None,
            image_campus: true,
            disk_gb: None,
            gpu_share: None,
        }
    }

    fn att(job: JobId, guest: bool, gpu: &str) -> ActiveAttempt {
        ActiveAttempt {
            job,
            attempt: 1,
            spec: Some(spec(guest, false)),
            gpus: vec![gpu.into()],
            started: Some(Duration::ZERO),
            stopping: false,
        }
    }

    fn stat(uuid: &str, util: u32, local: bool, fault: Option<&str>) -> GpuStat {
        GpuStat {
            uuid: uuid.into(),
            utilization_pct: util,
            memory_used_mb: 0,
            local_use: local,
            fault: fault.map(String::from),
        }
    }

    const NO_IDLE: IdleRule = IdleRule { after: None };
    const S: fn(u64) -> Duration = Duration::from_secs;

    fn stopped(d: &[Decision]) -> Vec<JobId> {
        d.iter()
            .filter_map(|d| match d {
                Decision::Stop { job, .. } => Some(*job),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn local_use_stops_the_guest_not_the_owner() {
        let atts = [att(1, true, "G0"), att(2, false, "G1")];
        let stats = [stat("G0", 90, true, None), stat("G1", 90, true, None)];
        let d = decide(
            S(5),
            &atts,
            &stats,
            false,
            NO_IDLE,
            &mut IdleTrack::default(),
        );
        assert_eq!(stopped(&d), vec![1]);
        let Decision::Stop {
            grace_s, reason, ..
        } = &d[0]
        else {
            panic!()
        };
        assert_eq!(
            (*grace_s, *reason),
            (20, StopReason::Preempted),
            "the node's grace"
        );
    }

    #[test]
    fn a_fault_stops_everyone_on_the_gpu_and_reclaim_every_guest() {
        let atts = [att(1, true, "G0"), att(2, false, "G0"), att(3, true, "G1")];
        let stats = [
            stat("G0", 0, false, Some("Xid 79: fallen off the bus")),
            stat("G1", 50, false, None),
        ];
        let d = decide(
            S(5),
            &atts,
            &stats,
            false,
            NO_IDLE,
            &mut IdleTrack::default(),
        );
        assert_eq!(stopped(&d), vec![1, 2]);
        let d = decide(
            S(5),
            &atts[2..],
            &stats,
            true,
            NO_IDLE,
            &mut IdleTrack::default(),
        );
        assert_eq!(stopped(&d), vec![3]);
    }

    #[test]
    fn idle_guests_are_warned_then_stopped_and_use_resets_the_clock() {
        let rule = IdleRule { after: Some(S(60)) };
        let mut track = IdleTrack::default();
        let mut inter = att(2, true, "G1");
        inter.spec = Some(spec(true, true));
        let atts = [att(1, true, "G0"), inter, att(3, false, "G2")];
        let idle = [
            stat("G0", 1, false, None),
            stat("G1", 0, false, None),
            stat("G2", 0, false, None),
        ];
        assert!(decide(S(0), &atts, &idle, false, rule, &mut track).is_empty());
        // Busy for a moment: the clock starts again for job 1.
        let mut busy = idle.clone();
        busy[0].utilization_pct = 80;
        decide(S(30), &atts, &busy, false, rule, &mut track);
        let d = decide(S(50), &atts, &idle, false, rule, &mut track);
        assert!(
            matches!(&d[..], [Decision::Warn { job: 2, .. }]),
            "job 2 is warned 10 s before its stop: {d:?}"
        );
        let d = decide(S(60), &atts, &idle, false, rule, &mut track);
        assert!(
            matches!(
                &d[..],
                [Decision::Stop {
                    job: 2,
                    reason: StopReason::Cancelled,
                    ..
                }]
            ),
            "an interactive guest is cancelled: {d:?}"
        );
        // Job 1 has been seen idle since 50 s.
        let d = decide(S(100), &atts, &idle, false, rule, &mut track);
        assert!(
            d.iter().any(|d| matches!(d, Decision::Warn { job: 1, .. })),
            "{d:?}"
        );
        let d = decide(S(110), &atts, &idle, false, rule, &mut track);
        assert!(
            d.iter().any(|d| matches!(
                d,
                Decision::Stop {
                    job: 1,
                    reason: StopReason::Preempted,
                    ..
                }
            )),
            "a batch guest is requeued after 60 s idle: {d:?}"
        );
        assert!(
            !stopped(&d).contains(&3),
            "the owner's idle job is left alone"
        );
    }
}
