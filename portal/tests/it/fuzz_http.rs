//! The API and the SSO callback under damaged input, against the real portal on both
//! backends: never a 5xx, and nothing stored for a refused request. Inputs come from
//! `fuzzkit` (valid requests damaged at random); `COMMONS_FUZZ_CASES` sets the budget.

use crate::support::fuzzkit::{budget, damaged, report, samples};
use crate::support::harness::{Backend, TestPortal, BACKENDS};
use serde_json::{json, Value};

/// Sends each body; asserts no 5xx; returns how many were accepted (2xx).
async fn hammer(p: &TestPortal, token: &str, method: &str, path: &str, bodies: &[Value]) -> usize {
    let mut accepted = 0;
    for body in bodies {
        let req = match method {
            "PUT" => p.http.put(format!("{}{path}", p.url)),
            _ => p.http.post(format!("{}{path}", p.url)),
        };
        let r = req.bearer_auth(token).json(body).send().await.unwrap();
        let status = r.status().as_u16();
        let text = r.text().await.unwrap_or_default();
        assert!(status < 500, "{method} {path} {body} -> {status} {text}");
        if status < 300 {
            accepted += 1;
        } else {
            let err: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
            assert!(
                err["error"].is_string() && err["message"].is_string(),
                "{method} {path} {body} -> {status}: not the API's error shape: {text}"
            );
        }
    }
    accepted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_api_requests_get_4xx_and_store_nothing() {
    let n = budget(150);
    for backend in BACKENDS {
        let p = TestPortal::start(backend).await;
        // Jobs: what is refused is not stored; what is accepted is cancelled at once, so
        // nothing runs when the agent comes.
        let jobs = samples(
            damaged(vec![
                json!({"image": "commons-demo:latest", "command": ["sh", "-c", "exit 0"],
                                "gpus": 1, "time_limit_minutes": 5, "lab": "vision"}),
                json!({"image": "commons-demo:latest", "gpus": 1, "time_limit_minutes": 5,
                       "inputs": ["data/train.tar", "code/", "lab:vision/shared/x.bin"]}),
                json!({"image": "commons-demo:latest", "gpus": 1, "time_limit_minutes": 5,
                       "datasets": [{"lab": "vision", "name": "imagenet", "mount": "/data/in"}]}),
            ]),
            n,
        );
        let accepted = hammer(&p, &p.alice, "POST", "/api/v1/jobs", &jobs).await;
        let listed = p.get_json(&p.alice, "/api/v1/jobs").await;
        let listed = listed.as_array().unwrap();
        assert_eq!(
            listed.len(),
            accepted,
            "{backend:?}: only accepted jobs are stored"
        );
        for j in listed {
            let id = j["id"].as_i64().unwrap();
            p.post_json(&p.alice, &format!("/api/v1/jobs/{id}/cancel"), &json!({}))
                .await;
        }

        let dir = tempfile::tempdir().unwrap();
        let (public, _) = crate::ssh_keys::keygen(dir.path(), "k", &["-t", "ed25519"]);
        let keys = samples(
            damaged(vec![json!({"public_key": public, "name": "laptop"})]),
            n,
        );
        let accepted = hammer(&p, &p.alice, "POST", "/api/v1/ssh-keys", &keys).await;
        let listed = p.get_json(&p.alice, "/api/v1/ssh-keys").await;
        assert_eq!(
            listed.as_array().unwrap().len(),
            accepted,
            "{backend:?}: keys"
        );

        // Dataset registrations: only what was accepted is listed.
        let sets = samples(
            damaged(vec![
                json!({"name": "imagenet", "source": "node:imagenet", "description": "d",
                       "visibility": ["physics"]}),
                json!({"name": "coco", "source": format!("https://h/c.tar.gz#sha256={}", "a".repeat(64)),
                       "visibility": "campus"}),
            ]),
            n,
        );
        let accepted = hammer(&p, &p.carol, "POST", "/api/v1/labs/vision/datasets", &sets).await;
        let listed = p.get_json(&p.carol, "/api/v1/labs/vision/datasets").await;
        assert_eq!(
            listed.as_array().unwrap().len(),
            accepted,
            "{backend:?}: datasets"
        );

        // Uploads in parts: only what was accepted is listed to resume.
        let starts = samples(
            damaged(vec![
                json!({"path": "data/x.bin", "size": 1000, "sha256": "b".repeat(64)}),
                json!({"path": "lab:vision/shared/y.bin", "size": 20_000_000}),
            ]),
            n,
        );
        let accepted = hammer(&p, &p.carol, "POST", "/api/v1/uploads", &starts).await;
        let listed = p.get_json(&p.carol, "/api/v1/uploads").await;
        assert_eq!(
            listed.as_array().unwrap().len(),
            accepted,
            "{backend:?}: uploads"
        );

        let quotas = samples(
            damaged(vec![
                json!({"max_gpus": 4, "max_gpu_hours": 100.0, "max_time_limit_minutes": 600}),
            ]),
            n,
        );
        hammer(&p, &p.olga, "PUT", "/api/v1/labs/vision/quota", &quotas).await;
        hammer(
            &p,
            &p.carol,
            "PUT",
            "/api/v1/labs/vision/members/alice/quota",
            &quotas,
        )
        .await;

        let _agent = p.agent("vision", "fake:1xA100-80GB").await;
        let nodes = p.get_json(&p.carol, "/api/v1/nodes").await;
        let node = nodes[0]["id"].as_i64().unwrap();
        let lending = samples(
            damaged(vec![
                json!({"mode": "always", "grace_seconds": 30, "max_lent_gpus": 1, "borrowers": ["physics"]}),
                json!({"mode": "windows", "windows": [{"days": [1, 2], "from": "19:00", "to": "07:00"}],
                       "min_idle_minutes": 10, "max_guest_minutes": 600}),
            ]),
            n,
        );
        hammer(
            &p,
            &p.carol,
            "PUT",
            &format!("/api/v1/nodes/{node}/lending"),
            &lending,
        )
        .await;
        // The portal still serves and the scheduler still runs a good job.
        let id = p
            .submit(
                &p.alice,
                json!({"image": "commons-demo:latest", "command": ["sh", "-c", "echo ok"],
                                           "gpus": 1, "time_limit_minutes": 5, "lab": "vision"}),
            )
            .await;
        p.wait_state(
            &p.alice,
            id,
            &["succeeded"],
            std::time::Duration::from_secs(60),
        )
        .await;
        p.stop().await;
    }
    report("HTTP API bodies (both backends)", u64::from(n) * 6 * 2);
}

/// The SSO callback with a real login in flight and its parameters damaged: never a
/// 5xx, never a session, never a user.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_sso_callbacks_are_refused() {
    let n = budget(60);
    let (p, _provider) = crate::sso::sso(Backend::Sqlite, false).await;
    let users_before = p
        .portal
        .state
        .db
        .run(commons_portal::db::users::all_users)
        .await
        .unwrap()
        .len();
    let params = samples(
        damaged(vec![
            json!({"state": "STATE", "code": "abc", "session_state": "x"}),
            json!({"error": "access_denied", "state": "STATE"}),
        ]),
        n,
    );
    for v in &params {
        let b = crate::support::session::browser();
        let r = b.get(format!("{}/auth/login", p.url)).send().await.unwrap();
        let location = r.headers()["location"].to_str().unwrap().to_string();
        let state = url::Url::parse(&location)
            .unwrap()
            .query_pairs()
            .find(|(k, _)| k == "state")
            .map(|(_, v)| v.to_string())
            .unwrap();
        let mut query = Vec::new();
        if let Value::Object(o) = v {
            for (k, val) in o {
                let val = match val {
                    Value::String(s) if s == "STATE" => state.clone(),
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                // URLs carry a few KiB at most; longer values are cut to that.
                let k: String = k.chars().take(2000).collect();
                query.push((k, val.chars().take(2000).collect::<String>()));
            }
        }
        let r = b
            .get(format!("{}/auth/callback", p.url))
            .query(&query)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        assert!(status < 500, "callback {query:?} -> {status}");
        let jobs = b.get(format!("{}/jobs", p.url)).send().await.unwrap();
        assert_eq!(jobs.status(), 303, "callback {query:?} signed someone in");
    }
    let users_after = p
        .portal
        .state
        .db
        .run(commons_portal::db::users::all_users)
        .await
        .unwrap()
        .len();
    assert_eq!(
        users_before, users_after,
        "no user made by a refused callback"
    );
    report("SSO callback parameters", u64::from(n));
    p.stop().await;
}

/// The agents' signed object route (`OBJECTS_PATH`) under damaged URLs, built from the
/// URLs a real listing gave: never a 5xx, a refusal in the API's error shape, and what
/// it serves is only ever one of the objects granted, whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_signed_object_urls_are_refused() {
    let n = budget(200);
    let dir = tempfile::tempdir().unwrap();
    let p = crate::support::files::portal_in(Backend::Sqlite, dir.path(), |_| {}).await;
    p.portal.scheduler.abort();
    let (job, _, cred, _, _) = crate::files_signed::placed(&p).await;
    let files = crate::files_signed::listing(&p, &cred, job).await;
    let seeds: Vec<String> = files.iter().map(|f| f.url.clone().unwrap()).collect();
    let (mut sent, mut served) = (0, 0);
    for u in samples(crate::support::fuzzkit::damaged_text(seeds), n) {
        // Only what still reaches this route: the rest is other routes' business.
        if !u.starts_with(&format!("{}/", commons_proto::OBJECTS_PATH)) {
            continue;
        }
        let url = format!("{}{u}", p.url);
        let Ok(r) = p.http.get(&url).send().await else {
            continue;
        };
        sent += 1;
        let status = r.status().as_u16();
        let body = r.bytes().await.unwrap();
        assert!(status < 500, "{url} -> {status}");
        if status < 300 {
            served += 1;
            assert!(
                [b"alpha\n".as_slice(), b"bravo\n".as_slice()].contains(&body.as_ref()),
                "{url} served {body:?}"
            );
        } else if status == 403 {
            let err: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            assert!(
                err["error"].is_string() && err["message"].is_string(),
                "{url} -> 403: not the API's error shape: {body:?}"
            );
        }
    }
    assert!(
        sent * 2 >= u64::from(n),
        "only {sent} of {n} damaged URLs reached the route"
    );
    println!("signed object URLs: {sent} damaged, {served} still served an object granted");
    report("signed object URLs", sent);
    p.stop().await;
}
