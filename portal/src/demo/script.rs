//! The demo's scripted workload: what sharing does, told in about two minutes, on the
//! campus of `campus.rs`. Jobs are submitted through the same use cases the API calls,
//! as the people of the campus; the narration on stdout reports what the portal's
//! database says, as the job pages show it.
//!
//! 1. carol (bio) runs a job on her lab's one GPU.
//! 2. bob (physics) submits four training jobs of one GPU: two run on his lab's server,
//!    two borrow vision's idle GPUs. A fifth, for physics' RTX 4090s only, waits: pat,
//!    physics' admin, lets each member use 4 GPUs at once.
//! 3. Once the guests run, alice (vision) submits a job for both of her lab's GPUs. It
//!    waits while the guests get SIGTERM and the grace period to save `/checkpoint`;
//!    then it runs, and the guests are requeued, waiting with the reason shown.
//! 4. When alice's job ends, the guests start again (attempt 2) from their checkpoints.
//!
//! Each step waits for what it builds on (with a timeout), not for a fixed time, so a
//! slow machine tells the same story, later.

use super::campus::{owner_of, LABS};
use crate::db;
use crate::service::policy::{self, LabQuota, QuotaRequest};
use crate::service::views::{job_views, JobView};
use crate::service::{jobs, Actor, Ctx};
use crate::validate::JobRequest;
use anyhow::Context;
use commons_api::JobState;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// The script's timings.
#[derive(Debug, Clone, Copy)]
pub struct Pace {
    /// The campus grace period (the portal's `policy.default_grace_s`).
    pub grace_s: u32,
    /// How long the guests run before alice wants her GPUs back.
    owner_after: Duration,
    /// How long alice's job runs.
    owner_runs_s: u32,
    /// Steps (one a second) of bob's training jobs and of carol's job.
    train_steps: u32,
    fold_steps: u32,
    /// How long a guest takes to save its checkpoint after SIGTERM (within the grace).
    save_s: u32,
}

/// The pace a person watches.
pub const NORMAL: Pace = Pace {
    grace_s: 60,
    owner_after: Duration::from_secs(15),
    owner_runs_s: 30,
    train_steps: 60,
    fold_steps: 80,
    save_s: 3,
};

/// The same story, shorter (`--fast`, for tests).
pub const FAST: Pace = Pace {
    grace_s: 3,
    owner_after: Duration::from_secs(3),
    owner_runs_s: 6,
    train_steps: 30,
    fold_steps: 40,
    save_s: 1,
};

/// How long any one step may wait for what it builds on.
const STEP_TIMEOUT: Duration = Duration::from_secs(90);

/// A job that counts steps, keeps the count in `/checkpoint` and resumes from it: the
/// checkpoint contract (docs/src/user/checkpoints.md), in plain sh. On SIGTERM it takes
/// `save_s` to "save".
fn steps_job(steps: u32, save_s: u32) -> Vec<String> {
    let script = format!(
        "n=0; [ -f /checkpoint/step ] && n=$(cat /checkpoint/step); \
         if [ \"${{COMMONS_RESUME:-0}}\" = 1 ]; then echo \"resuming at step $n\"; else echo starting; fi; \
         trap 'echo \"SIGTERM at step $n: saving the state\"; sleep {save_s}; echo saved; exit 143' TERM; \
         while [ $n -lt {steps} ]; do n=$((n+1)); echo $n > /checkpoint/t; mv /checkpoint/t /checkpoint/step; \
         echo \"step $n of {steps}\"; sleep 1; done; echo done"
    );
    vec!["sh".into(), "-c".into(), script]
}

fn request(lab: &str, gpus: i64, command: Vec<String>) -> JobRequest {
    // The rest left to the request's defaults, so a field added to the API needs no
    // change here.
    JobRequest {
        command,
        cpus: Some(1.0),
        memory_gb: Some(1.0),
        lab: Some(lab.into()),
        ..JobRequest::new(super::DEMO_IMAGE, gpus, 30)
    }
}

