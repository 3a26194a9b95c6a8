//! Committing plans: statement counts, and the guarantees (a job starts once, a GPU
//! goes to one start, preemptions move live attempts only).

use super::*;
use crate::db::models::AgentClock;
use crate::service::testkit::sqlite;
use crate::validate::{self, JobRequest};
use commons_sched::{Plan, Start};
use diesel::connection::{Connection, InstrumentationEvent};
use std::sync::{Arc, Mutex};

const TIMING: Timing = Timing {
    lease_ttl_s: 60,
    default_grace_s: 300,
    default_disk_gb: 20,
};

/// One online node with `gpus` GPUs and `jobs` queued jobs: (node, GPU ids, job ids).
fn queue(c: &mut DbConn, gpus: usize, jobs: usize) -> (i64, Vec<i64>, Vec<i64>) {
    let lab = db::users::create_lab(c, "vision", "Vision").unwrap();
    let user = db::users::create_user(c, "alice", "alice@x.test", false).unwrap();
    let token = db::users::create_enrol_token(c, lab.id).unwrap();
    let (node, _, _) = db::nodes::enrol(c, &token, "n1", "0").unwrap();
    let inventory: Vec<commons_proto::GpuInfo> = (0..gpus)
        .map(|i| commons_proto::GpuInfo {
            uuid: format!("GPU-{i}"),
            index: i as u32,
            model: "A100".into(),
            memory_mb: 80_000,
            fake: true,
        })
        .collect();
    db::nodes::upsert_gpus(c, node.id, "0", &inventory).unwrap();
    let clock = AgentClock {
        session: 7,
        seq: 1,
        received_at: db::now(),
    };
    db::nodes::set_agent_clock(c, node.id, &clock).unwrap();
    let mut gpu_ids: Vec<i64> = db::nodes::list_with_gpus(c).unwrap()[0]
        .2
        .iter()
        .map(|g| g.id)
        .collect();
    gpu_ids.sort();
    let labs = [("vision".to_string(), lab.id)];
    let jobs = (0..jobs)
        .map(|_| {
            let req: JobRequest = serde_json::from_value(serde_json::json!(
                {"image": "commons-demo:latest", "gpus": 1, "time_limit_minutes": 5}
            ))
            .unwrap();
            let v = validate::job(req, &labs).unwrap();
            db::jobs::insert(c, user.id, &v).unwrap().id
        })
        .collect();
    (node.id, gpu_ids, jobs)
}

fn starts(node: i64, gpus: &[i64], jobs: &[i64]) -> Plan {
    Plan {
        start: jobs
            .iter()
            .zip(gpus)
            .map(|(&job, &g)| Start {
                job,
                node,
                gpus: vec![g],
                share: None,
            })
            .collect(),
        ..Plan::default()
    }
}

/// The statements `f` runs on `c`.
fn statements<T>(c: &mut DbConn, f: impl FnOnce(&mut DbConn) -> T) -> (Vec<String>, T) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    c.set_instrumentation(move |e: InstrumentationEvent<'_>| {
        if let InstrumentationEvent::StartQuery { query, .. } = e {
            s.lock().unwrap().push(query.to_string());
        }
    });
    let out = f(c);
    c.set_instrumentation(|_: InstrumentationEvent<'_>| {});
    let seen = seen.lock().unwrap().clone();
    (seen, out)
}

fn commit_of(n: usize) -> (usize, Vec<Order>, DbConn, tempfile::TempDir, Vec<i64>) {
    let (dir, mut c) = sqlite();
    let (node, gpus, jobs) = queue(&mut c, n, n);
    let plan = starts(node, &gpus, &jobs);
    let (seen, orders) = statements(&mut c, |c| apply_plan(c, &plan, TIMING).unwrap());
    (seen.len(), orders, c, dir, jobs)
}

#[test]
fn a_plan_commits_in_the_same_statements_for_one_start_or_fifty() {
    let (one, o1, ..) = commit_of(1);
    let (fifty, o50, mut c, _dir, jobs) = commit_of(50);
    assert_eq!((o1.len(), o50.len()), (1, 50));
    assert_eq!(one, fifty, "statements do not grow with the starts");
    assert!(fifty <= 14, "{fifty} statements");
    // Every start is whole: the job starting as attempt 1 on its GPU, with its
    // attempt row, its history row and its `Start`.
    for (i, job) in jobs.iter().enumerate() {
        let j = db::jobs::get(&mut c, *job).unwrap();
        assert_eq!(
            (j.state, j.attempts, j.reason),
            (JobState::Starting, 1, None)
        );
        let a = db::attempts::find(&mut c, *job, 1).unwrap().unwrap();
        assert_eq!(a.state, AttemptStatus::Starting);
        assert_eq!(a.gpu_id_list().len(), 1);
        let events = db::jobs::events(&mut c, *job).unwrap();
        assert!(
            events
                .last()
                .unwrap()
                .message
                .starts_with("attempt 1 starting on n1 (GPU #"),
            "{events:?}"
        );
        let PortalMsg::Start {
            job: j,
            attempt,
            spec,
            gpus,
            ..
        } = &o50[i].msg
        else {
            panic!("{:?}", o50[i].msg)
        };
        assert_eq!((*j, *attempt, gpus.len()), (*job, 1, 1));
        assert_eq!(
            (spec.user.as_str(), spec.lab.as_deref()),
            ("alice", Some("vision"))
        );
    }
}

