use super::*;
use crate::service::testkit::{campus, sqlite, statements, take};
use chrono::Duration;

fn stat(util: u32, memory_used_mb: u64) -> GpuStat {
    GpuStat {
        uuid: "GPU-1".into(),
        utilization_pct: util,
        memory_used_mb,
        local_use: false,
        fault: None,
    }
}

fn running(job: i64) -> AttemptReport {
    AttemptReport {
        job,
        attempt: 1,
        state: AttemptState::Running,
        exit_code: None,
        stop: None,
        reason: None,
        gpu_memory_used_mb: None,
    }
}

#[test]
fn one_sample_per_attempt_and_interval_written_in_one_insert() {
    let (_d, mut c) = sqlite();
    let k = campus(&mut c, 2);
    let t0 = db::now();
    for j in &k.jobs {
        let a = db::attempts::find(&mut c, j.id, 1).unwrap().unwrap();
        db::attempts::mark_running(&mut c, a.id, t0).unwrap();
    }
    let (a, b) = (k.jobs[0].id, k.jobs[1].id);
    let reports = [running(a), running(b), running(999_999)];
    let seen = statements(&mut c);
    let mut s = Sampler::new(60);
    let node = k.node.id;

    // At rest (nothing runs): not a single statement.
    assert_eq!(
        record(&mut c, &mut s, node, &[stat(0, 0)], &[], t0).unwrap(),
        0
    );
    assert_eq!(take(&seen), Vec::<String>::new());

    // First sight: the attempts are learnt once, and sampled at once, in one INSERT; the
    // attempt the portal does not run here (999999) is not.
    let n = record(&mut c, &mut s, node, &[stat(40, 1000)], &reports, t0).unwrap();
    assert_eq!(n, 2);
    let inserts: Vec<String> = take(&seen)
        .into_iter()
        .filter(|q| q.starts_with("INSERT"))
        .collect();
    assert_eq!(inserts.len(), 1, "{inserts:?}");

    // Heartbeats within the interval cost nothing; they are averaged into the next sample.
    for (secs, util, mem) in [(5, 100, 3000), (30, 50, 2000)] {
        let at = t0 + Duration::seconds(secs);
        let n = record(&mut c, &mut s, node, &[stat(util, mem)], &reports, at).unwrap();
        assert_eq!(n, 0);
        assert_eq!(take(&seen), Vec::<String>::new(), "at +{secs} s");
    }
    let at = t0 + Duration::seconds(60);
    let n = record(&mut c, &mut s, node, &[stat(0, 500)], &reports, at).unwrap();
    assert_eq!(n, 2);
    let q = take(&seen);
    assert_eq!(q.len(), 1, "one statement: {q:?}");
    assert!(q[0].starts_with("INSERT"));

    let rows = db::samples::for_job(&mut c, a).unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(
        (rows[0].utilization_pct, rows[0].memory_used_mb),
        (40.0, 1000)
    );
    // The mean of the three heartbeats since (100, 50, 0), the peak of their memory.
    assert_eq!(
        (rows[1].utilization_pct, rows[1].memory_used_mb),
        (50.0, 3000)
    );
    assert_eq!(rows[1].at, at);

    // A new connection (the agent reconnected) starts from the stored samples: nothing
    // is due before the interval has passed since the last one.
    let mut again = Sampler::new(60);
    let soon = at + Duration::seconds(10);
    assert_eq!(
        record(&mut c, &mut again, node, &[stat(90, 0)], &reports, soon).unwrap(),
        0
    );
    let later = at + Duration::seconds(61);
    assert_eq!(
        record(&mut c, &mut again, node, &[stat(90, 0)], &reports, later).unwrap(),
        2
    );
    assert_eq!(db::samples::for_job(&mut c, b).unwrap().len(), 3);
    // An attempt no longer reported is forgotten.
    record(
        &mut c,
        &mut again,
        node,
        &[stat(90, 0)],
        &reports[..1],
        later,
    )
    .unwrap();
    assert_eq!(again.tracks.len(), 1);
}

#[test]
fn samples_past_the_retention_are_deleted_and_others_kept() {
    let (_d, mut c) = sqlite();
    let k = campus(&mut c, 1);
    let job = k.jobs[0].id;
    let now = db::now();
    let sample = |days: i64| Sample {
        job_id: job,
        attempt: 1,
        at: now - Duration::days(days),
        utilization_pct: 10.0,
        memory_used_mb: 1,
    };
    db::samples::insert(&mut c, &[sample(40), sample(31), sample(29), sample(0)]).unwrap();
    let keep = UtilizationConfig::default().retention_days as i64;
    assert_eq!(
        db::samples::expire(&mut c, now - Duration::days(keep)).unwrap(),
        2
    );
    let left: Vec<i64> = db::samples::for_job(&mut c, job)
        .unwrap()
        .iter()
        .map(|s| (now - s.at).num_days())
        .collect();
    assert_eq!(left, vec![29, 0]);
}
