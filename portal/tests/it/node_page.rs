//! The owner's controls on a node's page (drain, lending rule, reclaim, revoke), posted as
//! HTML forms with the development login: a lab admin can use each, with its audit entry;
//! a member, another lab's admin, or a form without its CSRF token changes nothing. A
//! node reporting GPUs it did not enrol with takes no guests until its lab admin approves.

use crate::support::harness::TestPortal;
use crate::support::session::BrowserSession;
use commons_portal::db::models::Role;
use commons_portal::db::{audit, users};
use serde_json::Value;

/// The node as `/api/v1/nodes` shows it, or `None` once it is gone.
async fn node(p: &TestPortal, id: i64) -> Option<Value> {
    let all = p.get_json(&p.olga, "/api/v1/nodes").await;
    all.as_array()
        .unwrap()
        .iter()
        .find(|n| n["id"].as_i64() == Some(id))
        .cloned()
}

/// What the controls change, to compare before and after a refused post.
fn settings(n: &Value) -> (Value, Value, Value) {
    (
        n["draining"].clone(),
        n["reclaim"].clone(),
        n["lending"].clone(),
    )
}

/// (actor, action, after) of the vision lab's audit entries about nodes.
async fn node_audit(p: &TestPortal) -> Vec<(String, String, String)> {
    let db = p.portal.state.db.clone();
    db.run(|c| {
        let lab = users::find_lab(c, "vision")?.unwrap();
        audit::list(c, Some(lab.id), 100)
    })
    .await
    .unwrap()
    .into_iter()
    .filter(|e| e.target.starts_with("node "))
    .map(|e| (e.actor, e.action, e.after))
    .collect()
}

