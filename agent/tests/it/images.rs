//! The agent's image checks against the real Docker Engine: the pin must equal the local
//! image ID (a retagged image is refused and nothing of it runs), the container is made
//! from the ID, missing images are pulled only from allowed registries and only by
//! digest, and a node that requires signatures checks them with its own keys. A guest's
//! image pinned by its own lab's allow-list never runs from this server's local copy: it
//! is pulled by digest from a real registry ([`crate::registry`]) or refused.

use super::registry::Registry;
use super::{final_event, guard_exe, lease_from_hello, local_id, new_agent_id, spec};
use commons_agent::executor::Executor;
use commons_agent::outbox::{self, OutboxRx};
use commons_agent::runtime::images::ImagePolicy;
use commons_agent::runtime::{ContainerRuntime, DockerRuntime};
use commons_agent::store::Store;
use commons_proto::{AttemptState, JobSpec};
use std::path::Path;
use std::process::Command;

/// Builds a FROM-scratch busybox image tagged `tag` whose `/marker` holds `marker`;
/// answers its ID.
fn build(tag: &str, marker: &str) -> String {
    let ctx = tempfile::tempdir().unwrap();
    std::fs::copy("/bin/busybox", ctx.path().join("busybox"))
        .expect("a static busybox at /bin/busybox (apt-get install busybox-static)");
    std::fs::write(ctx.path().join("marker"), marker).unwrap();
    std::fs::write(
        ctx.path().join("Dockerfile"),
        "FROM scratch\nCOPY busybox /bin/busybox\nCOPY marker /marker\n\
         RUN [\"/bin/busybox\", \"--install\", \"-s\", \"/bin\"]\n",
    )
    .unwrap();
    let out = Command::new("docker")
        .args(["build", "-q", "-t", tag])
        .arg(ctx.path())
        .output()
        .expect("the docker CLI is needed");
    assert!(
        out.status.success(),
        "docker build: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    local_id(tag)
}

/// Removes images by tag or ID at the end of a test (ignoring errors).
struct Cleanup(Vec<String>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for i in &self.0 {
            let _ = Command::new("docker").args(["rmi", "-f", i]).output();
        }
    }
}

async fn agent_with(dir: &Path, policy: ImagePolicy) -> (Executor, OutboxRx, DockerRuntime) {
    let rt = DockerRuntime::connect(new_agent_id())
        .await
        .expect("the Docker Engine must run")
        .with_images(policy);
    let (tx, rx) = outbox::channel(Default::default());
    let store = Store::new(dir).with_guard(Some(guard_exe()));
    // No free-space floor: the guests here must start on a shared machine's fuller disk.
    let disk = commons_agent::disk::DiskPolicy {
        floor: commons_agent::disk::Floor::Percent(0),
        ..Default::default()
    };
    (
        Executor::with_disk(rt.clone(), tx, store, None, disk),
        rx,
        rt,
    )
}

fn pinned(image: &str, digest: &str, cmd: &str) -> JobSpec {
    let mut s = spec(cmd, 60);
    s.image = image.into();
    s.image_digest = Some(digest.into());
    s
}