#[test]
fn a_job_starts_once_and_a_gpu_goes_to_one_start() {
    let (_d, mut c) = sqlite();
    let (node, gpus, jobs) = queue(&mut c, 2, 3);
    // Two starts want GPU 0: the first gets it.
    let mut plan = starts(node, &[gpus[0], gpus[0]], &jobs[..2]);
    let orders = apply_plan(&mut c, &plan, TIMING).unwrap();
    assert_eq!(orders.len(), 1);
    assert_eq!(
        db::jobs::get(&mut c, jobs[1]).unwrap().state,
        JobState::Queued
    );
    // The same plan again (a replayed or stale plan): the job is no longer queued and
    // its GPU is held; nothing starts.
    plan.start.truncate(1);
    assert!(apply_plan(&mut c, &plan, TIMING).unwrap().is_empty());
    // A cancelled job does not start, even on a free GPU.
    let j2 = db::jobs::get(&mut c, jobs[2]).unwrap();
    db::jobs::cancel(&mut c, &j2, "alice").unwrap();
    let plan = starts(node, &gpus[1..], &jobs[2..]);
    assert!(apply_plan(&mut c, &plan, TIMING).unwrap().is_empty());
    assert_eq!(
        db::attempts::find(&mut c, jobs[0], 2)
            .unwrap()
            .map(|a| a.id),
        None,
        "no second attempt"
    );
    let active = db::attempts::active_on_nodes_or_of_jobs(&mut c, &[node], &[]).unwrap();
    assert_eq!(active.len(), 1);
}

#[test]
fn the_claim_skips_a_job_that_left_the_queue_after_it_was_read() {
    let (_d, mut c) = sqlite();
    let (node, _gpus, jobs) = queue(&mut c, 1, 2);
    db::jobs::set_state(&mut c, jobs[1], JobState::Cancelled, "cancelled").unwrap();
    let claimed = db::plan::claim_queued(&mut c, &[(jobs[0], node), (jobs[1], node)]).unwrap();
    assert_eq!(claimed, vec![(jobs[0], 1)]);
    assert!(db::plan::claim_queued(&mut c, &[(jobs[0], node)])
        .unwrap()
        .is_empty());
}

#[test]
fn preemptions_move_live_attempts_only_in_a_few_statements() {
    let (_d, mut c) = sqlite();
    let (node, gpus, jobs) = queue(&mut c, 3, 3);
    apply_plan(&mut c, &starts(node, &gpus, &jobs), TIMING).unwrap();
    // Job 2 ended meanwhile: its preemption no longer holds.
    db::jobs::set_state(&mut c, jobs[2], JobState::Succeeded, "exited").unwrap();
    let plan = Plan {
        preempt: jobs
            .iter()
            .map(|&job| commons_sched::Preempt {
                job,
                grace_s: 120,
                reason: "the owner needs the GPU".into(),
            })
            .collect(),
        ..Plan::default()
    };
    let (seen, orders) = statements(&mut c, |c| apply_plan(c, &plan, TIMING).unwrap());
    assert!(seen.len() <= 7, "{seen:#?}");
    let stopped: Vec<i64> = orders
        .iter()
        .map(|o| match &o.msg {
            PortalMsg::Stop { job, grace_s, .. } => {
                assert_eq!(*grace_s, 120);
                *job
            }
            m => panic!("{m:?}"),
        })
        .collect();
    assert_eq!(stopped, jobs[..2]);
    for job in &jobs[..2] {
        assert_eq!(
            db::jobs::get(&mut c, *job).unwrap().state,
            JobState::Preempting
        );
        let a = db::attempts::find(&mut c, *job, 1).unwrap().unwrap();
        assert_eq!(a.state, AttemptStatus::Stopping);
        let events = db::jobs::events(&mut c, *job).unwrap();
        assert!(events
            .last()
            .unwrap()
            .message
            .starts_with("preempting: the owner"));
    }
    let a = db::attempts::find(&mut c, jobs[2], 1).unwrap().unwrap();
    assert_eq!(a.state, AttemptStatus::Starting, "left alone");
}