per_backend! {
    async fn lab_admins_use_the_owner_controls_on_the_node_page_and_no_one_else(backend: Backend) {
        let p = TestPortal::start(backend).await;
        let _agent = p.agent("vision", "fake:1xA100-80GB").await;
        let id = p.get_json(&p.alice, "/api/v1/nodes").await[0]["id"]
            .as_i64()
            .unwrap();
        // dave administers another lab.
        let db = p.portal.state.db.clone();
        db.run(|c| {
            let physics = users::find_lab(c, "physics")?.unwrap();
            let d = users::create_user(c, "dave", "dave@campus.test", false)?;
            users::set_membership(c, d.id, physics.id, Role::Admin)
        })
        .await
        .unwrap();
        let page = format!("/nodes/{id}");
        let action_path = |action: &str| format!("/nodes/{id}/{action}");
        let posts: [(&str, &[(&str, &str)]); 6] = [
            ("drain", &[]),
            ("undrain", &[]),
            ("lend", &[("mode", "never")]),
            ("reclaim", &[("on", "on")]),
            ("reclaim", &[("on", "off")]),
            ("revoke", &[]),
        ];
        let before = settings(&node(&p, id).await.unwrap());

        // Members and another lab's admin see the page, without controls, and every post
        // is refused with nothing changed.
        for who in ["alice", "bob", "dave"] {
            let b = BrowserSession::login(&p, who).await;
            let r = b.fetch(&page).await;
            assert_eq!(r.status(), 200, "[{backend:?}] {who} sees the node");
            let html = r.text().await.unwrap();
            assert!(html.contains("vision-server"), "[{backend:?}]");
            assert!(
                !html.contains("Owner controls"),
                "[{backend:?}] {who} gets no controls"
            );
            for (action, fields) in posts {
                let r = b.post_form(&action_path(action), fields).await;
                assert_eq!(r.status(), 403, "[{backend:?}] {who} may not {action}");
            }
        }
        assert_eq!(
            settings(&node(&p, id).await.expect("not revoked")),
            before,
            "[{backend:?}] nothing changed"
        );
        assert!(node_audit(&p).await.is_empty(), "[{backend:?}]");

        let carol = BrowserSession::login(&p, "carol").await;
        let html = carol.fetch(&page).await.text().await.unwrap();
        assert!(html.contains("Owner controls"), "[{backend:?}]");
        let post = |action: &str, fields: &'static [(&'static str, &'static str)]| {
            let path = action_path(action);
            let carol = &carol;
            async move { carol.post_form(&path, fields).await }
        };

        // Without its CSRF token a form does nothing, even from the lab's admin.
        let r = carol
            .post_form_without_token(&action_path("drain"), &[])
            .await;
        assert_eq!(r.status(), 403, "[{backend:?}] no CSRF token");
        assert_eq!(node(&p, id).await.unwrap()["draining"], false);

        let r = post("drain", &[]).await;
        assert_eq!(r.status(), 303, "[{backend:?}] drain");
        assert_eq!(node(&p, id).await.unwrap()["draining"], true);
        let html = carol.fetch(&page).await.text().await.unwrap();
        assert!(
            html.contains("drained") && html.contains("id=\"undrain\""),
            "[{backend:?}]"
        );
        let r = post("undrain", &[]).await;
        assert_eq!(r.status(), 303, "[{backend:?}] undrain");
        assert_eq!(node(&p, id).await.unwrap()["draining"], false);

        // The lending rule, in the agent's window grammar; bad input names its field.
        let r = post("lend", &[("mode", "windows"), ("windows", "someday 9-5")])
            .await;
        assert_eq!(r.status(), 422, "[{backend:?}]");
        assert!(r.text().await.unwrap().contains("windows"), "[{backend:?}]");
        let r = post("lend", &[("mode", "sometimes")]).await;
        assert_eq!(r.status(), 422, "[{backend:?}]");
        assert!(r.text().await.unwrap().contains("mode"), "[{backend:?}]");
        assert_eq!(node(&p, id).await.unwrap()["lending"]["mode"], "always");
        let r = post(
            "lend",
            &[
                ("mode", "windows"),
                ("windows", "mon-fri 19:00-07:00\r\nsat,sun 00:00-24:00\r\n"),
            ],
        )
        .await;
        assert_eq!(r.status(), 303, "[{backend:?}] lend windows");
        let n = node(&p, id).await.unwrap();
        assert_eq!(n["lending"]["mode"], "windows");
        assert_eq!(n["lending"]["windows"].as_array().unwrap().len(), 7);
        let html = carol.fetch(&page).await.text().await.unwrap();
        assert!(
            html.contains("mon 19:00-07:00") && html.contains("sun 00:00-24:00"),
            "[{backend:?}] the form shows the windows it set"
        );
        let r = post("lend", &[("mode", "always")]).await;
        assert_eq!(r.status(), 303, "[{backend:?}] lend always");

        let r = post("reclaim", &[("on", "maybe")]).await;
        assert_eq!(r.status(), 422, "[{backend:?}]");
        let r = post("reclaim", &[("on", "on")]).await;
        assert_eq!(r.status(), 303, "[{backend:?}] reclaim");
        assert_eq!(node(&p, id).await.unwrap()["reclaim"], true);
        let html = carol.fetch(&page).await.text().await.unwrap();
        assert!(html.contains("reclaimed"), "[{backend:?}]");
        let r = post("reclaim", &[("on", "off")]).await;
        assert_eq!(r.status(), 303, "[{backend:?}] reclaim off");
        assert_eq!(node(&p, id).await.unwrap()["reclaim"], false);

        let r = post("revoke", &[]).await;
        assert_eq!(r.status(), 303, "[{backend:?}] revoke");
        assert_eq!(r.headers()["location"], "/nodes");
        assert!(
            node(&p, id).await.is_none(),
            "[{backend:?}] the node is gone"
        );
        assert_eq!(carol.fetch(&page).await.status(), 404);
        assert_eq!(post("drain", &[]).await.status(), 404);

        let mut entries = node_audit(&p).await;
        entries.reverse();
        let want: Vec<(String, String, String)> = [
            ("drain", "true"),
            ("undrain", "false"),
            ("set_lending", "windows (7 weekly)"),
            ("set_lending", "always"),
            ("reclaim", "true"),
            ("reclaim", "false"),
            ("revoke_node", "revoked"),
        ]
        .iter()
        .map(|(a, after)| ("carol".to_string(), a.to_string(), after.to_string()))
        .collect();
        assert_eq!(
            entries, want,
            "[{backend:?}] each change audited as carol's"
        );
    }
}

