//! What the agent checks before it runs a job's image, and the node's image settings.
//!
//! Invariants (checked in this order, every start):
//! 1. The `Start` carries a pin (`JobSpec::image_digest`, from the portal's allow-list);
//!    without one nothing runs.
//! 2. When the node requires signatures, the entry's signature verifies against the
//!    node's own authority keys over `gpu-commons-image-v1 IMAGE@DIGEST`
//!    ([`commons_api::image::verify`]); the portal's word is not enough.
//! 3. The image's ID in the local engine equals the pin: a retagged or rebuilt image is
//!    refused with both digests in the reason ([`RuntimeError::ImageChanged`]).
//! 4. A missing image is pulled only when the node allows the image's registry
//!    (`--allow-pull REGISTRY`), and only by digest (`NAME@DIGEST`); the pulled image's
//!    ID must equal the pin too.
//! 5. The container is created from the ID, never the tag, so a retag between the check
//!    and the start cannot swap the image.

use super::RuntimeError;
use commons_api::image::{self as rules, AuthorityKey};
use commons_proto::JobSpec;

/// A node's image settings (`commons-agent run --allow-pull ... --require-signed-images
/// --image-authority-keys FILE`).
#[derive(Debug, Clone, Default)]
pub struct ImagePolicy {
    /// Registries (host[:port], `docker.io` for Docker Hub names) this node may pull
    /// missing allowed images from, by digest. Empty: it never pulls.
    pub allow_pull: Vec<String>,
    /// Run only images whose allow-list entry carries a signature by one of
    /// `authority_keys`.
    pub require_signed: bool,
    pub authority_keys: Vec<AuthorityKey>,
}

/// The registry an image name lives in: its first path component when that looks like a
/// host (has a '.' or ':', or is `localhost`), else Docker Hub (`docker.io`).
pub fn registry_of(image: &str) -> &str {
    match image.split_once('/') {
        Some((first, _)) if first.contains('.') || first.contains(':') || first == "localhost" => {
            first
        }
        _ => "docker.io",
    }
}

/// The repository of `NAME:TAG` (the name without its tag), for a pull by digest.
pub fn repository_of(image: &str) -> &str {
    let last_slash = image.rfind('/').map_or(0, |i| i + 1);
    match image[last_slash..].rfind(':') {
        Some(i) => &image[..last_slash + i],
        None => image,
    }
}

impl ImagePolicy {
    /// Steps 1 and 2: the pin, and the signature where the node requires one. Pure.
    pub fn check_spec<'a>(&self, spec: &'a JobSpec) -> Result<&'a str, RuntimeError> {
        let pin = spec
            .image_digest
            .as_deref()
            .ok_or_else(|| RuntimeError::ImageNotPinned(spec.image.clone()))?;
        rules::digest(pin).map_err(|e| RuntimeError::ImageNotPinned(e.message))?;
        if self.require_signed {
            let sig = spec.image_signature.as_deref().ok_or_else(|| {
                RuntimeError::ImageSignature(
                    spec.image.clone(),
                    "its allow-list entry has no signature".into(),
                )
            })?;
            rules::verify(&spec.image, pin, sig, &self.authority_keys)
                .map_err(|e| RuntimeError::ImageSignature(spec.image.clone(), e.message))?;
        }
        Ok(pin)
    }

    /// Whether a missing `image` may be pulled (its registry is allowed).
    pub fn may_pull(&self, image: &str) -> bool {
        let reg = registry_of(image);
        self.allow_pull.iter().any(|r| r == reg)
    }
}

/// Step 3: the local ID against the pin.
pub fn compare(image: &str, local: &str, pinned: &str) -> Result<(), RuntimeError> {
    if local == pinned {
        Ok(())
    } else {
        Err(RuntimeError::ImageChanged {
            image: image.to_string(),
            local: local.to_string(),
            pinned: pinned.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registries_and_repositories() {
        assert_eq!(registry_of("busybox:1"), "docker.io");
        assert_eq!(registry_of("lab/img:1"), "docker.io");
        assert_eq!(registry_of("reg.campus.edu/lab/img:1"), "reg.campus.edu");
        assert_eq!(registry_of("localhost:5000/img:1"), "localhost:5000");
        assert_eq!(repository_of("localhost:5000/img:1"), "localhost:5000/img");
        assert_eq!(repository_of("localhost:5000/img"), "localhost:5000/img");
        assert_eq!(repository_of("busybox:latest"), "busybox");
    }

    #[test]
    fn pins_and_signatures_are_required_as_configured() {
        let mut spec = JobSpec {
            image: "x:1".into(),
            command: vec![],
            env: Default::default(),
            cpus: 1.0,
            memory_mb: 1,
            time_limit_s: 1,
            user: "u".into(),
            shm_mb: None,
            checkpoint_interval_s: None,
            interactive: false,
            guest: false,
            lab: None,
            grace_s: None,
            image_digest: None,
            image_signature: None,
            disk_gb: None,
        };
        let open = ImagePolicy::default();
        assert!(matches!(
            open.check_spec(&spec),
            Err(RuntimeError::ImageNotPinned(_))
        ));
        let pin = format!("sha256:{}", "a".repeat(64));
        spec.image_digest = Some(pin.clone());
        assert_eq!(open.check_spec(&spec).unwrap(), pin);
        let strict = ImagePolicy {
            require_signed: true,
            ..Default::default()
        };
        let e = strict.check_spec(&spec).unwrap_err().to_string();
        assert!(e.contains("no signature"), "{e}");
        spec.image_signature = Some("garbage".into());
        let e = strict.check_spec(&spec).unwrap_err().to_string();
        assert!(e.contains("not an SSH signature"), "{e}");
        assert!(!open.may_pull("busybox:1"));
        let pulls = ImagePolicy {
            allow_pull: vec!["reg.campus.edu".into()],
            ..Default::default()
        };
        assert!(pulls.may_pull("reg.campus.edu/lab/x:1"));
        assert!(!pulls.may_pull("evil.example/lab/x:1"));
        let e = compare("x:1", "sha256:b", &pin).unwrap_err().to_string();
        assert!(e.contains("was changed") && e.contains(&pin), "{e}");
    }
}
