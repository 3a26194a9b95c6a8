//! The campus overview: every GPU right now (used by its owners, lent to a guest, idle
//! and lendable, withheld or offline), the queue by lab, and the typical wait. One read
//! model for the home page and `GET /api/v1/overview`, so the two always agree.
//!
//! Invariants:
//! - Every present GPU of every enrolled server is in exactly one state, and the counts
//!   are the number of cells in each state (the map and the numbers cannot differ).
//! - A GPU an active attempt holds is the owner's or a guest's whatever else is true of
//!   it (its job runs there as far as the portal knows).
//! - The viewer's labs come first (labs they administer, then labs they belong to), then
//!   the others by slug.

use super::Actor;
use crate::db::models::{Gpu, Lab, Node};
use crate::db::overview::Holder;
use crate::db::{self, DbConn};
use crate::error::AppError;
pub use commons_api::overview::{Cell, CellState, GpuCounts, LabLine, MyUse, Overview, Server};
use std::collections::BTreeMap;

/// The viewer's use in each of their labs.
fn my_use(c: &mut DbConn, actor: &Actor) -> Result<Vec<MyUse>, AppError> {
    let now = db::now();
    let mut out = Vec::new();
    for (lab, _) in &actor.labs {
        let used = db::usage::member_use(c, lab.id, now, db::snapshot::QUOTA_PERIOD_S)?;
        let (gpus_now, gpu_hours) = used.get(&actor.user.username).copied().unwrap_or_default();
        let own = db::users::membership(c, lab.id, actor.user.id)?
            .map(|m| m.quota.0)
            .unwrap_or_default();
        let quota = if own == commons_sched::Quota::default() {
            lab.member_quota.0.clone()
        } else {
            own
        };
        out.push(MyUse {
            lab: lab.slug.clone(),
            gpus_now,
            max_gpus: quota.max_gpus,
            gpu_hours,
            max_gpu_hours: quota.max_gpu_hours,
        });
    }
    Ok(out)
}

/// What the classification needs of a server.
struct ServerFacts {
    lab: i64,
    online: bool,
    draining: bool,
    reclaim: bool,
    lends_now: bool,
    max_lent: Option<u32>,
}

/// The state of one GPU that no attempt holds, and why. `lent` is how many GPUs of the
/// server guests hold now.
fn idle_state(s: &ServerFacts, g: &Gpu, lent: u32) -> (CellState, String) {
    if !s.online {
        (CellState::Offline, "the server is offline".into())
    } else if let Some(f) = &g.fault {
        (CellState::Withheld, format!("faulty: {f}"))
    } else if g.local_use {
        (CellState::Owner, "the owners use it directly".into())
    } else if s.reclaim {
        (CellState::Withheld, "the owners took every GPU back".into())
    } else if s.draining {
        (CellState::Withheld, "the server is drained".into())
    } else if !s.lends_now {
        (
            CellState::Withheld,
            "the lending rules do not lend now".into(),
        )
    } else if s.max_lent.is_some_and(|m| lent >= m) {
        (
            CellState::Withheld,
            format!(
                "the server lends at most {} GPUs at once",
                s.max_lent.unwrap_or(0)
            ),
        )
    } else {
        (CellState::Lendable, String::new())
    }
}

/// Median of `values` (the lower middle one of an even count).
fn median(mut values: Vec<i64>) -> Option<i64> {
    values.sort_unstable();
    values.get(values.len().saturating_sub(1) / 2).copied()
}

/// The overview as `actor` sees it (everyone sees the whole campus; the viewer's labs
/// come first).
pub fn overview(c: &mut DbConn, actor: &Actor, utc_offset_s: i32) -> Result<Overview, AppError> {
    let servers = db::nodes::list_with_gpus(c)?;
    let holders = db::overview::holders(c)?;
    let waiting = db::overview::waiting(c)?;
    let now = db::now();
    let starts = db::overview::recent_starts(c, now - chrono::Duration::days(7))?;
    let labs = db::users::all_lab_slugs(c)?;
    let mine = my_use(c, actor)?;
    Ok(build(
        actor,
        servers,
        &holders,
        &waiting,
        &starts,
        &labs,
        now,
        utc_offset_s,
        mine,
    ))
}

