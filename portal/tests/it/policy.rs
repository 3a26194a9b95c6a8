//! The scheduler's policy in the running system: owner first with preemption, lending
//! rules and quotas set through the API, with role checks.

use crate::support::harness::{wait_for, TestPortal};
use serde_json::json;
use std::time::Duration;

const T: Duration = Duration::from_secs(60);

fn job(cmd: &str, gpus: i64, minutes: i64) -> serde_json::Value {
    json!({"image": "commons-demo:latest", "command": ["sh", "-c", cmd], "gpus": gpus,
           "time_limit_minutes": minutes, "cpus": 0.25, "memory_gb": 0.125})
}

fn secs(v: &serde_json::Value) -> f64 {
    let t =
        chrono::NaiveDateTime::parse_from_str(v.as_str().unwrap(), "%Y-%m-%dT%H:%M:%S%.f").unwrap();
    t.and_utc().timestamp_millis() as f64 / 1000.0
}

per_backend! {
    async fn owner_job_preempts_a_guest_within_the_grace_period(backend: Backend) {
        let p = TestPortal::start(backend).await;
        let _agent = p.agent("vision", "fake:2xA100-80GB").await;
        let node = p.get_json(&p.alice, "/api/v1/nodes").await[0]["id"]
            .as_i64()
            .unwrap();
        let grace = 3;
        let (status, v) = p
            .put_json(
                &p.carol,
                &format!("/api/v1/nodes/{node}/lending"),
                &json!({"mode": "always", "grace_seconds": grace}),
            )
            .await;
        assert_eq!(status, 200, "{v}");

        // Bob (physics) fills the vision lab's idle GPUs as a guest.
        let g1 = p.submit(&p.bob, job("sleep 300", 1, 30)).await;
        let g2 = p.submit(&p.bob, job("sleep 300", 1, 60)).await;
        p.wait_state(&p.bob, g1, &["running"], T).await;
        p.wait_state(&p.bob, g2, &["running"], T).await;

        // Alice (vision) needs one GPU of her lab's server.
        let owner = p.submit(&p.alice, job("echo owner; sleep 2", 1, 10)).await;
        let o = p
            .wait_state(&p.alice, owner, &["running", "succeeded"], T)
            .await;
        let waited = secs(&o["started_at"]) - secs(&o["created_at"]);
        assert!(
            waited <= grace as f64 + 3.0,
            "[{backend:?}] the owner waited {waited:.1}s; grace is {grace}s plus one tick"
        );
        // Exactly one guest went back to the queue; the other kept running.
        let me = &p;
        wait_for(Duration::from_secs(20), "a guest requeued", || async move {
            let a = me.job(&me.bob, g1).await;
            let b = me.job(&me.bob, g2).await;
            let states = [
                a["state"].as_str().unwrap().to_string(),
                b["state"].as_str().unwrap().to_string(),
            ];
            states.contains(&"running".to_string())
                && (states.contains(&"queued".to_string())
                    || a["attempts"].as_i64() == Some(2)
                    || b["attempts"].as_i64() == Some(2))
        })
        .await;
        let (victim, survivor) = {
            let a = p.job(&p.bob, g1).await;
            if a["state"] == "running" && a["attempts"] == 1 {
                (g2, g1)
            } else {
                (g1, g2)
            }
        };
        let events = p
            .get_json(&p.bob, &format!("/api/v1/jobs/{victim}/events"))
            .await;
        let states: Vec<&str> = events
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["state"].as_str().unwrap())
            .collect();
        assert!(
            states.windows(2).any(|w| w == ["preempting", "queued"]),
            "[{backend:?}] the guest was preempted and requeued: {states:?}"
        );
        assert_eq!(p.job(&p.bob, survivor).await["attempts"], 1);
        // When the owner is done, the guest runs again (attempt 2).
        p.wait_state(&p.alice, owner, &["succeeded"], T).await;
        let again = p.wait_state(&p.bob, victim, &["running"], T).await;
        assert_eq!(again["attempts"], 2, "[{backend:?}] {again}");

        // The week's usage: vision lent, physics borrowed (all of what it used).
        let usage = |slug: &'static str| {
            let db = p.portal.state.db.clone();
            db.run_blocking(move |c| {
                let lab = commons_portal::db::users::lab_by_slug(c, slug)?;
                commons_portal::db::usage::lab_usage(c, lab.id, commons_portal::db::now(), 2)
            })
            .unwrap()
        };
        let vision = usage("vision");
        assert!(vision.weeks[0].lent > 0.0, "[{backend:?}] {vision:?}");
        assert!(
            vision.weeks[0].used > 0.0 && vision.weeks[0].borrowed == 0.0,
            "alice ran at home"
        );
        let physics = usage("physics");
        assert!(
            physics.weeks[0].used > 0.0 && physics.weeks[0].borrowed == physics.weeks[0].used,
            "{physics:?}"
        );
        assert_eq!(physics.members[0].0, "bob");
        // ... and the console shows them.
        let olga = crate::support::session::BrowserSession::login(&p, "olga").await;
        let page = olga
            .fetch("/labs/physics/admin")
            .await
            .text()
            .await
            .unwrap();
        assert!(
            page.contains("id=\"usage\"") && page.contains("<td>bob</td>"),
            "[{backend:?}]"
        );
        p.stop().await;
    }
}

