//! The image allow-list's rules, shared by the portal (which checks entries and jobs) and
//! the agent (which checks again before it runs anything): how an image is named
//! (`NAME:TAG`), what a pin looks like (`sha256:<64 hex>`, the image's ID in the Docker
//! Engine), and what an image signature is; and the allow-list's API types
//! (`/api/v1/images`).
//!
//! A signature is an SSH signature (`ssh-keygen -Y sign -n gpu-commons-image`, the
//! "SSHSIG" format, armored) by an ed25519 key of a campus authority over the bytes of
//! [`canonical`]: `gpu-commons-image-v1 NAME:TAG@DIGEST`, without a trailing newline. It
//! binds the name, the tag and the pinned digest together: the same signature does not
//! vouch for another tag or another digest. It is not cosign/sigstore: no registry, no
//! transparency log, no certificate chain; the trusted keys are configured by hand.
//!
//! Invariants: no I/O. Every refusal names its field (`name_tag`, `digest`, `image`,
//! `signature`).

use crate::Invalid;
use chrono::NaiveDateTime;
use serde::{Deserialize, Serialize};
use ssh_key::{Algorithm, PublicKey, SshSig};

/// The SSHSIG namespace of image signatures (`ssh-keygen -Y sign -n ...`).
pub const SIGNATURE_NAMESPACE: &str = "gpu-commons-image";

/// The string a signature covers.
pub fn canonical(name_tag: &str, digest: &str) -> String {
    format!("gpu-commons-image-v1 {name_tag}@{digest}")
}

/// An allow-list name, `NAME:TAG` (a missing tag is `latest`), as given in `field`; no
/// digest (the pin is its own field).
pub fn name_tag(field: &str, s: &str) -> Result<String, Invalid> {
    let s = s.trim();
    crate::rules::image_reference(s).map_err(|e| Invalid::new(field, e.message))?;
    if s.contains('@') {
        return Err(Invalid::new(
            field,
            format!("{s:?}: give NAME:TAG without a digest (the pin is the `digest` field)"),
        ));
    }
    Ok(with_tag(s))
}

/// The allow-list name a job's `image` stands for: `NAME:TAG`, `latest` when no tag is
/// given. A job names its image by tag; the digest comes from the allow-list.
pub fn job_image(s: &str) -> Result<String, Invalid> {
    let s = s.trim();
    if s.contains('@') {
        return Err(Invalid::new(
            "image",
            format!(
                "{s:?}: name the image as NAME:TAG as on the allow-list (GET /api/v1/images); \
                 the allow-list pins its digest"
            ),
        ));
    }
    Ok(with_tag(s))
}

fn with_tag(s: &str) -> String {
    let last = s.rsplit('/').next().unwrap_or(s);
    if last.contains(':') {
        s.to_string()
    } else {
        format!("{s}:latest")
    }
}

/// A pin: `sha256:` and 64 lower-case hex digits (what `docker image inspect --format
/// '{{.Id}}'` prints).
pub fn digest(s: &str) -> Result<(), Invalid> {
    let ok = s
        .strip_prefix("sha256:")
        .is_some_and(|h| h.len() == 64 && h.chars().all(|c| matches!(c, '0'..='9' | 'a'..='f')));
    if ok {
        Ok(())
    } else {
        Err(Invalid::new(
            "digest",
            format!("{s:?} is not a digest: expected sha256: and 64 lower-case hex digits (docker image inspect --format '{{{{.Id}}}}' NAME:TAG)"),
        ))
    }
}

/// A campus authority's public key: one OpenSSH line, `ssh-ed25519 AAAA... [comment]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthorityKey(PublicKey);

impl AuthorityKey {
    pub fn parse(line: &str) -> Result<AuthorityKey, String> {
        let key = PublicKey::from_openssh(line.trim())
            .map_err(|e| format!("not an OpenSSH public key ({e})"))?;
        if key.algorithm() != Algorithm::Ed25519 {
            return Err(format!(
                "image authority keys must be ed25519, not {}",
                key.algorithm()
            ));
        }
        Ok(AuthorityKey(key))
    }

    /// `SHA256:...`, as `ssh-keygen -l` prints it.
    pub fn fingerprint(&self) -> String {
        self.0.fingerprint(Default::default()).to_string()
    }
}

