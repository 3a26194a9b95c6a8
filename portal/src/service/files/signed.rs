//! Short-lived URLs of one object for an agent (issue 28 §5: the agent never holds a
//! credential of the store). The listing of a starting attempt's inputs or `lab:` dataset
//! gives each file one, made here:
//! - an S3 store signs it itself (a presigned GET, [`super::FileStore::presigned_get`]): the
//!   agent reads the object from the bucket, sending nothing of ours;
//! - a local store has no signer of its own, so the portal signs a URL of its own route
//!   (`commons_proto::OBJECTS_PATH`): an HMAC-SHA256 over the object's key, the expiry,
//!   the node and the attempt, with a key derived from the portal's session key (every
//!   replica shares it, so any replica answers a URL another one made).
//!
//! Invariants:
//! - A URL names exactly one object and one (node, job, attempt); changing any of them,
//!   or the expiry, breaks the signature (checked in constant time).
//! - It lives [`VALID_S`] seconds; the agent lists again for fresh ones.
//! - Even with a good signature the route serves only while the node is enrolled and not
//!   revoked and the attempt is still starting on it ([`open`]).
//! - The full URL is a bearer secret until it expires: it is never logged (only its path).

use super::store::ObjectRead;
use crate::db::{self, DbConn};
use crate::domain::AttemptStatus;
use crate::error::AppError;
use crate::service::Ctx;
use hmac::digest::KeyInit;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// How long a URL is good for, in seconds: long enough to start reading a large file (a
/// read under way is not cut when it expires), short enough that a copied URL is soon
/// worthless.
pub const VALID_S: u32 = 300;

/// What a signature covers.
const CONTEXT: &[u8] = b"commons agent object url v1";

/// The portal's key for its own object URLs. `Debug` hides it.
#[derive(Clone)]
pub struct UrlSigner {
    key: [u8; 32],
}

/// HMAC-SHA256 keyed by `key` of any length: the key as HMAC itself pads it to the hash's
/// 64-byte block (hashed first when longer), so no length can fail.
fn hmac(key: &[u8]) -> Hmac<Sha256> {
    let mut block = [0u8; 64];
    if key.len() > block.len() {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    <Hmac<Sha256> as KeyInit>::new(&block.into())
}

impl std::fmt::Debug for UrlSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UrlSigner(..)")
    }
}

/// One signed grant: who may read which object until when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub node: i64,
    pub job: i64,
    pub attempt: i32,
    /// The object's key in the store (`files/users/7/...`).
    pub object: String,
    /// Unix seconds, on the portal's clock.
    pub expires: i64,
}

impl UrlSigner {
    /// The key derived from the portal's session key (`session_key_file`): HMAC of a
    /// fixed context, so the session key itself never signs a URL.
    pub fn derive(secret: &[u8]) -> UrlSigner {
        let mut mac = hmac(secret);
        mac.update(CONTEXT);
        UrlSigner {
            key: mac.finalize().into_bytes().into(),
        }
    }

    /// A fresh random key (a portal without a session key file: one replica, dev).
    pub fn random() -> UrlSigner {
        UrlSigner {
            key: rand::random(),
        }
    }

    fn mac(&self, g: &Grant) -> Hmac<Sha256> {
        let mut mac = hmac(&self.key);
        let fields = format!("{}\n{}\n{}\n{}\n", g.node, g.job, g.attempt, g.expires);
        mac.update(fields.as_bytes());
        mac.update(g.object.as_bytes());
        mac
    }

    /// The signature of `g`, in hex.
    pub fn sign(&self, g: &Grant) -> String {
        hex::encode(self.mac(g).finalize().into_bytes())
    }

    /// Whether `sig` (hex) signs `g`; compared in constant time.
    pub fn verify(&self, g: &Grant, sig: &str) -> bool {
        match hex::decode(sig) {
            Ok(raw) => self.mac(g).verify_slice(&raw).is_ok(),
            Err(_) => false,
        }
    }

    /// The portal-relative URL of `g` (path and query).
    pub fn url(&self, g: &Grant) -> String {
        format!(
            "{}/{}?node={}&job={}&attempt={}&expires={}&sig={}",
            commons_proto::OBJECTS_PATH,
            commons_api::files::percent_encode_path(&g.object),
            g.node,
            g.job,
            g.attempt,
            g.expires,
            self.sign(g)
        )
    }
}

/// The query of a signed portal URL, as the route reads it.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Query {
    pub node: i64,
    pub job: i64,
    pub attempt: i32,
    pub expires: i64,
    pub sig: String,
}

/// Makes the URL of `object` for `node`'s `attempt` of `job`: the store's own presigned
/// GET when it signs (S3) and `[files] agents_read_from_store` allows, else a signed
/// portal URL. With how long it is valid.
pub async fn url_for(
    ctx: &Ctx,
    node: i64,
    job: i64,
    attempt: i32,
    object: &str,
) -> Result<(String, u32), AppError> {
    let valid = std::time::Duration::from_secs(VALID_S.into());
    if ctx.files.presign {
        if let Some(url) = ctx.files.store.presigned_get(object, valid).await? {
            return Ok((url, VALID_S));
        }
    }
    let g = Grant {
        node,
        job,
        attempt,
        object: object.to_string(),
        expires: chrono::Utc::now().timestamp() + i64::from(VALID_S),
    };
    Ok((ctx.files.signer.url(&g), VALID_S))
}