#[allow(clippy::too_many_arguments)]
fn build(
    actor: &Actor,
    servers: Vec<(Node, Lab, Vec<Gpu>)>,
    holders: &[Holder],
    waiting: &[db::overview::Waiting],
    starts: &[(chrono::NaiveDateTime, chrono::NaiveDateTime)],
    labs: &[(i64, String)],
    now: chrono::NaiveDateTime,
    utc_offset_s: i32,
    my_use: Vec<MyUse>,
) -> Overview {
    let now_s = now.and_utc().timestamp();
    let slugs = Slugs(labs);
    let held: BTreeMap<i64, &Holder> = holders
        .iter()
        .flat_map(|h| h.attempt.gpu_ids.0.iter().map(move |g| (*g, h)))
        .collect();
    let mut lines: BTreeMap<i64, LabLine> = BTreeMap::new();
    let mut total = GpuCounts::default();
    let mut map = Vec::new();
    for (node, lab, gpus) in servers {
        let rules = node.lending_rules();
        let facts = ServerFacts {
            lab: lab.id,
            online: node.online,
            draining: node.draining,
            reclaim: node.reclaim,
            lends_now: rules
                .lend_until(now_s, utc_offset_s)
                .is_some_and(|u| u > now_s),
            max_lent: rules.max_lent_gpus,
        };
        let line = lines.entry(lab.id).or_default();
        let cells = cells(&facts, gpus, &held, &slugs, |state| {
            total.add(state);
            line.gpus.add(state);
        });
        let server = Server {
            id: node.id,
            name: node.name,
            lab: lab.slug,
            online: node.online,
            cells,
        };
        map.push((lab.id, server));
    }
    let (n_waiting, n_gpus) = count_waiting(&mut lines, waiting, now);
    // The viewer's labs first: administered, then member of, then the rest.
    let mut labs_out: Vec<(u8, LabLine)> = lines
        .into_iter()
        .map(|(id, mut l)| {
            l.lab = slugs.of(id);
            l.mine = rank(actor, id) < 2;
            (rank(actor, id), l)
        })
        .collect();
    labs_out.sort_by(|a, b| (a.0, &a.1.lab).cmp(&(b.0, &b.1.lab)));
    map.sort_by(|a, b| {
        let key = |(lab, s): &(i64, Server)| (rank(actor, *lab), s.lab.clone(), s.name.clone());
        key(a).cmp(&key(b))
    });
    let waits: Vec<i64> = starts
        .iter()
        .map(|(created, started)| (*started - *created).num_seconds().max(0))
        .collect();
    Overview {
        gpus: total,
        waiting: n_waiting,
        waiting_gpus: n_gpus,
        started_last_7_days: waits.len() as u32,
        typical_wait_s: median(waits),
        labs: labs_out.into_iter().map(|(_, l)| l).collect(),
        servers: map.into_iter().map(|(_, s)| s).collect(),
        my_use,
    }
}

/// Lab ids to slugs.
struct Slugs<'a>(&'a [(i64, String)]);

impl Slugs<'_> {
    fn of(&self, id: i64) -> String {
        self.0
            .iter()
            .find(|(l, _)| *l == id)
            .map(|(_, s)| s.clone())
            .unwrap_or_default()
    }
}

/// Where a lab goes in the viewer's lists: 0 administered, 1 member of, 2 the rest.
fn rank(actor: &Actor, lab: i64) -> u8 {
    if actor
        .labs
        .iter()
        .any(|(l, r)| l.id == lab && *r == crate::db::models::Role::Admin)
    {
        0
    } else if actor.labs.iter().any(|(l, _)| l.id == lab) {
        1
    } else {
        2
    }
}

