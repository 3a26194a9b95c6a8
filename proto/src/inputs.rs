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
//! while it starts, lists, reads or reports staging; anything else is "not found".
//!
//! The agent never holds a credential of the store. A portal that can (every one since
//! this field came) gives each listed file a short-lived [`InputFile::url`] scoped to its
//! one object: the object store's own presigned GET (S3), or a signed portal URL
//! ([`OBJECTS_PATH`], a local store). The agent GETs it without its node credential and
//! checks size and SHA-256 as before; a file listed without one is read through
//! `{INPUTS_PATH}/{job}/{attempt}/{path}` as before (an older portal). Both fields are
//! optional and `InputFile` takes unknown fields, so an older agent reads a newer
//! portal's listing (and ignores the URL) within the same protocol.

use serde::{Deserialize, Serialize};

/// Where the inputs API lives.
pub const INPUTS_PATH: &str = "/api/agent/v1/inputs";
/// Where staging progress goes.
pub const STAGING_PATH: &str = "/api/agent/v1/staging";
/// Where a local store's signed object URLs point (`{OBJECTS_PATH}/{object key}?node=..&
/// job=..&attempt=..&expires=..&sig=..`): one object, no credential but the signature.
pub const OBJECTS_PATH: &str = "/api/agent/v1/objects";

/// One file to stage.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputFile {
    /// Relative to `/inputs`.
    pub path: String,
    pub size: u64,
    /// SHA-256 in hex.
    pub sha256: String,
    /// A short-lived URL of this one object, to GET without the node's credential:
    /// absolute (the object store's), or relative to the portal's address (its own
    /// signed route). Never shown to the job, never logged with its query. Absent: read
    /// the file through the portal with the node's credential.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// How many seconds `url` stays valid after the listing was answered (a duration,
    /// not an instant: the two clocks need not agree). Past it, list again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url_valid_s: Option<u32>,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `InputFile` as an agent of before the URLs declared it.
    #[derive(Debug, Deserialize)]
    struct OlderInputFile {
        path: String,
        size: u64,
        sha256: String,
    }

    #[test]
    fn listings_read_across_versions() {
        let older = r#"[{"path":"a","size":1,"sha256":"ab"}]"#;
        let read: Vec<InputFile> = serde_json::from_str(older).unwrap();
        assert_eq!((read[0].url.as_deref(), read[0].url_valid_s), (None, None));
        assert_eq!(
            serde_json::to_string(&read).unwrap(),
            older,
            "no URL, no field"
        );
        let newer = InputFile {
            url: Some("/api/agent/v1/objects/k?sig=1".into()),
            url_valid_s: Some(300),
            ..read[0].clone()
        };
        let text = serde_json::to_string(&newer).unwrap();
        let old: OlderInputFile = serde_json::from_str(&text).unwrap();
        assert_eq!(
            (old.path.as_str(), old.size, old.sha256.as_str()),
            ("a", 1, "ab")
        );
        let back: InputFile = serde_json::from_str(&text).unwrap();
        assert_eq!(back, newer);
    }
}