/// Containers (any agent's) made from image `id`.
fn containers_of(id: &str) -> String {
    let out = Command::new("docker")
        .args(["ps", "-aq", "--filter", &format!("ancestor={id}")])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retagged_image_is_refused_and_the_pinned_one_runs_by_id() {
    let tag = format!("commons-retag-{:08x}:v1", rand::random::<u32>());
    let pinned_id = build(&tag, "the allowed one");
    let _clean = Cleanup(vec![tag.clone(), pinned_id.clone()]);
    let dir = tempfile::tempdir().unwrap();
    let (exec, mut rx, rt) = agent_with(dir.path(), ImagePolicy::default()).await;

    // At its pin it runs, and the container was made from the ID, not the tag.
    exec.start(
        1,
        1,
        pinned(&tag, &pinned_id, "cat /marker; echo; sleep 2"),
        vec![],
        lease_from_hello(&exec, 3600),
    );
    let mut config_image = String::new();
    // Up to 60 s: a busy machine may take its time to create the container.
    for _ in 0..600 {
        if let Some(c) = rt.list().await.unwrap().first() {
            let out = Command::new("docker")
                .args(["inspect", "--format", "{{.Config.Image}}", &c.id])
                .output()
                .unwrap();
            config_image = String::from_utf8_lossy(&out.stdout).trim().to_string();
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(config_image, pinned_id, "created from the pinned ID");
    let end = final_event(&mut rx).await;
    assert_eq!(end.state, AttemptState::Exited, "{end:?}");
    assert!(end.logs.contains("the allowed one"), "{end:?}");

    // Someone builds another image and tags it over the allowed tag.
    let other = build(&tag, "a swapped one");
    let _clean2 = Cleanup(vec![other.clone()]);
    assert_ne!(other, pinned_id);
    exec.start(
        2,
        1,
        pinned(&tag, &pinned_id, "cat /marker"),
        vec![],
        lease_from_hello(&exec, 3600),
    );
    let end = final_event(&mut rx).await;
    assert_eq!(end.state, AttemptState::Failed, "{end:?}");
    let reason = end.reason.unwrap_or_default();
    assert!(
        reason.contains(&format!(
            "the local image {tag} is not the one the allow-list pins ({pinned_id})"
        )),
        "{reason}"
    );
    assert!(
        !reason.contains(other.trim_start_matches("sha256:")),
        "the reason, which the job's user reads, never tells the local ID: {reason}"
    );
    assert!(!end.logs.contains("swapped"), "{:?}", end.logs);
    assert!(rt.list().await.unwrap().is_empty(), "no container made");
    assert_eq!(
        containers_of(&other),
        "",
        "nothing of the swapped image ran"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_images_are_pulled_only_from_allowed_registries_and_only_by_digest() {
    let digest = format!("sha256:{}", "ab".repeat(32));
    let image = "127.0.0.1:9/commons-nothing:v1";
    let dir = tempfile::tempdir().unwrap();

    // No pulls allowed: missing, and nothing asked of any registry.
    let (exec, mut rx, _rt) = agent_with(dir.path(), ImagePolicy::default()).await;
    exec.start(
        1,
        1,
        pinned(image, &digest, "true"),
        vec![],
        lease_from_hello(&exec, 3600),
    );
    let end = final_event(&mut rx).await;
    assert_eq!(end.state, AttemptState::Failed);
    let reason = end.reason.unwrap_or_default();
    assert!(
        reason.contains("is missing on this server") && reason.contains("does not pull"),
        "{reason}"
    );

    // Another registry allowed: still not pulled.
    let dir2 = tempfile::tempdir().unwrap();
    let other = ImagePolicy {
        allow_pull: vec!["registry.campus.test".into()],
        ..Default::default()
    };
    let (exec, mut rx, _rt) = agent_with(dir2.path(), other).await;
    exec.start(
        2,
        1,
        pinned(image, &digest, "true"),
        vec![],
        lease_from_hello(&exec, 3600),
    );
    let end = final_event(&mut rx).await;
    assert!(
        end.reason
            .unwrap_or_default()
            .contains("is missing on this server"),
        "not pulled from a registry the node does not name"
    );

    // Its registry allowed (a closed port on loopback here: no registry is reachable):
    // the pull is tried by digest, and its failure is the reason.
    let dir3 = tempfile::tempdir().unwrap();
    let allowed = ImagePolicy {
        allow_pull: vec!["127.0.0.1:9".into()],
        ..Default::default()
    };
    let (exec, mut rx, _rt) = agent_with(dir3.path(), allowed).await;
    exec.start(
        3,
        1,
        pinned(image, &digest, "true"),
        vec![],
        lease_from_hello(&exec, 3600),
    );
    let end = final_event(&mut rx).await;
    assert_eq!(end.state, AttemptState::Failed);
    let reason = end.reason.unwrap_or_default();
    assert!(
        reason.contains(&format!(
            "pulling 127.0.0.1:9/commons-nothing@{digest} by digest failed"
        )),
        "{reason}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_without_a_pin_runs_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (exec, mut rx, rt) = agent_with(dir.path(), ImagePolicy::default()).await;
    let mut s = spec("echo should-not-run", 60);
    s.image_digest = None;
    exec.start(1, 1, s, vec![], lease_from_hello(&exec, 3600));
    let end = final_event(&mut rx).await;
    assert_eq!(end.state, AttemptState::Failed);
    assert!(
        end.reason
            .unwrap_or_default()
            .contains("has no pinned digest"),
        "refused"
    );
    assert!(rt.list().await.unwrap().is_empty());
}

/// A key pair made for the test with ssh-keygen; answers (private key path, public line).
pub(crate) fn keygen(dir: &Path, name: &str) -> (std::path::PathBuf, String) {
    let key = dir.join(name);
    let ok = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", name, "-f"])
        .arg(&key)
        .status()
        .expect("ssh-keygen is needed (apt-get install openssh-client)");
    assert!(ok.success());
    let public = std::fs::read_to_string(key.with_extension("pub")).unwrap();
    (key, public.trim().to_string())
}

/// `ssh-keygen -Y sign` of the canonical string for `image@digest`.
pub(crate) fn sign(dir: &Path, key: &Path, image: &str, digest: &str) -> String {
    // A fresh file each time: ssh-keygen does not overwrite an existing .sig.
    let msg = dir.join(format!("msg-{:016x}", rand::random::<u64>()));
    std::fs::write(&msg, commons_api::image::canonical(image, digest)).unwrap();
    let ok = Command::new("ssh-keygen")
        .args(["-q", "-Y", "sign", "-n", "gpu-commons-image", "-f"])
        .arg(key)
        .arg(&msg)
        .status()
        .unwrap();
    assert!(ok.success());
    std::fs::read_to_string(msg.with_extension("sig")).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_requires_signatures_checks_them_with_its_own_keys() {
    let keys = tempfile::tempdir().unwrap();
    let (authority, authority_pub) = keygen(keys.path(), "authority");
    let (rogue, _) = keygen(keys.path(), "rogue");
    let policy = ImagePolicy {
        require_signed: true,
        authority_keys: commons_api::image::parse_keys(&authority_pub).unwrap(),
        ..Default::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let (exec, mut rx, rt) = agent_with(dir.path(), policy).await;
    let base = spec("echo signed-and-running", 60);
    let digest = base.image_digest.clone().unwrap();

    let mut good = base.clone();
    good.image_signature = Some(sign(keys.path(), &authority, &good.image, &digest));
    exec.start(1, 1, good, vec![], lease_from_hello(&exec, 3600));
    let end = final_event(&mut rx).await;
    assert_eq!(end.state, AttemptState::Exited, "{end:?}");
    assert!(end.logs.contains("signed-and-running"));

    for (job, sig, why) in [
        (2, None, "has no signature"),
        (
            3,
            Some(sign(keys.path(), &rogue, &base.image, &digest)),
            "not signed by a trusted image authority key",
        ),
        (
            4,
            // The authority's signature, but of another digest.
            Some(sign(
                keys.path(),
                &authority,
                &base.image,
                &format!("sha256:{}", "0".repeat(64)),
            )),
            "does not match",
        ),
    ] {
        let mut s = base.clone();
        s.image_signature = sig;
        exec.start(job, 1, s, vec![], lease_from_hello(&exec, 3600));
        let end = final_event(&mut rx).await;
        assert_eq!(end.state, AttemptState::Failed, "job {job}");
        let reason = end.reason.unwrap_or_default();
        assert!(
            reason.contains("is not signed as this server requires") && reason.contains(why),
            "job {job}: {reason}"
        );
        assert!(!end.logs.contains("signed-and-running"));
    }
    assert!(rt.list().await.unwrap().is_empty());
}

/// A guest's job (lab physics) on a vision server, its image pinned by physics' own
/// allow-list entry.
fn guest_of_physics(image: &str, digest: &str, cmd: &str) -> JobSpec {
    let mut s = pinned(image, digest, cmd);
    s.image_campus = false;
    s.guest = true;
    s.lab = Some("physics".into());
    s
}

fn vision_server(allow_pull: Vec<String>) -> ImagePolicy {
    ImagePolicy {
        allow_pull,
        own_lab: Some("vision".into()),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guests_lab_entry_never_runs_the_servers_local_copy() {
    let tag = format!("commons-private-{:08x}:v1", rand::random::<u32>());
    let id = build(&tag, "vision's private files");
    let _clean = Cleanup(vec![tag.clone(), id.clone()]);
    // Pulls allowed from Docker Hub, where a local name like this one lives: the pull
    // by digest is tried and fails (nothing there, no network), and the local copy is
    // still not used.
    for (job, policy, why) in [
        (1, vision_server(vec![]), "is not one of them"),
        (
            2,
            vision_server(vec!["docker.io".into()]),
            "by digest failed",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let (exec, mut rx, rt) = agent_with(dir.path(), policy).await;
        let zero = format!("sha256:{}", "0".repeat(64));
        for (attempt, pin) in [(1, &zero), (2, &id)] {
            exec.start(
                job,
                attempt,
                guest_of_physics(&tag, pin, "cat /marker"),
                vec![],
                lease_from_hello(&exec, 3600),
            );
            let end = final_event(&mut rx).await;
            assert_eq!(end.state, AttemptState::Failed, "{end:?}");
            let reason = end.reason.unwrap_or_default();
            assert!(reason.contains(why), "job {job}: {reason}");
            if pin == &zero {
                assert!(
                    !reason.contains(id.trim_start_matches("sha256:")),
                    "the local ID is never told: {reason}"
                );
            }
            assert!(!end.logs.contains("private"), "{:?}", end.logs);
            assert!(rt.list().await.unwrap().is_empty(), "no container made");
        }
    }
    assert_eq!(containers_of(&id), "", "nothing of the private image ran");

    // The same entry for the server's own lab runs from the local copy.
    let dir = tempfile::tempdir().unwrap();
    let (exec, mut rx, _rt) = agent_with(dir.path(), vision_server(vec![])).await;
    let mut own = guest_of_physics(&tag, &id, "cat /marker");
    own.guest = false;
    own.lab = Some("vision".into());
    exec.start(9, 1, own, vec![], lease_from_hello(&exec, 3600));
    let end = final_event(&mut rx).await;
    assert_eq!(end.state, AttemptState::Exited, "{end:?}");
    assert!(
        end.logs.contains("vision's private files"),
        "{:?}",
        end.logs
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guests_lab_entry_runs_when_pulled_by_its_registry_digest() {
    let registry = Registry::start();
    let tag = format!(
        "{}/commons-shared-{:08x}:v1",
        registry.host,
        rand::random::<u32>()
    );
    let id = build(&tag, "physics' published image");
    let manifest = registry.push(&tag);
    let repo = tag.rsplit_once(':').unwrap().0.to_string();
    let _clean = Cleanup(vec![format!("{repo}@{manifest}"), tag.clone(), id.clone()]);
    // Gone from the engine: only the registry has it now.
    let out = Command::new("docker").args(["rmi", &tag]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let dir = tempfile::tempdir().unwrap();
    let (exec, mut rx, _rt) =
        agent_with(dir.path(), vision_server(vec![registry.host.clone()])).await;
    exec.start(
        1,
        1,
        guest_of_physics(&tag, &manifest, "cat /marker"),
        vec![],
        lease_from_hello(&exec, 3600),
    );
    let end = final_event(&mut rx).await;
    assert_eq!(end.state, AttemptState::Exited, "{end:?}");
    assert!(
        end.logs.contains("physics' published image"),
        "{:?}",
        end.logs
    );
    assert_eq!(
        local_id(&format!("{repo}@{manifest}")),
        id,
        "pulled by digest"
    );

    // The image now sits in this engine with the ID `id`. A pin of that ID (not a
    // registry digest) is still not served from the local copy: the pull by it fails.
    exec.start(
        2,
        1,
        guest_of_physics(&tag, &id, "cat /marker"),
        vec![],
        lease_from_hello(&exec, 3600),
    );
    let end = final_event(&mut rx).await;
    assert_eq!(end.state, AttemptState::Failed, "{end:?}");
    assert!(
        end.reason.unwrap_or_default().contains("by digest failed"),
        "refused"
    );
}
