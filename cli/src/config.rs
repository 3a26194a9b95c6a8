//! The stored credential: `$XDG_CONFIG_HOME/gpu-commons/credentials.toml` (else
//! `~/.config/gpu-commons/`), the portal's URL and a personal access token.
//!
//! Invariants: the file is written whole (a temporary file renamed over it) with mode
//! 0600 in a directory of mode 0700, so the token is never readable by others, not even
//! for a moment; `COMMONS_URL` and `COMMONS_TOKEN` in the environment take the place of
//! the file (for CI jobs and scripts). The token is never printed.

use crate::error::{CliError, Result};
use anyhow::Context;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Credentials {
    /// The portal's base URL, without a trailing slash.
    pub url: String,
    pub token: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    /// When the token expires (UTC), if it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("url", &self.url)
            .field("token", &"(hidden)")
            .field("username", &self.username)
            .finish()
    }
}

/// The folder of this program's files.
pub fn dir() -> Result<PathBuf> {
    let base = match std::env::var_os("XDG_CONFIG_HOME").filter(|v| !v.is_empty()) {
        Some(d) => PathBuf::from(d),
        None => {
            let home = std::env::var_os("HOME")
                .filter(|v| !v.is_empty())
                .ok_or_else(|| CliError::Usage("neither XDG_CONFIG_HOME nor HOME is set".into()))?;
            PathBuf::from(home).join(".config")
        }
    };
    Ok(base.join("gpu-commons"))
}

pub fn credentials_path() -> Result<PathBuf> {
    Ok(dir()?.join("credentials.toml"))
}

/// A portal URL as stored: scheme and host, no trailing slash.
pub fn normalise_url(url: &str) -> Result<String> {
    let u = url.trim().trim_end_matches('/');
    let rest = u
        .strip_prefix("https://")
        .or_else(|| u.strip_prefix("http://"))
        .ok_or_else(|| {
            CliError::Usage(format!(
                "{u:?} is not a portal URL: it starts with https:// (or http://)"
            ))
        })?;
    if rest.is_empty() || rest.contains(char::is_whitespace) {
        return Err(CliError::Usage(format!("{u:?} is not a portal URL")));
    }
    Ok(u.to_string())
}

/// The credential to use: the environment's, else the stored one.
pub fn load() -> Result<Credentials> {
    let env_url = std::env::var("COMMONS_URL").ok().filter(|s| !s.is_empty());
    let env_token = std::env::var("COMMONS_TOKEN")
        .ok()
        .filter(|s| !s.is_empty());
    let stored = read_file()?;
    let url = match (env_url, &stored) {
        (Some(u), _) => normalise_url(&u)?,
        (None, Some(s)) => s.url.clone(),
        (None, None) => return Err(CliError::NotLoggedIn),
    };
    match (env_token, stored) {
        (Some(token), _) => Ok(Credentials {
            url,
            token,
            username: None,
            expires_at: None,
        }),
        (None, Some(s)) => Ok(Credentials { url, ..s }),
        (None, None) => Err(CliError::NotLoggedIn),
    }
}

fn read_file() -> Result<Option<Credentials>> {
    let path = credentials_path()?;
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(anyhow::Error::new(e)
                .context(format!("reading {}", path.display()))
                .into())
        }
    };
    toml::from_str(&text).map(Some).map_err(|e| {
        CliError::Usage(format!(
            "{} is damaged ({}); run `commons logout` and log in again",
            path.display(),
            e.message()
        ))
    })
}

/// Stores `creds`, readable by this user only.
pub fn save(creds: &Credentials) -> Result<PathBuf> {
    let path = credentials_path()?;
    let text = toml::to_string(creds).context("encoding the credential")?;
    write_private(&path, text.as_bytes())?;
    Ok(path)
}

/// Writes `bytes` to `path` through a synced 0600 temporary file renamed over it, in a
/// 0700 directory, then syncs the directory.
pub fn write_private(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| CliError::Usage(format!("{} has no folder", path.display())))?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .with_context(|| format!("making {} private", dir.display()))?;
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("file"),
        std::process::id()
    ));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("creating {}", tmp.display()))?;
    let written = f
        .write_all(bytes)
        .and_then(|_| f.sync_all())
        .with_context(|| format!("writing {}", tmp.display()))
        .and_then(|()| {
            std::fs::rename(&tmp, path).with_context(|| format!("replacing {}", path.display()))
        });
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e.into());
    }
    // The same steps as the agent's state files (`commons_agent::atomic`), kept here since
    // the only crates the two share are pure: the rename lasts through a crash of the
    // machine only once the folder is synced too.
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("syncing {}", dir.display()))?;
    Ok(())
}

/// Removes the stored credential; false when there was none.
pub fn remove() -> Result<bool> {
    let path = credentials_path()?;
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(anyhow::Error::new(e)
            .context(format!("removing {}", path.display()))
            .into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_normalised_or_refused() {
        assert_eq!(
            normalise_url("https://gpu.campus.edu/").unwrap(),
            "https://gpu.campus.edu"
        );
        assert!(normalise_url("gpu.campus.edu").is_err());
        assert!(normalise_url("https://").is_err());
    }

    #[test]
    fn private_files_are_0600_in_a_0700_folder() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("sub").join("credentials.toml");
        write_private(&p, b"x").unwrap();
        write_private(&p, b"y").unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&p), 0o600);
        assert_eq!(mode(p.parent().unwrap()), 0o700);
        assert_eq!(std::fs::read(&p).unwrap(), b"y");
    }

    #[test]
    fn debug_hides_the_token() {
        let c = Credentials {
            url: "https://x".into(),
            token: "gcp_secret".into(),
            username: None,
            expires_at: None,
        };
        assert!(!format!("{c:?}").contains("gcp_secret"));
    }
}
