//! The host's identity, kept outside the state dir so it outlives the agent's identity.
//!
//! An agent's id (`commons.agent` on its containers) lives in its state dir. A state dir
//! that is lost (wiped, restored from an old image, a new disk) and enrolled again gives a
//! new agent id, and the containers of the old one are nobody's: no agent lists them, no
//! lease fences them once their guards are gone, and their jobs are requeued elsewhere
//! when their leases run out, so they would run twice. So every container also carries
//! the host's id ([`LABEL_HOST`]), read from a file outside the state dir (created once,
//! random), and an agent that starts stops and removes every container with its host id
//! and another agent id ([`stop_earlier_identities`], through any `ContainerRuntime`).
//!
//! Invariants: the host id is the same for every start on one Docker Engine, as long as
//! its file lives; two agents on one engine must have different host id files (tests,
//! demos), or each stops the other's containers; the file is created whole (a
//! temporary file, then a hard link that fails if another agent created it first), so
//! two agents starting at once agree on one id.

use crate::runtime::{ContainerRuntime, HostContainer, RuntimeError};
use std::path::{Path, PathBuf};
use thiserror::Error;

/// Where the host id lives unless `--host-id-file` says otherwise: beside the package's
/// state dir (`/var/lib/gpu-commons/agent`), not in it.
pub const DEFAULT_HOST_ID_FILE: &str = "/var/lib/gpu-commons/host-id";
/// The label with the host id, on every container.
pub const LABEL_HOST: &str = "commons.host";

#[derive(Debug, Error)]
pub enum HostIdError {
    #[error("cannot read the host id file {}: {source} (--host-id-file)", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot create the host id file {}: {source} (--host-id-file PATH: a file outside the state dir this user may write)", path.display())]
    Create {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the host id file {} holds {found:?}: a host id is 8 to 64 letters, digits, '-' or '_' (remove the file to get a new one)", path.display())]
    Invalid { path: PathBuf, found: String },
}

/// Whether `s` is a host id this agent accepts.
fn valid(s: &str) -> bool {
    (8..=64).contains(&s.len())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

fn read(path: &Path) -> Result<Option<String>, HostIdError> {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let id = text.trim();
            if valid(id) {
                Ok(Some(id.to_string()))
            } else {
                Err(HostIdError::Invalid {
                    path: path.to_path_buf(),
                    found: id.chars().take(80).collect(),
                })
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(HostIdError::Read {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// The host id in `path`; made (random) and written there when the file does not exist.
pub fn load_or_create(path: &Path) -> Result<String, HostIdError> {
    if let Some(id) = read(path)? {
        return Ok(id);
    }
    let create = |source| HostIdError::Create {
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(create)?;
    }
    let id = format!("{:032x}", rand::random::<u128>());
    let mut tmp = path.as_os_str().to_os_string();
    tmp.push(format!(".{:016x}.tmp", rand::random::<u64>()));
    let tmp = PathBuf::from(tmp);
    let written = std::fs::write(&tmp, format!("{id}\n"))
        .and_then(|()| std::fs::File::open(&tmp)?.sync_all())
        .and_then(|()| match std::fs::hard_link(&tmp, path) {
            // Another agent made it first: its id stands.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
            other => other,
        });
    let _ = std::fs::remove_file(&tmp);
    written.map_err(create)?;
    read(path)?.ok_or_else(|| {
        create(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "vanished right after it was written",
        ))
    })
}

/// A container of an earlier identity of this host, found (and stopped, when it was
/// `running`, then removed) at start.
pub type EarlierContainer = HostContainer;

/// Stops and removes every container with `rt`'s host id made by another agent id: an
/// earlier identity of this server whose state dir was lost. Its attempts are nobody's
/// now (the portal requeues them when their leases run out), so they must not run on.
/// Returns what was found, running or not; nothing without a host id.
pub async fn stop_earlier_identities<R: ContainerRuntime>(
    rt: &R,
) -> Result<Vec<EarlierContainer>, RuntimeError> {
    let mut out = Vec::new();
    for c in rt.list_host().await? {
        if c.agent == rt.agent_id() {
            continue;
        }
        if c.running {
            rt.stop(&c.id, crate::reconcile::ENFORCE_GRACE).await?;
        }
        rt.remove(&c.id).await?;
        out.push(c);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_id_is_made_once_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub").join("host-id");
        let first = load_or_create(&path).unwrap();
        assert!(valid(&first), "{first}");
        assert_eq!(
            load_or_create(&path).unwrap(),
            first,
            "read back, not made again"
        );
        let leftovers: Vec<_> = std::fs::read_dir(dir.path().join("sub"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(leftovers, ["host-id"], "no temporary file left");
    }

    #[test]
    fn an_operators_own_id_is_taken_and_a_bad_one_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("host-id");
        std::fs::write(&path, "gpu-server-07\n").unwrap();
        assert_eq!(load_or_create(&path).unwrap(), "gpu-server-07");
        std::fs::write(&path, "no spaces allowed").unwrap();
        let e = load_or_create(&path).unwrap_err().to_string();
        assert!(e.contains("8 to 64 letters"), "{e}");
        std::fs::write(&path, "").unwrap();
        assert!(load_or_create(&path).is_err(), "an empty file is not an id");
    }
}
