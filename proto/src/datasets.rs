//! Lab datasets between agent and portal: what a job mounts read-only
//! ([`crate::JobSpec::datasets`]), what a server offers ([`NodeDatasets`], in `Hello` and
//! in a `Heartbeat` when it changed), and the API through which an agent fetches a
//! dataset kept in a lab's file space (HTTP beside the WebSocket, the node's credential as
//! `Authorization: Bearer`):
//!
//! ```text
//! GET  {DATASETS_PATH}/{job}/{attempt}/{index}          DatasetListing: its version and files
//! GET  {DATASETS_PATH}/{job}/{attempt}/{index}/{path}   one file, streamed (x-commons-sha256 sent)
//! ```
//! `index` is the dataset's place in `JobSpec::datasets`; `path` is relative to the
//! dataset's folder, percent-encoded per segment. Only the node an attempt is placed on,
//! while it starts, may list or read; anything else is "not found". Each listed file
//! carries a short-lived URL of its object, read as for inputs (`crate::inputs`); the
//! per-file route serves agents from before it.

use serde::{Deserialize, Serialize};

/// Where the datasets API lives.
pub const DATASETS_PATH: &str = "/api/agent/v1/datasets";

/// One dataset a job gets, read-only, at `mount`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatasetMount {
    /// `LAB/NAME`, as researchers name it ("vision/imagenet").
    pub key: String,
    /// An absolute path in the container ("/datasets/imagenet").
    pub mount: String,
    pub source: DatasetSource,
}

/// Where a dataset's content comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum DatasetSource {
    /// A folder of the lab's file space, fetched through [`DATASETS_PATH`]. `version`:
    /// its content version when the attempt was placed (the listing says the current one).
    Lab { version: String },
    /// An archive (`.tar.gz`, `.tgz` or `.tar`) fetched by the server itself, verified
    /// against `sha256`, unpacked into the server's cache. The SHA-256 is its version.
    Https { url: String, sha256: String },
    /// A folder the server's owner exports on that server (`commons-agent run --data
    /// NAME=/path`), mounted as it is.
    Node { name: String },
    /// The job may no longer use it (removed, or no longer shared with its owner's
    /// labs): the agent fails the attempt with this reason.
    Refused { why: String },
}

impl DatasetSource {
    /// The content version a server caches it under; `None` for `node:` (never cached).
    pub fn version(&self) -> Option<&str> {
        match self {
            DatasetSource::Lab { version } => Some(version),
            DatasetSource::Https { sha256, .. } => Some(sha256),
            DatasetSource::Node { .. } | DatasetSource::Refused { .. } => None,
        }
    }
}

/// A lab dataset's files now, and their content version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DatasetListing {
    pub version: String,
    pub files: Vec<crate::InputFile>,
}

/// What a server offers for datasets.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeDatasets {
    /// The names its owner exports (`--data NAME=/path`), sorted.
    #[serde(default)]
    pub exports: Vec<String>,
    /// What its dataset cache holds.
    #[serde(default)]
    pub cached: Vec<CachedDataset>,
    /// The cache's cap (`--dataset-cache-gb`); 0: none.
    #[serde(default)]
    pub cache_cap_bytes: u64,
    /// How fast it last fetched a dataset or a job's inputs, in bytes per second; absent:
    /// not measured yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fetch_bytes_per_s: Option<u64>,
}

/// One dataset version a server holds.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct CachedDataset {
    pub key: String,
    pub version: String,
    pub bytes: u64,
}

/// `{DATASETS_PATH}/{job}/{attempt}/{index}`.
pub fn dataset_path(job: i64, attempt: i32, index: usize) -> String {
    format!("{DATASETS_PATH}/{job}/{attempt}/{index}")
}

/// `{DATASETS_PATH}/{job}/{attempt}/{index}/{path}`, `path` already percent-encoded.
pub fn dataset_file_path(job: i64, attempt: i32, index: usize, encoded_path: &str) -> String {
    format!("{DATASETS_PATH}/{job}/{attempt}/{index}/{encoded_path}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_read_as_written() {
        let m: DatasetMount = serde_json::from_str(
            r#"{"key":"vision/imagenet","mount":"/datasets/imagenet",
                "source":{"kind":"https","url":"https://x/a.tar.gz","sha256":"ab"}}"#,
        )
        .unwrap();
        assert_eq!(m.source.version(), Some("ab"));
        let n = DatasetSource::Node {
            name: "imagenet".into(),
        };
        assert_eq!(n.version(), None);
        let back: DatasetSource =
            serde_json::from_value(serde_json::to_value(&n).unwrap()).unwrap();
        assert_eq!(back, n);
        assert_eq!(
            dataset_file_path(3, 1, 0, "a%20b"),
            "/api/agent/v1/datasets/3/1/0/a%20b"
        );
    }
}