#[test]
fn a_plan_that_preempts_a_guest_does_not_start_another_job_on_its_gpu_in_the_same_commit() {
    let (_d, mut c) = sqlite();
    let (node, gpus, jobs) = queue(&mut c, 2, 3);
    apply_plan(&mut c, &starts(node, &gpus[..1], &jobs[..1]), TIMING).unwrap();
    // The commit reads only the attempts on the starts' nodes and of the preempted jobs:
    // the guest being stopped still holds GPU 0 until its attempt ends.
    let mut plan = starts(node, &[gpus[0], gpus[1]], &jobs[1..]);
    plan.preempt.push(commons_sched::Preempt {
        job: jobs[0],
        grace_s: 60,
        reason: "the owner needs the GPU".into(),
    });
    let orders = apply_plan(&mut c, &plan, TIMING).unwrap();
    let what: Vec<(i64, &str)> = orders
        .iter()
        .map(|o| match &o.msg {
            PortalMsg::Stop { job, .. } => (*job, "stop"),
            PortalMsg::Start { job, .. } => (*job, "start"),
            m => panic!("{m:?}"),
        })
        .collect();
    assert_eq!(what, vec![(jobs[0], "stop"), (jobs[2], "start")]);
    assert_eq!(
        db::jobs::get(&mut c, jobs[1]).unwrap().state,
        JobState::Queued,
        "GPU 0 is still held by the guest being stopped"
    );
}

#[test]
fn waiting_rows_are_written_only_where_they_change() {
    let (_d, mut c) = sqlite();
    let (_node, _gpus, jobs) = queue(&mut c, 1, 30);
    let pending = |shift: u32| -> Vec<commons_sched::Pending> {
        jobs.iter()
            .enumerate()
            .map(|(i, &job)| commons_sched::Pending {
                job,
                reason: commons_sched::Reason::WaitingForGpus { gpus: 1 },
                position: i as u32 + shift,
                estimated_start: (i % 2 == 0).then_some(1_800_000_000 + i as i64),
            })
            .collect()
    };
    let place = |c: &mut DbConn, job: i64| {
        db::plan::places(c, &[job])
            .unwrap()
            .first()
            .map_or((None, None), |p| (p.1, p.2))
    };
    let shown = |c: &mut DbConn| -> BTreeMap<i64, Waiting> {
        db::jobs::by_ids(c, &jobs)
            .unwrap()
            .into_iter()
            .map(|j| {
                let (position, estimated_start) = place(c, j.id);
                let w = Waiting {
                    reason: j.reason,
                    position,
                    estimated_start,
                };
                (j.id, w)
            })
            .collect()
    };
    let now = shown(&mut c);
    assert_eq!(
        record_waiting(
            &mut c,
            &pending(1),
            |id| now.get(&id).map(Waiting::shown),
            true
        )
        .unwrap()
        .len(),
        30
    );
    let now = shown(&mut c);
    let j = db::jobs::get(&mut c, jobs[4]).unwrap();
    assert_eq!(
        place(&mut c, jobs[4]),
        (
            Some(5),
            chrono::DateTime::from_timestamp(1_800_000_004, 0).map(|t| t.naive_utc())
        )
    );
    assert!(j.reason.is_some());
    // The same plan again writes nothing.
    let (seen, n) = statements(&mut c, |c| {
        record_waiting(c, &pending(1), |id| now.get(&id).map(Waiting::shown), true)
            .unwrap()
            .len()
    });
    assert_eq!(n, 0);
    assert!(
        !seen
            .iter()
            .any(|q| q.contains("UPDATE") || q.contains("INSERT")),
        "{seen:?}"
    );
    // Everyone moved up one place: nothing yet unless moves are written, then one
    // statement for all of them.
    assert_eq!(
        record_waiting(
            &mut c,
            &pending(0),
            |id| now.get(&id).map(Waiting::shown),
            false
        )
        .unwrap()
        .len(),
        0
    );
    assert_eq!(place(&mut c, jobs[4]).0, Some(5));
    let (seen, n) = statements(&mut c, |c| {
        record_waiting(c, &pending(0), |id| now.get(&id).map(Waiting::shown), true)
            .unwrap()
            .len()
    });
    assert_eq!(n, 30);
    // The places alone moved: one statement into `job_places`, and the jobs' own rows
    // are not rewritten.
    assert_eq!(
        seen.iter()
            .filter(|q| q.contains("INSERT INTO job_places"))
            .count(),
        1,
        "{seen:?}"
    );
    assert!(!seen.iter().any(|q| q.contains("UPDATE jobs")), "{seen:?}");
    assert_eq!(place(&mut c, jobs[4]).0, Some(4));
}

#[test]
fn the_start_carries_the_jobs_disk_or_the_campus_default() {
    let (_d, mut c) = sqlite();
    let (_, _, jobs) = queue(&mut c, 1, 1);
    let mut job = db::jobs::get(&mut c, jobs[0]).unwrap();
    assert_eq!(job.disk_gb, None, "none asked: stored as such");
    let facts = StartFacts::read(&mut c, std::iter::once(&job)).unwrap();
    let lease = commons_proto::Lease {
        session: 7,
        seq: 1,
        valid_for_s: 60,
    };
    let disk_of = |job: &Job| match start_msg(job, 1, (&[], None), lease, TIMING, &facts) {
        PortalMsg::Start { spec, .. } => spec.disk_gb,
        other => panic!("{other:?}"),
    };
    assert_eq!(disk_of(&job), Some(TIMING.default_disk_gb));
    job.disk_gb = Some(7);
    assert_eq!(disk_of(&job), Some(7));
}
