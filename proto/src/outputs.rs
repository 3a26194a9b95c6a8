//! A job's outputs between agent and portal (HTTP beside the WebSocket, the node's
//! credential as `Authorization: Bearer`): whatever a job writes to `/outputs` is kept in
//! its owner's file space under `jobs/{job}/`, and a resumed attempt gets it back.
//!
//! ```text
//! PUT {OUTPUTS_PATH}/{job}/{attempt}/{path}   one file of attempt `attempt`, streamed;
//!                                             x-commons-sha256 checked when sent
//! GET {OUTPUTS_PATH}/{job}/{attempt}          [OutputFile] the job kept so far, for attempt `attempt`
//! GET {OUTPUTS_PATH}/{job}/{attempt}/{path}   one of them, for attempt `attempt`
//! ```
//! `path` is relative to `/outputs`, percent-encoded per segment, with the file spaces'
//! rules (UTF-8, no empty, `.` or `..` segment). Only the node an attempt is placed on
//! uploads for it (until the attempt is reported ended) or downloads for it (while it
//! starts or runs); anything else is "not found". Uploads count against the owner's file
//! quota as they arrive (413 `file_quota`).

use serde::{Deserialize, Serialize};

/// Where the outputs API lives.
pub const OUTPUTS_PATH: &str = "/api/agent/v1/outputs";

/// One file a job has kept in its outputs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputFile {
    /// Relative to `/outputs` (`model/weights.pt`).
    pub path: String,
    pub size: u64,
    /// SHA-256 in hex.
    pub sha256: String,
}

/// `{OUTPUTS_PATH}/{job}/{attempt}`.
pub fn outputs_path(job: i64, attempt: i32) -> String {
    format!("{OUTPUTS_PATH}/{job}/{attempt}")
}

/// `{OUTPUTS_PATH}/{job}/{attempt}/{path}`, `path` already percent-encoded.
pub fn output_file_path(job: i64, attempt: i32, encoded_path: &str) -> String {
    format!("{OUTPUTS_PATH}/{job}/{attempt}/{encoded_path}")
}
