//! The owner's commands on the server (`commons-agent lend|drain|undrain|leave|reclaim`),
//! as the agent forwards them to the portal, and the node's state as the portal sees it
//! (`commons-agent status`). Plain HTTP beside the WebSocket, with the node credential:
//!
//! - `GET  {NODE_CONTROL_PATH}`: the node's [`NodeState`].
//! - `POST {NODE_CONTROL_PATH}` with a [`NodeCommand`]: applies it, records it in the
//!   lab's audit log as done on the server (by `by`), answers a [`NodeControlAnswer`].
//!   A refused command is 4xx with the API's JSON error `{error, message, field?}`.
//!
//! Also the lending-window grammar the command line uses, so the agent refuses a window
//! that does not parse before anything is sent: `DAYS HH:MM-HH:MM`, where DAYS is
//! `mon-fri`, `sat,sun`, `daily`, or a list of day ranges (`mon,wed-fri`).

use serde::{Deserialize, Serialize};

/// The node's own control endpoint (see the module docs).
pub const NODE_CONTROL_PATH: &str = "/api/agent/v1/node";

/// What the server has besides GPUs; the scheduler places jobs' `cpus` and `memory_gb`
/// against it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct NodeCapacity {
    /// Logical CPUs the agent may give to containers.
    pub cpus: f64,
    /// Memory in MiB.
    pub memory_mb: u64,
    /// Free disk space for containers (the Docker data root) in GiB.
    pub disk_gb: u64,
}

/// The node's disk as its agent reports it (`commons-agent run --max-job-disk-gb
/// --min-free-disk`): the scheduler places no job whose `disk_gb` is above `max_job_gb`
/// there, and no new guest while it is `below_floor`. Sizes in GiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeDisk {
    /// The largest `disk_gb` a job may have on this server.
    pub max_job_gb: u64,
    /// Free space on the file system where jobs' volumes grow (the agent's state dir).
    pub free_gb: u64,
    /// The agent's free-space floor on that file system.
    pub floor_gb: u64,
    /// Free space is below the floor: the agent takes no new guests.
    pub below_floor: bool,
}

/// One weekly lending window, as the portal's lending API takes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LendWindow {
    /// Weekdays, 0 = Monday.
    pub days: Vec<u32>,
    /// "HH:MM" campus time; `to` before `from` runs past midnight.
    pub from: String,
    pub to: String,
}

/// A command from the server's owner.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "snake_case", deny_unknown_fields)]
pub enum NodeCommand {
    /// The lending rule: `never`, `always` or `windows` (with at least one window).
    Lend {
        mode: String,
        #[serde(default)]
        windows: Vec<LendWindow>,
        /// Who ran it on the server (the local user).
        by: String,
    },
    /// No new guests; running guests move elsewhere; owner jobs finish.
    Drain {
        by: String,
    },
    Undrain {
        by: String,
    },
    /// Take every GPU back now (`on`), or lend again (`on: false`).
    Reclaim {
        on: bool,
        by: String,
    },
    /// Leave GPU Commons: every job here is stopped and requeued, the node and its GPUs
    /// vanish, its credential is revoked.
    Leave {
        by: String,
    },
}

/// The portal's answer to a command: what it did, in words, and the node's state after.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeControlAnswer {
    pub message: String,
    pub state: NodeState,
}

/// The node as the portal sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeState {
    pub node_id: i64,
    pub name: String,
    pub lab: String,
    /// The lending rule in words ("always", "never", "windows: Mon-Fri 19:00-07:00").
    pub lending: String,
    /// Lending now, under the rule and the clock.
    pub lending_now: bool,
    pub draining: bool,
    pub reclaim: bool,
    /// Idle minutes a GPU needs before it is lent.
    pub min_idle_minutes: i64,
    pub gpus: Vec<GpuState>,
}

/// One GPU as the portal sees it: lendable now or why not.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuState {
    pub uuid: String,
    pub lendable: bool,
    /// Why it is not lendable now (local use, fault, idle time, the rule), or "".
    #[serde(default)]
    pub why: String,
}

const DAYS: [&str; 7] = [
    "monday",
    "tuesday",
    "wednesday",
    "thursday",
    "friday",
    "saturday",
    "sunday",
];

/// "mon", "Monday", "tues": a day by a prefix of at least three letters (0 = Monday).
fn day(s: &str) -> Option<u32> {
    let s = s.to_ascii_lowercase();
    (s.len() >= 3)
        .then(|| DAYS.iter().position(|d| d.starts_with(&s)))
        .flatten()
        .map(|i| i as u32)
}