/// What the narration last saw of a job.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    state: JobState,
    attempts: i32,
    node: Option<String>,
    reason: Option<String>,
}

/// The story so far: the clock, and the jobs it follows (by id: who, and what it saw).
struct Story {
    ctx: Ctx,
    pace: Pace,
    t0: Instant,
    jobs: BTreeMap<i64, (&'static str, Option<Seen>)>,
}

impl Story {
    fn say(&self, line: &str) {
        let s = self.t0.elapsed().as_secs();
        println!("[{}:{:02}] {line}", s / 60, s % 60);
    }

    async fn actor(&self, username: &'static str) -> anyhow::Result<Actor> {
        self.ctx
            .db
            .run(move |c| {
                let user = db::users::user_by_name(c, username)?
                    .ok_or(crate::error::AppError::NotFound("user"))?;
                let labs = db::users::labs_of(c, user.id)?;
                Ok::<_, crate::error::AppError>(Actor { user, labs })
            })
            .await
            .with_context(|| format!("the demo user {username}"))
    }

    async fn submit(&mut self, who: &'static str, req: JobRequest) -> anyhow::Result<i64> {
        let actor = self.actor(who).await?;
        let job = jobs::submit(&self.ctx, &actor, req)
            .await
            .with_context(|| format!("submitting {who}'s job"))?;
        self.jobs.insert(job.id, (who, None));
        Ok(job.id)
    }

    async fn views(&self) -> anyhow::Result<Vec<JobView>> {
        let ids: Vec<i64> = self.jobs.keys().copied().collect();
        Ok(self
            .ctx
            .db
            .run(move |c| {
                let rows = ids
                    .iter()
                    .map(|id| db::jobs::get(c, *id))
                    .collect::<Result<Vec<_>, _>>()?;
                job_views(c, &rows)
            })
            .await?)
    }

    /// Reads the jobs once, tells what changed; their views, by id.
    async fn observe(&mut self) -> anyhow::Result<BTreeMap<i64, JobView>> {
        let views = self.views().await?;
        let mut lines = Vec::new();
        for v in &views {
            let Some((who, seen)) = self.jobs.get_mut(&v.id) else {
                continue;
            };
            let now = Seen {
                state: v.state,
                attempts: v.attempts,
                node: v.node.clone(),
                reason: v.reason.clone(),
            };
            if seen.as_ref() != Some(&now) {
                if let Some(line) = tell(v, who, seen.as_ref(), &now, self.pace.grace_s) {
                    lines.push(line);
                }
                *seen = Some(now);
            }
        }
        for l in lines {
            self.say(&l);
        }
        Ok(views.into_iter().map(|v| (v.id, v)).collect())
    }

