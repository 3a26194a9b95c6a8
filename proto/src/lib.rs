//! Wire types between the GPU Commons agent and the portal.
//!
//! The agent keeps one outbound WebSocket to the portal ([`CONNECT_PATH`]) and both sides
//! exchange JSON messages: [`AgentMsg`] upstream, [`PortalMsg`] downstream. Nothing here
//! does I/O.
//!
//! The rule that keeps reconnects, duplicates and late messages harmless: every message
//! about a job names its attempt, and a receiver that no longer owns that attempt ignores
//! the message and answers with a `Stop` (portal) or a report (agent).
//!
//! The version is in the path: an incompatible change gets `/api/agent/v2/...`; within a
//! path, `Hello.protocol` must equal [`PROTOCOL_VERSION`] or the portal refuses the agent.
//!
//! Leases are durations, never wall-clock instants: a [`Lease`] is valid for `valid_for_s`
//! seconds after the agent *sent* its message `seq` (the `Hello` or `Heartbeat` the portal
//! answers). The agent measures that on its own monotonic clock (boot time), the portal
//! counts from when it *received* that message, which is later: so the agent's deadline
//! always comes first, whatever the two machines' wall clocks say.
//!
//! Time limits count from the attempt's start on the agent's own clock, like leases. The
//! `Start` carries the job's limit ([`JobSpec::time_limit_s`]); when the owner of an
//! interactive job extends it, every later `Renew` carries the attempt's new limit
//! ([`TimeLimit`]) and the agent moves the deadline by what it grew. Both additions
//! (`JobSpec::interactive`, `Renew::time_limits`) are optional fields within protocol 2:
//! an older agent ignores them (it runs the image's default command for an interactive
//! job without one, and stops an extended attempt at its first limit), and a newer agent
//! reads an older portal's messages as before.
//!
//! Checkpoints travel over plain HTTP, not the WebSocket (see [`CHECKPOINTS_PATH`]): the
//! agent uploads an archive of `/checkpoint` (tar + zstd) in checksummed parts and commits
//! it; the commit's answer ([`CheckpointCommitted`]) is the record, so there is no
//! `CheckpointStored` message: a commit the portal answered is stored, one it did not
//! answer is not, and the agent retries it (a commit is idempotent).

use serde::{Deserialize, Serialize};

pub mod attempt;
pub mod checkpoint;
pub mod control;
pub mod datasets;
pub mod inputs;
pub mod outputs;
pub mod relay;
pub mod share;
pub use attempt::*;
pub use checkpoint::*;
pub use control::{
    NodeCapacity, NodeCommand, NodeControlAnswer, NodeDisk, NodeState, NODE_CONTROL_PATH,
};
pub use datasets::{
    dataset_file_path, dataset_path, CachedDataset, DatasetListing, DatasetMount, DatasetSource,
    NodeDatasets, DATASETS_PATH,
};
pub use inputs::{
    input_file_path, inputs_path, staging_path, InputFile, Staging, INPUTS_PATH, OBJECTS_PATH,
    STAGING_PATH,
};
pub use outputs::{output_file_path, outputs_path, OutputFile, OUTPUTS_PATH};
pub use relay::RelayOpen;
pub use share::{share_env, GpuShare, ShareMode};

/// Protocol version spoken by this build; sent in `Hello`.
///
/// 3: `JobSpec::image_digest` (and `image_signature`): the agent runs the image only if
/// its local ID equals the pin. An agent of protocol 2 would ignore the pin and run the
/// tag, so the portal refuses it (upgrade agents before or with the portal).
///
/// 4: `JobSpec::image_campus` (a lab's own allow-list entry runs from a local image on
/// that lab's servers only) and the hardening round's other fields; an agent of protocol
/// 3 would run another lab's private local image for a guest, so it is refused.
///
/// 5: `JobSpec::inputs` and `JobSpec::datasets` (staged or mounted read-only before the
/// container starts) and `NodeDatasets` in `Hello`/`Heartbeat`; an agent of protocol 4
/// would start such a job without its data, so it is refused.
pub const PROTOCOL_VERSION: u32 = 5;
/// One-time enrolment: `POST` an [`EnrolRequest`], get an [`EnrolResponse`].
pub const ENROL_PATH: &str = "/api/agent/v1/enrol";
/// The agent's WebSocket, authenticated with `Authorization: Bearer <node credential>`.
pub const CONNECT_PATH: &str = "/api/agent/v1/connect";

