//! Lab servers (nodes), their enrolment, and the GPUs their agents report.

use super::models::{Gpu, Lab, Node};
use super::schema::*;
use super::users::{hash_secret, new_secret};
use super::DbError;
use super::{now, DbConn};
use crate::insert_returning_id;
use commons_proto::GpuInfo;
use diesel::prelude::*;

/// Spends a one-time enrolment token on a new node; returns the node, its lab and the
/// node's credential (shown once). A used, expired or unknown token is refused.
pub fn enrol(
    c: &mut DbConn,
    token: &str,
    hostname: &str,
    agent_version: &str,
) -> Result<(Node, Lab, String), DbError> {
    crate::transaction(c, |c| {
        let (token_id, lab_id) = unspent_token(c, token)?;
        let name = node_name(hostname);
        let credential = new_secret("gcn");
        let node_id = insert_returning_id!(
            c,
            diesel::insert_into(nodes::table).values((
                nodes::lab_id.eq(lab_id),
                nodes::name.eq(&name),
                nodes::credential_hash.eq(hash_secret(&credential)),
                nodes::agent_version.eq(agent_version),
                nodes::created_at.eq(now()),
                // The campus default grace, until the lab admin sets one.
                nodes::grace_s.eq(0),
            )),
            nodes::id
        )?;
        // Guarded update: of two agents racing with one token, only one wins.
        let spent = diesel::update(
            enrol_tokens::table
                .find(token_id)
                .filter(enrol_tokens::used_at.is_null()),
        )
        .set((
            enrol_tokens::used_at.eq(now()),
            enrol_tokens::node_id.eq(node_id),
        ))
        .execute(c)?;
        if spent != 1 {
            return Err(DbError::BadCredential(
                "this enrolment token was used already".into(),
            ));
        }
        let node = nodes::table
            .find(node_id)
            .select(Node::as_select())
            .first(c)?;
        let lab = labs::table.find(lab_id).select(Lab::as_select()).first(c)?;
        Ok((node, lab, credential))
    })
}

/// The id and lab of an enrolment token that is known, unused and not expired.
fn unspent_token(c: &mut DbConn, token: &str) -> Result<(i64, i64), DbError> {
    type TokenRow = (
        i64,
        i64,
        Option<chrono::NaiveDateTime>,
        chrono::NaiveDateTime,
    );
    let row: Option<TokenRow> = enrol_tokens::table
        .filter(enrol_tokens::token_hash.eq(hash_secret(token)))
        .select((
            enrol_tokens::id,
            enrol_tokens::lab_id,
            enrol_tokens::used_at,
            enrol_tokens::expires_at,
        ))
        .first(c)
        .optional()?;
    let Some((token_id, lab_id, used_at, expires_at)) = row else {
        return Err(DbError::BadCredential("unknown enrolment token".into()));
    };
    if used_at.is_some() {
        return Err(DbError::BadCredential(
            "this enrolment token was used already; ask the lab admin for a new one".into(),
        ));
    }
    if expires_at < now() {
        return Err(DbError::BadCredential(
            "this enrolment token has expired".into(),
        ));
    }
    Ok((token_id, lab_id))
}

/// A node's name from the agent's hostname: letters, digits and `-._`, at most 63.
fn node_name(hostname: &str) -> String {
    let name: String = hostname
        .chars()
        .filter(|ch| ch.is_ascii_alphanumeric() || "-._".contains(*ch))
        .take(63)
        .collect();
    if name.is_empty() {
        "server".to_string()
    } else {
        name
    }
}

pub fn node_by_credential(c: &mut DbConn, credential: &str) -> Result<Option<Node>, DbError> {
    Ok(nodes::table
        .filter(nodes::credential_hash.eq(hash_secret(credential)))
        .filter(nodes::revoked_at.is_null())
        .select(Node::as_select())
        .first(c)
        .optional()?)
}

