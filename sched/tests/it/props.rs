//! Property tests over random snapshots: the invariants every plan keeps.

use std::collections::{BTreeMap, BTreeSet};

use commons_sched::*;
use proptest::prelude::*;

use crate::support::*;

const MODELS: [&str; 3] = ["A100", "T4", "A100"];

fn arb_lending() -> impl Strategy<Value = Lending> {
    (
        0..4u8,
        prop::option::of(0..4u32),
        prop::sample::select(vec![0i64, 1800]),
        prop::option::of(prop::sample::select(vec![1800i64, 4 * 3600])),
        prop::sample::select(vec![vec![], vec![1], vec![2, 3]]),
        prop::bool::weighted(0.5),
    )
        .prop_map(
            |(mode, max_lent, idle, longest, borrowers, share_gpus)| Lending {
                mode: match mode {
                    0 | 1 => LendMode::Always,
                    2 => LendMode::Never,
                    _ => LendMode::Windows,
                },
                windows: WeeklyWindow::daily(&[0, 1, 2, 3, 4], 11 * 60, 15 * 60),
                max_lent_gpus: max_lent,
                min_idle_s: idle,
                max_guest_time_limit_s: longest,
                borrowers,
                share_gpus,
            },
        )
}

fn arb_quota() -> impl Strategy<Value = Quota> {
    (
        prop::option::of(0..6u32),
        prop::option::of(prop::sample::select(vec![5.0f64, 20.0, 200.0])),
        prop::option::of(prop::sample::select(vec![3600i64, 4 * 3600])),
    )
        .prop_map(|(g, h, t)| Quota {
            max_gpus: g,
            max_gpu_hours: h,
            max_time_limit_s: t,
        })
}

/// (owner lab, GPUs as (model, local use, idle since), lending, schedulable, reclaim).
type NodeSpec = (LabId, Vec<(usize, bool, Option<i64>)>, Lending, bool, bool);

fn arb_node() -> impl Strategy<Value = NodeSpec> {
    (
        1..4i64,
        prop::collection::vec(
            (
                0..2usize,
                prop::bool::weighted(0.1),
                prop::option::of(-7200..0i64),
            ),
            1..6,
        ),
        arb_lending(),
        prop::bool::weighted(0.9),
        prop::bool::weighted(0.05),
    )
}