/// Container labels by which the agent finds (and re-adopts) its containers.
pub const LABEL_JOB: &str = "commons.job";
pub const LABEL_ATTEMPT: &str = "commons.attempt";

pub type JobId = i64;
pub type Attempt = i32;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnrolRequest {
    /// The one-time token a lab admin created.
    pub token: String,
    /// The server's host name, used as the node's display name.
    pub hostname: String,
    pub agent_version: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EnrolResponse {
    pub node_id: i64,
    pub node_name: String,
    pub lab: String,
    /// The node's own credential; the agent keeps it in its state dir.
    pub credential: String,
}

/// A GPU as the agent sees it (physical GPU or MIG instance).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuInfo {
    /// Stable identifier (`GPU-...` or `MIG-...` from NVML, `GPU-fake-...` for fakes).
    pub uuid: String,
    pub index: u32,
    pub model: String,
    pub memory_mb: u64,
    /// True for fake GPUs: the agent passes no NVIDIA device request for them.
    #[serde(default)]
    pub fake: bool,
}

/// Live numbers about one GPU, sent with every heartbeat.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuStat {
    pub uuid: String,
    pub utilization_pct: u32,
    pub memory_used_mb: u64,
    /// A process that GPU Commons did not start uses this GPU (the owner, directly).
    pub local_use: bool,
    /// The GPU is faulty (Xid or uncorrected ECC errors, fallen off the bus), in words
    /// for the lab admin: the portal withdraws it and requeues its jobs. Absent: healthy
    /// (and what an agent that predates this field sends).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault: Option<String>,
}

/// Agent -> portal.
///
/// Final attempt states travel twice: as an `AttemptEvent` when they happen and in every
/// later `Hello`/`Heartbeat` until the portal stops renewing that attempt, so a state change
/// sent into a dying connection is not lost.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum AgentMsg {
    /// First message of every connection: inventory and every container found by label.
    Hello {
        agent_version: String,
        protocol: u32,
        /// Random per agent process: leases name it, so a lease granted to an earlier
        /// process of the same node means nothing to a later one.
        session: u64,
        /// This message's sequence number; leases count from messages by their `seq`.
        seq: u64,
        gpus: Vec<GpuInfo>,
        attempts: Vec<AttemptReport>,
        /// The server's CPUs, memory and disk (absent from agents that predate it: the
        /// portal then places no CPU or memory limits there).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        capacity: Option<NodeCapacity>,
        /// The largest job's disk and the free-space floor (absent from agents that
        /// predate it: no limit is placed there).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        disk: Option<NodeDisk>,
        /// Its exported datasets and dataset cache.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        datasets: Option<NodeDatasets>,
        /// How it enforces shares of one GPU (`commons-agent run --share-mode`); absent:
        /// it takes no shares (and an agent that predates shares sends none).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        share_mode: Option<ShareMode>,
    },
    Heartbeat {
        /// Increases with every `Hello` and `Heartbeat` of the agent process.
        seq: u64,
        gpu_stats: Vec<GpuStat>,
        attempts: Vec<AttemptReport>,
        /// As in `Hello`, when it changed (CPUs taken offline, memory resized).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        capacity: Option<NodeCapacity>,
        /// As in `Hello`, when it changed since the last one sent on this connection.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        disk: Option<NodeDisk>,
        /// As in `Hello`, when it changed since the last one sent on this connection.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        datasets: Option<NodeDatasets>,
    },
    /// An attempt changed state.
    AttemptEvent {
        job: JobId,
        attempt: Attempt,
        state: AttemptState,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        exit_code: Option<i64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stop: Option<StopReason>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// Output of an attempt's container, in order.
    Logs {
        job: JobId,
        attempt: Attempt,
        chunk: String,
    },
}