per_backend! {
    async fn lending_rules_and_quotas_bind_guests_and_need_the_right_role(backend: Backend) {
        let p = TestPortal::start(backend).await;
        let _agent = p.agent("vision", "fake:2xA100-80GB").await;
        let node = p.get_json(&p.alice, "/api/v1/nodes").await[0]["id"]
            .as_i64()
            .unwrap();
        let lending = format!("/api/v1/nodes/{node}/lending");

        // Only vision's admins (or operators) set its lending rules.
        let (status, _) = p
            .put_json(&p.alice, &lending, &json!({"mode": "never"}))
            .await;
        assert_eq!(status, 403, "a member is refused");
        let (status, _) = p
            .put_json(&p.bob, &lending, &json!({"mode": "never"}))
            .await;
        assert_eq!(status, 403, "another lab is refused");
        for (body, field) in [
            (json!({"mode": "sometimes"}), "mode"),
            (
                json!({"mode": "always", "max_lent_gpus": -1}),
                "max_lent_gpus",
            ),
            (json!({"mode": "windows"}), "windows"),
            (
                json!({"mode": "windows", "windows": [{"days": [7], "from": "19:00", "to": "07:00"}]}),
                "windows[0].days",
            ),
            (
                json!({"mode": "windows", "windows": [{"days": [0], "from": "25:00", "to": "07:00"}]}),
                "windows[0].from",
            ),
            (
                json!({"mode": "always", "borrowers": ["nowhere"]}),
                "borrowers",
            ),
            (
                json!({"mode": "always", "grace_seconds": 99999}),
                "grace_seconds",
            ),
        ] {
            let (status, v) = p.put_json(&p.carol, &lending, &body).await;
            assert_eq!(status, 422, "[{backend:?}] {body}: {v}");
            assert_eq!(v["field"], field, "{v}");
        }
        assert_eq!(
            p.get_json(&p.alice, "/api/v1/nodes").await[0]["lending"]["mode"],
            "always",
            "nothing changed"
        );

        // Lend never: a guest waits, and says why; the owner still runs.
        let (status, v) = p
            .put_json(&p.carol, &lending, &json!({"mode": "never"}))
            .await;
        assert_eq!(status, 200, "{v}");
        let guest = p.submit(&p.bob, job("true", 1, 5)).await;
        let me = &p;
        wait_for(Duration::from_secs(10), "a reason", || async move {
            let j = me.job(&me.bob, guest).await;
            j["state"] == "queued" && j["reason"].as_str().is_some_and(|r| r.contains("lend"))
        })
        .await;
        let owner = p.submit(&p.alice, job("true", 1, 5)).await;
        assert_eq!(
            p.wait_state(&p.alice, owner, &["succeeded", "failed"], T)
                .await["state"],
            "succeeded"
        );
        assert_eq!(p.job(&p.bob, guest).await["state"], "queued");

        // Lend always, but physics' quota allows no job longer than 10 minutes.
        let (status, _) = p
            .put_json(
                &p.carol,
                "/api/v1/labs/physics/quota",
                &json!({"max_job_minutes": 10}),
            )
            .await;
        assert_eq!(status, 403, "lab quotas are the operators'");
        let (status, v) = p
            .put_json(
                &p.olga,
                "/api/v1/labs/physics/quota",
                &json!({"max_job_minutes": -5}),
            )
            .await;
        assert_eq!(
            (status, v["field"].as_str()),
            (422, Some("max_job_minutes"))
        );
        let (status, _) = p
            .put_json(
                &p.olga,
                "/api/v1/labs/physics/quota",
                &json!({"max_job_minutes": 10}),
            )
            .await;
        assert_eq!(status, 200);
        p.put_json(&p.carol, &lending, &json!({"mode": "always"}))
            .await;
        let long = p.submit(&p.bob, job("true", 1, 60)).await;
        p.wait_state(&p.bob, guest, &["succeeded"], T).await;
        let me = &p;
        wait_for(Duration::from_secs(10), "a quota reason", || async move {
            let j = me.job(&me.bob, long).await;
            j["state"] == "queued" && j["reason"].as_str().is_some_and(|r| r.contains("quota"))
        })
        .await;

        // A lab's default member quota binds members without their own; an own quota
        // replaces it.
        let (status, _) = p
            .put_json(
                &p.alice,
                "/api/v1/labs/vision/member-default-quota",
                &json!({"max_job_minutes": 10}),
            )
            .await;
        assert_eq!(status, 403, "members do not set it");
        let (status, v) = p
            .put_json(
                &p.carol,
                "/api/v1/labs/vision/member-default-quota",
                &json!({"max_job_minutes": 10}),
            )
            .await;
        assert_eq!(status, 200, "{v}");
        let long_owner = p.submit(&p.alice, job("true", 1, 60)).await;
        let me = &p;
        wait_for(
            Duration::from_secs(10),
            "a member quota reason",
            || async move {
                let j = me.job(&me.alice, long_owner).await;
                j["state"] == "queued" && j["reason"].as_str().is_some_and(|r| r.contains("quota"))
            },
        )
        .await;
        let (status, _) = p
            .put_json(
                &p.carol,
                "/api/v1/labs/vision/members/alice/quota",
                &json!({"max_gpus": 2}),
            )
            .await;
        assert_eq!(status, 200);
        let j = p
            .wait_state(&p.alice, long_owner, &["succeeded", "failed"], T)
            .await;
        assert_eq!(
            j["state"], "succeeded",
            "[{backend:?}] her own quota replaced the default: {j}"
        );

        // A lab admin sets a member's quota; only for members of their lab.
        let (status, _) = p
            .put_json(
                &p.carol,
                "/api/v1/labs/vision/members/alice/quota",
                &json!({"max_gpus": 1}),
            )
            .await;
        assert_eq!(status, 200);
        let (status, _) = p
            .put_json(
                &p.carol,
                "/api/v1/labs/physics/members/bob/quota",
                &json!({"max_gpus": 1}),
            )
            .await;
        assert_eq!(status, 403);
        p.stop().await;
    }
}

