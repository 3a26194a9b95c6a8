//! A lab's own allow-list entries serve that lab's servers: the exploit of issue 26 tried
//! end to end, with a real agent and the real Docker Engine, on both backends.
//!
//! Physics' lab admin pins `NAME:TAG` of a private image that only sits in the vision
//! lab's engine (vision built it; no registry has it), first to a made-up digest to read
//! the real ID from the failure, then to the real ID, and submits guest jobs onto
//! vision's server. Neither learns the ID nor runs the image; vision's own job on its own
//! entry does run it, from the local copy.

use crate::support::harness::{wait_for, TestPortal, BACKENDS};
use commons_portal::db::models::Role;
use commons_portal::db::users;
use serde_json::{json, Value};
use std::process::Command;
use std::time::Duration;

const T: Duration = Duration::from_secs(60);

/// Builds a FROM-scratch busybox image tagged `tag` whose `/secret` holds `secret`;
/// answers its ID.
fn build_private(tag: &str, secret: &str) -> String {
    let ctx = tempfile::tempdir().unwrap();
    std::fs::copy("/bin/busybox", ctx.path().join("busybox"))
        .expect("a static busybox at /bin/busybox (apt-get install busybox-static)");
    std::fs::write(ctx.path().join("secret"), secret).unwrap();
    std::fs::write(
        ctx.path().join("Dockerfile"),
        "FROM scratch\nCOPY busybox /bin/busybox\nCOPY secret /secret\n\
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
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Containers (any agent's, any state) made from image `id`.
fn containers_of(id: &str) -> String {
    let out = Command::new("docker")
        .args(["ps", "-aq", "--filter", &format!("ancestor={id}")])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

struct RemoveImage(String);

impl Drop for RemoveImage {
    fn drop(&mut self) {
        let _ = Command::new("docker").args(["rmi", "-f", &self.0]).output();
    }
}

/// A physics lab admin (the attacker), with an API token.
async fn physics_admin(p: &TestPortal) -> String {
    let db = p.portal.state.db.clone();
    tokio::task::spawn_blocking(move || {
        db.run_blocking(|c| {
            let physics = users::find_lab(c, "physics")?.unwrap();
            let pat = users::create_user(c, "pat", "pat@campus.test", false)?;
            users::set_membership(c, pat.id, physics.id, Role::Admin)?;
            users::create_api_token(c, pat.id, "test")
        })
        .unwrap()
    })
    .await
    .unwrap()
}

fn job(image: &str, cmd: &str) -> Value {
    json!({"image": image, "command": ["sh", "-c", cmd], "gpus": 1, "time_limit_minutes": 5})
}

/// Pins `image` on `lab`'s allow-list to `digest` (as `token`); answers the entry's id.
async fn pin(p: &TestPortal, token: &str, lab: &str, image: &str, digest: &str) -> i64 {
    let (status, v) = p
        .post_json(
            token,
            "/api/v1/images",
            &json!({"name_tag": image, "digest": digest, "lab": lab}),
        )
        .await;
    assert_eq!(status, 201, "{v}");
    v["id"].as_i64().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_labs_private_local_image_never_runs_for_a_guest() {
    let tag = format!("vision-secret-{:08x}:v1", rand::random::<u32>());
    let secret = format!("vision-private-{:016x}", rand::random::<u64>());
    let real_id = build_private(&tag, &secret);
    let _clean = RemoveImage(real_id.clone());
    for backend in BACKENDS {
        let p = TestPortal::start(backend).await;
        let agent = p.agent("vision", "fake:2xA100-80GB").await;
        let node = p.get_json(&p.alice, "/api/v1/nodes").await[0]["id"]
            .as_i64()
            .unwrap();
        let (status, v) = p
            .put_json(
                &p.carol,
                &format!("/api/v1/nodes/{node}/lending"),
                &json!({"mode": "always"}),
            )
            .await;
        assert_eq!(status, 200, "{v}");
        let pat = physics_admin(&p).await;

        // 1. A made-up pin for vision's private tag: the job fails, and its reason does
        //    not tell the real ID.
        let zero = format!("sha256:{}", "0".repeat(64));
        let entry = pin(&p, &pat, "physics", &tag, &zero).await;
        let probe = p.submit(&p.bob, job(&tag, "cat /secret")).await;
        let j = p
            .wait_state(&p.bob, probe, &["failed", "succeeded"], T)
            .await;
        assert_eq!(j["state"], "failed", "[{backend:?}] {j}");
        let events = p
            .get_json(&p.bob, &format!("/api/v1/jobs/{probe}/events"))
            .await;
        let seen = format!("{j} {events} {}", p.logs(&p.bob, probe).await);
        let hex = real_id.trim_start_matches("sha256:");
        assert!(
            !seen.contains(&hex[..12]),
            "[{backend:?}] the local image's ID leaked to the guest: {seen}"
        );

        // 2. Pinned to the real ID (as if it had leaked): still never run here.
        let status = p
            .http
            .delete(format!("{}/api/v1/images/{entry}", p.url))
            .bearer_auth(&pat)
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(status, 204);
        pin(&p, &pat, "physics", &tag, &real_id).await;
        let guest = p.submit(&p.bob, job(&tag, "cat /secret")).await;
        let j = p
            .wait_state(&p.bob, guest, &["failed", "succeeded"], T)
            .await;
        assert_eq!(j["state"], "failed", "[{backend:?}] {j}");
        let reason = j["reason"].as_str().unwrap_or_default();
        assert!(
            reason.contains("lab physics's own allow-list")
                && reason.contains("pulled by digest from a registry this server allows"),
            "[{backend:?}] {reason}"
        );
        assert!(
            !p.logs(&p.bob, guest).await.contains(&secret),
            "[{backend:?}] the guest read vision's private image"
        );
        assert_eq!(
            containers_of(&real_id),
            "",
            "[{backend:?}] no container was made from vision's private image for a guest"
        );

        // 3. Vision's own entry, for vision's own job on vision's server: runs locally.
        pin(&p, &p.carol, "vision", &tag, &real_id).await;
        let own = p.submit(&p.alice, job(&tag, "cat /secret")).await;
        let j = p
            .wait_state(&p.alice, own, &["failed", "succeeded"], T)
            .await;
        assert_eq!(j["state"], "succeeded", "[{backend:?}] {j}");
        let (me, secret) = (&p, &secret);
        wait_for(T, "the owner's job's output", || async move {
            me.logs(&me.alice, own).await.contains(secret)
        })
        .await;
        drop(agent);
        p.stop().await;
    }
}