/// Random campus: nodes of labs 1..3, running jobs on some GPUs, a queue from labs 1..4.
fn arb_snapshot() -> impl Strategy<Value = Snapshot> {
    (
        prop::collection::vec(arb_node(), 1..5),
        prop::collection::vec(
            (
                1..5i64,
                0..3i64,
                1..4u32,
                0..2usize,
                prop::bool::ANY,
                0..4u8,
                prop::bool::weighted(0.3),
                0..6u8,
            ),
            0..20,
        ),
        prop::collection::vec(
            (
                1..5i64,
                prop::option::of(arb_quota()),
                0.0..300f64,
                any::<bool>(),
            ),
            0..4,
        ),
        prop::collection::vec((1..5i64, 0..3i64, arb_quota()), 0..5),
        prop::collection::vec(
            (1..5i64, 0..3i64, 0..100usize, any::<bool>(), 0..3u8, 0..4u8),
            0..12,
        ),
    )
        .prop_map(|(nodes, queue, labs, members, running)| {
            let mut snapshot = Snapshot::default();
            let mut gpu_id = 0;
            for (i, (lab, gpus, lending, schedulable, reclaim)) in nodes.into_iter().enumerate() {
                let mut n = node(i as i64 + 1, lab, 0, 0, "", 0);
                n.lending = lending;
                n.schedulable = schedulable;
                n.reclaim = reclaim;
                n.grace_s = (i as u32) * 60;
                // Every other node has owner return rates: risk placement and the
                // re-lending hysteresis take part in every invariant below.
                if i % 2 == 0 {
                    n.owner_return_rate = (0..168).map(|h| f64::from(h % 3) * 0.2).collect();
                }
                for (m, local, idle) in gpus {
                    gpu_id += 1;
                    // Kind 2 is a MIG slice of an A100.
                    n.gpus.push(Gpu {
                        id: gpu_id,
                        model: MODELS[m].into(),
                        memory_mb: [80, 16, 10][m] * 1024,
                        local_use: local,
                        idle_since: idle.map_or(0, |d| NOW + d),
                        mig_profile: (m == 2).then(|| "1g.10gb".into()),
                    });
                }
                snapshot.nodes.push(n);
            }
            // Running jobs take consecutive free GPUs of one node; some hold a share of
            // the first GPU (not MIG, not held whole) with room for it.
            let mut taken = BTreeSet::new();
            let mut shared: BTreeMap<GpuId, (u32, u64)> = BTreeMap::new();
            for (k, (lab, user, pick, ckpt, size, kind)) in running.into_iter().enumerate() {
                let n = &snapshot.nodes[pick % snapshot.nodes.len()];
                let share = share_of(kind);
                let gpus: Vec<GpuId> = if let Some(sh) = share {
                    let room = n.gpus.iter().find(|g| {
                        let (m, mb) = shared.get(&g.id).copied().unwrap_or((0, 0));
                        !taken.contains(&g.id)
                            && g.mig_profile.is_none()
                            && m + sh.milli <= 1000
                            && mb + sh.memory_mb <= g.memory_mb
                    });
                    let Some(g) = room else { continue };
                    let e = shared.entry(g.id).or_default();
                    e.0 += sh.milli;
                    e.1 += sh.memory_mb;
                    vec![g.id]
                } else {
                    let free: Vec<GpuId> = n
                        .gpus
                        .iter()
                        .map(|g| g.id)
                        .filter(|g| !taken.contains(g) && !shared.contains_key(g))
                        .collect();
                    let want = usize::from(size) + 1;
                    if free.len() < want {
                        continue;
                    }
                    free[..want].to_vec()
                };
                if share.is_none() {
                    taken.extend(gpus.iter().copied());
                }
                let started = NOW - (k as i64 + 1) * 1000;
                snapshot.running.push(RunningJob {
                    id: 1000 + k as i64,
                    user: user + 10 * lab,
                    lab,
                    node: n.id,
                    gpus,
                    started_at: started,
                    time_limit_s: if k % 3 == 0 { 0 } else { 6 * H },
                    preempting: k % 5 == 4,
                    last_checkpoint_at: ckpt.then_some(started + 500),
                    share,
                    ..Default::default()
                });
            }
            for (i, (lab, user, gpus, kind, strict, limit, interactive, share)) in
                queue.into_iter().enumerate()
            {
                let mut j = job(i as i64 + 1, lab, user + 10 * lab, gpus);
                j.interactive = interactive;
                // Some jobs ask for a share of one GPU: as a fraction, as memory, or both.
                j.share = match share {
                    3 => Some(GpuShare {
                        milli: 500,
                        memory_mb: 0,
                    }),
                    4 => Some(GpuShare {
                        milli: 0,
                        memory_mb: 30 * 1024,
                    }),
                    5 => Some(GpuShare {
                        milli: 250,
                        memory_mb: 8 * 1024,
                    }),
                    _ => None,
                };
                if j.share.is_some() {
                    j.gpus = 1;
                }
                match (strict, kind) {
                    (false, 0) => {}
                    (false, _) => j.min_memory_mb = 40 * 1024,
                    (true, 0) => j.models = vec![MODELS[0].into()],
                    (true, 1) => j.models = vec![MODELS[1].into()],
                    (true, _) => j.mig_profile = Some("1g.10gb".into()),
                }
                j.time_limit_s = [0, 1800, H, 5 * H][usize::from(limit)];
                // Every third job was taken back before, some recently, some long ago.
                j.take_backs = (i % 3 == 1) as u32 * (1 + (i % 4) as u32);
                j.taken_back_at = NOW - (i as i64 % 5) * 2 * H;
                snapshot.queue.push(j);
            }
            let mut seen = BTreeSet::new();
            for (id, quota, used, interactive_boost) in labs {
                if seen.insert(id) {
                    snapshot.labs.push(LabInfo {
                        id,
                        quota: quota.unwrap_or_default(),
                        period_gpu_hours: used / 10.0,
                        lent_gpu_hours: 300.0 - used,
                        used_gpu_hours: used,
                        ledger_at: NOW - 3600,
                        base_share_gpu_hours: None,
                        interactive_boost,
                    });
                }
            }
            let mut seen = BTreeSet::new();
            for (lab, user, quota) in members {
                if seen.insert((lab, user)) {
                    snapshot.members.push(MemberInfo {
                        lab,
                        user: user + 10 * lab,
                        quota,
                        ..Default::default()
                    });
                }
            }
            snapshot
        })
}

