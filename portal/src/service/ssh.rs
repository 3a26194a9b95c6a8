//! The SSH gateway's use cases: who may log in to which job, where the job runs now, and
//! the audit entry of each login. The gateway (`crate::ssh`) only speaks SSH.
//!
//! Rules:
//! - The SSH user name is `job-<id>`; only the keys of the job's owner open it.
//! - A refused login looks the same whatever the reason (no such job, another user's job,
//!   an unknown key), so it tells nothing about which jobs exist. The reason is logged.
//! - A key query (`publickey` without a signature: "would this key do?") is answered by
//!   [`key_registered`] alone, the same for every job and user name: whether some user
//!   registered the key. Which jobs a key opens shows only to whoever can sign with it.
//! - Once logged in, the owner learns the job's state in words when it is not running.

use super::Ctx;
use crate::db::models::{Job, User};
use crate::db::DbError;
use crate::db::{audit, jobs, ssh_keys, users};
use crate::domain::JobState;
use crate::error::AppError;
use commons_proto::Attempt;

/// A login the gateway accepted.
#[derive(Debug, Clone)]
pub struct Login {
    pub user: User,
    pub job: i64,
    pub lab: i64,
    pub key_fingerprint: String,
}

/// Why a login was refused, for the log only (the client sees one answer for all).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    BadUserName,
    NoSuchJob,
    NotTheOwnersKey,
}

/// The job of an SSH user name `job-<id>`.
pub fn job_of_user_name(name: &str) -> Option<i64> {
    let id = name.strip_prefix("job-")?;
    if id.is_empty() || id.len() > 18 || !id.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    id.parse().ok().filter(|&n: &i64| n > 0)
}

/// Whether `key` (an OpenSSH public key) opens job `name`. With `login_from` (the
/// client's address, after the signature was checked) it is a login: the key's use and
/// the audit entry are recorded in the same transaction as the check, one database trip,
/// and a login whose audit entry cannot be written is an error, never accepted.
pub async fn authorize(
    ctx: &Ctx,
    name: &str,
    key: &russh::keys::PublicKey,
    login_from: Option<String>,
) -> Result<Result<Login, Refusal>, AppError> {
    let Some(job) = job_of_user_name(name) else {
        return Ok(Err(Refusal::BadUserName));
    };
    let offered = key.key_data().clone();
    ctx.db
        .run(move |c| {
            crate::db::transaction(c, |c| {
                let job = match jobs::get(c, job) {
                    Ok(j) => j,
                    Err(DbError::NotFound(_)) => return Ok(Err(Refusal::NoSuchJob)),
                    Err(e) => return Err(e),
                };
                let keys = ssh_keys::keys_of_user(c, job.user_id)?;
                let found = keys.into_iter().find(|k| {
                    russh::keys::PublicKey::from_openssh(&k.public_key)
                        .is_ok_and(|p| p.key_data() == &offered)
                });
                let Some(k) = found else {
                    return Ok(Err(Refusal::NotTheOwnersKey));
                };
                let user = users::user_by_id(c, job.user_id)?;
                if let Some(from) = &login_from {
                    ssh_keys::touch(c, k.id)?;
                    audit::record(
                        c,
                        &user,
                        Some(job.lab_id),
                        "ssh.login",
                        &format!("job {}", job.id),
                        "",
                        &format!("from {from}, key {}", k.fingerprint),
                    )?;
                }
                Ok(Ok(Login {
                    user,
                    job: job.id,
                    lab: job.lab_id,
                    key_fingerprint: k.fingerprint,
                }))
            })
            .map_err(AppError::from)
        })
        .await
}

/// Whether anyone registered `key`: the answer to a key query, whichever job it names.
pub async fn key_registered(ctx: &Ctx, key: &russh::keys::PublicKey) -> Result<bool, AppError> {
    let fingerprint = crate::pubkey::fingerprint(key);
    Ok(ctx
        .db
        .run(move |c| ssh_keys::fingerprint_taken(c, &fingerprint))
        .await?)
}