/// Portal -> agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
// `Start` carries the whole spec: a message lives only between the socket and its
// handler, so its size costs little, and boxing the spec would touch every use of it.
#[allow(clippy::large_enum_variant)]
pub enum PortalMsg {
    /// Answer to `Hello`.
    Welcome {
        node_id: i64,
        heartbeat_s: u64,
        lease_ttl_s: u64,
    },
    Start {
        job: JobId,
        attempt: Attempt,
        spec: JobSpec,
        /// UUIDs of the GPUs this attempt gets.
        gpus: Vec<String>,
        /// The agent stops the attempt when it runs out and no `Renew` extended it.
        lease: Lease,
        /// The job has a checkpoint: restore the latest into `/checkpoint` before the
        /// container starts, and set `COMMONS_RESUME=1`.
        #[serde(default)]
        resume: bool,
    },
    Stop {
        job: JobId,
        attempt: Attempt,
        /// SIGTERM, then this long to save `/checkpoint` and exit, then SIGKILL.
        grace_s: u64,
        reason: StopReason,
        /// Words for the job's owner ("the owner lab needs its GPUs").
        #[serde(default, skip_serializing_if = "Option::is_none")]
        detail: Option<String>,
    },
    /// Extends the leases of the listed attempts.
    Renew {
        lease: Lease,
        attempts: Vec<(JobId, Attempt)>,
        /// The current time limit of each listed attempt that is active (an extension
        /// reaches the agent with the next heartbeat's `Renew`, from whichever portal
        /// replica holds the connection). The agent moves an attempt's time-limit
        /// deadline (and its `lease.json`, which the guard reads) later by what the limit
        /// grew; a time limit never shrinks, so an equal or smaller one changes nothing.
        /// An agent that predates this field ignores it: the attempt then stops at the
        /// limit it started with (never later than granted).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        time_limits: Vec<TimeLimit>,
    },
    /// Dial a relay for an SSH channel into the attempt's container (see [`relay`]).
    /// An agent that cannot serve it (the attempt is not running here) still dials and
    /// answers [`relay::RelayCtl::Closed`] with the reason, so the user is not left waiting.
    OpenRelay(RelayOpen),
}

impl AgentMsg {
    /// The message's type, as on the wire (for metrics and logs).
    pub fn kind(&self) -> &'static str {
        match self {
            AgentMsg::Hello { .. } => "hello",
            AgentMsg::Heartbeat { .. } => "heartbeat",
            AgentMsg::AttemptEvent { .. } => "attempt_event",
            AgentMsg::Logs { .. } => "logs",
        }
    }
}