per_backend! {
    /// The node's page and the API for a server that comes back with more GPUs than it
    /// enrolled with: no guest is placed there (the owner lab's jobs run) until its lab admin
    /// approves them, with the form on the page (CSRF, audited) or the API; a member may not.
    async fn gpus_a_node_did_not_enrol_with_wait_for_its_lab_admin_before_guests_get_them(backend: Backend) {
        let p = TestPortal::start(backend).await;
        let mut agent = p.agent("vision", "fake:1xA100-80GB").await;
        let id = p.get_json(&p.alice, "/api/v1/nodes").await[0]["id"]
            .as_i64()
            .unwrap();
        let n = node(&p, id).await.unwrap();
        assert_eq!(n["approved_gpus"], serde_json::json!({"A100-80GB": 1}));
        assert_eq!(
            n["inventory_unapproved"], false,
            "[{backend:?}] its baseline"
        );
        // The agent comes back claiming three GPUs, one of another model.
        agent.restart("fake:2xA100-80GB,1xH100-80GB").await;
        p.wait_online("vision", 3).await;

        // bob's job (physics: a guest here) waits, and says why; alice's (vision) runs.
        let job = |gpus: u32| {
            serde_json::json!({"image": "commons-demo:latest", "command": ["sh", "-c", "sleep 600"],
                               "gpus": gpus, "time_limit_minutes": 30})
        };
        let guest = p.submit(&p.bob, job(2)).await;
        let me = &p;
        crate::support::harness::wait_for(
            std::time::Duration::from_secs(30),
            "the guest's reason",
            || async move {
                let j = me.job(&me.bob, guest).await;
                assert!(
                    j["state"] == "queued",
                    "[{backend:?}] the guest was placed on GPUs nobody approved: {j}"
                );
                j["reason"]
                    .as_str()
                    .is_some_and(|r| r.contains("has not approved yet"))
            },
        )
        .await;
        let n = node(&p, id).await.unwrap();
        assert_eq!(n["inventory_unapproved"], true, "[{backend:?}] {n}");
        assert_eq!(n["approved_gpus"], serde_json::json!({"A100-80GB": 1}));
        let owners = p.submit(&p.alice, job(1)).await;
        p.wait_state(
            &p.alice,
            owners,
            &["running"],
            std::time::Duration::from_secs(30),
        )
        .await;
        assert_eq!(p.job(&p.bob, guest).await["state"], "queued");

        // A member may not approve; the lab admin does it on the page.
        let (status, _) = p
            .post_json(
                &p.alice,
                &format!("/api/v1/nodes/{id}/inventory/approve"),
                &serde_json::json!({}),
            )
            .await;
        assert_eq!(status, 403, "[{backend:?}]");
        let carol = BrowserSession::login(&p, "carol").await;
        let html = carol.fetch(&format!("/nodes/{id}")).await.text().await.unwrap();
        assert!(
            html.contains("id=\"inventory-unapproved\"")
                && html.contains("2 × A100-80GB, 1 × H100-80GB")
                && html.contains("id=\"approve-inventory\""),
            "[{backend:?}] {html}"
        );
        let approve = format!("/nodes/{id}/approve-inventory");
        let r = carol.post_form_without_token(&approve, &[]).await;
        assert_eq!(r.status(), 403, "[{backend:?}] no CSRF token");
        assert_eq!(node(&p, id).await.unwrap()["inventory_unapproved"], true);
        let r = carol.post_form(&approve, &[]).await;
        assert_eq!(r.status(), 303, "[{backend:?}]");
        let n = node(&p, id).await.unwrap();
        assert_eq!(n["inventory_unapproved"], false, "[{backend:?}]");
        assert_eq!(
            n["approved_gpus"],
            serde_json::json!({"A100-80GB": 2, "H100-80GB": 1})
        );
        assert_eq!(
            node_audit(&p).await,
            [(
                "carol".to_string(),
                "approve_inventory".to_string(),
                "2 × A100-80GB, 1 × H100-80GB".to_string()
            )],
            "[{backend:?}]"
        );
        p.wait_state(
            &p.bob,
            guest,
            &["running"],
            std::time::Duration::from_secs(30),
        )
        .await;
        // The API call does the same (already approved: the same baseline again).
        let (status, v) = p
            .post_json(
                &p.carol,
                &format!("/api/v1/nodes/{id}/inventory/approve"),
                &serde_json::json!({}),
            )
            .await;
        assert_eq!(status, 200, "[{backend:?}] {v}");
        assert_eq!(v["inventory_unapproved"], false);
        drop(agent);
        p.stop().await;
    }
}