/// Records an agent message a lease can count from, whatever session holds the node
/// (seeding a node in tests and tools; the broker goes through `node_link`, which lets
/// one session at a time in). Returns false, and writes nothing, when the node's
/// credential was revoked (on any replica): one statement both checks and records.
pub fn set_agent_clock(
    c: &mut DbConn,
    node: i64,
    clock: &super::models::AgentClock,
) -> Result<bool, DbError> {
    let written = diesel::update(nodes::table.find(node).filter(nodes::revoked_at.is_null()))
        .set((
            nodes::agent_session.eq(clock.session as i64),
            nodes::agent_seq.eq(clock.seq as i64),
            nodes::agent_seq_at.eq(Some(clock.received_at)),
            nodes::online.eq(true),
            nodes::last_seen_at.eq(clock.received_at),
        ))
        .execute(c)?;
    Ok(written > 0)
}

/// Sets the node's GPU baseline (`Some`: a new one; `None`: keeps it) and whether what
/// it reports now awaits its lab admin's approval (`service::inventory`).
pub fn set_inventory(
    c: &mut DbConn,
    node: i64,
    baseline: Option<&str>,
    unapproved: bool,
) -> Result<(), DbError> {
    let target = nodes::table.find(node);
    match baseline {
        Some(b) => diesel::update(target)
            .set((
                nodes::gpu_baseline.eq(Some(b)),
                nodes::inventory_unapproved.eq(unapproved),
            ))
            .execute(c)?,
        None => diesel::update(target)
            .set(nodes::inventory_unapproved.eq(unapproved))
            .execute(c)?,
    };
    Ok(())
}

/// Records the inventory of a `Hello`: known GPUs are updated, new ones added, missing ones
/// marked absent (never deleted: attempts refer to them).
pub fn upsert_gpus(
    c: &mut DbConn,
    node: i64,
    version: &str,
    inventory: &[GpuInfo],
) -> Result<(), DbError> {
    crate::transaction(c, |c| {
        // Online, and when it was heard, are the link's (`node_link::claim`).
        diesel::update(nodes::table.find(node))
            .set(nodes::agent_version.eq(version))
            .execute(c)?;
        diesel::update(gpus::table.filter(gpus::node_id.eq(node)))
            .set(gpus::present.eq(false))
            .execute(c)?;
        for g in inventory {
            let updated = diesel::update(
                gpus::table
                    .filter(gpus::node_id.eq(node))
                    .filter(gpus::uuid.eq(&g.uuid)),
            )
            .set((
                gpus::idx.eq(g.index as i32),
                gpus::model.eq(&g.model),
                gpus::memory_mb.eq(g.memory_mb as i64),
                gpus::is_fake.eq(g.fake),
                gpus::present.eq(true),
            ))
            .execute(c)?;
            if updated == 0 {
                diesel::insert_into(gpus::table)
                    .values((
                        gpus::node_id.eq(node),
                        gpus::uuid.eq(&g.uuid),
                        gpus::idx.eq(g.index as i32),
                        gpus::model.eq(&g.model),
                        gpus::memory_mb.eq(g.memory_mb as i64),
                        gpus::is_fake.eq(g.fake),
                        gpus::present.eq(true),
                    ))
                    .execute(c)?;
            }
        }
        Ok(())
    })
}

/// Nodes whose agent has not been heard from since `cutoff` go offline.
pub fn mark_silent_offline(
    c: &mut DbConn,
    cutoff: chrono::NaiveDateTime,
) -> Result<usize, DbError> {
    Ok(diesel::update(
        nodes::table
            .filter(nodes::online.eq(true))
            .filter(nodes::last_seen_at.lt(cutoff)),
    )
    .set(nodes::online.eq(false))
    .execute(c)?)
}

/// Every node with its lab and GPUs, for the nodes page and API.
pub fn list_with_gpus(c: &mut DbConn) -> Result<Vec<(Node, Lab, Vec<Gpu>)>, DbError> {
    let rows: Vec<(Node, Lab)> = nodes::table
        .inner_join(labs::table)
        .filter(nodes::revoked_at.is_null())
        .order(nodes::id)
        .select((Node::as_select(), Lab::as_select()))
        .load(c)?;
    let all_gpus: Vec<Gpu> = gpus::table
        .filter(gpus::present.eq(true))
        .order((gpus::node_id, gpus::idx))
        .select(Gpu::as_select())
        .load(c)?;
    Ok(rows
        .into_iter()
        .map(|(n, l)| {
            let g = all_gpus
                .iter()
                .filter(|g| g.node_id == n.id)
                .cloned()
                .collect();
            (n, l, g)
        })
        .collect())
}

