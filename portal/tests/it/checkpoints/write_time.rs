//! A checkpoint's write time, as the agent reports it with the commit, reaches the
//! scheduler's snapshot: the longer grace for slow savers (`grace_covers_checkpoint_s`)
//! and save-aware victims read it there.

use super::*;

impl Agent<'_> {
    /// Commits `data` (uploaded as `parts` parts) saying it took `write_ms` to write.
    async fn commit_timed(
        &self,
        job: i64,
        attempt: i32,
        parts: usize,
        data: &[u8],
        write_ms: Option<u64>,
    ) -> (u16, Value) {
        let mut body = json!({"parts": parts, "bytes": data.len(), "sha256": sha(data)});
        if let Some(ms) = write_ms {
            body["write_ms"] = json!(ms);
        }
        let r = self
            .p
            .http
            .post(format!(
                "{}{}",
                self.p.url,
                checkpoint_commit_path(job, attempt)
            ))
            .bearer_auth(&self.credential)
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// Uploads `data` in one part and commits it; asserts it was stored.
    async fn store(&self, job: i64, attempt: i32, data: &[u8], write_ms: Option<u64>) {
        self.upload(job, attempt, data, data.len(), None).await;
        let (status, v) = self.commit_timed(job, attempt, 1, data, write_ms).await;
        assert_eq!(status, 200, "commit of attempt {attempt}: {v}");
    }
}

/// The snapshot's (write time, last checkpoint) of `job`'s running attempt.
async fn seen(p: &TestPortal, job: i64) -> (Option<i64>, Option<i64>) {
    let policy = commons_sched::Policy::default();
    let snap = run(p, move |c| db::snapshot::read(c, &policy)).await;
    let r = snap
        .running
        .iter()
        .find(|r| r.id == job)
        .unwrap_or_else(|| panic!("job {job} is not running in {:?}", snap.running));
    (r.checkpoint_write_s, r.last_checkpoint_at)
}

per_backend! {
    /// The latest committed checkpoint with a known write time, of this attempt or an
    /// earlier one, in whole seconds rounded up; a commit without one (an older agent)
    /// is accepted and leaves the known one in place.
    async fn write_time_reaches_the_snapshot(backend: Backend) {
        let (p, _dir) = portal(backend, &Kind::File, None).await;
        let (node, credential) = enrol(&p, "vision", "vision-a").await;
        let a = Agent { p: &p, credential };
        let job = running_job(&p, node).await;
        assert_eq!(seen(&p, job).await, (None, None), "[{backend:?}] nothing yet");

        a.store(job, 1, &archive(3_000, 1), Some(61_001)).await;
        let (write_s, at) = seen(&p, job).await;
        assert_eq!(write_s, Some(62), "[{backend:?}] 61.001 s rounds up");
        assert!(at.is_some(), "[{backend:?}]");
        let stored = run(&p, move |c| rows::for_job(c, job)).await;
        assert_eq!(stored[0].write_ms, Some(61_001), "[{backend:?}] the row");

        // An older agent's commit: no write time; the known one still applies.
        a.store(job, 1, &archive(3_000, 2), None).await;
        assert_eq!(seen(&p, job).await.0, Some(62), "[{backend:?}] after an untimed commit");

        // The next attempt has no checkpoint of its own yet: the job's last write time
        // is what its grace must cover.
        run(&p, move |c| place(c, job, 2, node)).await;
        assert_eq!(seen(&p, job).await, (Some(62), None), "[{backend:?}] attempt 2");

        // Its own, faster checkpoint supersedes the earlier attempt's.
        a.store(job, 2, &archive(3_000, 3), Some(1_500)).await;
        assert_eq!(seen(&p, job).await.0, Some(2), "[{backend:?}] attempt 2's own");
        p.stop().await;
    }
}
