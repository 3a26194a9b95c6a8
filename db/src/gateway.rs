//! What the SSH gateway keeps in the database: the deployment's host public key, and the
//! mailbox through which one replica asks another to pass a message to an agent.

use super::schema::{agent_mail, ssh_host_keys};
use super::DbError;
use super::{clock, now, DbConn};
use diesel::prelude::*;

/// Records `public_key` as the deployment's host key of its algorithm unless one is
/// recorded; returns the recorded one (which may differ: another replica's).
pub fn claim_host_key(
    c: &mut DbConn,
    algorithm: &str,
    public_key: &str,
) -> Result<String, DbError> {
    crate::transaction(c, |c| {
        let have: Option<String> = ssh_host_keys::table
            .find(algorithm)
            .select(ssh_host_keys::public_key)
            .first(c)
            .optional()?;
        if let Some(k) = have {
            return Ok(k);
        }
        diesel::insert_into(ssh_host_keys::table)
            .values((
                ssh_host_keys::algorithm.eq(algorithm),
                ssh_host_keys::public_key.eq(public_key),
                ssh_host_keys::created_at.eq(now()),
            ))
            .execute(c)?;
        Ok(public_key.to_string())
    })
}

/// The deployment's host public keys (OpenSSH one-line form), oldest first.
pub fn host_keys(c: &mut DbConn) -> Result<Vec<String>, DbError> {
    Ok(ssh_host_keys::table
        .order(ssh_host_keys::created_at.asc())
        .select(ssh_host_keys::public_key)
        .load(c)?)
}

/// Leaves `body` (a JSON `PortalMsg`) for the replica that holds `node`'s agent.
pub fn post(c: &mut DbConn, node: i64, body: &str) -> Result<(), DbError> {
    // On the database's clock, which [`take`] judges its age on.
    let t = clock(c)?;
    diesel::insert_into(agent_mail::table)
        .values((
            agent_mail::node_id.eq(node),
            agent_mail::body.eq(body),
            agent_mail::created_at.eq(t),
        ))
        .execute(c)?;
    Ok(())
}

/// Takes out the mail of `nodes` posted less than `ttl` ago on the database's clock
/// (older mail is dropped: what it asked for has timed out), in the order it was posted.
pub fn take(
    c: &mut DbConn,
    nodes: &[i64],
    ttl: chrono::Duration,
) -> Result<Vec<(i64, String)>, DbError> {
    crate::transaction(c, |c| {
        let since = clock(c)? - ttl;
        diesel::delete(agent_mail::table.filter(agent_mail::created_at.lt(since))).execute(c)?;
        if nodes.is_empty() {
            return Ok(Vec::new());
        }
        let mail: Vec<(i64, i64, String)> = agent_mail::table
            .filter(agent_mail::node_id.eq_any(nodes))
            .order(agent_mail::id.asc())
            .select((agent_mail::id, agent_mail::node_id, agent_mail::body))
            .load(c)?;
        let ids: Vec<i64> = mail.iter().map(|m| m.0).collect();
        diesel::delete(agent_mail::table.filter(agent_mail::id.eq_any(&ids))).execute(c)?;
        Ok(mail.into_iter().map(|(_, n, b)| (n, b)).collect())
    })
}
