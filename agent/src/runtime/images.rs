//! What the agent checks before it runs a job's image, and the node's image settings.
//!
//! Invariants (checked in this order, every start):
//! 1. The `Start` carries a pin (`JobSpec::image_digest`, from the portal's allow-list);
//!    without one nothing runs.
//! 2. When the node requires signatures, the entry's signature verifies against the
//!    node's own authority keys over `gpu-commons-image-v1 IMAGE@DIGEST`
//!    ([`commons_api::image::verify`]); the portal's word is not enough.
//! 3. A local copy serves only a pin this server may take from its own engine
//!    ([`ImagePolicy::local_ok`]): the campus allow-list's, or the allow-list of the lab
//!    that owns this server. A pin from another lab's own list is a guest's: its lab
//!    admin could name any `NAME:TAG` and digest, so a private image this server's owners
//!    keep in their engine must not run for it. Such an image runs only when pulled here
//!    by digest from a registry the node allows (step 5), and never from the local copy.
//! 4. The image's ID in the local engine equals the pin: a retagged or rebuilt image is
//!    refused ([`RuntimeError::ImageChanged`]). The reason names the pin only: the local
//!    ID goes to the agent's log, never to the job's reason, which its user reads.
//! 5. A missing image (or a guest's lab-list image, always) is pulled only when the node
//!    allows the image's registry (`--allow-pull REGISTRY`), and only by digest
//!    (`NAME@DIGEST`); what was pulled must be the pin: its ID, or the registry digest
//!    Docker recorded for that pull (`RepoDigests`, what `docker push` prints).
//! 6. The container is created from the ID, never the tag, so a retag between the check
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
    /// The slug of the lab that owns this server (from its credential). `None`: no
    /// lab's own entries run from local images here, only the campus's.
    pub own_lab: Option<String>,
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

    /// Step 3: whether the job's pin may be served from this engine's local images: a
    /// campus entry, or an entry of the lab that owns this server (the job is that
    /// lab's). Pure.
    pub fn local_ok(&self, spec: &JobSpec) -> bool {
        spec.image_campus
            || self
                .own_lab
                .as_deref()
                .is_some_and(|own| spec.lab.as_deref() == Some(own))
    }

    /// Whether a missing `image` may be pulled (its registry is allowed).
    pub fn may_pull(&self, image: &str) -> bool {
        let reg = registry_of(image);
        self.allow_pull.iter().any(|r| r == reg)
    }
}

/// Step 4: the local ID against the pin. The local ID is logged here, on the server,
/// and kept out of the error, whose words reach the job's user.
pub fn compare(image: &str, local: &str, pinned: &str) -> Result<(), RuntimeError> {
    if local == pinned {
        Ok(())
    } else {
        tracing::warn!(
            image,
            local,
            pinned,
            "the local image is not the pinned one"
        );
        Err(RuntimeError::ImageChanged {
            image: image.to_string(),
            pinned: pinned.to_string(),
        })
    }
}

/// Step 5: whether the image pulled as `by_digest` (`REPOSITORY@DIGEST`) is the pin:
/// its ID is the pin, or Docker recorded `by_digest` among its registry digests (a pin
/// of the registry's manifest digest, which is what a pull by digest can name).
pub fn pulled_is_pin(id: &str, repo_digests: &[String], by_digest: &str, pin: &str) -> bool {
    id == pin || repo_digests.iter().any(|d| d == by_digest)
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
            inputs: Vec::new(),
            datasets: Vec::new(),
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
            image_campus: true,
            disk_gb: None,
            gpu_share: None,
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
        let e = compare("x:1", "sha256:b0b0", &pin).unwrap_err().to_string();
        assert!(e.contains("is not the one") && e.contains(&pin), "{e}");
        assert!(!e.contains("b0b0"), "the local ID stays on the server: {e}");
    }

    #[test]
    fn local_copies_serve_campus_pins_and_the_servers_own_lab_only() {
        let mut spec = JobSpec {
            inputs: Vec::new(),
            datasets: Vec::new(),
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
            guest: true,
            lab: Some("physics".into()),
            grace_s: None,
            image_digest: None,
            image_signature: None,
            image_campus: true,
            disk_gb: None,
            gpu_share: None,
        };
        let vision = ImagePolicy {
            own_lab: Some("vision".into()),
            ..Default::default()
        };
        assert!(vision.local_ok(&spec), "a campus entry, anywhere");
        spec.image_campus = false;
        assert!(
            !vision.local_ok(&spec),
            "physics' own entry on vision's server"
        );
        assert!(
            !ImagePolicy::default().local_ok(&spec),
            "no own lab known: no lab's entry"
        );
        spec.lab = None;
        assert!(!vision.local_ok(&spec), "a job of no named lab");
        spec.lab = Some("vision".into());
        assert!(
            vision.local_ok(&spec),
            "vision's own entry on vision's server"
        );
    }

    #[test]
    fn a_pull_is_the_pin_by_its_id_or_its_registry_digest() {
        let by = "reg/x@sha256:m";
        assert!(pulled_is_pin("sha256:c", &[], by, "sha256:c"));
        assert!(pulled_is_pin("sha256:c", &[by.to_string()], by, "sha256:m"));
        assert!(!pulled_is_pin(
            "sha256:c",
            &["reg/other@sha256:m".to_string()],
            by,
            "sha256:m"
        ));
    }
}