    /// Observes every half second until `done` holds for the jobs' views.
    async fn until(
        &mut self,
        what: &str,
        done: impl Fn(&BTreeMap<i64, JobView>) -> bool,
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + STEP_TIMEOUT;
        loop {
            if done(&self.observe().await?) {
                return Ok(());
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "the demo script waited {STEP_TIMEOUT:?} for {what}; see the agents' logs"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

/// The narration of one change of a job, if it is worth a line.
fn tell(v: &JobView, who: &str, before: Option<&Seen>, now: &Seen, grace_s: u32) -> Option<String> {
    let job = format!("job {} ({who}, {})", v.id, v.lab);
    let moved = before.is_none_or(|b| b.state != now.state || b.attempts != now.attempts);
    match now.state {
        JobState::Running if moved => {
            let node = now.node.as_deref().unwrap_or("?");
            let whose = match owner_of(node) {
                Some(lab) if lab == v.lab => "its lab's own server".to_string(),
                Some(lab) => format!("a guest on {lab}'s idle GPUs"),
                None => "another server".to_string(),
            };
            let resumed = if now.attempts > 1 {
                match v.last_checkpoint_at {
                    Some(at) => format!(
                        ", attempt {}, resumed from its checkpoint of {} UTC",
                        now.attempts,
                        at.format("%H:%M:%S")
                    ),
                    None => format!(", attempt {}", now.attempts),
                }
            } else {
                String::new()
            };
            Some(format!("{job} runs on {node}: {whose}{resumed}"))
        }
        JobState::Preempting if moved => Some(format!(
            "{job} is preempted on {}: SIGTERM, then {grace_s} s to save /checkpoint",
            now.node.as_deref().unwrap_or("its server")
        )),
        JobState::Queued => {
            let requeued =
                before.is_some_and(|b| matches!(b.state, JobState::Running | JobState::Preempting));
            let reason_changed = before.and_then(|b| b.reason.as_ref()) != now.reason.as_ref();
            // Every new job says this until the scheduler's next round: not worth a line.
            let reason = now
                .reason
                .as_ref()
                .filter(|r| *r != "waiting for the scheduler");
            match reason {
                Some(r) if requeued => Some(format!("{job} is requeued; it waits: {r}")),
                None if requeued => Some(format!("{job} is requeued")),
                Some(r) if reason_changed => Some(format!("{job} waits: {r}")),
                _ => None,
            }
        }
        JobState::Succeeded | JobState::Failed | JobState::Cancelled if moved => {
            Some(format!("{job} {}", now.state))
        }
        _ => None,
    }
}

/// Cancels the unfinished jobs of the demo's people, left from an earlier run, so the
/// story starts on idle servers.
async fn cancel_leftovers(story: &Story) -> anyhow::Result<usize> {
    let mut n = 0;
    for lab in &LABS {
        for (name, _) in lab.people {
            let actor = story.actor(name).await?;
            for j in jobs::list(&story.ctx, &actor, 200).await? {
                // `list` is the actor's own jobs.
                if !j.state.is_final() {
                    jobs::cancel(&story.ctx, &actor, j.id).await?;
                    n += 1;
                }
            }
        }
    }
    Ok(n)
}

fn on_node<'a>(views: &'a BTreeMap<i64, JobView>, ids: &[i64]) -> Vec<&'a JobView> {
    ids.iter().filter_map(|id| views.get(id)).collect()
}

/// Runs the story; returns when it is told (every job it started has ended).
pub async fn run(ctx: Ctx, pace: Pace) -> anyhow::Result<()> {
    let mut story = Story {
        ctx,
        pace,
        t0: Instant::now(),
        jobs: BTreeMap::new(),
    };
    let left = cancel_leftovers(&story).await?;
    if left > 0 {
        story.say(&format!(
            "cancelled {left} unfinished jobs of an earlier demo run"
        ));
    }
    wait_for_servers(&story).await?;

    physics_quota(&story).await?;
    carol_runs(&mut story).await?;
    let borrowed = bob_borrows(&mut story).await?;
    alice_takes_back(&mut story, &borrowed).await?;
    story
        .until("every job of the story to end", |v| {
            v.values().all(|j| j.state.is_final())
        })
        .await?;
    story.say(
        "the story is told; the campus keeps running: log in, submit jobs, \
         take a server's GPUs back with `commons-agent reclaim --now --state-dir ...`",
    );
    Ok(())
}

/// pat, physics' admin, sets the member quota.
async fn physics_quota(story: &Story) -> anyhow::Result<()> {
    let pat = story.actor("pat").await?;
    policy::set_lab_quota(
        &story.ctx,
        &pat,
        "physics".into(),
        QuotaRequest {
            max_gpus: Some(4),
            max_gpu_hours: None,
            max_job_minutes: None,
        },
        LabQuota::MemberDefault,
    )
    .await
    .context("setting physics' member quota")?;
    story.say("pat, physics' admin, lets each member use 4 GPUs at once");

    Ok(())
}

/// carol (bio) runs a job on her lab's server.
async fn carol_runs(story: &mut Story) -> anyhow::Result<()> {
    let pace = story.pace;
    let carol = story
        .submit(
            "carol",
            request("bio", 1, steps_job(pace.fold_steps, pace.save_s)),
        )
        .await?;
    story.say(&format!("carol (bio) submits job {carol}, one GPU"));
    story
        .until("carol's job to run", |v| {
            v.get(&carol).is_some_and(|j| j.state == JobState::Running)
        })
        .await?;

    Ok(())
}

/// bob (physics) submits more than his lab has: vision's idle GPUs take the rest. Returns
/// the jobs that run there.
async fn bob_borrows(story: &mut Story) -> anyhow::Result<Vec<i64>> {
    let pace = story.pace;
    let mut guests = Vec::new();
    for _ in 0..4 {
        guests.push(
            story
                .submit(
                    "bob",
                    request("physics", 1, steps_job(pace.train_steps, pace.save_s)),
                )
                .await?,
        );
    }
    let mut rtx = request("physics", 1, steps_job(pace.train_steps, pace.save_s));
    rtx.gpu_models = vec!["RTX4090-24GB".into()];
    let fifth = story.submit("bob", rtx).await?;
    story.say(&format!(
        "bob (physics) submits jobs {}-{}, one GPU each (his lab has two), and job {fifth} \
         for an RTX 4090 only",
        guests[0], guests[3]
    ));
    story
        .until("bob's four jobs to run", |v| {
            on_node(v, &guests)
                .iter()
                .all(|j| j.state == JobState::Running)
        })
        .await?;
    let borrowed: Vec<i64> = {
        let v = story.observe().await?;
        on_node(&v, &guests)
            .iter()
            .filter(|j| j.node.as_deref().and_then(owner_of) == Some("vision"))
            .map(|j| j.id)
            .collect()
    };
    story.say(&format!(
        "vision's idle GPUs run physics' jobs {borrowed:?}; log in as bob to watch them"
    ));

    Ok(borrowed)
}

/// alice (vision) wants her lab's GPUs back: the guests are preempted and run again.
async fn alice_takes_back(story: &mut Story, borrowed: &[i64]) -> anyhow::Result<()> {
    let pace = story.pace;
    let t = Instant::now();
    while t.elapsed() < pace.owner_after {
        story.observe().await?;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let render = format!(
        "echo rendering on GPUs $NVIDIA_VISIBLE_DEVICES; sleep {}; echo rendered",
        pace.owner_runs_s
    );
    let submitted = Instant::now();
    let alice = story
        .submit(
            "alice",
            request("vision", 2, vec!["sh".into(), "-c".into(), render]),
        )
        .await?;
    story.say(&format!(
        "alice (vision) wants her lab's GPUs back: job {alice}, two GPUs on vision-gpu1"
    ));
    story
        .until("alice's job to run", |v| {
            v.get(&alice).is_some_and(|j| j.state == JobState::Running)
        })
        .await?;
    story.say(&format!(
        "alice's job {alice} runs {:.0} s after she submitted it (grace period {} s): \
         the owner comes first",
        submitted.elapsed().as_secs_f64(),
        pace.grace_s
    ));
    story
        .until("alice's job to end", |v| {
            v.get(&alice).is_some_and(|j| j.state.is_final())
        })
        .await?;
    story
        .until("the guests to run again", |v| {
            on_node(v, borrowed)
                .iter()
                .all(|j| j.state == JobState::Running || j.state.is_final())
        })
        .await?;
    Ok(())
}

/// Waits until every server of the campus is online.
async fn wait_for_servers(story: &Story) -> anyhow::Result<()> {
    let deadline = Instant::now() + STEP_TIMEOUT;
    loop {
        // Connected to this portal now: the database's `online` may still be from a run
        // that ended without a goodbye.
        let nodes = story.ctx.db.run(db::nodes::list_with_gpus).await?;
        let up = LABS
            .iter()
            .filter(|l| {
                nodes.iter().any(|(n, _, _)| {
                    n.name == l.server && n.online && story.ctx.agents.is_connected(n.id)
                })
            })
            .count();
        if up == LABS.len() {
            story.say("the three labs' servers are online");
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "only {up} of the {} demo servers came online; see their agent.log",
            LABS.len()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}