/// Every key of a file of OpenSSH public key lines (blank lines and `#` comments skipped).
pub fn parse_keys(text: &str) -> Result<Vec<AuthorityKey>, String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .enumerate()
        .map(|(i, l)| AuthorityKey::parse(l).map_err(|e| format!("key {}: {e}", i + 1)))
        .collect()
}

/// Checks `signature` (armored SSHSIG) over [`canonical`]`(name_tag, digest)` against the
/// trusted `keys`; answers the fingerprint of the key that signed. Refusals name the
/// field `signature` and say which check failed.
pub fn verify(
    name_tag: &str,
    digest: &str,
    signature: &str,
    keys: &[AuthorityKey],
) -> Result<String, Invalid> {
    let bad = |why: String| Invalid::new("signature", why);
    let sig = SshSig::from_pem(signature.trim().as_bytes()).map_err(|e| {
        bad(format!(
            "not an SSH signature (ssh-keygen -Y sign output): {e}"
        ))
    })?;
    if sig.namespace() != SIGNATURE_NAMESPACE {
        return Err(bad(format!(
            "signed for namespace {:?}; image signatures use -n {SIGNATURE_NAMESPACE}",
            sig.namespace()
        )));
    }
    let key = keys
        .iter()
        .find(|k| k.0.key_data() == sig.public_key())
        .ok_or_else(|| bad("not signed by a trusted image authority key".into()))?;
    key.0
        .verify(
            SIGNATURE_NAMESPACE,
            canonical(name_tag, digest).as_bytes(),
            &sig,
        )
        .map_err(|_| {
            bad(format!(
                "the signature does not match {:?}",
                canonical(name_tag, digest)
            ))
        })?;
    Ok(key.fingerprint())
}

/// `POST /api/v1/images`: an allow-list entry to add.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct NewImage {
    /// `NAME:TAG` (a missing tag is `latest`).
    pub name_tag: String,
    /// `sha256:...`, the image's ID (`docker image inspect --format '{{.Id}}'`). Absent:
    /// the Docker Engine on the portal's host is asked.
    #[serde(default)]
    pub digest: Option<String>,
    /// A lab's slug; absent: a campus-wide entry (operators only).
    #[serde(default)]
    pub lab: Option<String>,
    #[serde(default)]
    pub description: Option<String>,
    /// `ssh-keygen -Y sign -n gpu-commons-image` output over
    /// `gpu-commons-image-v1 NAME:TAG@DIGEST`.
    #[serde(default)]
    pub signature: Option<String>,
}

/// An allow-list entry (`GET /api/v1/images`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ImageView {
    pub id: i64,
    pub name_tag: String,
    /// The pinned digest: jobs on this entry run exactly this image.
    pub digest: String,
    pub description: String,
    /// The lab's slug; `null`: campus-wide.
    pub lab: Option<String>,
    /// The fingerprint of the campus authority key that signed it.
    pub signed_by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<String>,
    pub created_by: String,
    pub created_at: NaiveDateTime,
}

/// `PUT /api/v1/labs/{slug}/signed-images`: whether the lab's jobs may use signed
/// entries only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RequireSigned {
    pub require_signed: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_digests() {
        assert_eq!(name_tag("name_tag", "busybox").unwrap(), "busybox:latest");
        assert_eq!(
            name_tag("name_tag", "reg.campus:5000/lab/img:v1").unwrap(),
            "reg.campus:5000/lab/img:v1"
        );
        assert_eq!(
            name_tag("name_tag", "reg.campus:5000/lab/img").unwrap(),
            "reg.campus:5000/lab/img:latest"
        );
        assert_eq!(
            name_tag("name_tag", &format!("a:b@sha256:{}", "0".repeat(64)))
                .unwrap_err()
                .field,
            "name_tag"
        );
        assert_eq!(
            name_tag("name_tag", "Bad Name").unwrap_err().field,
            "name_tag"
        );
        assert_eq!(job_image("x@sha256:00").unwrap_err().field, "image");
        assert!(digest(&format!("sha256:{}", "a".repeat(64))).is_ok());
        for bad in [
            "sha256:ABC",
            "md5:00",
            "",
            &format!("sha256:{}", "A".repeat(64)),
        ] {
            assert_eq!(digest(bad).unwrap_err().field, "digest");
        }
    }

    #[test]
    fn only_ed25519_keys() {
        let rsa = "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAAAgQC7 x";
        assert!(AuthorityKey::parse(rsa).is_err());
        assert!(parse_keys("# none\n\n").unwrap().is_empty());
    }
}
