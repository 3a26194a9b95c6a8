//! Users' SSH public keys over the API and the web page, on both backends, with keys
//! made by OpenSSH's `ssh-keygen`; and the two calls the SSH gateway makes.

use crate::support::harness::{TestPortal, BACKENDS};
use crate::support::session::BrowserSession;
use commons_portal::db::ssh_keys;
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;

/// Makes a key pair with `ssh-keygen`; returns (public line, private key file).
pub(crate) fn keygen(dir: &Path, file: &str, args: &[&str]) -> (String, String) {
    let path = dir.join(file);
    let out = Command::new("ssh-keygen")
        .args(["-q", "-N", "", "-f"])
        .arg(&path)
        .args(args)
        .output()
        .expect("ssh-keygen is needed for these tests: apt-get install openssh-client");
    assert!(out.status.success(), "ssh-keygen {args:?}: {out:?}");
    (
        std::fs::read_to_string(path.with_extension("pub")).unwrap(),
        std::fs::read_to_string(&path).unwrap(),
    )
}

async fn delete(p: &TestPortal, token: &str, id: i64) -> u16 {
    p.http
        .delete(format!("{}/api/v1/ssh-keys/{id}", p.url))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

fn ids(list: &Value) -> Vec<i64> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|k| k["id"].as_i64().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ssh_keys_over_the_api() {
    let dir = tempfile::tempdir().unwrap();
    let (ed, ed_private) = keygen(dir.path(), "ed", &["-t", "ed25519", "-C", "alice@laptop"]);
    let (ec, _) = keygen(dir.path(), "ec", &["-t", "ecdsa", "-C", "alice@desk"]);
    let (rsa, _) = keygen(dir.path(), "rsa", &["-t", "rsa", "-b", "2048"]);
    let (rsa1024, _) = keygen(dir.path(), "rsa1024", &["-t", "rsa", "-b", "1024"]);
    for backend in BACKENDS {
        let p = TestPortal::start(backend).await;
        let path = "/api/v1/ssh-keys";
        assert_eq!(p.get_json(&p.alice, path).await, json!([]));

        let (status, k) = p
            .post_json(
                &p.alice,
                path,
                &json!({"public_key": ed, "name": "  laptop "}),
            )
            .await;
        assert_eq!(status, 201, "[{backend:?}] {k}");
        assert_eq!(k["name"], "laptop");
        assert_eq!(k["algorithm"], "ssh-ed25519");
        assert!(k["fingerprint"].as_str().unwrap().starts_with("SHA256:"));
        assert_eq!(k["public_key"], ed.trim());
        assert!(k["created_at"].is_string() && k["last_used_at"].is_null());
        assert!(k.get("user_id").is_none(), "{k}");
        let ed_id = k["id"].as_i64().unwrap();
        let (status, k) = p
            .post_json(&p.alice, path, &json!({"public_key": ec}))
            .await;
        assert_eq!(status, 201, "{k}");
        assert_eq!(k["name"], "alice@desk", "the comment names it");
        assert_eq!(k["algorithm"], "ecdsa-sha2-nistp256");
        let (status, k) = p
            .post_json(&p.alice, path, &json!({"public_key": rsa}))
            .await;
        assert_eq!((status, k["algorithm"].as_str()), (201, Some("ssh-rsa")));

        // Refusals: status, code and field; nothing is stored.
        let long = "n".repeat(101);
        for (body, code, field) in [
            (
                json!({"public_key": rsa1024}),
                "rsa_key_too_short",
                "public_key",
            ),
            (
                json!({"public_key": ed_private}),
                "private_key",
                "public_key",
            ),
            (
                json!({"public_key": "ssh-rsa hello"}),
                "not_a_public_key",
                "public_key",
            ),
            (json!({"public_key": "  "}), "key_missing", "public_key"),
            (json!({"name": "x"}), "invalid_input", "public_key"),
            (
                json!({"public_key": ed, "colour": 1}),
                "invalid_input",
                "colour",
            ),
            (
                json!({"public_key": ec, "name": long}),
                "name_too_long",
                "name",
            ),
            (json!({"public_key": ed}), "duplicate_key", "public_key"),
        ] {
            let (status, e) = p.post_json(&p.alice, path, &body).await;
            assert_eq!(status, 422, "[{backend:?}] {body}: {e}");
            assert_eq!(
                (e["error"].as_str(), e["field"].as_str()),
                (Some(code), Some(field)),
                "{e}"
            );
            assert!(e["message"].is_string());
        }
        let (_, e) = p
            .post_json(&p.alice, path, &json!({"public_key": rsa1024}))
            .await;
        assert!(e["message"].as_str().unwrap().contains("1024 bits"), "{e}");
        let (_, e) = p
            .post_json(&p.alice, path, &json!({"public_key": ed_private}))
            .await;
        assert!(
            e["message"]
                .as_str()
                .unwrap()
                .contains("never paste a private key"),
            "{e}"
        );

        // Someone else's key is "already registered", in the very same words.
        let (_, mine) = p
            .post_json(&p.alice, path, &json!({"public_key": ed}))
            .await;
        let with_other_comment = format!("{} bob@elsewhere", ed.rsplit_once(' ').unwrap().0);
        let (status, theirs) = p
            .post_json(&p.bob, path, &json!({"public_key": with_other_comment}))
            .await;
        assert_eq!(status, 422);
        assert_eq!(theirs, mine, "the answer tells nothing about who holds it");
        assert_eq!(p.get_json(&p.bob, path).await, json!([]));

        let list = p.get_json(&p.alice, path).await;
        assert_eq!(list.as_array().unwrap().len(), 3, "{list}");
        assert_eq!(ids(&list)[0], ed_id, "oldest first");

        // The gateway's calls: the owner's keys, and the time a key was used.
        let db = p.portal.state.db.clone();
        let alice_id = list[0]["id"].as_i64().unwrap();
        let stored = db
            .run(move |c| {
                let uid = commons_portal::db::users::user_by_name(c, "alice")?
                    .unwrap()
                    .id;
                ssh_keys::touch(c, alice_id)?;
                ssh_keys::keys_of_user(c, uid)
            })
            .await
            .unwrap();
        assert_eq!(stored.len(), 3);
        assert_eq!(stored[0].public_key, ed.trim());
        assert_eq!(stored[0].fingerprint, list[0]["fingerprint"]);
        let list = p.get_json(&p.alice, path).await;
        assert!(list[0]["last_used_at"].is_string(), "{list}");

        // Only the owner removes a key: others (an operator too) get 404.
        assert_eq!(delete(&p, &p.bob, ed_id).await, 404);
        assert_eq!(delete(&p, &p.olga, ed_id).await, 404);
        assert_eq!(delete(&p, &p.alice, ed_id + 1000).await, 404);
        assert_eq!(
            p.get_json(&p.alice, path).await.as_array().unwrap().len(),
            3
        );
        assert_eq!(delete(&p, &p.alice, ed_id).await, 204, "[{backend:?}]");
        assert_eq!(delete(&p, &p.alice, ed_id).await, 404);
        assert!(!ids(&p.get_json(&p.alice, path).await).contains(&ed_id));
        // A removed key is free again.
        let (status, _) = p.post_json(&p.bob, path, &json!({"public_key": ed})).await;
        assert_eq!(status, 201);

        let r = p.http.get(format!("{}{path}", p.url)).send().await.unwrap();
        assert_eq!(r.status(), 401, "no token, no keys");
        let audit = db
            .run(|c| commons_portal::db::audit::list(c, None, 100))
            .await
            .unwrap();
        // (The harness allows the demo image first: that entry is not this test's.)
        let actions: Vec<_> = audit
            .iter()
            .filter(|e| e.action != "allow_image")
            .map(|e| (e.actor.as_str(), e.action.as_str()))
            .collect();
        assert_eq!(
            actions,
            [
                ("bob", "add_ssh_key"),
                ("alice", "remove_ssh_key"),
                ("alice", "add_ssh_key"),
                ("alice", "add_ssh_key"),
                ("alice", "add_ssh_key"),
            ],
            "[{backend:?}]"
        );
        p.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ssh_keys_page_adds_refuses_and_removes() {
    let dir = tempfile::tempdir().unwrap();
    let (ed, _) = keygen(dir.path(), "ed", &["-t", "ed25519", "-C", "alice@laptop"]);
    let (rsa1024, _) = keygen(dir.path(), "rsa1024", &["-t", "rsa", "-b", "1024"]);
    let (_, private) = keygen(dir.path(), "other", &["-t", "ed25519"]);
    for backend in BACKENDS {
        let p = TestPortal::start(backend).await;
        let alice = BrowserSession::login(&p, "alice").await;
        let page = alice.fetch("/jobs").await.text().await.unwrap();
        assert!(
            page.contains("href=\"/ssh-keys\""),
            "linked in the navigation"
        );
        let page = alice.fetch("/ssh-keys").await.text().await.unwrap();
        assert!(page.contains("No keys yet"), "{page}");

        let r = alice
            .post_form_without_token("/ssh-keys", &[("public_key", ed.as_str()), ("name", "")])
            .await;
        assert_eq!(r.status(), 403, "no CSRF token, no key");

        // Refused: the error beside the field, and what was typed is kept.
        let r = alice
            .post_form(
                "/ssh-keys",
                &[("public_key", &rsa1024), ("name", "old box")],
            )
            .await;
        assert_eq!(r.status(), 422, "[{backend:?}]");
        let page = r.text().await.unwrap();
        let err = page
            .find("id=\"public_key-error\">")
            .expect("the error is shown");
        assert!(page[err..].starts_with("id=\"public_key-error\">this RSA key has 1024 bits"));
        let base64 = rsa1024.split_whitespace().nth(1).unwrap();
        let pasted = page.find(base64);
        assert!(
            pasted.is_some_and(|at| at < err),
            "the pasted key is kept: {page}"
        );
        assert!(page.contains("value=\"old box\""), "the name is kept");
        let long = "n".repeat(101);
        let r = alice
            .post_form("/ssh-keys", &[("public_key", &ed), ("name", &long)])
            .await;
        assert_eq!(r.status(), 422);
        assert!(r
            .text()
            .await
            .unwrap()
            .contains("id=\"name-error\">the name has 101"));
        // A private key pasted by mistake: warned, and not sent back into the page.
        let r = alice
            .post_form("/ssh-keys", &[("public_key", &private), ("name", "")])
            .await;
        assert_eq!(r.status(), 422);
        assert_eq!(r.headers()["cache-control"], "no-store");
        let page = r.text().await.unwrap();
        assert!(page.contains("never paste a private key"));
        let secret = private.lines().filter(|l| !l.starts_with("-----"));
        let chunks: Vec<&str> = secret
            .flat_map(|l| l.split(|c: char| !c.is_ascii_alphanumeric()))
            .filter(|w| w.len() >= 12)
            .collect();
        assert!(!chunks.is_empty());
        for chunk in chunks {
            assert!(
                !page.contains(chunk),
                "the private key is not echoed: {chunk}"
            );
        }
        assert_eq!(p.get_json(&p.alice, "/api/v1/ssh-keys").await, json!([]));

        let r = alice
            .post_form("/ssh-keys", &[("public_key", &ed), ("name", "")])
            .await;
        assert_eq!(r.status(), 303, "[{backend:?}] {}", r.text().await.unwrap());
        assert_eq!(r.headers()["location"], "/ssh-keys");
        let keys = p.get_json(&p.alice, "/api/v1/ssh-keys").await;
        let fingerprint = keys[0]["fingerprint"].as_str().unwrap().to_string();
        let id = keys[0]["id"].as_i64().unwrap();
        let page = alice.fetch("/ssh-keys").await.text().await.unwrap();
        assert!(page.contains("alice@laptop") && page.contains("ssh-ed25519"));
        assert!(page.contains(
            fingerprint
                .trim_start_matches("SHA256:")
                .split('/')
                .next()
                .unwrap()
        ));
        let remove = format!("/ssh-keys/{id}/remove");
        assert!(page.contains(&remove));

        // Bob cannot remove it; Alice can.
        let bob = BrowserSession::login(&p, "bob").await;
        let r = bob.post_form(&remove, &[]).await;
        assert_eq!(r.status(), 404);
        let r = alice.post_form_with_token(&remove, "", &[]).await;
        assert_eq!(r.status(), 403, "removing needs the CSRF token too");
        let r = alice.post_form(&remove, &[]).await;
        assert_eq!(r.status(), 303);
        assert!(alice.page("/ssh-keys").await.contains("No keys yet"));
        assert_eq!(p.get_json(&p.alice, "/api/v1/ssh-keys").await, json!([]));
        p.stop().await;
    }
}
