//! The openb (Alibaba GPU-sharing) replay on a small synthetic cluster: the files are
//! generated here in the openb layout, no trace data is shipped.

use commons_sched::share::{GpuAsk, SharePolicy, ShareTuning};
use commons_sim::openb::{
    arrivals, hostable, read_nodes, read_pods, replay_openb, replay_openb_all, sample_nodes, Order,
};
use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;

const POD_HEADER: &str = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n";

/// 40 nodes (2-, 4- and 8-GPU, two models) and 300 tasks of the trace's kinds: CPU-only,
/// shares of 0.1-0.9, one whole GPU, 2/4/8 GPUs, some bound to a model.
fn write_files(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let mut nodes = String::from("sn,cpu_milli,memory_mib,gpu,model\n");
    for i in 0..40 {
        let (gpus, model, cpu) = match i % 3 {
            0 => (8, "G2", 96_000),
            1 => (2, "T4", 104_000),
            _ => (4, "V100M16", 32_000),
        };
        writeln!(nodes, "node-{i:03},{cpu},262144,{gpus},{model}").unwrap();
    }
    let mut pods = String::from(POD_HEADER);
    for i in 0u32..300 {
        let x = i.wrapping_mul(2_654_435_761) >> 7;
        let (num, milli) = match x % 10 {
            0 => (0, 0),
            1..=4 => (1, 100 * (1 + x / 10 % 9)),
            5..=7 => (1, 1000),
            8 => (2 + 2 * (x / 10 % 2), 1000),
            _ => (8, 1000),
        };
        let spec = if x % 7 == 0 { "T4|G2" } else { "" };
        let cpu = 2000 + 1000 * (x / 100 % 16);
        writeln!(
            pods,
            "pod-{i:04},{cpu},16384,{num},{milli},{spec},LS,Running,0,10,0"
        )
        .unwrap();
    }
    let (p, n) = (dir.join("pods.csv"), dir.join("nodes.csv"));
    std::fs::write(&p, pods).unwrap();
    std::fs::write(&n, nodes).unwrap();
    (p, n)
}

#[test]
fn openb_files_read_into_shares_and_whole_gpus() {
    let dir = tempfile::tempdir().unwrap();
    let (p, n) = write_files(dir.path());
    let tasks = read_pods(&p).unwrap();
    let nodes = read_nodes(&n).unwrap();
    assert_eq!((tasks.len(), nodes.len()), (300, 40));
    assert!(tasks
        .iter()
        .any(|t| matches!(t.req.gpu, GpuAsk::Share { .. })));
    assert!(tasks
        .iter()
        .any(|t| t.req.gpu == GpuAsk::Whole { count: 8 }));
    assert!(tasks.iter().any(|t| t.req.models == ["T4", "G2"]));
    assert_eq!(nodes[0].gpus.len(), 8);
    assert!(nodes[0].gpus.iter().all(|g| g.is_empty()));
    let bad = dir.path().join("bad.csv");
    std::fs::write(&bad, format!("{POD_HEADER}p,1,1,1,0,,LS,Running,0,0,0\n")).unwrap();
    let err = read_pods(&bad).unwrap_err().to_string();
    assert!(err.contains("line 2"), "{err}");
}

#[test]
fn arrivals_stop_when_the_demand_reaches_capacity() {
    let dir = tempfile::tempdir().unwrap();
    let (p, n) = write_files(dir.path());
    let tasks = read_pods(&p).unwrap();
    let nodes = read_nodes(&n).unwrap();
    let capacity: u64 = nodes.iter().map(|n| n.gpus.len() as u64 * 1000).sum();
    for order in [Order::File, Order::Seeded(7)] {
        let a = arrivals(&tasks, order, capacity);
        let demand = |k: usize| -> u64 {
            a[..k]
                .iter()
                .map(|&i| tasks[i].req.gpu.demand_milli())
                .sum()
        };
        assert!(demand(a.len()) >= capacity, "{order:?}");
        assert!(
            demand(a.len() - 1) < capacity,
            "{order:?}: stops at the first task reaching it"
        );
    }
    let file = arrivals(&tasks, Order::File, capacity);
    assert_eq!(&file[..5], &[0, 1, 2, 3, 4]);
    assert_ne!(arrivals(&tasks, Order::Seeded(1), capacity), file);
    assert_eq!(
        arrivals(&tasks, Order::Seeded(1), capacity),
        arrivals(&tasks, Order::Seeded(1), capacity)
    );
}

