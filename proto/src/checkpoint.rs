//! The checkpoint store's agent API: paths, headers and bodies. Checkpoints travel over
//! plain HTTP beside the WebSocket (see the crate's documentation).

use crate::{Attempt, JobId};
use serde::{Deserialize, Serialize};

/// The checkpoint store's agent API, under this prefix; every call carries
/// `Authorization: Bearer <node credential>` (the node must hold the attempt it names).
///
/// - `PUT {prefix}/{job}/{attempt}/parts/{n}`: one part (`n` from 0, at most the
///   portal's part size, told by [`PART_BYTES_HEADER`]), with [`SHA256_HEADER`] = the
///   part's SHA-256 in hex. Idempotent; answers a [`CheckpointPart`]. A wrong checksum is
///   422, a part over the size 413.
/// - `GET {prefix}/{job}/{attempt}/parts`: the parts uploaded and not yet committed, as
///   `[CheckpointPart]` sorted by `n`, with [`PART_BYTES_HEADER`]. Upload what is missing.
/// - `POST {prefix}/{job}/{attempt}/commit` with a [`CheckpointCommit`]: checks the parts,
///   the sizes, the whole archive's checksum and the lab's cap (409 `checkpoint_cap` when
///   over it), records the checkpoint and answers a [`CheckpointCommitted`]. The next
///   upload of the same attempt starts from no parts.
/// - `GET {prefix}/{job}/latest`: the job's latest committed archive (parts concatenated,
///   `content-length`, [`SHA256_HEADER`]); 404 when the job has none. Only for a node that
///   holds a starting or running attempt of the job. A later attempt's checkpoints
///   supersede an earlier attempt's.
///
/// Answers an agent acts on: 401 (credential), 404 (the node does not hold that attempt,
/// or no checkpoint), 409 `job_ended` (the job is over: drop the checkpoint), 409
/// `checkpoint_superseded` (a later attempt has `keep_per_job` newer ones: drop it), 409
/// `checkpoint_cap` (the lab's space is full: keep it, try again later), 413 (a part over
/// the size), 422 with `field` (a checksum, a missing part, a size), 503 (the store is
/// unreachable: retry with back-off). Errors are JSON `{error, message, field?}`.
pub const CHECKPOINTS_PATH: &str = "/api/agent/v1/checkpoints";
/// Header with a SHA-256 in lowercase hex: of a part (upload) or of the archive (download).
pub const SHA256_HEADER: &str = "x-commons-sha256";
/// Header on the parts list: the largest part the portal takes, in bytes.
pub const PART_BYTES_HEADER: &str = "x-commons-part-bytes";
/// Header on `latest`: the attempt whose checkpoint it is.
pub const CHECKPOINT_ATTEMPT_HEADER: &str = "x-commons-checkpoint-attempt";
/// Part numbers run from 0 to below this.
pub const MAX_CHECKPOINT_PARTS: u32 = 100_000;

/// `PUT` one part here.
pub fn checkpoint_part_path(job: JobId, attempt: Attempt, n: u32) -> String {
    format!("{CHECKPOINTS_PATH}/{job}/{attempt}/parts/{n}")
}
/// `GET` the parts uploaded so far here.
pub fn checkpoint_parts_path(job: JobId, attempt: Attempt) -> String {
    format!("{CHECKPOINTS_PATH}/{job}/{attempt}/parts")
}
/// `POST` a [`CheckpointCommit`] here.
pub fn checkpoint_commit_path(job: JobId, attempt: Attempt) -> String {
    format!("{CHECKPOINTS_PATH}/{job}/{attempt}/commit")
}
/// `GET` the job's latest checkpoint here.
pub fn checkpoint_latest_path(job: JobId) -> String {
    format!("{CHECKPOINTS_PATH}/{job}/latest")
}

/// One uploaded part of a checkpoint archive.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointPart {
    pub n: u32,
    pub bytes: u64,
    /// SHA-256 of the part, lowercase hex.
    pub sha256: String,
}

/// Commits the parts `0..parts` as one archive of `bytes` bytes whose SHA-256 is `sha256`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointCommit {
    pub parts: u32,
    pub bytes: u64,
    /// SHA-256 of the whole archive (the parts concatenated), lowercase hex.
    pub sha256: String,
    /// How long the checkpoint took to write, in milliseconds: from the start of packing
    /// the archive to its last part uploaded, on the agent's clock. Older agents omit it
    /// (and an agent resuming an earlier try's archive does not know it); the scheduler
    /// gives a guest whose last checkpoint took longer than its node's grace a longer one.
    /// A portal that predates it refuses the field (400): the agent sends the commit
    /// again without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_ms: Option<u64>,
}

/// The answer to a commit: the checkpoint's id and when it was stored (RFC 3339, UTC).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointCommitted {
    pub id: i64,
    pub at: String,
}

/// What the store keeps beside a committed checkpoint's parts (`manifest.json`): enough
/// to read the archive back without the database.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointManifest {
    pub job: JobId,
    pub attempt: Attempt,
    /// Which commit of the attempt, from 1.
    pub seq: i32,
    pub node: i64,
    pub bytes: u64,
    pub sha256: String,
    /// RFC 3339, UTC.
    pub at: String,
    /// In order; part `i` is stored as `part-{i:05}-{sha256}`.
    pub parts: Vec<CheckpointPart>,
}