/// The GPUs node `id` reports now, in index order.
pub fn gpus_of(c: &mut DbConn, node: i64) -> Result<Vec<Gpu>, DbError> {
    Ok(gpus::table
        .filter(gpus::node_id.eq(node))
        .filter(gpus::present.eq(true))
        .order(gpus::idx)
        .select(Gpu::as_select())
        .load(c)?)
}

pub fn gpus_by_ids(c: &mut DbConn, ids: &[i64]) -> Result<Vec<Gpu>, DbError> {
    Ok(gpus::table
        .filter(gpus::id.eq_any(ids))
        .order(gpus::idx)
        .select(Gpu::as_select())
        .load(c)?)
}

/// Names of the nodes `ids` (one query).
pub fn names(
    c: &mut DbConn,
    ids: &[i64],
) -> Result<std::collections::BTreeMap<i64, String>, DbError> {
    Ok(nodes::table
        .filter(nodes::id.eq_any(ids))
        .select((nodes::id, nodes::name))
        .load::<(i64, String)>(c)?
        .into_iter()
        .collect())
}

/// A lab's enrolled (not revoked) nodes.
pub fn of_lab(c: &mut DbConn, lab: i64) -> Result<Vec<Node>, DbError> {
    Ok(nodes::table
        .filter(nodes::lab_id.eq(lab))
        .filter(nodes::revoked_at.is_null())
        .order(nodes::id)
        .select(Node::as_select())
        .load(c)?)
}

/// Replaces a node's lending rules (JSON of `commons_sched::Lending`), grace and reclaim.
pub fn set_lending(
    c: &mut DbConn,
    node: i64,
    lending_json: &str,
    grace_s: i32,
    reclaim: bool,
) -> Result<(), DbError> {
    diesel::update(nodes::table.find(node))
        .set((
            nodes::lending.eq(lending_json),
            nodes::grace_s.eq(grace_s),
            nodes::reclaim.eq(reclaim),
        ))
        .execute(c)?;
    Ok(())
}

/// The nodes among `ids` that are online and not revoked (one query).
pub fn online_nodes(c: &mut DbConn, ids: &[i64]) -> Result<Vec<Node>, DbError> {
    Ok(nodes::table
        .filter(nodes::id.eq_any(ids))
        .filter(nodes::online.eq(true))
        .filter(nodes::revoked_at.is_null())
        .select(Node::as_select())
        .load(c)?)
}

/// The nodes `ids` (one query).
pub fn by_ids(c: &mut DbConn, ids: &[i64]) -> Result<Vec<Node>, DbError> {
    Ok(nodes::table
        .filter(nodes::id.eq_any(ids))
        .select(Node::as_select())
        .load(c)?)
}

/// Node `id` if it is online and not revoked (where a start may go).
pub fn online_node(c: &mut DbConn, id: i64) -> Result<Option<Node>, DbError> {
    Ok(nodes::table
        .find(id)
        .filter(nodes::online.eq(true))
        .filter(nodes::revoked_at.is_null())
        .select(Node::as_select())
        .first(c)
        .optional()?)
}

/// Records the server's capacity from its agent.
pub fn set_capacity(
    c: &mut DbConn,
    node: i64,
    cap: &commons_proto::NodeCapacity,
) -> Result<(), DbError> {
    diesel::update(nodes::table.find(node))
        .set((
            nodes::cpus.eq(cap.cpus.max(0.0)),
            nodes::memory_mb.eq(i64::try_from(cap.memory_mb).unwrap_or(i64::MAX)),
            nodes::disk_gb.eq(i64::try_from(cap.disk_gb).unwrap_or(i64::MAX)),
        ))
        .execute(c)?;
    Ok(())
}