#[test]
fn every_policy_keeps_the_books_straight() {
    let dir = tempfile::tempdir().unwrap();
    let (p, n) = write_files(dir.path());
    let tasks = read_pods(&p).unwrap();
    let nodes = read_nodes(&n).unwrap();
    let gpus: f64 = nodes.iter().map(|n| n.gpus.len() as f64).sum();
    let all = replay_openb_all(
        &nodes,
        &tasks,
        Order::Seeded(3),
        &SharePolicy::ALL,
        &ShareTuning::default(),
    );
    assert_eq!(all.len(), 3);
    for (name, o) in &all {
        let allocated = o.gpu_allocation_rate_at_full * gpus;
        assert!(
            (0.0..=1.0).contains(&o.gpu_allocation_rate_at_full),
            "{name}"
        );
        assert!(
            (allocated + o.unallocated_gpus_at_full - gpus).abs() < 1e-6,
            "{name}"
        );
        assert!(o.tasks_failed <= o.tasks_arrived, "{name}");
        let last = o.curve.last().unwrap();
        assert!(last.arrived_gpus >= gpus, "{name}: the curve ends at full");
        assert!(
            (last.unallocated_gpus - o.unallocated_gpus_at_full).abs() < 1e-9,
            "{name}"
        );
        assert!(
            o.curve
                .windows(2)
                .all(|w| w[0].arrived_gpus < w[1].arrived_gpus),
            "{name}"
        );
        assert!(
            o.curve
                .windows(2)
                .all(|w| w[0].allocated_gpus <= w[1].allocated_gpus),
            "{name}"
        );
    }
    let order = arrivals(&tasks, Order::Seeded(3), (gpus * 1000.0) as u64);
    let again = replay_openb(
        &nodes,
        &tasks,
        &order,
        SharePolicy::Commons,
        &ShareTuning::default(),
    );
    assert_eq!(&again, &all["commons"], "same input, same figures");
}

#[test]
fn the_cli_replays_openb_and_writes_json() {
    let dir = tempfile::tempdir().unwrap();
    let (p, n) = write_files(dir.path());
    let run = |extra: &[&str]| {
        let out = openb_replay(&p, &n, &[&["--quiet", "--json"], extra].concat());
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let v = run(&["--seed", "5"]);
    for policy in ["best-fit", "fgd", "commons"] {
        let o = &v["policies"][policy];
        assert!(
            o["gpu_allocation_rate_at_full"].as_f64().is_some(),
            "{policy}: {v}"
        );
        assert!(
            o["unallocated_gpus_at_full"].as_f64().is_some(),
            "{policy}: {v}"
        );
        assert!(
            o["curve"].as_array().is_some_and(|c| !c.is_empty()),
            "{policy}"
        );
    }
    assert!(v["commons_to_best_fit_unallocated"].as_f64().is_some());
    assert_eq!(v, run(&["--seed", "5"]), "a seed gives the same figures");
    let one = run(&["--policy", "best-fit"]);
    assert_eq!(one["policies"].as_object().unwrap().len(), 1);
    let bad = openb_replay(&p, &n, &["--policy", "worst-fit"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("unknown openb policy"));
}

#[test]
fn a_campus_sized_cluster_is_drawn_from_the_node_list() {
    let dir = tempfile::tempdir().unwrap();
    let (p, n) = write_files(dir.path());
    let nodes = read_nodes(&n).unwrap();
    let ten = sample_nodes(&nodes, 10, 7).unwrap();
    assert_eq!(ten.len(), 10);
    assert_eq!(
        ten,
        sample_nodes(&nodes, 10, 7).unwrap(),
        "a seed, the same draw"
    );
    assert_ne!(ten, sample_nodes(&nodes, 10, 8).unwrap());
    let names: Vec<&str> = ten.iter().map(|n| n.name.as_str()).collect();
    assert!(
        names.windows(2).all(|w| w[0] < w[1]),
        "in the list's order: {names:?}"
    );
    assert!(sample_nodes(&nodes, 0, 1).is_none());
    assert!(sample_nodes(&nodes, 41, 1).is_none());
    assert_eq!(sample_nodes(&nodes, 40, 1).unwrap(), nodes);
    // Only the 2-GPU T4 servers: 8-GPU tasks and those bound to other models go.
    let t4: Vec<_> = nodes
        .iter()
        .filter(|n| n.gpus.len() == 2)
        .cloned()
        .collect();
    let tasks = read_pods(&p).unwrap();
    let kept = hostable(&t4, tasks.clone());
    assert!(!kept.is_empty() && kept.len() < tasks.len());
    assert!(kept
        .iter()
        .all(|t| t.req.gpu.gpu_count() <= 2 && t4.iter().any(|n| n.hosts(&t.req))));
    let replay =
        |extra: &[&str]| openb_replay(&p, &n, &[&["--quiet", "--json", "-"], extra].concat());
    let out = replay(&["--sample-nodes", "12", "--node-seed", "3"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["nodes"], 12);
    assert_eq!(v["sample"]["seed"], 3);
    assert!(v["sample"]["tasks_left_out"].as_u64().is_some(), "{v}");
    let too_many = replay(&["--sample-nodes", "41"]);
    assert!(!too_many.status.success());
    let err = String::from_utf8_lossy(&too_many.stderr);
    assert!(
        err.contains("--sample-nodes 41") && err.contains("40 servers"),
        "{err}"
    );
}

/// `commons-sim replay --trace-format openb` on the files `p` and `n`, with `extra`.
fn openb_replay(p: &Path, n: &Path, extra: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_commons-sim"))
        .args(["replay", "--trace-format", "openb"])
        .arg("--trace")
        .arg(p)
        .arg("--nodes")
        .arg(n)
        .args(extra)
        .output()
        .unwrap()
}
