//! Node capacity: jobs' CPUs, memory and disk are placed against what the servers
//! report, and a server under its disk floor takes no new guest.

use crate::support::*;
use commons_sched::*;

const GB: u64 = 1024;

fn sized(mut n: Node, cpus: f64, memory_gb: u64) -> Node {
    n.cpus = cpus;
    n.memory_mb = memory_gb * GB;
    n
}

fn asking(mut j: QueuedJob, cpus: f64, memory_gb: u64) -> QueuedJob {
    j.cpus = cpus;
    j.memory_mb = memory_gb * GB;
    j
}

fn go(s: &Snapshot) -> Plan {
    plan(s, &Policy::default(), NOW)
}

#[test]
fn a_job_larger_than_every_server_waits_with_that_reason() {
    let s = snap(
        vec![sized(node(1, 1, 10, 4, "A100-80GB", 80), 16.0, 128)],
        vec![],
        vec![asking(job(1, 2, 20, 1), 32.0, 64)],
    );
    let p = go(&s);
    assert!(p.start.is_empty(), "{p:?}");
    let r = reason(&p, 1);
    assert!(matches!(r, Reason::NoNodeCapacity { .. }), "{r:?}");
    assert!(r.to_string().contains("32 CPUs"), "{r}");
    // Memory alone too.
    let s = snap(
        vec![sized(node(1, 1, 10, 4, "A100-80GB", 80), 16.0, 128)],
        vec![],
        vec![asking(job(1, 2, 20, 1), 4.0, 256)],
    );
    assert!(reason(&go(&s), 1).to_string().contains("256 GB of memory"));
}

#[test]
fn the_server_that_has_room_gets_the_job() {
    // Best fit would pick node 1 (fewest free GPUs left), but it has too few CPUs.
    let s = snap(
        vec![
            sized(node(1, 1, 10, 1, "A100-80GB", 80), 8.0, 64),
            sized(node(2, 1, 20, 4, "A100-80GB", 80), 64.0, 512),
        ],
        vec![],
        vec![asking(job(1, 2, 20, 1), 16.0, 32)],
    );
    let p = go(&s);
    assert_eq!(p.start[0].node, 2, "{p:?}");
}

#[test]
fn cpus_in_use_are_not_given_twice() {
    // 16 CPUs, 12 held by a running guest: a 8-CPU job waits though GPUs are free.
    let mut r = run(7, 3, 1, &[10], NOW - 60);
    r.cpus = 12.0;
    r.memory_mb = 8 * GB;
    let s = snap(
        vec![sized(node(1, 1, 10, 4, "A100-80GB", 80), 16.0, 128)],
        vec![r],
        vec![
            asking(job(1, 2, 20, 1), 8.0, 8),
            asking(job(2, 2, 21, 1), 4.0, 8),
        ],
    );
    let p = go(&s);
    assert_eq!(
        started(&p),
        vec![2],
        "the job that fits in what is left starts"
    );
    assert!(matches!(reason(&p, 1), Reason::WaitingForGpus { .. }));
    // Two jobs that each fit do not both start when together they do not.
    let s = snap(
        vec![sized(node(1, 1, 10, 4, "A100-80GB", 80), 16.0, 128)],
        vec![],
        vec![
            asking(job(1, 2, 20, 1), 10.0, 8),
            asking(job(2, 2, 21, 1), 10.0, 8),
        ],
    );
    assert_eq!(go(&s).start.len(), 1);
}

#[test]
fn owner_jobs_respect_capacity_and_unknown_capacity_means_no_limit() {
    let s = snap(
        vec![sized(node(1, 1, 10, 2, "A100-80GB", 80), 8.0, 64)],
        vec![],
        vec![
            asking(job(1, 1, 10, 1), 6.0, 8),
            asking(job(2, 1, 11, 1), 6.0, 8),
        ],
    );
    assert_eq!(started(&go(&s)), vec![1]);
    let s = snap(
        vec![node(1, 1, 10, 2, "A100-80GB", 80)],
        vec![],
        vec![asking(job(1, 2, 20, 1), 600.0, 4096)],
    );
    assert_eq!(
        started(&go(&s)),
        vec![1],
        "a node without capacity figures limits nothing"
    );
}

#[test]
fn guests_leave_when_the_node_stops_lending() {
    // A window that closed (or a rule turned to never): guests go, the owner's job stays.
    let mut n = node(1, 1, 10, 2, "A100-80GB", 80);
    n.lending.mode = LendMode::Never;
    let s = snap(
        vec![n],
        vec![
            run(7, 2, 1, &[10], NOW - 600),
            run(8, 1, 1, &[11], NOW - 600),
        ],
        vec![],
    );
    let p = go(&s);
    assert_eq!(preempted(&p), vec![7], "{p:?}");
    assert!(p.preempt[0].reason.contains("no longer lends"), "{p:?}");
}