/// One server's GPUs as map cells; `count` sees each cell's state.
fn cells(
    facts: &ServerFacts,
    gpus: Vec<Gpu>,
    held: &BTreeMap<i64, &Holder>,
    slugs: &Slugs,
    mut count: impl FnMut(CellState),
) -> Vec<Cell> {
    let lent = gpus
        .iter()
        .filter(|g| held.get(&g.id).is_some_and(|h| h.job_lab != facts.lab))
        .count() as u32;
    gpus.into_iter()
        .map(|g| {
            let (state, why, job) = match held.get(&g.id) {
                Some(h) if h.job_lab == facts.lab => (CellState::Owner, String::new(), Some(*h)),
                Some(h) => (CellState::Guest, String::new(), Some(*h)),
                None => {
                    let (s, why) = idle_state(facts, &g, lent);
                    (s, why, None)
                }
            };
            count(state);
            Cell {
                index: g.idx,
                memory_gb: g.memory_mb / 1024,
                model: g.model,
                state,
                utilization_pct: g.utilization_pct,
                job: job.map(|h| h.attempt.job_id),
                job_lab: job.map(|h| slugs.of(h.job_lab)),
                user: job.map(|h| h.username.clone()),
                why,
            }
        })
        .collect()
}

/// Adds the waiting jobs to their labs' lines; returns how many wait, and for how many
/// GPUs.
fn count_waiting(
    lines: &mut BTreeMap<i64, LabLine>,
    waiting: &[db::overview::Waiting],
    now: chrono::NaiveDateTime,
) -> (u32, u32) {
    let (mut n_waiting, mut n_gpus) = (0, 0);
    for w in waiting {
        let line = lines.entry(w.lab_id).or_default();
        line.waiting += 1;
        line.waiting_gpus += w.gpus.max(0) as u32;
        let waited = (now - w.created_at).num_seconds().max(0);
        line.oldest_wait_s = Some(line.oldest_wait_s.unwrap_or(0).max(waited));
        n_waiting += 1;
        n_gpus += w.gpus.max(0) as u32;
    }
    (n_waiting, n_gpus)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(id: i64) -> Gpu {
        Gpu {
            id,
            node_id: 1,
            uuid: format!("GPU-{id}"),
            idx: id as i32,
            model: "A100".into(),
            memory_mb: 81920,
            is_fake: true,
            present: true,
            local_use: false,
            utilization_pct: 0,
            idle_since: None,
            fault: None,
        }
    }

    fn facts() -> ServerFacts {
        ServerFacts {
            lab: 1,
            online: true,
            draining: false,
            reclaim: false,
            lends_now: true,
            max_lent: None,
        }
    }

    #[test]
    fn an_idle_gpu_is_lendable_only_when_nothing_keeps_it_back() {
        assert_eq!(idle_state(&facts(), &gpu(1), 0).0, CellState::Lendable);
        let offline = ServerFacts {
            online: false,
            ..facts()
        };
        assert_eq!(idle_state(&offline, &gpu(1), 0).0, CellState::Offline);
        let mut local = gpu(1);
        local.local_use = true;
        assert_eq!(idle_state(&facts(), &local, 0).0, CellState::Owner);
        for s in [
            ServerFacts {
                reclaim: true,
                ..facts()
            },
            ServerFacts {
                draining: true,
                ..facts()
            },
            ServerFacts {
                lends_now: false,
                ..facts()
            },
            ServerFacts {
                max_lent: Some(1),
                ..facts()
            },
        ] {
            let (state, why) = idle_state(&s, &gpu(1), 1);
            assert_eq!(state, CellState::Withheld, "{why}");
            assert!(!why.is_empty());
        }
        let mut faulty = gpu(1);
        faulty.fault = Some("Xid 79".into());
        assert!(idle_state(&facts(), &faulty, 0).1.contains("Xid 79"));
    }

    #[test]
    fn counts_add_up_and_offline_is_withheld_too() {
        let mut c = GpuCounts::default();
        for s in [
            CellState::Owner,
            CellState::Guest,
            CellState::Lendable,
            CellState::Withheld,
            CellState::Offline,
        ] {
            c.add(s);
        }
        assert_eq!(c.total, c.owner + c.guest + c.lendable + c.withheld);
        assert_eq!((c.withheld, c.offline), (2, 1));
    }

    #[test]
    fn the_median_wait() {
        assert_eq!(median(vec![]), None);
        assert_eq!(median(vec![30, 10, 20]), Some(20));
        assert_eq!(median(vec![40, 10, 20, 30]), Some(20));
    }
}