fn hhmm(s: &str) -> Option<u32> {
    let (h, m) = s.split_once(':')?;
    if h.is_empty() || h.len() > 2 || m.len() != 2 {
        return None;
    }
    let (h, m): (u32, u32) = (h.parse().ok()?, m.parse().ok()?);
    (h < 24 && m < 60 || h == 24 && m == 0).then_some(h * 60 + m)
}

/// Parses one window, `DAYS HH:MM-HH:MM` (e.g. `mon-fri 19:00-07:00`, `sat,sun
/// 00:00-24:00`, `daily 22:00-06:00`), or says what is wrong with it.
pub fn parse_window(text: &str) -> Result<LendWindow, String> {
    let bad = |why: &str| {
        format!(
            "lending window {text:?}: {why}; write DAYS HH:MM-HH:MM, e.g. \"mon-fri 19:00-07:00\" or \"sat,sun 00:00-24:00\""
        )
    };
    let mut parts = text.split_whitespace();
    let (Some(days_text), Some(times), None) = (parts.next(), parts.next(), parts.next()) else {
        return Err(bad("expected days and a time range"));
    };
    let mut days = Vec::new();
    if days_text.eq_ignore_ascii_case("daily") {
        days.extend(0..7);
    } else {
        for item in days_text.split(',') {
            let (a, b) = item.split_once('-').unwrap_or((item, item));
            let (Some(a), Some(b)) = (day(a), day(b)) else {
                return Err(bad(&format!("{item:?} is not a day or a range of days")));
            };
            let mut d = a;
            loop {
                days.push(d);
                if d == b {
                    break;
                }
                d = (d + 1) % 7;
            }
        }
    }
    days.sort_unstable();
    days.dedup();
    let Some((from, to)) = times.split_once('-') else {
        return Err(bad("the times need a dash: HH:MM-HH:MM"));
    };
    let (Some(f), Some(t)) = (hhmm(from), hhmm(to)) else {
        return Err(bad("times are HH:MM, 00:00 to 24:00"));
    };
    if f == t % 1440 && f == t {
        return Err(bad("a window needs a length"));
    }
    Ok(LendWindow {
        days,
        from: from.to_string(),
        to: to.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_parse() {
        let w = parse_window("mon-fri 19:00-07:00").unwrap();
        assert_eq!(w.days, vec![0, 1, 2, 3, 4]);
        assert_eq!((w.from.as_str(), w.to.as_str()), ("19:00", "07:00"));
        assert_eq!(
            parse_window("Sat,sun 00:00-24:00").unwrap().days,
            vec![5, 6]
        );
        assert_eq!(
            parse_window("fri-mon 20:00-08:00").unwrap().days,
            vec![0, 4, 5, 6]
        );
        assert_eq!(parse_window("daily 22:00-06:00").unwrap().days.len(), 7);
    }

    #[test]
    fn bad_windows_say_why() {
        for bad in [
            "nights",
            "mon-fri",
            "mon-fri 19:00",
            "moon 19:00-20:00",
            "mon 25:00-26:00",
            "mon 9-17",
            "mon 10:00-10:00",
            "mon 10:00-11:00 extra",
        ] {
            let e = parse_window(bad).unwrap_err();
            assert!(e.contains("DAYS HH:MM-HH:MM"), "{bad}: {e}");
        }
    }

    #[test]
    fn commands_are_tagged_and_closed() {
        let c = NodeCommand::Reclaim {
            on: true,
            by: "root".into(),
        };
        let text = serde_json::to_string(&c).unwrap();
        assert_eq!(text, r#"{"command":"reclaim","on":true,"by":"root"}"#);
        assert!(serde_json::from_str::<NodeCommand>(r#"{"command":"explode","by":"x"}"#).is_err());
    }

    #[test]
    fn old_heartbeats_and_stats_still_read() {
        let hb = r#"{"type":"heartbeat","seq":1,"gpu_stats":[{"uuid":"g","utilization_pct":1,"memory_used_mb":0,"local_use":false}],"attempts":[]}"#;
        let m: crate::AgentMsg = serde_json::from_str(hb).unwrap();
        let crate::AgentMsg::Heartbeat {
            capacity,
            disk,
            gpu_stats,
            ..
        } = m
        else {
            panic!("not a heartbeat")
        };
        assert!(capacity.is_none() && disk.is_none());
        assert!(gpu_stats[0].fault.is_none());
    }
}
