//! A job's inputs between agent and portal (HTTP beside the WebSocket, the node's
//! credential as `Authorization: Bearer`): the files and folders a job names in
//! `JobSpec::inputs`, staged read-only under `/inputs` before its container starts.
//!
//! ```text
//! GET  {INPUTS_PATH}/{job}/{attempt}          [InputFile] every file to stage, by path
//! GET  {INPUTS_PATH}/{job}/{attempt}/{path}   one of them, streamed (x-commons-sha256 sent)
//! POST {STAGING_PATH}/{job}/{attempt}         Staging: how far staging got
//! ```
//! `path` is where the file goes under `/inputs` (`data/train.tar`; a lab's files under
//! `lab/SLUG/...`), percent-encoded per segment. Only the node an attempt is placed on,
//! while it starts, lists, reads or reports staging; anything else is "not found". The
//! agent never holds a credential of the store: the portal streams each object.

use serde::{Deserialize, Serialize};

/// Where the inputs API lives.
pub const INPUTS_PATH: &str = "/api/agent/v1/inputs";
/// Where staging progress goes.
pub const STAGING_PATH: &str = "/api/agent/v1/staging";

/// One file to stage.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputFile {
    /// Relative to `/inputs`.
    pub path: String,
    pub size: u64,
    /// SHA-256 in hex.
    pub sha256: String,
}

/// An attempt's staging, as its agent reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Staging {
    pub done_bytes: u64,
    pub total_bytes: u64,
    pub files: u64,
    /// Every file is staged (or staging failed: `error`).
    #[serde(default)]
    pub finished: bool,
    /// Why staging failed, naming the file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `{INPUTS_PATH}/{job}/{attempt}`.
pub fn inputs_path(job: i64, attempt: i32) -> String {
    format!("{INPUTS_PATH}/{job}/{attempt}")
}

/// `{INPUTS_PATH}/{job}/{attempt}/{path}`, `path` already percent-encoded.
pub fn input_file_path(job: i64, attempt: i32, encoded_path: &str) -> String {
    format!("{INPUTS_PATH}/{job}/{attempt}/{encoded_path}")
}

/// `{STAGING_PATH}/{job}/{attempt}`.
pub fn staging_path(job: i64, attempt: i32) -> String {
    format!("{STAGING_PATH}/{job}/{attempt}")
}