/// What a running job of generator kind `kind` holds: a share (kinds 2 and 3) or whole GPUs.
fn share_of(kind: u8) -> Option<GpuShare> {
    match kind {
        2 => Some(GpuShare {
            milli: 500,
            memory_mb: 20 * 1024,
        }),
        3 => Some(GpuShare {
            milli: 250,
            memory_mb: 6 * 1024,
        }),
        _ => None,
    }
}

/// GPUs a running job holds, a share counting as its fraction.
fn gpus_held(r: &RunningJob) -> f64 {
    r.share
        .map_or(r.gpus.len() as f64, |s| f64::from(s.milli) / 1000.0)
}

fn owner_of(s: &Snapshot) -> BTreeMap<NodeId, LabId> {
    s.nodes.iter().map(|n| (n.id, n.lab)).collect()
}

/// (gpus, committed GPU-hours) held by jobs matching `pick`, as the quota rules count.
fn held(s: &Snapshot, now: Time, pick: impl Fn(&RunningJob) -> bool) -> (f64, f64) {
    s.running
        .iter()
        .filter(|r| pick(r))
        .fold((0.0, 0.0), |(g, h), r| {
            let left = if r.time_limit_s > 0 {
                (r.started_at + r.time_limit_s - now).max(0) as f64 / 3600.0
            } else {
                0.0
            };
            (g + gpus_held(r), h + gpus_held(r) * left)
        })
}

fn quota_ok(q: &Quota, (gpus, hours): (f64, f64), period: f64, limits: &[i64]) -> bool {
    q.max_gpus.is_none_or(|m| gpus <= f64::from(m) + 1e-9)
        && q.max_gpu_hours.is_none_or(|m| period + hours <= m + 1e-6)
        && q.max_time_limit_s
            .is_none_or(|m| limits.iter().all(|&l| l > 0 && l <= m))
}

