//! Times in the reader's time zone, in headless Chromium started in other zones.

use crate::pages::job;
use crate::pages_browser::{browser_login, js};
use crate::support::browser::Browser;
use crate::support::harness::{wait_for, Backend, TestPortal};
use std::time::Duration;

/// Times on the pages are the reader's: Chromium in another time zone (its `TZ`) shows a
/// known timestamp in that zone with the zone's UTC offset (east and west of UTC), also
/// after the live part of the page was fetched again, and the title keeps the campus
/// time; "5 min ago" is counted by the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn times_show_in_the_readers_time_zone_with_its_offset() {
    use chrono::Timelike;
    use commons_portal::db::schema::jobs;
    use diesel::{ExpressionMethods, QueryDsl, RunQueryDsl};
    let p = TestPortal::start(Backend::Sqlite).await;
    // No server: the job waits, and its page keeps refreshing its live part.
    let id = p.submit(&p.alice, job("sleep 1", 1, None, "vision")).await;
    // Submitted 5 min 10 s ago, to the second.
    let created = (chrono::Utc::now().naive_utc() - chrono::Duration::seconds(310))
        .with_nanosecond(0)
        .unwrap();
    p.portal
        .state
        .db
        .run_blocking(|c| {
            diesel::update(jobs::table.find(id))
                .set(jobs::created_at.eq(created))
                .execute(c)
                .map_err(commons_portal::error::AppError::from)
        })
        .unwrap();
    let campus = commons_portal::web::human::at(created, p.portal.state.config.policy.utc_offset_s);
    for (zone, east_min, shown) in [
        ("Asia/Kolkata", 330, "UTC+05:30"),
        ("America/Argentina/Buenos_Aires", -180, "UTC-03:00"),
    ] {
        let b = Browser::start_in_zone(zone).await;
        assert_eq!(
            js(
                &b,
                "return new Date(Date.UTC(2026, 11, 8)).getTimezoneOffset();"
            )
            .await,
            -east_min,
            "Chromium runs in {zone}"
        );
        browser_login(&b, &p, "alice").await;
        b.client
            .goto(&format!("{}/jobs/{id}", p.url))
            .await
            .unwrap();
        let want = format!(
            "{} {shown}",
            (created + chrono::Duration::minutes(east_min)).format("%Y-%m-%d %H:%M")
        );
        let read = "const t = document.querySelector('#job-facts time');
                    return { text: t.textContent, title: t.title,
                             row: t.closest('tr').textContent,
                             history: document.querySelector('#history time').textContent };";
        let (me, server_text) = (&b, campus.as_str());
        wait_for(Duration::from_secs(10), "the local time", || async move {
            js(me, read).await["text"].as_str() != Some(server_text)
        })
        .await;
        let first = js(&b, read).await;
        assert_eq!(first["text"], want.as_str(), "{zone}: {first}");
        assert_eq!(
            first["title"],
            campus.as_str(),
            "the campus time in the title"
        );
        assert!(
            first["row"].as_str().unwrap().contains("(5 min ago)"),
            "{first}"
        );
        assert!(
            first["history"].as_str().unwrap().ends_with(shown),
            "the history's times too: {first}"
        );
        // The live part is fetched again every 2 s: still the reader's time.
        js(
            &b,
            "document.getElementById('job-facts').dataset.old = '1'; return null;",
        )
        .await;
        wait_for(
            Duration::from_secs(10),
            "a refresh of the live part",
            || async move {
                js(
                    me,
                    "return !document.getElementById('job-facts').dataset.old;",
                )
                .await
                .as_bool()
                    == Some(true)
            },
        )
        .await;
        let again = js(&b, read).await;
        assert_eq!(
            again["text"],
            want.as_str(),
            "{zone} after a refresh: {again}"
        );
        let errors = b.console_errors().await;
        assert!(errors.is_empty(), "console errors: {errors:?}");
        b.close().await;
    }
}