impl PortalMsg {
    /// The message's type, as on the wire (for metrics and logs).
    pub fn kind(&self) -> &'static str {
        match self {
            PortalMsg::Welcome { .. } => "welcome",
            PortalMsg::Start { .. } => "start",
            PortalMsg::Stop { .. } => "stop",
            PortalMsg::Renew { .. } => "renew",
            PortalMsg::OpenRelay(_) => "open_relay",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_tagged_json() {
        let m = AgentMsg::AttemptEvent {
            job: 7,
            attempt: 2,
            state: AttemptState::Exited,
            exit_code: Some(3),
            stop: None,
            reason: None,
        };
        let text = serde_json::to_string(&m).unwrap();
        assert_eq!(
            text,
            r#"{"type":"attempt_event","job":7,"attempt":2,"state":"exited","exit_code":3}"#
        );
        assert_eq!(serde_json::from_str::<AgentMsg>(&text).unwrap(), m);
    }

    /// Found by the fuzz test in CI: without serde_json's `float_roundtrip` a CPU count such
    /// as -1.1739098046973182e-219 came back one bit off, so a decoded message was not the one
    /// that was sent.
    #[test]
    fn floats_survive_a_round_trip_bit_for_bit() {
        for x in [
            -1.1739098046973182e-219_f64,
            0.1,
            1.0 / 3.0,
            5e-324,
            f64::MAX,
        ] {
            let text = serde_json::to_string(&x).unwrap();
            let back: f64 = serde_json::from_str(&text).unwrap();
            assert_eq!(back.to_bits(), x.to_bits(), "{text}");
        }
    }

    #[test]
    fn stop_round_trips() {
        let m = PortalMsg::Stop {
            job: 1,
            attempt: 1,
            grace_s: 30,
            reason: StopReason::Preempted,
            detail: Some("the owner lab needs its GPUs".into()),
        };
        let text = serde_json::to_string(&m).unwrap();
        assert!(text.contains(r#""reason":"preempted""#), "{text}");
        let back: PortalMsg = serde_json::from_str(&text).unwrap();
        assert_eq!(back, m);
        assert!(
            serde_json::from_str::<PortalMsg>(&text.replace("preempted", "lease expired: x"))
                .is_err(),
            "reasons are a closed set"
        );
    }

    #[test]
    fn stop_reasons_say_whether_the_job_returns_to_the_queue() {
        assert!(StopReason::Preempted.requeues());
        assert!(StopReason::LeaseExpired.requeues());
        assert!(StopReason::Lost.requeues());
        assert!(!StopReason::Cancelled.requeues());
        assert!(!StopReason::TimeLimit.requeues());
    }

    #[test]
    fn enrol_request_rejects_unknown_fields() {
        let err = serde_json::from_str::<EnrolRequest>(
            r#"{"token":"t","hostname":"h","agent_version":"1","extra":1}"#,
        );
        assert!(err.is_err());
    }

    #[test]
    fn checkpoint_paths_and_commit() {
        assert_eq!(
            checkpoint_part_path(7, 2, 0),
            "/api/agent/v1/checkpoints/7/2/parts/0"
        );
        assert_eq!(
            checkpoint_parts_path(7, 2),
            "/api/agent/v1/checkpoints/7/2/parts"
        );
        assert_eq!(
            checkpoint_commit_path(7, 2),
            "/api/agent/v1/checkpoints/7/2/commit"
        );
        assert_eq!(
            checkpoint_latest_path(7),
            "/api/agent/v1/checkpoints/7/latest"
        );
        let c: CheckpointCommit =
            serde_json::from_str(r#"{"parts":3,"bytes":10,"sha256":"ab"}"#).unwrap();
        assert_eq!(c.parts, 3);
        assert_eq!(c.write_ms, None, "older agents omit it");
        assert_eq!(
            serde_json::to_string(&c).unwrap(),
            r#"{"parts":3,"bytes":10,"sha256":"ab"}"#
        );
        let timed: CheckpointCommit =
            serde_json::from_str(r#"{"parts":3,"bytes":10,"sha256":"ab","write_ms":61001}"#)
                .unwrap();
        assert_eq!(timed.write_ms, Some(61_001));
        assert!(serde_json::from_str::<CheckpointCommit>(
            r#"{"parts":3,"bytes":10,"sha256":"ab","x":1}"#
        )
        .is_err());
    }

    #[test]
    fn open_relay_round_trips() {
        let m = PortalMsg::OpenRelay(RelayOpen {
            ticket: "t".into(),
            job: 4,
            attempt: 1,
            relay_url: None,
            target: relay::RelayTarget::Sftp,
        });
        let text = serde_json::to_string(&m).unwrap();
        assert_eq!(
            text,
            r#"{"type":"open_relay","ticket":"t","job":4,"attempt":1,"target":{"kind":"sftp"}}"#
        );
        assert_eq!(serde_json::from_str::<PortalMsg>(&text).unwrap(), m);
    }

    #[test]
    fn new_fields_are_optional_for_old_peers() {
        // A Renew and a JobSpec from a portal that predates them still read.
        let old =
            r#"{"type":"renew","lease":{"session":1,"seq":2,"valid_for_s":3},"attempts":[[7,1]]}"#;
        let PortalMsg::Renew { time_limits, .. } = serde_json::from_str(old).unwrap() else {
            panic!("not a renew")
        };
        assert!(time_limits.is_empty());
        let spec: JobSpec = serde_json::from_str(
            r#"{"image":"x","command":[],"cpus":1.0,"memory_mb":1,"time_limit_s":60,"user":"u"}"#,
        )
        .unwrap();
        assert!(!spec.interactive);
        assert!(spec.image_digest.is_none() && spec.image_signature.is_none());
        // And what a new portal sends without them looks as it did.
        let text = serde_json::to_string(&spec).unwrap();
        assert!(!text.contains("interactive"), "{text}");
        let renew = PortalMsg::Renew {
            lease: Lease {
                session: 1,
                seq: 2,
                valid_for_s: 3,
            },
            attempts: vec![(7, 1)],
            time_limits: vec![TimeLimit {
                job: 7,
                attempt: 1,
                time_limit_s: 7200,
            }],
        };
        let text = serde_json::to_string(&renew).unwrap();
        assert!(
            text.contains(r#""time_limits":[{"job":7,"attempt":1,"time_limit_s":7200}]"#),
            "{text}"
        );
        assert_eq!(serde_json::from_str::<PortalMsg>(&text).unwrap(), renew);
    }

    #[test]
    fn final_states() {
        assert!(AttemptState::Exited.is_final());
        assert!(!AttemptState::Running.is_final());
    }
}
