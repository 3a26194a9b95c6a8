//! The lab admin console, personal access tokens and the audit log, over HTTP with the
//! development login.

use crate::support::harness::TestPortal;
use crate::support::session::BrowserSession;

per_backend! {
    async fn lab_admin_page_sets_lending_rules_and_quotas(backend: Backend) {
        let p = TestPortal::start(backend).await;
        let _agent = p.agent("vision", "fake:1xA100-80GB").await;
        let node = p.get_json(&p.alice, "/api/v1/nodes").await[0]["id"]
            .as_i64()
            .unwrap();
        let url = |path: &str| format!("{}{path}", p.url);

        for member in ["alice", "bob"] {
            let b = BrowserSession::login(&p, member).await;
            let r = b.fetch("/labs/vision/admin").await;
            assert_eq!(
                r.status(),
                403,
                "[{backend:?}] {member} is no admin of vision"
            );
        }
        let carol = BrowserSession::login(&p, "carol").await;
        let page = carol
            .get(url("/labs/vision/admin"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(
            page.contains("vision-server") && page.contains("alice"),
            "[{backend:?}]"
        );
        assert!(
            !page.contains("Save lab quota"),
            "lab quotas are for operators"
        );
        let lending = format!("/labs/vision/nodes/{node}/lending");

        let r = carol
            .post_form(&lending, &[
                ("mode", "nights"),
                ("max_lent_gpus", "-3"),
            ])
            .await;
        assert_eq!(r.status(), 422);
        assert!(
            r.text().await.unwrap().contains("max_lent_gpus"),
            "the field is named"
        );
        let r = carol
            .post_form_without_token(&lending, &[("mode", "never")])
            .await;
        assert_eq!(r.status(), 403, "no CSRF token, no change");
        assert_eq!(
            p.get_json(&p.alice, "/api/v1/nodes").await[0]["lending"]["mode"],
            "always"
        );

        let r = carol
            .post_form(&lending, &[
                ("mode", "nights_weekends"),
                ("max_lent_gpus", "1"),
                ("grace_seconds", "60"),
                ("borrowers", "physics"),
            ])
            .await;
        assert_eq!(r.status(), 303, "[{backend:?}] {}", r.text().await.unwrap());
        let n = &p.get_json(&p.alice, "/api/v1/nodes").await[0];
        assert_eq!(n["lending"]["mode"], "windows");
        assert_eq!(
            n["lending"]["windows"].as_array().unwrap().len(),
            9,
            "7 nights and 2 weekend days"
        );
        assert_eq!(n["lending"]["max_lent_gpus"], 1);
        assert_eq!(n["grace_s"], 60);
        assert_eq!(n["lending"]["borrowers"].as_array().unwrap().len(), 1);
        let page = carol
            .get(url("/labs/vision/admin"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(
            page.contains(r#"value="nights_weekends" selected"#),
            "the page shows what was saved"
        );

        let r = carol
            .post_form("/labs/vision/members/alice/quota", &[
                ("max_gpus", "2"),
                ("max_gpu_hours", "100"),
                ("max_job_minutes", ""),
            ])
            .await;
        assert_eq!(r.status(), 303);
        let page = carol
            .get(url("/labs/vision/admin"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(
            page.contains(r#"name="max_gpu_hours:alice" value="100""#),
            "[{backend:?}] saved member quota shown"
        );

        // A new server: the console makes a one-time enrolment token, shown once.
        let r = carol
            .post_form("/labs/vision/enrol-token", &[])
            .await;
        assert_eq!(r.status(), 200);
        let page = r.text().await.unwrap();
        let at = page
            .find("id=\"enrol-token\">")
            .expect("the token is shown")
            + "id=\"enrol-token\">".len();
        let token = page[at..].split('<').next().unwrap().to_string();
        assert!(
            page.contains("commons-agent run --portal"),
            "with the command that uses it"
        );
        let r = p
            .http
            .post(url("/api/agent/v1/enrol"))
            .json(&serde_json::json!({"token": token, "hostname": "new-server", "agent_version": "0"}))
            .send()
            .await
            .unwrap();
        assert_eq!(
            r.status(),
            201,
            "[{backend:?}] the console's token enrols a server"
        );
        let alice = BrowserSession::login(&p, "alice").await;
        let r = alice
            .post_form("/labs/vision/enrol-token", &[])
            .await;
        assert_eq!(r.status(), 403, "a member makes no enrolment tokens");

        let olga = BrowserSession::login(&p, "olga").await;
        let page = olga
            .get(url("/labs/physics/admin"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(page.contains("Save lab quota"), "operators edit lab quotas");
        let r = olga
            .post_form("/labs/physics/quota", &[("max_gpus", "4")])
            .await;
        assert_eq!(r.status(), 303);
        p.stop().await;
    }
}

per_backend! {
    async fn tokens_members_and_the_audit_log(backend: Backend) {
        let p = TestPortal::start(backend).await;
        let url = |path: &str| format!("{}{path}", p.url);

        // A personal access token: made in the browser, shown once, works, revoked.
        let alice = BrowserSession::login(&p, "alice").await;
        let r = alice
            .post_form("/tokens", &[
                ("name", ""),
                ("expires_days", "30"),
            ])
            .await;
        assert_eq!(r.status(), 422, "a token needs a name");
        let r = alice
            .post_form("/tokens", &[
                ("name", "laptop"),
                ("expires_days", "30"),
            ])
            .await;
        assert_eq!(r.status(), 200);
        let page = r.text().await.unwrap();
        let at = page
            .find("id=\"new-token\">")
            .expect("the new token is shown")
            + "id=\"new-token\">".len();
        let token = page[at..].split('<').next().unwrap().to_string();
        assert!(token.starts_with("gcp_"));
        assert_eq!(
            p.get_json(&token, "/api/v1/jobs").await,
            serde_json::json!([])
        );
        let listing = alice
            .get(url("/tokens"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(!listing.contains(&token), "[{backend:?}] shown once only");
        assert!(listing.contains("laptop"));
        let id: i64 = {
            let at = listing.find("/tokens/").unwrap() + "/tokens/".len();
            listing[at..].split('/').next().unwrap().parse().unwrap()
        };
        let r = alice
            .post_form(&format!("/tokens/{id}/revoke"), &[])
            .await;
        assert_eq!(r.status(), 303);
        let r = p
            .http
            .get(url("/api/v1/jobs"))
            .bearer_auth(&token)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401, "[{backend:?}] a revoked token is refused");
        let bob = BrowserSession::login(&p, "bob").await;
        let r = bob
            .post_form(&format!("/tokens/{id}/revoke"), &[])
            .await;
        assert_eq!(r.status(), 404, "nobody revokes another's token");

        // A lab admin adds a member by e-mail, makes them admin, sets a quota; all audited.
        let carol = BrowserSession::login(&p, "carol").await;
        let r = carol
            .post_form("/labs/vision/members", &[
                ("member", "nobody@campus.test"),
                ("role", "member"),
            ])
            .await;
        assert_eq!(r.status(), 422);
        let r = carol
            .post_form("/labs/vision/members", &[
                ("member", "bob@campus.test"),
                ("role", "member"),
            ])
            .await;
        assert_eq!(r.status(), 303);
        let r = carol
            .post_form("/labs/vision/members", &[
                ("member", "bob"),
                ("role", "admin"),
            ])
            .await;
        assert_eq!(r.status(), 303);
        let r = carol
            .post_form("/labs/vision/members/alice/quota", &[("max_gpus", "3")])
            .await;
        assert_eq!(r.status(), 303);
        let r = bob.get(url("/labs/vision/admin")).send().await.unwrap();
        assert_eq!(
            r.status(),
            200,
            "[{backend:?}] bob is an admin of vision now"
        );
        let page = r.text().await.unwrap();
        for action in ["set_member", "set_member_quota"] {
            assert!(
                page.contains(action),
                "[{backend:?}] the audit log shows {action}"
            );
        }
        let audit = &page[page.find("id=\"audit\"").expect("an audit table")..];
        assert!(
            audit.contains("max_gpus&#34;:3"),
            "[{backend:?}] the value after is shown: {audit}"
        );
        let r = carol
            .post_form("/labs/vision/members/bob/remove", &[])
            .await;
        assert_eq!(r.status(), 303);
        assert_eq!(
            bob.get(url("/labs/vision/admin"))
                .send()
                .await
                .unwrap()
                .status(),
            403
        );

        // Operators read the whole log; others may not.
        assert_eq!(alice.get(url("/audit")).send().await.unwrap().status(), 403);
        let olga = BrowserSession::login(&p, "olga").await;
        let all = olga
            .get(url("/audit"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(
            all.contains("remove_member") && all.contains("carol"),
            "[{backend:?}]"
        );
        p.stop().await;
    }
}
