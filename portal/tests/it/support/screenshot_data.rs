//! What the screenshots (`pages_browser::screenshots`) need beyond the seeded campus:
//! quotas for "My usage", and a running job with some minutes of utilisation samples.

use crate::support::harness::TestPortal;

/// Quotas, so that "My usage" has bars to show.
pub async fn quotas_for_the_usage_shot(p: &TestPortal) {
    for (token, path, body) in [
        (
            &p.carol,
            "/api/v1/labs/vision/member-default-quota",
            serde_json::json!({"max_gpus": 2, "max_gpu_hours": 40}),
        ),
        (
            &p.olga,
            "/api/v1/labs/vision/quota",
            serde_json::json!({"max_gpu_hours": 100}),
        ),
    ] {
        let (status, v) = p.put_json(token, path, &body).await;
        assert_eq!(status, 200, "{path}: {v}");
    }
}

/// 25 minutes of utilisation samples for the running job's chart in the screenshot,
/// written directly, the job moved back to match (a real run would take that long; the
/// harness's fake GPUs report 0 %; `utilization.rs` tests the real path).
pub async fn minutes_of_samples(p: &TestPortal, job: i64) {
    use commons_portal::db::samples::{self, Sample};
    use commons_portal::db::schema::{attempt_samples, job_attempts, job_events, jobs};
    use diesel::{ExpressionMethods, QueryDsl, RunQueryDsl};
    let now = chrono::Utc::now().naive_utc();
    let back = chrono::Duration::minutes(26);
    let rows: Vec<Sample> = (0..25i64)
        .map(|i| Sample {
            job_id: job,
            attempt: 1,
            at: now - chrono::Duration::minutes(24 - i),
            utilization_pct: if i < 4 {
                (15 + 20 * i) as f64
            } else {
                (88 + (i * 7) % 11 - 5) as f64
            },
            memory_used_mb: (61_440 * (i + 1).min(6) / 6) + (i % 5) * 300,
        })
        .collect();
    let db = p.portal.state.db.clone();
    tokio::task::spawn_blocking(move || {
        db.run_blocking(|c| {
            type T = chrono::NaiveDateTime;
            let (created, started): (T, Option<T>) = jobs::table
                .find(job)
                .select((jobs::created_at, jobs::started_at))
                .first(c)?;
            diesel::update(jobs::table.find(job))
                .set((
                    jobs::created_at.eq(created - back),
                    jobs::started_at.eq(started.map(|t| t - back)),
                ))
                .execute(c)?;
            let attempts: Vec<(i64, Option<T>)> = job_attempts::table
                .filter(job_attempts::job_id.eq(job))
                .select((job_attempts::id, job_attempts::started_at))
                .load(c)?;
            for (id, t) in attempts {
                diesel::update(job_attempts::table.find(id))
                    .set(job_attempts::started_at.eq(t.map(|t| t - back)))
                    .execute(c)?;
            }
            let events: Vec<(i64, T)> = job_events::table
                .filter(job_events::job_id.eq(job))
                .select((job_events::id, job_events::at))
                .load(c)?;
            for (id, t) in events {
                diesel::update(job_events::table.find(id))
                    .set(job_events::at.eq(t - back))
                    .execute(c)?;
            }
            diesel::delete(attempt_samples::table.filter(attempt_samples::job_id.eq(job)))
                .execute(c)?;
            samples::insert(c, &rows)
        })
    })
    .await
    .unwrap()
    .unwrap();
}