/// Gives `files` (with their objects) their URLs, in place.
pub async fn sign_all(
    ctx: &Ctx,
    node: i64,
    job: i64,
    attempt: i32,
    files: &mut [(commons_proto::InputFile, String)],
) -> Result<(), AppError> {
    for (f, object) in files.iter_mut() {
        let (url, valid) = url_for(ctx, node, job, attempt, object).await?;
        f.url = Some(url);
        f.url_valid_s = Some(valid);
    }
    Ok(())
}

fn refuse(why: &str) -> AppError {
    AppError::Forbidden(format!("this object URL {why}"))
}

/// Checks a signed portal URL for `object` (decoded from its path): the signature, the
/// expiry, then that its node is enrolled and unrevoked and still starts the attempt.
/// Each refusal is a 403 saying which.
pub async fn open(ctx: &Ctx, object: String, q: Query) -> Result<String, AppError> {
    let g = Grant {
        node: q.node,
        job: q.job,
        attempt: q.attempt,
        object,
        expires: q.expires,
    };
    if !ctx.files.signer.verify(&g, &q.sig) {
        return Err(refuse(
            "has a bad signature (it names another object, node or attempt than it was made for)",
        ));
    }
    if chrono::Utc::now().timestamp() > g.expires {
        return Err(refuse("has expired: list the files again for a fresh one"));
    }
    let (node, job, attempt) = (g.node, g.job, g.attempt);
    ctx.db
        .run(move |c| still_holds(c, node, job, attempt))
        .await?;
    Ok(g.object)
}

/// The URL's node is enrolled, not revoked, and still starting the attempt.
fn still_holds(c: &mut DbConn, node: i64, job: i64, attempt: i32) -> Result<(), AppError> {
    let found = db::nodes::by_ids(c, &[node])?;
    match found.first() {
        None => return Err(refuse(&format!("names node {node}, which is not enrolled"))),
        Some(n) if n.revoked_at.is_some() => {
            return Err(refuse(&format!(
                "names node {node}, whose credential was revoked"
            )))
        }
        Some(_) => {}
    }
    let a = db::attempts::find(c, job, attempt)?;
    match a {
        Some(a) if a.node_id != node => Err(refuse(&format!(
            "was made for node {node}, but attempt {attempt} of job {job} is on another node"
        ))),
        Some(a) if a.state == AttemptStatus::Starting => Ok(()),
        _ => Err(refuse(&format!(
            "is for attempt {attempt} of job {job}, which is no longer starting"
        ))),
    }
}

/// The bytes of `object` (decoded from the URL's path) that a signed portal URL grants:
/// the range `range_header` asks for, or all of it, once [`open`] accepted the URL.
pub async fn get(
    ctx: &Ctx,
    object: String,
    q: Query,
    range_header: Option<&str>,
) -> Result<ObjectRead, AppError> {
    let object = open(ctx, object, q).await?;
    ctx.files.store.read_object(&object, range_header).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant() -> Grant {
        Grant {
            node: 3,
            job: 42,
            attempt: 1,
            object: "files/users/7/ab".into(),
            expires: 1_800_000_000,
        }
    }

    #[test]
    fn the_key_is_hmacs_own_for_any_length() {
        for len in [0, 32, 64, 65, 200] {
            let key = vec![5u8; len];
            let mut ours = hmac(&key);
            let mut theirs = <Hmac<Sha256> as Mac>::new_from_slice(&key).unwrap();
            ours.update(b"x");
            theirs.update(b"x");
            assert_eq!(
                ours.finalize().into_bytes(),
                theirs.finalize().into_bytes(),
                "{len}"
            );
        }
    }

    #[test]
    fn a_signature_covers_every_field() {
        let s = UrlSigner::derive(&[7u8; 64]);
        let g = grant();
        let sig = s.sign(&g);
        assert!(s.verify(&g, &sig));
        for other in [
            Grant { node: 4, ..grant() },
            Grant { job: 43, ..grant() },
            Grant {
                attempt: 2,
                ..grant()
            },
            Grant {
                object: "files/users/7/ac".into(),
                ..grant()
            },
            Grant {
                expires: 1_800_000_001,
                ..grant()
            },
        ] {
            assert!(!s.verify(&other, &sig), "{other:?}");
        }
        assert!(!s.verify(&g, "zz"), "not hex");
        assert!(
            !UrlSigner::derive(&[8u8; 64]).verify(&g, &sig),
            "another key"
        );
        assert!(!format!("{s:?}").contains(&hex::encode(s.key)));
        let url = s.url(&g);
        assert!(url.starts_with("/api/agent/v1/objects/files/users/7/ab?node=3&job=42&attempt=1&expires=1800000000&sig="));
    }
}
