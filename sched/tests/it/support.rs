//! Builders for snapshots, and the "apply a plan" step the portal performs.

use commons_sched::*;

/// Monday 2024-01-01 12:00 UTC.
pub const NOW: Time = 1_704_067_200 + 12 * 3600;
pub const H: i64 = 3600;

/// A schedulable node of `lab` with GPUs `first..first+count` of one model.
pub fn node(id: NodeId, lab: LabId, first: GpuId, count: i64, model: &str, gb: u64) -> Node {
    Node {
        id,
        name: format!("n{id}"),
        lab,
        schedulable: true,
        gpus: (first..first + count)
            .map(|g| Gpu {
                id: g,
                model: model.into(),
                memory_mb: gb * 1024,
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

/// A 1-hour job of `gpus` GPUs, submitted in id order.
pub fn job(id: JobId, lab: LabId, user: UserId, gpus: u32) -> QueuedJob {
    QueuedJob {
        id,
        user,
        lab,
        gpus,
        time_limit_s: H,
        submitted_at: NOW - 1000 + id,
        ..Default::default()
    }
}

/// A job running since `started_at` with a 24-hour limit.
pub fn run(id: JobId, lab: LabId, node: NodeId, gpus: &[GpuId], started_at: Time) -> RunningJob {
    RunningJob {
        id,
        user: 100 + lab,
        lab,
        node,
        gpus: gpus.to_vec(),
        started_at,
        time_limit_s: 24 * H,
        ..Default::default()
    }
}

pub fn snap(nodes: Vec<Node>, running: Vec<RunningJob>, queue: Vec<QueuedJob>) -> Snapshot {
    Snapshot {
        nodes,
        running,
        queue,
        ..Default::default()
    }
}

pub fn started(plan: &Plan) -> Vec<JobId> {
    plan.start.iter().map(|s| s.job).collect()
}

pub fn preempted(plan: &Plan) -> Vec<JobId> {
    plan.preempt.iter().map(|p| p.job).collect()
}

pub fn reason(plan: &Plan, job: JobId) -> Reason {
    plan.pending
        .iter()
        .find(|p| p.job == job)
        .unwrap_or_else(|| panic!("job {job} is not pending in {plan:#?}"))
        .reason
        .clone()
}

/// What the portal does with a plan: started jobs run, preempted ones are stopping.
pub fn apply(s: &Snapshot, plan: &Plan, now: Time) -> Snapshot {
    let mut next = s.clone();
    for st in &plan.start {
        let q = s.queue.iter().find(|q| q.id == st.job).unwrap();
        next.running.push(RunningJob {
            id: q.id,
            user: q.user,
            lab: q.lab,
            node: st.node,
            gpus: st.gpus.clone(),
            started_at: now,
            time_limit_s: q.time_limit_s,
            share: st.share,
            ..Default::default()
        });
    }
    next.queue
        .retain(|q| !plan.start.iter().any(|st| st.job == q.id));
    for p in &plan.preempt {
        let r = next.running.iter_mut().find(|r| r.id == p.job).unwrap();
        r.preempting = true;
    }
    next
}
