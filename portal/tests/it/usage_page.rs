//! "My usage" (`/usage`) over HTTP, for a member, a lab admin and an operator, on both
//! backends: the bars' figures are those of `/api/v1/me` and `/api/v1/usage`, and the
//! pages are valid HTML. (`pages_browser` drives the page in Chromium too.)

use crate::pages::{job, page};
use crate::support::harness::{TestPortal, BACKENDS};
use crate::support::session::BrowserSession;
use serde_json::json;
use std::time::Duration;

const T: Duration = Duration::from_secs(60);

/// Pretends job `id`'s (ended) attempts ran for `minutes`: they started that long before
/// they ended.
async fn ran_for(p: &TestPortal, id: i64, minutes: i64) {
    use commons_portal::db::schema::job_attempts as a;
    use diesel::{ExpressionMethods, QueryDsl, RunQueryDsl};
    let db = p.portal.state.db.clone();
    tokio::task::spawn_blocking(move || {
        db.run_blocking(|c| {
            let ended: Vec<(i64, Option<chrono::NaiveDateTime>)> = a::table
                .filter(a::job_id.eq(id))
                .select((a::id, a::ended_at))
                .load(c)?;
            for (attempt, end) in ended {
                let end = end.expect("the attempt ended");
                diesel::update(a::table.find(attempt))
                    .set(a::started_at.eq(end - chrono::Duration::minutes(minutes)))
                    .execute(c)?;
            }
            Ok::<_, commons_portal::error::AppError>(())
        })
    })
    .await
    .unwrap()
    .unwrap();
}

/// The text of the element with id `id`.
fn text_at(html: &str, id: &str) -> String {
    let key = format!("id=\"{id}\">");
    let at = html
        .find(&key)
        .unwrap_or_else(|| panic!("no #{id} on the page"))
        + key.len();
    html[at..].split('<').next().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn my_usage_shows_the_weeks_gpu_hours_against_each_quota() {
    use commons_portal::web::human;
    for backend in BACKENDS {
        let p = TestPortal::start(backend).await;
        let _physics = p.agent("physics", "fake:2xRTX4090-24GB").await;
        // alice's vision job borrows both of physics' GPUs for 90 minutes: 3 GPU-hours.
        let id = p.submit(&p.alice, job("sleep 1", 2, None, "vision")).await;
        p.wait_state(&p.alice, id, &["succeeded"], T).await;
        ran_for(&p, id, 90).await;
        for (token, path, body) in [
            (
                &p.carol,
                "/api/v1/labs/vision/members/alice/quota",
                json!({"max_gpus": 2, "max_gpu_hours": 10}),
            ),
            (
                &p.olga,
                "/api/v1/labs/vision/quota",
                json!({"max_gpu_hours": 12}),
            ),
        ] {
            let (status, v) = p.put_json(token, path, &body).await;
            assert_eq!(status, 200, "{path}: {v}");
        }
        let me = p.get_json(&p.alice, "/api/v1/me").await;
        let lab = &me["labs"][0];
        let days = me["quota_period_days"].as_i64().unwrap();
        let mine = lab["gpu_hours_in_period"].as_f64().unwrap();
        let borrowed = lab["lab_borrowed_gpu_hours_in_period"].as_f64().unwrap();
        assert!((mine - 3.0).abs() < 1e-6, "[{backend:?}] {me}");
        assert!((borrowed - 3.0).abs() < 1e-6, "{me}");

        let alice = BrowserSession::login(&p, "alice").await;
        let (status, html) = page(&alice, &p, "/usage").await;
        assert_eq!(status, 200, "[{backend:?}] {html}");
        assert!(
            html.contains("<a href=\"/usage\">My usage</a>"),
            "in the nav"
        );
        assert_eq!(
            text_at(&html, "mine-hours-vision"),
            format!("{} used in {days} days of 10 h", human::hours(mine))
        );
        assert_eq!(
            text_at(&html, "mine-hours-vision"),
            "3.0 h used in 7 days of 10 h"
        );
        assert_eq!(text_at(&html, "mine-gpus-vision"), "0 in use of 2");
        assert_eq!(
            text_at(&html, "lab-hours-vision"),
            format!("{} borrowed in {days} days of 12 h", human::hours(borrowed))
        );
        assert!(html.contains("style=\"width: 30%\""), "3 of 10 h as a bar");
        assert!(html.contains("style=\"width: 25%\""), "3 of 12 h as a bar");
        assert!(
            !html.contains("/labs/vision/admin\">the lab's console"),
            "a member gets no console link"
        );
        // By week, as GET /api/v1/usage has it.
        let usage = p.get_json(&p.alice, "/api/v1/usage").await;
        let weeks = usage[0]["members"][0]["gpu_hours"].as_array().unwrap();
        let table = &html[html.find("id=\"weeks-vision\"").unwrap()..];
        let shown: Vec<&str> = table
            .split("<span class=\"use\">")
            .skip(1)
            .map(|s| s.split('<').next().unwrap())
            .collect();
        let want: Vec<String> = weeks
            .iter()
            .map(|h| human::hours(h.as_f64().unwrap()))
            .collect();
        assert_eq!(shown, want, "[{backend:?}]");
        assert!(want.iter().any(|h| h != "0"), "the 3 hours are in a week");

        // The lab admin: her own use (no quota of her own) and the lab's borrowing.
        let carol = BrowserSession::login(&p, "carol").await;
        let (status, carol_html) = page(&carol, &p, "/usage").await;
        assert_eq!(status, 200);
        assert_eq!(
            text_at(&carol_html, "mine-hours-vision"),
            "0 used in 7 days"
        );
        assert_eq!(
            text_at(&carol_html, "lab-hours-vision"),
            "3.0 h borrowed in 7 days of 12 h"
        );
        assert!(carol_html.contains("href=\"/labs/vision/admin\">the lab's console"));
        // An operator in no lab: no quota binds them.
        let olga = BrowserSession::login(&p, "olga").await;
        let (status, olga_html) = page(&olga, &p, "/usage").await;
        assert_eq!(status, 200);
        assert!(olga_html.contains("id=\"no-labs\""));
        // Logged out: to the login page.
        let r = BrowserSession::anonymous(&p).fetch("/usage").await;
        assert!([303, 401].contains(&r.status().as_u16()), "{}", r.status());
        crate::pages_browser::validate_html(&[
            ("usage-member".into(), html),
            ("usage-admin".into(), carol_html),
            ("usage-operator".into(), olga_html),
        ]);
    }
}
