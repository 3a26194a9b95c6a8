//! SSH into jobs: the caller's public keys (`/api/v1/ssh-keys`) and how to reach the
//! portal's SSH gateway (`GET /api/v1/ssh-gateway`).

use chrono::NaiveDateTime;
use serde::{Deserialize, Serialize};

/// `POST /api/v1/ssh-keys`: a public key to add.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct NewSshKey {
    /// One line as in `~/.ssh/id_ed25519.pub`.
    pub public_key: String,
    /// Defaults to the key's comment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// One of the caller's SSH public keys.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SshKey {
    pub id: i64,
    pub name: String,
    /// `ssh-ed25519`, `ecdsa-sha2-nistp256`, `ssh-rsa`, ...
    pub algorithm: String,
    /// `SHA256:...` as `ssh-keygen -l` prints it.
    pub fingerprint: String,
    /// The canonical OpenSSH one-line form `algo base64 [comment]`.
    pub public_key: String,
    pub created_at: NaiveDateTime,
    /// The last time the SSH gateway let someone in with it.
    pub last_used_at: Option<NaiveDateTime>,
}

/// How users reach the gateway: what job pages and `GET /api/v1/ssh-gateway` show.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GatewayInfo {
    pub host: String,
    pub port: u16,
    /// The host public key (`ssh-ed25519 AAAA...`).
    pub host_key: String,
    /// Its SHA-256 fingerprint, as `ssh` prints it.
    pub fingerprint: String,
    /// The name the host key is filed under in `known_hosts` (`HostKeyAlias`), one for
    /// every job of this portal.
    pub host_key_alias: String,
    /// The line for `~/.ssh/known_hosts`.
    pub known_hosts: String,
}

impl GatewayInfo {
    /// `ssh` for job `job`.
    pub fn command(&self, job: i64) -> String {
        if self.port == 22 {
            format!("ssh job-{job}@{}", self.host)
        } else {
            format!("ssh -p {} job-{job}@{}", self.port, self.host)
        }
    }

    /// A block for `~/.ssh/config`: `ssh commons-job-42` (and VS Code's Remote-SSH).
    pub fn config_block(&self, job: i64) -> String {
        format!(
            "Host commons-job-{job}\n    HostName {}\n    Port {}\n    User job-{job}\n    \
             HostKeyAlias {}\n",
            self.host, self.port, self.host_key_alias
        )
    }
}
