//! [`super::reading::map`] over recorded NVML readings (`testdata/*.json`): each file holds
//! a server's reading, what the agent runs there, and the GPUs the agent must report.

use super::reading::{map, model_name, NvmlReading, ProcessOwner};
use super::Ours;
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Fixture {
    what: String,
    ours: FixtureOurs,
    reading: NvmlReading,
    expect: Vec<Expected>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FixtureOurs {
    containers: BTreeSet<String>,
    pids: BTreeSet<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Expected {
    index: u32,
    uuid: String,
    model: String,
    memory_mb: u64,
    memory_used_mb: u64,
    utilization_pct: u32,
    local_use: bool,
    fault: Option<String>,
    /// PID -> "ours", "gone", "local" or "local:<container id>".
    processes: BTreeMap<u32, String>,
}

const FIXTURES: [(&str, &str); 3] = [
    ("a100-mig.json", include_str!("testdata/a100-mig.json")),
    (
        "workstation-cgroup-v1.json",
        include_str!("testdata/workstation-cgroup-v1.json"),
    ),
    (
        "h100-faults.json",
        include_str!("testdata/h100-faults.json"),
    ),
];

fn owner_word(o: &ProcessOwner) -> String {
    match o {
        ProcessOwner::Ours => "ours".into(),
        ProcessOwner::Gone => "gone".into(),
        ProcessOwner::Local { container: None } => "local".into(),
        ProcessOwner::Local { container: Some(c) } => format!("local:{c}"),
    }
}

#[test]
fn recorded_readings_map_to_the_expected_gpus() {
    for (file, text) in FIXTURES {
        let f: Fixture = serde_json::from_str(text).unwrap_or_else(|e| panic!("{file}: {e}"));
        let ours = Ours {
            containers: f.ours.containers,
            pids: f.ours.pids,
            gpus: BTreeSet::new(),
        };
        let got = map(&f.reading, &ours);
        assert_eq!(got.len(), f.expect.len(), "{file} ({}): GPU count", f.what);
        for (g, e) in got.iter().zip(&f.expect) {
            let at = format!("{file}, GPU {}", e.index);
            assert_eq!(g.info.index, e.index, "{at}: index");
            assert_eq!(g.info.uuid, e.uuid, "{at}: uuid");
            assert_eq!(g.stat.uuid, e.uuid, "{at}: stat uuid");
            assert_eq!(g.info.model, e.model, "{at}: model");
            assert_eq!(g.info.memory_mb, e.memory_mb, "{at}: memory");
            assert!(!g.info.fake, "{at}: NVML GPUs are real");
            assert_eq!(g.stat.memory_used_mb, e.memory_used_mb, "{at}: memory used");
            assert_eq!(
                g.stat.utilization_pct, e.utilization_pct,
                "{at}: utilisation"
            );
            assert_eq!(g.stat.local_use, e.local_use, "{at}: local use");
            assert_eq!(g.stat.fault, e.fault, "{at}: fault");
            let procs: BTreeMap<u32, String> = g
                .processes
                .iter()
                .map(|p| (p.pid, owner_word(&p.owner)))
                .collect();
            assert_eq!(procs, e.processes, "{at}: processes");
        }
    }
}

fn fixture(file: &str) -> NvmlReading {
    let text = FIXTURES
        .iter()
        .find(|(f, _)| *f == file)
        .map(|(_, t)| *t)
        .unwrap_or_else(|| panic!("no fixture {file}"));
    let v: serde_json::Value = serde_json::from_str(text).unwrap();
    serde_json::from_value(v["reading"].clone()).unwrap()
}

#[test]
fn the_parent_of_mig_instances_is_never_lent() {
    let r = fixture("a100-mig.json");
    let got = map(&r, &Ours::default());
    let parent = &r.devices[0].uuid;
    assert!(got.iter().all(|g| &g.info.uuid != parent));
    assert_eq!(
        got.iter()
            .filter(|g| g.info.uuid.starts_with("MIG-"))
            .count(),
        3
    );
}

#[test]
fn without_our_containers_every_live_gpu_process_is_local_use() {
    // The same server, before the agent knows any container: nothing is ours, and a
    // process that ended (no cgroup to read) is still nobody's.
    let got = map(&fixture("a100-mig.json"), &Ours::default());
    let local: Vec<bool> = got.iter().map(|g| g.stat.local_use).collect();
    assert_eq!(local, [true, false, true, true]);
    assert!(got[3]
        .processes
        .iter()
        .any(|p| p.pid == 60555 && p.owner == ProcessOwner::Gone));
}

#[test]
fn a_container_id_matches_whatever_its_case() {
    let r = fixture("a100-mig.json");
    let id = "9C1F6E2A4B3D5C7E8F9012A3B4C5D6E7F8091A2B3C4D5E6F708192A3B4C5D6E7".to_string();
    let ours = Ours {
        containers: [id].into(),
        pids: BTreeSet::new(),
        gpus: BTreeSet::new(),
    };
    assert!(!map(&r, &ours)[0].stat.local_use);
}

#[test]
fn several_faults_are_named_together_and_xid_79_once_when_lost() {
    let mut r = fixture("h100-faults.json");
    r.devices[1].xids = vec![48, 13, 48];
    let got = map(&r, &Ours::default());
    assert_eq!(
        got[1].stat.fault.as_deref(),
        Some("a double-bit ECC error (Xid 48); 2 uncorrected ECC errors since the driver loaded")
    );
    // Lost and Xid 79 say the same thing: said once.
    assert_eq!(
        got[2].stat.fault.as_deref(),
        Some("fallen off the bus (NVML: GPU is lost)")
    );
}

#[test]
fn sensors_pass_through() {
    let got = map(&fixture("a100-mig.json"), &Ours::default());
    assert_eq!(got[3].temperature_c, Some(63));
    assert_eq!(got[3].power_w, Some(312.45));
    assert_eq!(got[3].ecc_corrected, Some(3));
    // A MIG instance shows its GPU's sensors.
    assert_eq!(got[0].temperature_c, Some(41));
}

#[test]
fn model_names_are_short() {
    assert_eq!(model_name("NVIDIA H200", 143771), "H200-140GB");
    assert_eq!(model_name("NVIDIA A100-SXM4-80GB", 81920), "A100-SXM4-80GB");
    assert_eq!(
        model_name("NVIDIA GeForce RTX 4090", 24564),
        "RTX-4090-24GB"
    );
    assert_eq!(model_name("NVIDIA H100 80GB HBM3", 81559), "H100-80GB-HBM3");
    assert_eq!(model_name("NVIDIA H100 PCIe", 81559), "H100-PCIe-80GB");
}
