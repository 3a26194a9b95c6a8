//! Fuzzing of what the portal and the agent parse from others, property-based on stable
//! Rust (proptest; see `fuzzkit.rs`): job requests as the API reads them, both
//! directions of the agent protocol, the portal's configuration file and SSH public
//! keys. Each harness: no panic on any input; what parses obeys its invariants. The
//! HTTP side (no 5xx, nothing stored for a refused input) is `it/fuzz_http.rs`.

#[path = "it/support/fuzzkit.rs"]
mod fuzzkit;

use commons_proto::{AgentMsg, PortalMsg};
use fuzzkit::{budget, damaged, damaged_text, run};
use proptest::prelude::*;
use serde_json::{json, Value};

fn job_seeds() -> Vec<Value> {
    vec![
        json!({"image": "commons-demo:latest", "command": ["sh", "-c", "echo hi"], "gpus": 1,
               "time_limit_minutes": 10}),
        json!({"image": "registry.campus.edu/vision/train@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
               "command": ["python", "train.py"], "env": {"EPOCHS": "3"}, "gpus": 2,
               "gpu_models": ["A100-80GB"], "min_gpu_memory_gb": 40.0, "cpus": 8.0,
               "memory_gb": 64.0, "time_limit_minutes": 1440, "kind": "interactive",
               "lab": "vision", "checkpoint_minutes": 30, "shm_mb": 2048}),
    ]
}

#[test]
fn job_requests_never_panic_and_what_passes_is_sane() {
    let mut accepted = 0u32;
    run(
        "job request (API JSON + rules)",
        budget(3000),
        damaged(job_seeds()),
        |v| {
            let bytes = serde_json::to_vec(&v).unwrap();
            let parsed = commons_portal::api::parse_json::<commons_api::job::JobRequest>(&bytes);
            if let Ok(req) = parsed {
                if commons_api::job::check(&req).is_ok() {
                    accepted += 1;
                    prop_assert!(req.gpus >= 1 && req.time_limit_minutes >= 1, "{req:?}");
                    prop_assert!(!req.image.contains('\0'));
                    for (k, val) in &req.env {
                        prop_assert!(!k.starts_with("NVIDIA_") && k != "CUDA_VISIBLE_DEVICES");
                        prop_assert!(!k.contains('\0') && !val.contains('\0'));
                    }
                }
            }
            Ok(())
        },
    );
    assert!(accepted > 0, "some damaged requests are still valid ones");
}

fn agent_seeds() -> Vec<Value> {
    let report = json!({"job": 7, "attempt": 1, "state": "running"});
    vec![
        json!({"type": "hello", "agent_version": "0.1.0", "protocol": 2, "session": 9, "seq": 1,
               "gpus": [{"uuid": "GPU-1", "index": 0, "model": "A100-80GB", "memory_mb": 81920}],
               "attempts": [report]}),
        json!({"type": "heartbeat", "seq": 2,
               "gpu_stats": [{"uuid": "GPU-1", "utilization_pct": 97, "memory_used_mb": 1000, "local_use": false}],
               "attempts": [{"job": 7, "attempt": 1, "state": "exited", "exit_code": 3}]}),
        json!({"type": "attempt_event", "job": 7, "attempt": 1, "state": "stopped",
               "stop": "preempted", "reason": "the owner needs it"}),
        json!({"type": "logs", "job": 7, "attempt": 1, "chunk": "epoch 1 loss 0.3\n"}),
    ]
}

fn portal_seeds() -> Vec<Value> {
    let lease = json!({"session": 9, "seq": 4, "valid_for_s": 90});
    vec![
        json!({"type": "welcome", "node_id": 3, "heartbeat_s": 5, "lease_ttl_s": 90}),
        json!({"type": "start", "job": 7, "attempt": 2, "gpus": ["GPU-1"], "lease": lease, "resume": true,
               "spec": {"image": "commons-demo:latest", "command": ["sh"], "env": {"A": "b"}, "cpus": 1.5,
                        "memory_mb": 4096, "time_limit_s": 600, "user": "alice", "shm_mb": 64,
                        "checkpoint_interval_s": 60, "interactive": true}}),
        json!({"type": "stop", "job": 7, "attempt": 2, "grace_s": 30, "reason": "preempted", "detail": "owner"}),
        json!({"type": "renew", "lease": lease, "attempts": [[7, 2]]}),
    ]
}

