//! A heartbeat's GPU figures (utilisation, the owner's direct use, faults) against what
//! the portal holds.
//!
//! Only GPUs whose figures changed are written: at rest a heartbeat writes no GPU row
//! (the node's row, with its clock, is written by `node_link::beat`). What the portal
//! holds is read once per agent connection and then kept by it ([`GpuFigures`]): the
//! node's agent is the only writer of these columns, one message at a time, so a
//! heartbeat at rest costs no statement here (it was one read per heartbeat, a quarter
//! of an idle node's statements).

use crate::schema::gpus;
use crate::{DbConn, DbError};
use commons_proto::GpuStat;
use diesel::prelude::*;
use std::collections::BTreeMap;

/// One GPU's figures as the portal holds them: the owner's direct use, utilisation (%),
/// idle since, fault.
type Known = (bool, i32, Option<chrono::NaiveDateTime>, Option<String>);

/// What the portal holds of a node's GPU figures, by UUID, kept by the node's agent
/// connection between heartbeats. Forget it ([`GpuFigures::default`]) when the node's
/// GPUs change (a `Hello`).
#[derive(Debug, Clone, Default)]
pub struct GpuFigures(Option<BTreeMap<String, Known>>);

/// Records a heartbeat's GPU numbers, reading what the portal holds only when `known`
/// does not have it yet. Returns whether any GPU's local use or fault changed (the
/// scheduler should look again).
pub fn update_gpu_stats(
    c: &mut DbConn,
    node: i64,
    stats: &[GpuStat],
    known: &mut GpuFigures,
) -> Result<bool, DbError> {
    let held = match &mut known.0 {
        Some(held) => held,
        empty => empty.insert(read(c, node)?),
    };
    let mut changed = false;
    let mut writes = Vec::new();
    for s in stats {
        let Some((was_local, was_util, idle_since, fault)) = held.get(&s.uuid).cloned() else {
            continue;
        };
        let util = s.utilization_pct.min(100) as i32;
        if !s.local_use && !was_local && util == was_util && fault == s.fault {
            continue;
        }
        changed |= was_local != s.local_use || fault != s.fault;
        // Idle time counts from the owner's last direct use.
        let idle_since = if s.local_use || was_local {
            Some(crate::now())
        } else {
            idle_since
        };
        writes.push((s, util, idle_since));
    }
    if writes.is_empty() {
        return Ok(false);
    }
    let written = crate::transaction(c, |c| {
        for (s, util, idle_since) in &writes {
            diesel::update(
                gpus::table
                    .filter(gpus::node_id.eq(node))
                    .filter(gpus::uuid.eq(&s.uuid)),
            )
            .set((
                gpus::local_use.eq(s.local_use),
                gpus::utilization_pct.eq(util),
                gpus::idle_since.eq(idle_since),
                gpus::fault.eq(s.fault.as_deref()),
            ))
            .execute(c)?;
        }
        Ok::<_, DbError>(())
    });
    match written {
        Ok(()) => {
            for (s, util, idle_since) in writes {
                held.insert(
                    s.uuid.clone(),
                    (s.local_use, util, idle_since, s.fault.clone()),
                );
            }
            Ok(changed)
        }
        Err(e) => {
            // Not known what was written: read again next time.
            known.0 = None;
            Err(e)
        }
    }
}

/// What the portal holds of the node's GPU figures.
fn read(c: &mut DbConn, node: i64) -> Result<BTreeMap<String, Known>, DbError> {
    Ok(gpus::table
        .filter(gpus::node_id.eq(node))
        .select((
            gpus::uuid,
            gpus::local_use,
            gpus::utilization_pct,
            gpus::idle_since,
            gpus::fault,
        ))
        .load::<(
            String,
            bool,
            i32,
            Option<chrono::NaiveDateTime>,
            Option<String>,
        )>(c)?
        .into_iter()
        .map(|(uuid, local, util, idle, fault)| (uuid, (local, util, idle, fault)))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::{campus, sqlite};
    use diesel::connection::{Connection, InstrumentationEvent};
    use std::sync::{Arc, Mutex};

    fn stat(util: u32, local_use: bool) -> GpuStat {
        GpuStat {
            uuid: "GPU-1".into(),
            utilization_pct: util,
            memory_used_mb: 0,
            local_use,
            fault: None,
        }
    }

    /// The load test showed every heartbeat rewriting every GPU row; at rest it writes
    /// none, and once the connection holds the figures it reads none either.
    #[test]
    fn a_heartbeat_at_rest_costs_no_statement_once_the_figures_are_held() {
        let (_d, mut c) = sqlite();
        let node = campus(&mut c, 0).node;
        let mut known = GpuFigures::default();
        update_gpu_stats(&mut c, node.id, &[stat(10, false)], &mut known).unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        c.set_instrumentation(move |e: InstrumentationEvent<'_>| {
            if let InstrumentationEvent::StartQuery { query, .. } = e {
                s.lock().unwrap().push(query.to_string());
            }
        });
        let take = || std::mem::take(&mut *seen.lock().unwrap());
        assert!(!update_gpu_stats(&mut c, node.id, &[stat(10, false)], &mut known).unwrap());
        assert_eq!(take(), Vec::<String>::new(), "no statement at rest");
        // A connection that holds nothing yet reads once, and writes nothing at rest.
        let mut fresh = GpuFigures::default();
        assert!(!update_gpu_stats(&mut c, node.id, &[stat(10, false)], &mut fresh).unwrap());
        let q = take();
        assert!(q.len() == 1 && q[0].starts_with("SELECT"), "{q:?}");
        // A change is still written: utilisation, and the owner's direct use; what it
        // wrote is held (the same figures again write nothing).
        update_gpu_stats(&mut c, node.id, &[stat(90, false)], &mut known).unwrap();
        assert!(update_gpu_stats(&mut c, node.id, &[stat(90, true)], &mut known).unwrap());
        let writes = take()
            .into_iter()
            .filter(|q| q.starts_with("UPDATE"))
            .count();
        assert_eq!(writes, 2);
        let (local, util): (bool, i32) = gpus::table
            .filter(gpus::node_id.eq(node.id))
            .select((gpus::local_use, gpus::utilization_pct))
            .first(&mut c)
            .unwrap();
        assert!(local);
        assert_eq!(util, 90);
        // The owner still uses it: idle time counts from now, so the row is written.
        assert!(!update_gpu_stats(&mut c, node.id, &[stat(90, true)], &mut known).unwrap());
        // Back to guests only: written once (the direct use ended), then nothing.
        assert!(update_gpu_stats(&mut c, node.id, &[stat(90, false)], &mut known).unwrap());
        take();
        assert!(!update_gpu_stats(&mut c, node.id, &[stat(90, false)], &mut known).unwrap());
        assert_eq!(take(), Vec::<String>::new());
        // What a connection holds matches a fresh read.
        let mut fresh = GpuFigures::default();
        update_gpu_stats(&mut c, node.id, &[], &mut fresh).unwrap();
        assert_eq!(known.0, fresh.0);
    }
}