/// Where the job runs now: its node and attempt, or words for its owner on why there is
/// nothing to connect to.
pub async fn running_attempt(
    ctx: &Ctx,
    job: i64,
) -> Result<Result<(i64, Attempt), String>, AppError> {
    let j: Job = ctx.db.run(move |c| jobs::get(c, job)).await?;
    Ok(attempt_of(&j))
}

/// Where job `j` runs now (its node and attempt), or why there is nothing to connect to.
pub fn attempt_of(j: &Job) -> Result<(i64, Attempt), String> {
    let job = j.id;
    match (j.state(), j.node_id) {
        (JobState::Running, Some(node)) => Ok((node, j.attempts)),
        (JobState::Queued, _) => Err(format!(
            "job {job} is queued{}: SSH works while it runs; try again then",
            j.reason
                .as_deref()
                .map(|r| format!(" ({r})"))
                .unwrap_or_default()
        )),
        (JobState::Starting, _) => Err(format!("job {job} is starting: try again in a moment")),
        (JobState::Preempting, _) => Err(format!(
            "job {job} is being preempted and goes back to the queue: connect again when it runs"
        )),
        (state, _) => Err(format!(
            "job {job} has ended ({state}): there is nothing to connect to"
        )),
    }
}

pub use commons_api::ssh::GatewayInfo;

/// The gateway's coordinates, when it is on: `endpoint` from the configuration, the host
/// key from the database (the deployment's, whichever replica recorded it).
pub async fn gateway(
    ctx: &Ctx,
    endpoint: Option<(String, u16)>,
) -> Result<Option<GatewayInfo>, AppError> {
    let Some((host, port)) = endpoint else {
        return Ok(None);
    };
    let keys = ctx.db.run(crate::db::gateway::host_keys).await?;
    let Some(key) = keys
        .iter()
        .find_map(|k| russh::keys::PublicKey::from_openssh(k).ok())
    else {
        return Ok(None);
    };
    let algo_and_key: String = key
        .to_openssh()
        .map_err(|e| AppError::Internal(e.into()))?
        .split_whitespace()
        .take(2)
        .collect::<Vec<_>>()
        .join(" ");
    let host_key_alias = format!("gpu-commons-{host}");
    Ok(Some(GatewayInfo {
        known_hosts: format!("{host_key_alias} {algo_and_key}"),
        fingerprint: key.fingerprint(russh::keys::HashAlg::Sha256).to_string(),
        host_key: algo_and_key,
        host_key_alias,
        host,
        port,
    }))
}

/// The deployment's SSH host key: this replica's (`public`) when none is recorded yet,
/// else the one recorded, which every replica must use.
pub async fn claim_host_key(
    ctx: &Ctx,
    algorithm: String,
    public: String,
) -> Result<String, AppError> {
    ctx.db
        .run(move |c| crate::db::gateway::claim_host_key(c, &algorithm, &public))
        .await
        .map_err(AppError::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_names_name_jobs() {
        assert_eq!(job_of_user_name("job-42"), Some(42));
        assert_eq!(job_of_user_name("job-0"), None);
        assert_eq!(job_of_user_name("job-"), None);
        assert_eq!(job_of_user_name("job-+4"), None);
        assert_eq!(job_of_user_name("job-4 "), None);
        assert_eq!(job_of_user_name("alice"), None);
        assert_eq!(job_of_user_name("job-99999999999999999999"), None);
    }

    #[test]
    fn config_block_names_the_job_and_the_key_alias() {
        let g = GatewayInfo {
            host: "gpu.campus.edu".into(),
            port: 2222,
            host_key: "ssh-ed25519 AAAA".into(),
            fingerprint: "SHA256:x".into(),
            host_key_alias: "gpu-commons-gpu.campus.edu".into(),
            known_hosts: "gpu-commons-gpu.campus.edu ssh-ed25519 AAAA".into(),
        };
        assert_eq!(
            g.config_block(42),
            "Host commons-job-42\n    HostName gpu.campus.edu\n    Port 2222\n    User job-42\n    \
             HostKeyAlias gpu-commons-gpu.campus.edu\n"
        );
        assert_eq!(g.command(42), "ssh -p 2222 job-42@gpu.campus.edu");
    }
}