/// Whatever an agent sends, the portal decodes it without panicking, its bounds check
/// answers, and what decodes re-encodes to the same message.
#[test]
fn the_portal_decodes_any_agent_message() {
    let mut decoded = 0u32;
    run(
        "agent -> portal messages",
        budget(3000),
        damaged(agent_seeds()),
        |v| {
            let text = v.to_string();
            if let Ok(msg) = serde_json::from_str::<AgentMsg>(&text) {
                decoded += 1;
                let _ = commons_portal::broker::limits::check(&msg);
                let again: AgentMsg =
                    serde_json::from_str(&serde_json::to_string(&msg).unwrap()).unwrap();
                prop_assert_eq!(again, msg);
            }
            Ok(())
        },
    );
    assert!(decoded > 0);
}

/// Whatever a portal (or something posing as one) sends, the agent decodes it without
/// panicking, and what decodes re-encodes to the same message.
#[test]
fn the_agent_decodes_any_portal_message() {
    let mut decoded = 0u32;
    run(
        "portal -> agent messages",
        budget(3000),
        damaged(portal_seeds()),
        |v| {
            let text = v.to_string();
            if let Ok(msg) = serde_json::from_str::<PortalMsg>(&text) {
                decoded += 1;
                let again: PortalMsg =
                    serde_json::from_str(&serde_json::to_string(&msg).unwrap()).unwrap();
                prop_assert_eq!(again, msg);
            }
            if let Ok(ctl) = serde_json::from_str::<commons_proto::relay::RelayCtl>(&text) {
                let _ = serde_json::to_string(&ctl).unwrap();
            }
            Ok(())
        },
    );
    assert!(decoded > 0);
}

#[test]
fn the_portal_config_parser_never_panics() {
    let example = include_str!("../../deploy/portal.example.toml").to_string();
    let small = "listen = \"127.0.0.1:8080\"\ndatabase_url = \"sqlite://x.db\"\n[oidc]\nissuer = \"https://sso\"\n".to_string();
    run(
        "portal config (TOML)",
        budget(2000),
        damaged_text(vec![example, small]),
        |text| {
            if let Ok(c) = toml::from_str::<commons_portal::config::Config>(&text) {
                let _ = c.validate();
            }
            Ok(())
        },
    );
}

const KEYS: [&str; 3] = [
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIADwqSvC2pKPsoN91ARf1XbNNsYZllNqpNB4kWNBWT5v fuzz",
    "ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTYAAABBBPr3IxaFW3JM67SrGC2B7OQroTXC2eNPHtG8rTMNQl2ks/EQt1ghJTAKJPiaLXB7qDj2zkMEryC+ycIRHfRDC0Q= fuzz",
    "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQChBz/llrQMO94n5jQr78KntZMdM+DA1IkyN7UUjAkpJzR5wYW4OtUsgAzVeg2c6hwaOLendjfdW2aembWBEg3TwGA9tIRGFOa2KfxxELqng8qIOudFiNDuneVq+ru4IEbemVEMt2bTQ/y/JfBCveC3c1vlqLUsF9kjQGWPayawIzNJmoy2cwW8Il+c+exC50g1TpEF1j2TnBpl4uyfhZfLblzRNg0hrDhw1I0JJbBUQpDp7ft5GhL0jJPM+gg1GlxuGCiQLxB6OTuDG4Fjk2zpk5qZr+sJEWXPj6fZ1MS48TPFLrGRfoRy6q8bArSvSbHhg+HGIG5CdCos+LmQLeez fuzz",
];

#[test]
fn the_ssh_key_parser_never_panics() {
    for k in KEYS {
        assert!(commons_portal::pubkey::parse(k, None).is_ok(), "{k}");
    }
    let seeds = KEYS.iter().map(|k| k.to_string()).collect();
    run(
        "SSH public keys",
        budget(3000),
        damaged_text(seeds),
        |text| {
            if let Ok(k) = commons_portal::pubkey::parse(&text, None) {
                prop_assert!(k.fingerprint.starts_with("SHA256:"), "{}", k.fingerprint);
            }
            Ok(())
        },
    );
}
