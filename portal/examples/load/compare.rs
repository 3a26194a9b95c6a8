//! Phase 6 of the load test (`--compare-array N`): the scheduler's round with N single
//! jobs queued, with one array of N tasks, with one of N tasks and a throttle, and with N
//! single jobs of the array's user, in turn, each queue cancelled before the next is made.

use super::load::{self, submit};
use super::{job, ms, scheduler_figures, seed_queue, seed_queue_of};
use std::time::Instant;

/// What [`compare_array`] runs.
pub struct Compare<'a> {
    pub url: &'a str,
    pub db_url: &'a str,
    pub token: &'a str,
    pub n: u64,
    pub throttle: u64,
    pub run_s: u64,
    pub tick_s: u64,
}

/// Phase 6: the round with `n` single jobs queued, then with one array of `n` tasks
/// (and one with a throttle), the previous queue cancelled in between (test setup,
/// straight into the database) so that each case has the same number queued.
pub async fn compare_array(c: &Compare<'_>, campus: &load::Campus, agents: usize, gpus: u32) {
    let template = submit(
        c.url,
        &[c.token.to_string()],
        1,
        1,
        job(Some(c.run_s as f64)),
    )
    .await;
    let template = template
        .jobs
        .first()
        .expect("the template job was refused")
        .0;
    let n = seed_queue(c.db_url, template, c.n, c.run_s);
    println!("6. {n} single jobs queued (seeded):");
    scheduler_figures(c.url, c.tick_s, campus, agents, gpus).await;
    let mut specs = vec![(format!("0-{}", c.n - 1), "no throttle")];
    if c.throttle > 0 {
        specs.push((format!("0-{}%{}", c.n - 1, c.throttle), "with a throttle"));
    }
    for (spec, what) in specs {
        let cancelled = cancel_queued(c.db_url);
        let mut body = job(Some(c.run_s as f64));
        body["array"] = serde_json::json!(spec);
        let sent = Instant::now();
        let r: serde_json::Value = reqwest::Client::new()
            .post(format!("{}/api/v1/jobs", c.url))
            .bearer_auth(c.token)
            .json(&body)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let took = sent.elapsed();
        assert!(
            r["count"].as_u64() == Some(c.n),
            "the array was refused: {r}"
        );
        analyze(c.db_url);
        println!(
            "6. one array of {} tasks ({spec}, {what}) accepted in {} ({cancelled} queued jobs \
             cancelled first):",
            c.n,
            ms(took)
        );
        scheduler_figures(c.url, c.tick_s, campus, agents, gpus).await;
    }
    // Last, the singles again, all of the array's user (the same owner, and a check on
    // the order of the cases).
    let cancelled = cancel_queued(c.db_url);
    let n = seed_queue_of(c.db_url, template, c.n, c.run_s, true);
    println!("6. {n} single jobs of one user queued (seeded; {cancelled} cancelled first):");
    scheduler_figures(c.url, c.tick_s, campus, agents, gpus).await;
}

/// Cancels every queued job (test setup between the cases); how many.
fn cancel_queued(url: &str) -> usize {
    use diesel::{Connection, RunQueryDsl};
    let mut c = diesel::PgConnection::establish(url).unwrap();
    diesel::sql_query(
        "UPDATE jobs SET state = 'cancelled', reason = NULL, \
         finished_at = now() AT TIME ZONE 'UTC' WHERE state = 'queued'",
    )
    .execute(&mut c)
    .unwrap()
}

fn analyze(url: &str) {
    use diesel::{Connection, RunQueryDsl};
    let mut c = diesel::PgConnection::establish(url).unwrap();
    diesel::sql_query("ANALYZE jobs, job_events")
        .execute(&mut c)
        .unwrap();
}