/// How many sessions hold the scheduler leader lock in this test's database (advisory
/// locks are per database; other tests share the server).
pub fn leader_locks(url: &str) -> i64 {
    use diesel::{Connection, RunQueryDsl};
    #[derive(diesel::QueryableByName)]
    struct N {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    let mut c = diesel::PgConnection::establish(url).unwrap();
    diesel::sql_query(format!(
        "SELECT count(*) AS n FROM pg_locks WHERE locktype = 'advisory' AND granted \
         AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
         AND ((classid::bigint << 32) | objid::bigint) = {}",
        commons_portal::db::leader::LEADER_LOCK
    ))
    .get_result::<N>(&mut c)
    .unwrap()
    .n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_replica_schedules_and_another_takes_over() {
    let p = TestPortal::start(crate::support::harness::Backend::Postgres).await;
    let url = p.portal.state.config.database_url.clone();
    let u = url.clone();
    wait_for(Duration::from_secs(10), "the first portal to lead", || {
        let u = u.clone();
        async move {
            tokio::task::spawn_blocking(move || leader_locks(&u))
                .await
                .unwrap()
                == 1
        }
    })
    .await;
    // A second replica; the agent talks to it, the first one schedules.
    let replica = p.replica().await;
    let _agent = p
        .agent_at(&replica.url(), "vision", "fake:1xA100-80GB")
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let u = url.clone();
    assert_eq!(
        tokio::task::spawn_blocking(move || leader_locks(&u))
            .await
            .unwrap(),
        1,
        "one leader"
    );
    let first = p.submit(&p.alice, job("echo one", 1, 5)).await;
    let j = p
        .wait_state(&p.alice, first, &["succeeded", "failed"], T)
        .await;
    assert_eq!(
        j["state"], "succeeded",
        "started by the leader, delivered by the replica: {j}"
    );

    // The leader goes; the replica takes the lock and schedules.
    p.portal.scheduler.abort();
    let u = url.clone();
    wait_for(Duration::from_secs(20), "the replica to lead", || {
        let u = u.clone();
        async move {
            tokio::task::spawn_blocking(move || leader_locks(&u))
                .await
                .unwrap()
                == 1
        }
    })
    .await;
    let second = p.submit(&p.alice, job("echo two", 1, 5)).await;
    let j = p
        .wait_state(&p.alice, second, &["succeeded", "failed"], T)
        .await;
    assert_eq!(j["state"], "succeeded", "{j}");
    replica.scheduler.abort();
    replica.handle.stop(false).await;
    p.stop().await;
}
