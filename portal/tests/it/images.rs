//! The image allow-list through the API on both backends: jobs name only allowed images
//! (nothing stored otherwise), lab entries serve their lab only, who may add and remove
//! what, audit entries, signatures checked when added and required by labs, and the job
//! form's choices.

use crate::support::harness::{TestPortal, BACKENDS};
use crate::support::session::BrowserSession;
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;

fn digest(c: char) -> String {
    format!("sha256:{}", c.to_string().repeat(64))
}

fn job(image: &str) -> Value {
    json!({"image": image, "command": ["true"], "gpus": 1, "time_limit_minutes": 5})
}

async fn delete(p: &TestPortal, token: &str, path: &str) -> u16 {
    p.http
        .delete(format!("{}{path}", p.url))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

per_backend! {
    async fn a_job_naming_an_image_not_on_the_list_is_refused_and_nothing_stored(backend: Backend) {
        let p = TestPortal::start(backend).await;
        let (status, body) = p
            .post_json(&p.alice, "/api/v1/jobs", &job("busybox:1.36"))
            .await;
        assert_eq!(status, 422, "[{backend:?}] {body}");
        assert_eq!(body["field"], "image", "{body}");
        let msg = body["message"].as_str().unwrap();
        assert!(
            msg.contains("busybox:1.36 is not on the image allow-list of lab vision")
                && msg.contains("ask a lab admin to allow it"),
            "{msg}"
        );
        // By digest is refused too: the allow-list pins, the job names the tag.
        let (status, body) = p
            .post_json(
                &p.alice,
                "/api/v1/jobs",
                &job(&format!("commons-demo@{}", digest('1'))),
            )
            .await;
        assert_eq!((status, body["field"].as_str()), (422, Some("image")));
        let jobs = p.get_json(&p.alice, "/api/v1/jobs").await;
        assert_eq!(jobs.as_array().unwrap().len(), 0, "nothing stored");
        // The demo image is allowed (the harness does what `demo` does): the job keeps
        // the pin.
        let id = p.submit(&p.alice, job("commons-demo")).await;
        let j = p.job(&p.alice, id).await;
        assert_eq!(j["image"], "commons-demo:latest", "{j}");
        p.stop().await;
    }
}

per_backend! {
    async fn lab_entries_serve_their_lab_only_and_roles_decide_who_adds(backend: Backend) {
        let p = TestPortal::start(backend).await;
        let entry = |lab: Option<&str>, name: &str| {
            let mut e =
                json!({"name_tag": name, "digest": digest('a'), "description": "Vision's own"});
            if let Some(l) = lab {
                e["lab"] = json!(l);
            }
            e
        };
        // A member adds nothing; a lab admin only for their lab; campus entries are
        // operators'.
        for (who, body, want) in [
            (&p.alice, entry(Some("vision"), "vision-only:v1"), 403),
            (&p.alice, entry(None, "vision-only:v1"), 403),
            (&p.carol, entry(Some("physics"), "vision-only:v1"), 403),
            (&p.carol, entry(None, "vision-only:v1"), 403),
            (&p.carol, entry(Some("nowhere"), "vision-only:v1"), 404),
        ] {
            let (status, b) = p.post_json(who, "/api/v1/images", &body).await;
            assert_eq!(status, want, "[{backend:?}] {body} {b}");
        }
        for (body, field) in [
            (
                json!({"name_tag": "x:1", "digest": "sha256:nope", "lab": "vision"}),
                "digest",
            ),
            (
                json!({"name_tag": "Not An Image", "digest": digest('a')}),
                "name_tag",
            ),
            (
                json!({"name_tag": "x:1", "digest": digest('a'), "lab": "vision", "description": "a\nb"}),
                "description",
            ),
        ] {
            let (status, b) = p.post_json(&p.carol, "/api/v1/images", &body).await;
            assert_eq!((status, b["field"].as_str()), (422, Some(field)), "{b}");
        }
        let (status, added) = p
            .post_json(
                &p.carol,
                "/api/v1/images",
                &entry(Some("vision"), "vision-only:v1"),
            )
            .await;
        assert_eq!(status, 201, "{added}");
        assert_eq!(added["lab"], "vision");
        let (status, again) = p
            .post_json(
                &p.carol,
                "/api/v1/images",
                &entry(Some("vision"), "vision-only:v1"),
            )
            .await;
        assert_eq!(
            (status, again["error"].as_str()),
            (409, Some("already_allowed"))
        );
        let (status, _) = p
            .post_json(&p.olga, "/api/v1/images", &entry(None, "campus-wide:v2"))
            .await;
        assert_eq!(status, 201);

        // Vision's entry serves vision's jobs, not physics'.
        let (status, b) = p
            .post_json(&p.bob, "/api/v1/jobs", &job("vision-only:v1"))
            .await;
        assert_eq!((status, b["field"].as_str()), (422, Some("image")), "{b}");
        p.submit(&p.alice, job("vision-only:v1")).await;
        p.submit(&p.bob, job("campus-wide:v2")).await;
        let seen = |list: &Value| -> Vec<String> {
            list.as_array()
                .unwrap()
                .iter()
                .map(|e| e["name_tag"].as_str().unwrap().to_string())
                .collect()
        };
        let bobs = seen(&p.get_json(&p.bob, "/api/v1/images").await);
        assert!(
            !bobs.contains(&"vision-only:v1".to_string())
                && bobs.contains(&"campus-wide:v2".to_string()),
            "{bobs:?}"
        );

        // Removing: not the member, not another lab (not found), the lab's admin yes.
        let path = format!("/api/v1/images/{}", added["id"]);
        assert_eq!(delete(&p, &p.alice, &path).await, 403);
        assert_eq!(delete(&p, &p.bob, &path).await, 404);
        assert_eq!(delete(&p, &p.carol, &path).await, 204);
        assert_eq!(delete(&p, &p.carol, &path).await, 404);

        let db = p.portal.state.db.clone();
        let log = tokio::task::spawn_blocking(move || {
            db.run_blocking(|c| commons_portal::db::audit::list(c, None, 100))
                .unwrap()
        })
        .await
        .unwrap();
        let of = |action: &str| {
            log.iter()
                .filter(|e| e.action == action)
                .map(|e| (e.actor.clone(), e.target.clone()))
                .collect::<Vec<_>>()
        };
        assert!(of("allow_image").contains(&("carol".into(), "image vision-only:v1".into())));
        assert!(of("allow_image").contains(&("olga".into(), "image campus-wide:v2".into())));
        assert_eq!(
            of("remove_image"),
            vec![("carol".to_string(), "image vision-only:v1".to_string())]
        );
        p.stop().await;
    }
}

fn keygen(dir: &Path, name: &str) -> (std::path::PathBuf, String) {
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

fn sign(dir: &Path, key: &Path, image: &str, digest: &str) -> String {
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
async fn signatures_are_verified_when_added_and_required_by_labs() {
    let keys = tempfile::tempdir().unwrap();
    let (authority, public) = keygen(keys.path(), "campus-authority");
    let (rogue, _) = keygen(keys.path(), "rogue");
    for backend in BACKENDS {
        let pubkey = public.clone();
        let p = TestPortal::builder(backend)
            .config(move |c| {
                c.images.authority_keys = vec![pubkey];
            })
            .start()
            .await;
        let image = "signed-model:v1";
        let d = digest('b');
        let add = |sig: String| json!({"name_tag": image, "digest": d, "lab": "vision", "signature": sig});
        for (sig, why) in [
            (
                sign(keys.path(), &rogue, image, &d),
                "not signed by a trusted",
            ),
            (
                sign(keys.path(), &authority, image, &digest('c')),
                "does not match",
            ),
            (
                sign(keys.path(), &authority, "other:v1", &d),
                "does not match",
            ),
            ("not a signature".into(), "not an SSH signature"),
        ] {
            let (status, b) = p.post_json(&p.carol, "/api/v1/images", &add(sig)).await;
            assert_eq!(
                (status, b["field"].as_str()),
                (422, Some("signature")),
                "{b}"
            );
            assert!(b["message"].as_str().unwrap().contains(why), "{b}");
        }
        let (status, b) = p
            .post_json(
                &p.carol,
                "/api/v1/images",
                &add(sign(keys.path(), &authority, image, &d)),
            )
            .await;
        assert_eq!(status, 201, "[{backend:?}] {b}");
        assert!(
            b["signed_by"].as_str().unwrap().starts_with("SHA256:"),
            "{b}"
        );

        // Vision now runs signed images only: the (unsigned) demo entry no longer serves
        // its jobs, the signed one does; physics is unaffected.
        let (status, _) = p
            .put_json(
                &p.alice,
                "/api/v1/labs/vision/signed-images",
                &json!({"require_signed": true}),
            )
            .await;
        assert_eq!(status, 403);
        let (status, _) = p
            .put_json(
                &p.carol,
                "/api/v1/labs/vision/signed-images",
                &json!({"require_signed": true}),
            )
            .await;
        assert_eq!(status, 200);
        let (status, b) = p
            .post_json(&p.alice, "/api/v1/jobs", &job("commons-demo:latest"))
            .await;
        assert_eq!((status, b["field"].as_str()), (422, Some("image")), "{b}");
        assert!(b["message"]
            .as_str()
            .unwrap()
            .contains("signed images only"));
        p.submit(&p.alice, job(image)).await;
        p.submit(&p.bob, job("commons-demo:latest")).await;
        let (status, b) = p
            .post_json(
                &p.carol,
                "/api/v1/images",
                &json!({"name_tag": "unsigned:v1", "digest": d, "lab": "vision"}),
            )
            .await;
        assert_eq!(
            (status, b["field"].as_str()),
            (422, Some("signature")),
            "{b}"
        );
        p.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_job_form_offers_the_allowed_images_with_their_descriptions() {
    let p = TestPortal::start(crate::support::harness::Backend::Sqlite).await;
    let (status, _) = p
        .post_json(
            &p.carol,
            "/api/v1/images",
            &json!({"name_tag": "pytorch:2.5", "digest": digest('d'), "lab": "vision", "description": "PyTorch 2.5 with CUDA 12"}),
        )
        .await;
    assert_eq!(status, 201);
    let alice = BrowserSession::login(&p, "alice").await;
    let page = alice.fetch("/jobs/new").await.text().await.unwrap();
    assert!(page.contains(r#"list="allowed-images""#), "{page}");
    assert!(
        page.contains(
            r#"<option value="pytorch:2.5">PyTorch 2.5 with CUDA 12 · lab vision</option>"#
        ),
        "{page}"
    );
    assert!(page.contains(r#"<option value="commons-demo:latest">"#));
    let bob = BrowserSession::login(&p, "bob").await;
    let page = bob.fetch("/jobs/new").await.text().await.unwrap();
    assert!(
        !page.contains("pytorch:2.5"),
        "another lab's entry is not offered"
    );
    p.stop().await;
}

per_backend! {
    /// The console page manages the list as the API does: a lab admin adds and removes their
    /// lab's entries and sets "signed only"; a refused entry comes back beside its field with
    /// the form kept and nothing stored; a member sees the list with no form and is refused
    /// (403, nothing stored) when posting anyway.
    async fn the_console_page_manages_the_list_with_the_apis_rules(backend: Backend) {
        let p = TestPortal::start(backend).await;
        let carol = BrowserSession::login(&p, "carol").await;
        let page = carol.fetch("/images").await.text()
            .await
            .unwrap();
        assert!(page.contains("<code>commons-demo:latest</code>"), "{page}");
        assert!(
            page.contains(r#"<option value="vision">lab vision</option>"#),
            "{page}"
        );
        assert!(
            !page.contains("the whole campus"),
            "a lab admin adds no campus entries"
        );

        // A bad digest: 422, the error beside the digest field, the form as typed.
        let r = carol
            .post_form("/images", &[
                ("name_tag", "pytorch:2.5"),
                ("digest", "sha256:short"),
                ("lab", "vision"),
                ("description", "PyTorch 2.5"),
                ("signature", ""),
            ])
            .await;
        assert_eq!(r.status(), 422);
        let body = r.text().await.unwrap();
        assert!(body.contains(r#"id="digest-error""#), "{body}");
        assert!(
            body.contains(r#"value="pytorch:2.5""#),
            "the form is kept: {body}"
        );
        assert!(
            p.get_json(&p.carol, "/api/v1/images")
                .await
                .as_array()
                .unwrap()
                .len()
                == 1
        );

        let r = carol
            .post_form("/images", &[
                ("name_tag", "pytorch:2.5"),
                ("digest", &digest('e')),
                ("lab", "vision"),
                ("description", "PyTorch 2.5"),
                ("signature", ""),
            ])
            .await;
        assert_eq!(r.status(), 303);
        let list = p.get_json(&p.alice, "/api/v1/images").await;
        let entry = list
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name_tag"] == "pytorch:2.5")
            .cloned()
            .expect("added through the page");
        assert_eq!(entry["lab"], "vision");
        assert_eq!(entry["description"], "PyTorch 2.5");

        // A member sees it, with no form and no remove button, and is refused anyway.
        let alice = BrowserSession::login(&p, "alice").await;
        let page = alice.fetch("/images").await.text()
            .await
            .unwrap();
        assert!(page.contains("<code>pytorch:2.5</code>"), "{page}");
        assert!(
            !page.contains("Allow an image") && !page.contains(">Remove<"),
            "{page}"
        );
        let r = alice
            .post_form("/images", &[
                ("name_tag", "sneaky:1"),
                ("digest", &digest('f')),
                ("lab", "vision"),
            ])
            .await;
        assert_eq!(r.status(), 403);
        let remove = format!("/images/{}/remove", entry["id"]);
        let r = alice.post_form(&remove, &[]).await;
        assert_eq!(r.status(), 403);
        let names: Vec<String> = p
            .get_json(&p.olga, "/api/v1/images")
            .await
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["name_tag"].as_str().unwrap().to_string())
            .collect();
        assert!(
            names.contains(&"pytorch:2.5".into()) && !names.contains(&"sneaky:1".into()),
            "{names:?}"
        );

        // "Signed only" for vision, then the entry removed by its admin.
        let r = carol
            .post_form("/images/signed/vision", &[("require_signed", "on")])
            .await;
        assert_eq!(r.status(), 303);
        let (status, b) = p
            .post_json(&p.alice, "/api/v1/jobs", &job("pytorch:2.5"))
            .await;
        assert_eq!(
            (status, b["field"].as_str()),
            (422, Some("image")),
            "unsigned now refused: {b}"
        );
        let r = carol.post_form(&remove, &[]).await;
        assert_eq!(r.status(), 303);
        let page = carol.fetch("/images").await.text()
            .await
            .unwrap();
        assert!(
            !page.contains("<code>pytorch:2.5</code>") && page.contains("Accept unsigned entries"),
            "{page}"
        );
        // The operator may add campus entries from the page.
        let olga = BrowserSession::login(&p, "olga").await;
        let page = olga.fetch("/images").await.text()
            .await
            .unwrap();
        assert!(
            page.contains(r#"<option value="" selected>the whole campus</option>"#),
            "{page}"
        );
        p.stop().await;
    }
}