/// Every lending rule of node `n` holds for guest job `j` started on `gpus`.
fn lent_by_rules(
    n: &Node,
    j: &QueuedJob,
    gpus: &[GpuId],
    now: Time,
    s: &Snapshot,
    p: &Plan,
    utc_offset_s: i32,
) -> Result<(), TestCaseError> {
    let rules = &n.lending;
    prop_assert!(!n.reclaim && rules.mode != LendMode::Never);
    prop_assert!(rules.borrowers.is_empty() || rules.borrowers.contains(&j.lab));
    if let Some(max) = rules.max_guest_time_limit_s {
        prop_assert!(j.time_limit_s > 0 && j.time_limit_s <= max);
    }
    if rules.mode == LendMode::Windows {
        let until = rules.lend_until(now, utc_offset_s);
        prop_assert!(until.is_some_and(|u| j.time_limit_s > 0 && now + j.time_limit_s <= u));
    }
    for g in gpus {
        let gpu = n.gpus.iter().find(|x| x.id == *g).unwrap();
        prop_assert!(
            gpu.idle_since <= now - rules.min_idle_s,
            "GPU {} not idle long enough",
            g
        );
    }
    if let Some(max) = rules.max_lent_gpus {
        let owners = owner_of(s);
        // A GPU with guest shares counts once.
        let guest_gpus = s
            .running
            .iter()
            .filter(|r| r.node == n.id && owners.get(&r.node) != Some(&r.lab))
            .flat_map(|r| r.gpus.iter().copied())
            .chain(
                p.start
                    .iter()
                    .filter(|st| st.node == n.id)
                    .filter(|st| s.queue.iter().any(|q| q.id == st.job && q.lab != n.lab))
                    .flat_map(|st| st.gpus.iter().copied()),
            )
            .collect::<BTreeSet<GpuId>>()
            .len();
        prop_assert!(
            guest_gpus <= max as usize,
            "node {} lends {} > {}",
            n.id,
            guest_gpus,
            max
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000,
        ..ProptestConfig::default() })]

    #[test]
    fn plans_keep_every_invariant(
        s in arb_snapshot(),
        offset in 0..(7 * 24 * 3600i64),
        min_runtime_s in prop::sample::select(vec![0i64, 600]),
        backfill_depth in prop::sample::select(vec![0u32, 3, 64]),
        running_charge_gpu_hours in prop::sample::select(vec![0.0f64, 1.0, 50.0]),
        taken_back_max_risk in prop::sample::select(vec![0.0f64, 0.05, 0.3]),
    ) {
        let now = NOW + offset - offset % 600;
        let policy = Policy {
            min_runtime_s,
            backfill_depth,
            running_charge_gpu_hours,
            taken_back_max_risk,
            ..Default::default()
        };
        let p = plan(&s, &policy, now);
        let owners = owner_of(&s);

        // Same snapshot, same plan; and the order of the input does not matter.
        prop_assert_eq!(&plan(&s, &policy, now), &p);
        let mut shuffled = s.clone();
        shuffled.nodes.reverse();
        shuffled.queue.reverse();
        shuffled.running.reverse();
        prop_assert_eq!(&plan(&shuffled, &policy, now), &p);

        // No GPU in two jobs, whole or a whole and shares; shares never over-allocate
        // compute or memory, and go only to sharing nodes' whole GPUs; starts only on
        // free, matching, schedulable GPUs, one node.
        let mut used: BTreeSet<GpuId> = s.running.iter().filter(|r| r.share.is_none())
            .flat_map(|r| r.gpus.clone()).collect();
        let mut shared: BTreeMap<GpuId, (u32, u64)> = BTreeMap::new();
        for r in s.running.iter().filter(|r| r.share.is_some()) {
            let sh = r.share.unwrap();
            let e = shared.entry(r.gpus[0]).or_default();
            e.0 += sh.milli;
            e.1 += sh.memory_mb;
        }
        for st in &p.start {
            let j = s.queue.iter().find(|q| q.id == st.job).unwrap();
            let n = s.nodes.iter().find(|n| n.id == st.node).unwrap();
            prop_assert!(n.schedulable);
            prop_assert_eq!(st.gpus.len() as u32, j.gpus);
            if let Some(ask) = j.share {
                let sh = st.share.unwrap();
                prop_assert!(n.lending.share_gpus, "share on non-sharing node {}", n.id);
                prop_assert!(sh.milli > 0 && sh.memory_mb > 0);
                prop_assert!(ask.milli == 0 || ask.milli == sh.milli);
                prop_assert!(ask.memory_mb == 0 || ask.memory_mb == sh.memory_mb);
                let g = st.gpus[0];
                let gpu = n.gpus.iter().find(|x| x.id == g).unwrap();
                prop_assert!(!used.contains(&g), "share on GPU {} held whole", g);
                prop_assert!(gpu.mig_profile.is_none() && !gpu.local_use);
                prop_assert!(j.models.is_empty() || j.models.contains(&gpu.model));
                prop_assert!(gpu.memory_mb >= j.min_memory_mb);
                let e = shared.entry(g).or_default();
                e.0 += sh.milli;
                e.1 += sh.memory_mb;
                prop_assert!(e.0 <= 1000 && e.1 <= gpu.memory_mb, "GPU {} over-allocated: {:?}", g, e);
                if n.lab != j.lab {
                    lent_by_rules(n, j, &st.gpus, now, &s, &p, policy.utc_offset_s)?;
                }
                continue;
            }
            prop_assert!(st.share.is_none());
            for g in &st.gpus {
                prop_assert!(!shared.contains_key(g), "whole job on GPU {} with shares", g);
                prop_assert!(used.insert(*g), "GPU {} given twice", g);
                let gpu = n.gpus.iter().find(|x| x.id == *g).unwrap();
                prop_assert!(!gpu.local_use);
                prop_assert!(j.models.is_empty() || j.models.contains(&gpu.model));
                prop_assert!(gpu.memory_mb >= j.min_memory_mb);
                prop_assert_eq!(&gpu.mig_profile, &j.mig_profile);
            }
            if n.lab != j.lab {
                lent_by_rules(n, j, &st.gpus, now, &s, &p, policy.utc_offset_s)?;
            }
        }

        // No guest starts on the matching GPUs of the node an owner job waits on.
        for pe in &p.pending {
            let node_name = match &pe.reason {
                Reason::WaitingForOwnJobs { node } | Reason::WaitingForGuestsToLeave { node, .. } => node,
                _ => continue,
            };
            let owner_job = s.queue.iter().find(|q| q.id == pe.job).unwrap();
            let n = s.nodes.iter().find(|n| &n.name == node_name).unwrap();
            for st in p.start.iter().filter(|st| st.node == n.id) {
                let j = s.queue.iter().find(|q| q.id == st.job).unwrap();
                if j.lab == n.lab {
                    continue;
                }
                for g in &st.gpus {
                    // A share beside other guests' shares takes nothing the owner job
                    // could have used whole.
                    let beside = st.share.is_some()
                        && (s.running.iter().any(|r| r.share.is_some() && r.gpus == [*g])
                            || p.start.iter().any(|o| o.job != st.job && o.gpus == [*g]));
                    if beside && owner_job.share.is_none() {
                        continue;
                    }
                    let gpu = n.gpus.iter().find(|x| x.id == *g).unwrap();
                    let matches = (owner_job.models.is_empty() || owner_job.models.contains(&gpu.model))
                        && gpu.memory_mb >= owner_job.min_memory_mb
                        && gpu.mig_profile == owner_job.mig_profile
                        && owner_job.share.is_none_or(|sh| gpu.memory_mb >= sh.memory_mb);
                    prop_assert!(!matches, "guest {} took GPU {} that owner job {} waits for", j.id, g, pe.job);
                }
            }
        }

        // Only guests are preempted, once, and never a job this plan started.
        let mut seen = BTreeSet::new();
        for pr in &p.preempt {
            let r = s.running.iter().find(|r| r.id == pr.job).unwrap();
            prop_assert!(seen.insert(pr.job));
            prop_assert!(!r.preempting);
            prop_assert_ne!(owners.get(&r.node).copied(), Some(r.lab), "owner job preempted");
        }

        // Every queued job starts or waits with a reason; positions are 1..=n.
        let queued: BTreeSet<JobId> = s.queue.iter().map(|q| q.id).collect();
        let mut decided: BTreeSet<JobId> = started(&p).into_iter().collect();
        for (i, pe) in p.pending.iter().enumerate() {
            prop_assert_eq!(pe.position as usize, i + 1);
            prop_assert!(decided.insert(pe.job), "job {} decided twice", pe.job);
            prop_assert!(!pe.reason.to_string().is_empty());
            // An estimated start is never in the past.
            prop_assert!(pe.estimated_start.is_none_or(|e| e >= now), "{:?}", pe);
        }
        prop_assert_eq!(decided, queued);

        // No quota exceeded by what this plan starts.
        let next = apply(&s, &p, now);
        for st in &p.start {
            let j = s.queue.iter().find(|q| q.id == st.job).unwrap();
            if let Some(m) = s.members.iter().find(|m| m.lab == j.lab && m.user == j.user) {
                let usage = held(&next, now, |r| r.lab == j.lab && r.user == j.user);
                prop_assert!(quota_ok(&m.quota, usage, m.period_gpu_hours, &[j.time_limit_s]),
                    "member quota of {:?} exceeded", (j.lab, j.user));
            }
            let guest = owners.get(&st.node) != Some(&j.lab);
            if let (true, Some(l)) = (guest, s.labs.iter().find(|l| l.id == j.lab)) {
                let usage = held(&next, now, |r| r.lab == j.lab && owners.get(&r.node) != Some(&r.lab));
                prop_assert!(quota_ok(&l.quota, usage, l.period_gpu_hours, &[j.time_limit_s]),
                    "lab quota of {} exceeded", j.lab);
            }
        }

        // A lab's boosted interactive job is never passed over by a batch job of the same
        // member asking for exactly the same (so both face the same quotas and GPUs).
        let boosting: BTreeSet<LabId> =
            s.labs.iter().filter(|l| l.interactive_boost).map(|l| l.id).collect();
        let starts: BTreeSet<JobId> = started(&p).into_iter().collect();
        let same = |a: &QueuedJob, b: &QueuedJob| {
            (a.lab, a.user, a.gpus, &a.models, a.min_memory_mb, &a.mig_profile, a.time_limit_s, a.share)
                == (b.lab, b.user, b.gpus, &b.models, b.min_memory_mb, &b.mig_profile, b.time_limit_s, b.share)
        };
        for a in s.queue.iter().filter(|q| q.interactive && boosting.contains(&q.lab)) {
            for b in s.queue.iter().filter(|b| !b.interactive && same(a, b)) {
                prop_assert!(!starts.contains(&b.id) || starts.contains(&a.id),
                    "batch job {} started before boosted interactive job {}", b.id, a.id);
            }
        }

        // Planning again after applying the plan changes nothing.
        let again = plan(&next, &policy, now);
        prop_assert!(again.start.is_empty(), "second plan starts {:?}", again.start);
        prop_assert!(again.preempt.is_empty(), "second plan preempts {:?}", again.preempt);
    }
}
