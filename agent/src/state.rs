//! The agent's state dir: its node credential and the fake-GPU overrides (the attempts'
//! files are `store`'s).
//!
//! The credential file is written once, at enrolment, with mode 0600; started again with
//! the same state dir, the agent needs no enrolment token.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use thiserror::Error;

const NODE_FILE: &str = "node.json";
const FAKE_FILE: &str = "fake-gpus.json";

#[derive(Debug, Error)]
pub enum StateError {
    #[error("{} is damaged ({source}); remove it and enrol again", path.display())]
    Damaged {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("{} is damaged ({source})", path.display())]
    Unreadable {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot encode {}: {source}", path.display())]
    Encode {
        path: PathBuf,
        source: serde_json::Error,
    },
}

/// What enrolment gave this node.
#[derive(Clone, Serialize, Deserialize)]
pub struct NodeCredential {
    pub node_id: i64,
    pub node_name: String,
    pub lab: String,
    pub credential: String,
    /// Random id put on every container as `commons.agent`, so agents sharing one Docker
    /// Engine (tests, or two nodes on one host) never touch each other's containers.
    pub agent_id: String,
}

impl std::fmt::Debug for NodeCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeCredential")
            .field("node_id", &self.node_id)
            .field("node_name", &self.node_name)
            .field("lab", &self.lab)
            .field("credential", &"<hidden>")
            .finish()
    }
}

/// The node credential, or `None` when this state dir was never enrolled.
pub fn load_credential(dir: &Path) -> Result<Option<NodeCredential>, StateError> {
    let path = dir.join(NODE_FILE);
    match std::fs::read(&path) {
        Ok(bytes) => match serde_json::from_slice(&bytes) {
            Ok(c) => Ok(Some(c)),
            Err(source) => Err(StateError::Damaged { path, source }),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(StateError::Read { path, source }),
    }
}

/// Forgets the node credential (after `leave`: the portal revoked it).
pub fn remove_credential(dir: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(dir.join(NODE_FILE)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Writes the credential whole and durably, readable by the agent's user only (`atomic`).
pub fn save_credential(dir: &Path, cred: &NodeCredential) -> Result<(), StateError> {
    crate::store::write_json_mode(&dir.join(NODE_FILE), cred, crate::atomic::PRIVATE)
}

/// Per-GPU overrides that `commons-agent fake` writes and the fake GPU source reads.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FakeOverride {
    #[serde(default)]
    pub local_use: bool,
    #[serde(default)]
    pub util_pct: u32,
    /// A fault to report (as NVML would: "Xid 79: fallen off the bus"); none: healthy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault: Option<String>,
}

pub fn load_fake_overrides(dir: &Path) -> BTreeMap<u32, FakeOverride> {
    std::fs::read(dir.join(FAKE_FILE))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

/// Writes the overrides whole and durably (`atomic`): the fake GPU source reads them any
/// time.
pub fn save_fake_overrides(
    dir: &Path,
    overrides: &BTreeMap<u32, FakeOverride>,
) -> Result<(), StateError> {
    crate::store::write_json(&dir.join(FAKE_FILE), overrides)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credential_round_trip_and_hidden_debug() {
        let dir = tempfile::tempdir().unwrap();
        assert!(load_credential(dir.path()).unwrap().is_none());
        let c = NodeCredential {
            node_id: 3,
            node_name: "n".into(),
            lab: "vision".into(),
            credential: "secret-value".into(),
            agent_id: "a".into(),
        };
        save_credential(dir.path(), &c).unwrap();
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join(NODE_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(
            mode & 0o777,
            0o600,
            "the credential is the agent user's only"
        );
        let back = load_credential(dir.path()).unwrap().unwrap();
        assert_eq!(back.credential, "secret-value");
        assert!(!format!("{back:?}").contains("secret-value"));
    }

    #[test]
    fn a_damaged_credential_says_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(NODE_FILE), "{not json").unwrap();
        let err = load_credential(dir.path()).unwrap_err().to_string();
        assert!(err.contains("node.json is damaged"), "{err}");
        assert!(err.contains("enrol again"), "{err}");
    }

    #[test]
    fn fake_overrides_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let mut o = BTreeMap::new();
        o.insert(
            1,
            FakeOverride {
                local_use: true,
                util_pct: 80,
                fault: None,
            },
        );
        save_fake_overrides(dir.path(), &o).unwrap();
        assert_eq!(load_fake_overrides(dir.path()), o);
    }
}