fn disk(mut n: Node, max_job_disk_gb: u64) -> Node {
    n.max_job_disk_gb = max_job_disk_gb;
    n
}

fn wanting_disk(mut j: QueuedJob, disk_gb: u64) -> QueuedJob {
    j.disk_gb = disk_gb;
    j
}

#[test]
fn a_job_asking_more_disk_than_any_server_gives_waits_with_that_reason() {
    let s = snap(
        vec![
            disk(node(1, 1, 10, 4, "A100-80GB", 80), 100),
            disk(node(2, 1, 20, 4, "A100-80GB", 80), 50),
        ],
        vec![],
        vec![wanting_disk(job(1, 2, 20, 1), 500)],
    );
    let p = go(&s);
    assert!(p.start.is_empty(), "{p:?}");
    let r = reason(&p, 1);
    assert_eq!(
        r,
        Reason::NoNodeDisk {
            disk_gb: 500,
            largest_gb: 100
        }
    );
    assert!(
        r.to_string().contains("500 GiB") && r.to_string().contains("disk_gb"),
        "{r}"
    );
    // The server that gives enough gets it; one that reports no limit takes anything.
    let s = snap(
        vec![
            disk(node(1, 1, 10, 1, "A100-80GB", 80), 10),
            disk(node(2, 1, 20, 4, "A100-80GB", 80), 100),
        ],
        vec![],
        vec![wanting_disk(job(1, 2, 20, 1), 50)],
    );
    assert_eq!(go(&s).start[0].node, 2, "best fit would pick node 1");
    let s = snap(
        vec![node(1, 1, 10, 1, "A100-80GB", 80)],
        vec![],
        vec![wanting_disk(job(1, 2, 20, 1), 5000)],
    );
    assert_eq!(started(&go(&s)), vec![1]);
}

#[test]
fn a_server_under_its_disk_floor_takes_no_new_guest_but_its_owner_jobs() {
    let mut n = node(1, 1, 10, 2, "A100-80GB", 80);
    n.low_disk = true;
    let s = snap(vec![n], vec![], vec![job(1, 2, 20, 1), job(2, 1, 10, 1)]);
    let p = go(&s);
    assert_eq!(started(&p), vec![2], "the owner's job: {p:?}");
    let r = reason(&p, 1).to_string();
    assert!(
        r.contains("low on disk space") && r.contains("no new guests"),
        "{r}"
    );
}

fn exporting(mut n: Node, name: &str) -> Node {
    n.name = name.into();
    n.exports = vec!["vision/imagenet".into()];
    n
}

fn needing_imagenet(mut j: QueuedJob) -> QueuedJob {
    j.needs_exports = vec!["vision/imagenet".into()];
    j.datasets = vec!["vision/imagenet".into()];
    j
}

#[test]
fn a_job_needing_an_exported_dataset_runs_only_where_it_is_exported() {
    // Guests of lab 2 on lab 1's servers: only server 2 exports the dataset.
    let s = snap(
        vec![
            node(1, 1, 10, 4, "A100-80GB", 80),
            exporting(node(2, 1, 20, 4, "A100-80GB", 80), "vision-gpu2"),
        ],
        vec![],
        vec![needing_imagenet(job(1, 2, 20, 1))],
    );
    let p = go(&s);
    assert_eq!(started(&p), vec![1], "{p:?}");
    assert_eq!(p.start[0].node, 2, "{p:?}");
    // Four GPUs where it is exported, eight asked: it waits naming the dataset and the
    // server that exports it.
    let s = snap(
        vec![
            node(1, 1, 10, 8, "A100-80GB", 80),
            exporting(node(2, 1, 20, 4, "A100-80GB", 80), "vision-gpu2"),
        ],
        vec![],
        vec![needing_imagenet(job(1, 2, 20, 8))],
    );
    let p = go(&s);
    assert!(p.start.is_empty(), "{p:?}");
    let r = reason(&p, 1).to_string();
    assert_eq!(
        r,
        "needs dataset vision/imagenet, exported by vision-gpu2 only"
    );
    // Nobody exports it.
    let s = snap(
        vec![node(1, 1, 10, 8, "A100-80GB", 80)],
        vec![],
        vec![needing_imagenet(job(1, 2, 20, 1))],
    );
    let r = reason(&go(&s), 1).to_string();
    assert!(r.contains("which no server exports now"), "{r}");
}

#[test]
fn among_equal_servers_one_that_caches_the_jobs_datasets_wins() {
    let mut cached = node(2, 1, 20, 4, "A100-80GB", 80);
    cached.cached = vec!["vision/coco".into()];
    let mut j = job(1, 2, 20, 1);
    j.datasets = vec!["vision/coco".into()];
    let s = snap(
        vec![node(1, 1, 10, 4, "A100-80GB", 80), cached],
        vec![],
        vec![j],
    );
    let p = go(&s);
    assert_eq!(p.start[0].node, 2, "{p:?}");
}
