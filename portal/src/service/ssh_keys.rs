//! A user's SSH public keys, which the SSH gateway accepts for that user's jobs: add,
//! list, remove.
//!
//! Invariants:
//! - Keys are personal: each use case works on the actor's own keys only. Another
//!   user's key answers "not found" (to operators too), never "forbidden".
//! - A key is checked whole ([`pubkey::parse`]) before anything is written; the
//!   duplicate check, the per-user limit and the insert run in one transaction with the
//!   user's row locked, so concurrent adds cannot pass the limit.
//! - "Already registered" reads the same whoever holds the key.
//! - Adding and removing are written to the audit log in the same transaction.

use super::{Actor, Ctx};
use crate::db::models::{SshKey, User};
use crate::db::{self, ssh_keys, DbConn};
use crate::error::AppError;
use crate::pubkey::{self, KeyError, ParsedKey, MAX_KEYS_PER_USER};

pub use commons_api::ssh::NewSshKey;

/// A key as the API shows it.
pub fn view(k: SshKey) -> commons_api::ssh::SshKey {
    commons_api::ssh::SshKey {
        id: k.id,
        name: k.name,
        algorithm: k.algorithm,
        fingerprint: k.fingerprint,
        public_key: k.public_key,
        created_at: k.created_at,
        last_used_at: k.last_used_at,
    }
}

/// Checks and stores a key for the actor.
pub async fn add(state: &Ctx, actor: &Actor, req: NewSshKey) -> Result<SshKey, AppError> {
    let parsed = pubkey::parse(&req.public_key, req.name.as_deref())?;
    let user = actor.user.clone();
    let key = state.db.run(move |c| store(c, &user, &parsed)).await?;
    tracing::info!(user = %actor.user.username, key = key.id, fingerprint = %key.fingerprint, "SSH key added");
    Ok(key)
}

/// The actor's keys, oldest first.
pub async fn list(state: &Ctx, actor: &Actor) -> Result<Vec<SshKey>, AppError> {
    let user = actor.user.id;
    Ok(state
        .db
        .run(move |c| ssh_keys::keys_of_user(c, user))
        .await?)
}

/// Removes one of the actor's keys; another user's (or no) key is "not found".
pub async fn remove(state: &Ctx, actor: &Actor, id: i64) -> Result<(), AppError> {
    let user = actor.user.clone();
    state.db.run(move |c| delete(c, &user, id)).await?;
    tracing::info!(user = %actor.user.username, key = id, "SSH key removed");
    Ok(())
}

fn store(c: &mut DbConn, user: &User, key: &ParsedKey) -> Result<SshKey, AppError> {
    db::transaction(c, |c| {
        ssh_keys::lock_user(c, user.id)?;
        if ssh_keys::fingerprint_taken(c, &key.fingerprint)? {
            return Err(KeyError::Duplicate.into());
        }
        if ssh_keys::count_of_user(c, user.id)? >= MAX_KEYS_PER_USER {
            return Err(KeyError::TooMany.into());
        }
        // A concurrent add of the same key by someone else can still win the race: the
        // UNIQUE column turns it into the same answer.
        let stored = ssh_keys::insert(c, user.id, key)?.ok_or(KeyError::Duplicate)?;
        db::audit::record(
            c,
            user,
            None,
            "add_ssh_key",
            &format!("ssh key {}", stored.fingerprint),
            "none",
            &describe(&stored),
        )?;
        Ok(stored)
    })
}

fn delete(c: &mut DbConn, user: &User, id: i64) -> Result<(), AppError> {
    db::transaction(c, |c| {
        let key = ssh_keys::own_key(c, user.id, id)?.ok_or(AppError::NotFound("SSH key"))?;
        if !ssh_keys::delete_own(c, user.id, id)? {
            return Err(AppError::NotFound("SSH key"));
        }
        Ok(db::audit::record(
            c,
            user,
            None,
            "remove_ssh_key",
            &format!("ssh key {}", key.fingerprint),
            &describe(&key),
            "none",
        )?)
    })
}

fn describe(key: &SshKey) -> String {
    format!("{} ({})", key.name, key.algorithm)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::testkit::sqlite;

    /// A syntactically valid ed25519 key whose 32 bytes are `seed`.
    fn key(seed: u8, comment: &str) -> ParsedKey {
        use russh::keys::ssh_key::public::{Ed25519PublicKey, KeyData};
        let k =
            russh::keys::PublicKey::new(KeyData::Ed25519(Ed25519PublicKey([seed; 32])), comment);
        pubkey::parse(&k.to_openssh().unwrap(), None).unwrap()
    }

    #[test]
    fn duplicates_limits_ownership_and_audit() {
        let (_dir, mut c) = sqlite();
        let alice = db::users::create_user(&mut c, "alice", "a@x.test", false).unwrap();
        let bob = db::users::create_user(&mut c, "bob", "b@x.test", false).unwrap();
        let olga = db::users::create_user(&mut c, "olga", "o@x.test", true).unwrap();

        let a1 = store(&mut c, &alice, &key(1, "laptop")).unwrap();
        assert_eq!(a1.name, "laptop");
        // The same key again, by its owner or by someone else: one answer, nothing stored.
        for (who, comment) in [(&alice, "laptop"), (&bob, "other comment")] {
            let e = store(&mut c, who, &key(1, comment)).unwrap_err();
            assert_eq!((e.code(), e.field()), ("duplicate_key", Some("public_key")));
            assert_eq!(e.to_string(), KeyError::Duplicate.to_string());
        }
        assert!(ssh_keys::keys_of_user(&mut c, bob.id).unwrap().is_empty());

        // Nobody removes another's key, operators neither.
        for other in [&bob, &olga] {
            let e = delete(&mut c, other, a1.id).unwrap_err();
            assert!(matches!(e, AppError::NotFound(_)), "{e:?}");
        }
        assert_eq!(ssh_keys::keys_of_user(&mut c, alice.id).unwrap().len(), 1);

        // The gateway's calls.
        assert!(a1.last_used_at.is_none());
        ssh_keys::touch(&mut c, a1.id).unwrap();
        let keys = ssh_keys::keys_of_user(&mut c, alice.id).unwrap();
        assert!(keys[0].last_used_at.is_some());
        assert_eq!(keys[0].public_key, a1.public_key);

        delete(&mut c, &alice, a1.id).unwrap();
        assert!(matches!(
            delete(&mut c, &alice, a1.id),
            Err(AppError::NotFound(_))
        ));
        // Once removed, anyone may register it.
        store(&mut c, &bob, &key(1, "")).unwrap();

        for seed in 0..MAX_KEYS_PER_USER as u8 {
            store(&mut c, &alice, &key(100 + seed, "k")).unwrap();
        }
        let e = store(&mut c, &alice, &key(99, "one too many")).unwrap_err();
        assert_eq!(e.code(), "too_many_keys");
        assert_eq!(ssh_keys::count_of_user(&mut c, alice.id).unwrap(), 50);

        let log = db::audit::list(&mut c, None, 500).unwrap();
        let count = |action: &str| log.iter().filter(|e| e.action == action).count();
        assert_eq!(count("add_ssh_key"), 52);
        assert_eq!(count("remove_ssh_key"), 1);
        let removed = log.iter().find(|e| e.action == "remove_ssh_key").unwrap();
        assert_eq!(removed.actor, "alice");
        assert_eq!(removed.target, format!("ssh key {}", a1.fingerprint));
        assert_eq!(removed.before, "laptop (ssh-ed25519)");
    }
}