/// Records how the node's agent enforces shares of one GPU (`None`: it takes none).
pub fn set_share_mode(c: &mut DbConn, node: i64, mode: Option<&str>) -> Result<(), DbError> {
    diesel::update(nodes::table.find(node))
        .set(nodes::share_mode.eq(mode))
        .execute(c)?;
    Ok(())
}

/// Records the GPU memory the processes of share attempts use, as their agent measured
/// it (`(job, attempt, MiB)`); attempts of other nodes are left alone.
pub fn set_gpu_memory_used(
    c: &mut DbConn,
    node: i64,
    used: &[(i64, i32, u64)],
) -> Result<(), DbError> {
    for &(job, attempt, mb) in used {
        diesel::update(
            job_attempts::table
                .filter(job_attempts::job_id.eq(job))
                .filter(job_attempts::attempt.eq(attempt))
                .filter(job_attempts::node_id.eq(node)),
        )
        .set(job_attempts::gpu_memory_used_mb.eq(Some(i64::try_from(mb).unwrap_or(i64::MAX))))
        .execute(c)?;
    }
    Ok(())
}

/// Records the node's disk from its agent: the largest job's disk, and why it takes no
/// new guests when its disk is under the agent's floor.
pub fn set_disk(c: &mut DbConn, node: i64, disk: &commons_proto::NodeDisk) -> Result<(), DbError> {
    let low = disk.below_floor.then(|| {
        format!(
            "its disk has {} GiB free, under its agent's floor of {} GiB: it takes no new \
             guests",
            disk.free_gb, disk.floor_gb
        )
    });
    diesel::update(nodes::table.find(node))
        .set((
            nodes::max_job_disk_gb.eq(Some(i64::try_from(disk.max_job_gb).unwrap_or(i64::MAX))),
            nodes::disk_low.eq(low),
        ))
        .execute(c)?;
    Ok(())
}

/// Revokes a node's credential: it is refused from now on (its next connection, and a
/// connected one at its next message) and vanishes from the lists.
pub fn revoke(c: &mut DbConn, node: i64) -> Result<(), DbError> {
    diesel::update(nodes::table.find(node))
        .set((nodes::revoked_at.eq(Some(now())), nodes::online.eq(false)))
        .execute(c)?;
    Ok(())
}

pub fn set_draining(c: &mut DbConn, node: i64, draining: bool) -> Result<(), DbError> {
    diesel::update(nodes::table.find(node))
        .set(nodes::draining.eq(draining))
        .execute(c)?;
    Ok(())
}

pub fn node_by_id(c: &mut DbConn, id: i64) -> Result<Node, DbError> {
    nodes::table
        .find(id)
        .select(Node::as_select())
        .first(c)
        .optional()?
        .ok_or(DbError::NotFound("node"))
}

/// Every node's (name, lab id, online), for the metrics.
pub fn online_by_node(c: &mut DbConn) -> Result<Vec<(String, i64, bool)>, DbError> {
    Ok(nodes::table
        .select((nodes::name, nodes::lab_id, nodes::online))
        .order_by(nodes::id)
        .load(c)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::{campus, sqlite};

    #[test]
    fn a_revoked_node_gets_no_clock() {
        let (_d, mut c) = sqlite();
        let node = campus(&mut c, 0).node;
        let clock = crate::models::AgentClock {
            session: 9,
            seq: 5,
            received_at: now(),
        };
        assert!(set_agent_clock(&mut c, node.id, &clock).unwrap());
        diesel::update(nodes::table.find(node.id))
            .set(nodes::revoked_at.eq(now()))
            .execute(&mut c)
            .unwrap();
        let clock = crate::models::AgentClock { seq: 6, ..clock };
        assert!(!set_agent_clock(&mut c, node.id, &clock).unwrap());
        let seq: i64 = nodes::table
            .find(node.id)
            .select(nodes::agent_seq)
            .first(&mut c)
            .unwrap();
        assert_eq!(seq, 5, "nothing written for a revoked node");
    }
}
