//! The sections of the portal's configuration file below the top level: utilisation
//! samples, metrics, images, SSH, checkpoints and single sign-on.

use anyhow::Context;
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// How jobs' GPU utilisation is sampled and kept (`attempt_samples`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UtilizationConfig {
    /// At most one sample per running attempt this often, in seconds: the mean of the
    /// heartbeats in between (the peak of their memory).
    pub sample_interval_s: u64,
    /// Samples older than this many days are deleted (checked hourly).
    pub retention_days: u64,
}

impl Default for UtilizationConfig {
    fn default() -> Self {
        Self {
            sample_interval_s: 60,
            retention_days: 30,
        }
    }
}

/// `/metrics` (Prometheus text format) on the portal's own listener.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// Serve `/metrics` at all.
    pub enabled: bool,
    /// File holding a bearer token that scrapers must send (`Authorization: Bearer ...`),
    /// read at start and at each scrape (so it can be rotated). Required when `listen` is
    /// not a loopback address; unset on loopback, `/metrics` answers anyone who reaches
    /// the listener (block it at the reverse proxy then).
    pub bearer_token_file: Option<PathBuf>,
}

impl MetricsConfig {
    /// The scrape token, when a file is named; an unreadable or empty file is an error.
    pub fn token(&self) -> anyhow::Result<Option<Secret>> {
        let Some(path) = &self.bearer_token_file else {
            return Ok(None);
        };
        let s = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read metrics.bearer_token_file {}", path.display()))?;
        let t = s.trim();
        anyhow::ensure!(
            !t.is_empty(),
            "metrics.bearer_token_file {} is empty",
            path.display()
        );
        Ok(Some(Secret(t.to_string())))
    }
}

impl Default for MetricsConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            bearer_token_file: None,
        }
    }
}

/// Image signatures (see `commons_api::image`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ImagesConfig {
    /// The campus image authorities' ed25519 public keys, one OpenSSH line each
    /// (`ssh-ed25519 AAAA... name`). Allow-list entries may carry a signature by one of
    /// them; labs that require signed images accept only such entries.
    pub authority_keys: Vec<String>,
}

impl ImagesConfig {
    pub fn keys(&self) -> anyhow::Result<Vec<commons_api::image::AuthorityKey>> {
        self.authority_keys
            .iter()
            .enumerate()
            .map(|(i, k)| {
                commons_api::image::AuthorityKey::parse(k)
                    .map_err(|e| anyhow::anyhow!("images.authority_keys[{i}]: {e}"))
            })
            .collect()
    }
}

/// The SSH gateway (off unless `listen` is set).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SshConfig {
    /// Address the gateway listens on, e.g. `0.0.0.0:2222` (flag `--ssh-listen`).
    pub listen: Option<String>,
    /// The gateway's private host key (OpenSSH format). Made at first start when missing;
    /// replicas must share one file. Unset: `ssh_host_ed25519_key` beside the SQLite file
    /// (in the working directory with PostgreSQL).
    pub host_key_file: Option<PathBuf>,
    /// The host name users connect to, for the `~/.ssh/config` block on job pages.
    /// Unset: the host of `public_url`, else of `listen`.
    pub public_host: Option<String>,
    /// The port users connect to (a port forward or load balancer may differ from
    /// `listen`). Unset: the port of `listen`.
    pub public_port: Option<u16>,
    /// This replica's own base URL as agents reach it, sent with each relay so the agent
    /// dials the replica that holds the user's connection. Needed with several replicas;
    /// unset: agents dial the portal URL they are configured with.
    pub relay_url: Option<String>,
    /// New connections allowed per source address per minute.
    pub connections_per_minute: u32,
    /// Failed logins (a key query counts as one) per minute per source address and user
    /// name (`job-42`); past it that name is refused from that address for a minute.
    pub auth_failures_per_minute: u32,
    /// Failed logins per minute per source address, whatever the user name; past it the
    /// address is refused for a minute. Higher than `auth_failures_per_minute`, so that
    /// one person's failures do not lock out everyone behind the same NAT.
    pub auth_failures_per_address_per_minute: u32,
    /// The ciphers the gateway offers, in its order. An SSH client takes the first of
    /// its own list that the server offers, and OpenSSH lists ChaCha20-Poly1305 first:
    /// offering it makes every OpenSSH client use it, and a 100 MiB copy then takes
    /// 1.1-1.2x the time it takes with AES-GCM (both sides' CPU, on this project's
    /// 2-core benchmark machine). The default offers AES-GCM only, which every OpenSSH
    /// since 6.2 (2013) and PuTTY since 0.76 speak; add `chacha20-poly1305@openssh.com`
    /// or `aes256-ctr` for older clients.
    pub ciphers: Vec<String>,
}

/// What [`SshConfig::ciphers`] offers unless configured.
pub const DEFAULT_SSH_CIPHERS: [&str; 2] = ["aes256-gcm@openssh.com", "aes128-gcm@openssh.com"];

impl Default for SshConfig {
    fn default() -> Self {
        Self {
            listen: None,
            host_key_file: None,
            public_host: None,
            public_port: None,
            relay_url: None,
            connections_per_minute: 60,
            auth_failures_per_minute: 20,
            auth_failures_per_address_per_minute: 200,
            ciphers: DEFAULT_SSH_CIPHERS.iter().map(|c| c.to_string()).collect(),
        }
    }
}

impl SshConfig {
    /// Where the host key lives (see `host_key_file`).
    pub fn host_key_path(&self, database_url: &str) -> PathBuf {
        if let Some(p) = &self.host_key_file {
            return p.clone();
        }
        let dir = database_url
            .strip_prefix("sqlite://")
            .and_then(|f| Path::new(f).parent().map(Path::to_path_buf))
            .unwrap_or_default();
        dir.join("ssh_host_ed25519_key")
    }

    /// Host and port for users, when the gateway is on.
    pub fn public_endpoint(&self, public_url: Option<&str>) -> Option<(String, u16)> {
        let listen = self.listen.as_deref()?;
        let (lhost, lport) = listen.rsplit_once(':')?;
        let port = self.public_port.or_else(|| lport.parse().ok())?;
        let from_url = public_url
            .and_then(|u| url::Url::parse(u).ok())
            .and_then(|u| u.host_str().map(str::to_string));
        let host = self.public_host.clone().or(from_url).unwrap_or_else(|| {
            let h = lhost.trim_start_matches('[').trim_end_matches(']');
            if h == "0.0.0.0" || h == "::" || h.is_empty() {
                "localhost".to_string()
            } else {
                h.to_string()
            }
        });
        Some((host, port))
    }
}

/// The checkpoint store: a local directory by default, S3-compatible by configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CheckpointsConfig {
    /// `file:///ABSOLUTE/PATH` or `s3://BUCKET[/PREFIX]`. Unset: a `checkpoints` directory
    /// beside the SQLite file (`./checkpoints` with PostgreSQL).
    pub store: Option<String>,
    /// S3: the endpoint URL of an S3-compatible server (MinIO, Ceph, ...); unset for AWS.
    pub endpoint: Option<String>,
    /// S3: the region (`us-east-1` unless set).
    pub region: Option<String>,
    /// S3: the access key id; unset, the server's instance or web-identity credentials.
    pub access_key_id: Option<String>,
    /// S3: the secret access key; prefer `secret_access_key_file`.
    pub secret_access_key: Option<Secret>,
    /// S3: a file holding the secret access key.
    pub secret_access_key_file: Option<PathBuf>,
    /// S3: allow a plain `http://` endpoint (a server on the same host or network).
    pub allow_http: bool,
    /// Committed checkpoints kept per job, newest first (at least 1).
    pub keep_per_job: u32,
    /// The campus default cap on the checkpoints a lab keeps, in GB (10^9 bytes); an
    /// operator can set a lab's own (`labs.checkpoint_cap_gb`).
    pub lab_cap_gb: f64,
    /// The largest part an agent uploads in one request, in MiB.
    pub part_mb: u64,
    /// The most one checkpoint of one attempt may take in the store, in GB (10^9 bytes),
    /// counted part by part as it is uploaded.
    pub attempt_cap_gb: f64,
    /// A local directory store refuses parts that would leave less free space on its
    /// filesystem than the larger of `min_free_gb` (GB) and `min_free_percent` (% of the
    /// filesystem's size), so a full store never takes the database beside it down.
    /// (No floor for S3: the bucket's own quotas apply.)
    pub min_free_gb: f64,
    pub min_free_percent: f64,
}

impl Default for CheckpointsConfig {
    fn default() -> Self {
        Self {
            store: None,
            endpoint: None,
            region: None,
            access_key_id: None,
            secret_access_key: None,
            secret_access_key_file: None,
            allow_http: false,
            keep_per_job: 2,
            lab_cap_gb: 50.0,
            part_mb: 8,
            // Two fifths of the default lab cap: one attempt cannot take a lab's whole
            // share, and with keep_per_job = 2 a job's checkpoints fit in the lab's cap.
            attempt_cap_gb: 20.0,
            // Room for the SQLite file and its WAL to grow (jobs' logs are kept there)
            // and for an online backup of a campus database; on a large disk, 5 % keeps
            // the filesystem out of the nearly-full regime and gives operators time.
            min_free_gb: 2.0,
            min_free_percent: 5.0,
        }
    }
}

/// Where checkpoints are kept, as [`CheckpointsConfig::location`] resolves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckpointLocation {
    /// An absolute directory (created on first use).
    Dir(PathBuf),
    /// A bucket and a key prefix without slashes at either end (maybe empty).
    S3 { bucket: String, prefix: String },
}

impl CheckpointsConfig {
    /// The store named by `store`, or the default beside the SQLite file of `database_url`.
    pub fn location(&self, database_url: &str) -> anyhow::Result<CheckpointLocation> {
        let Some(store) = self.store.as_deref() else {
            let dir = database_url
                .strip_prefix("sqlite://")
                .and_then(|path| Path::new(path).parent())
                .map(|dir| dir.join("checkpoints"))
                .unwrap_or_else(|| PathBuf::from("checkpoints"));
            let dir = std::path::absolute(&dir)
                .with_context(|| format!("checkpoints: cannot resolve {}", dir.display()))?;
            return Ok(CheckpointLocation::Dir(dir));
        };
        if let Some(path) = store.strip_prefix("file://") {
            anyhow::ensure!(
                path.starts_with('/'),
                "checkpoints.store {store:?} must name an absolute path: file:///PATH"
            );
            return Ok(CheckpointLocation::Dir(PathBuf::from(path)));
        }
        if let Some(rest) = store.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            anyhow::ensure!(
                !bucket.is_empty(),
                "checkpoints.store {store:?} names no bucket: s3://BUCKET/PREFIX"
            );
            return Ok(CheckpointLocation::S3 {
                bucket: bucket.to_string(),
                prefix: prefix.trim_matches('/').to_string(),
            });
        }
        anyhow::bail!("checkpoints.store must be file:///PATH or s3://BUCKET/PREFIX, got {store:?}")
    }

    /// The S3 secret access key, from the file if one is named.
    pub fn secret(&self) -> anyhow::Result<Option<Secret>> {
        if let Some(path) = &self.secret_access_key_file {
            let s = std::fs::read_to_string(path).with_context(|| {
                format!(
                    "cannot read checkpoints.secret_access_key_file {}",
                    path.display()
                )
            })?;
            return Ok(Some(Secret(s.trim().to_string())));
        }
        Ok(self.secret_access_key.clone())
    }

    /// The largest part, in bytes.
    pub fn part_bytes(&self) -> u64 {
        self.part_mb.saturating_mul(1 << 20)
    }

    pub(super) fn validate(&self, database_url: &str) -> anyhow::Result<()> {
        let location = self.location(database_url)?;
        anyhow::ensure!(
            self.keep_per_job >= 1,
            "checkpoints.keep_per_job must be at least 1"
        );
        anyhow::ensure!(
            self.lab_cap_gb.is_finite() && self.lab_cap_gb >= 0.0,
            "checkpoints.lab_cap_gb must be a number of GB, 0 or more"
        );
        anyhow::ensure!(
            (1..=1024).contains(&self.part_mb),
            "checkpoints.part_mb must be between 1 and 1024"
        );
        anyhow::ensure!(
            self.attempt_cap_gb.is_finite() && self.attempt_cap_gb > 0.0,
            "checkpoints.attempt_cap_gb must be a number of GB, more than 0"
        );
        anyhow::ensure!(
            self.min_free_gb.is_finite() && self.min_free_gb >= 0.0,
            "checkpoints.min_free_gb must be a number of GB, 0 or more"
        );
        anyhow::ensure!(
            (0.0..100.0).contains(&self.min_free_percent),
            "checkpoints.min_free_percent must be at least 0 and under 100"
        );
        if let Some(endpoint) = &self.endpoint {
            let url = url::Url::parse(endpoint)
                .with_context(|| format!("checkpoints.endpoint {endpoint:?} is not a URL"))?;
            anyhow::ensure!(
                url.scheme() == "https" || (url.scheme() == "http" && self.allow_http),
                "checkpoints.endpoint {endpoint:?} is plain http: set checkpoints.allow_http = true to allow it"
            );
        }
        if matches!(location, CheckpointLocation::S3 { .. }) {
            anyhow::ensure!(
                self.access_key_id.is_some() == self.secret()?.is_some(),
                "checkpoints.access_key_id and checkpoints.secret_access_key (or _file) go together"
            );
        }
        Ok(())
    }
}

/// A secret that never shows in logs or `Debug` output.
#[derive(Clone, Default, Deserialize)]
#[serde(transparent)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<hidden>")
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OidcConfig {
    /// The provider's issuer URL (env `COMMONS_OIDC_ISSUER`); SSO is on when it is set.
    pub issuer: Option<String>,
    /// Env `COMMONS_OIDC_CLIENT_ID`.
    pub client_id: Option<String>,
    /// Env `COMMONS_OIDC_CLIENT_SECRET`; prefer `client_secret_file`.
    pub client_secret: Option<Secret>,
    /// File holding the client secret (env `COMMONS_OIDC_CLIENT_SECRET_FILE`).
    pub client_secret_file: Option<PathBuf>,
    /// Scopes asked for besides `openid`.
    pub scopes: Vec<String>,
    /// The claim that lists the user's groups (env `COMMONS_OIDC_GROUPS_CLAIM`).
    pub groups_claim: String,
    /// How groups map to labs, roles and operators.
    pub groups: crate::identity::GroupRules,
}

impl Default for OidcConfig {
    fn default() -> Self {
        Self {
            issuer: None,
            client_id: None,
            client_secret: None,
            client_secret_file: None,
            scopes: vec!["email".into(), "profile".into()],
            groups_claim: "groups".into(),
            groups: Default::default(),
        }
    }
}

impl OidcConfig {
    /// The client secret, from the file if one is named.
    pub fn secret(&self) -> anyhow::Result<Option<String>> {
        if let Some(path) = &self.client_secret_file {
            let s = std::fs::read_to_string(path).with_context(|| {
                format!("cannot read oidc.client_secret_file {}", path.display())
            })?;
            return Ok(Some(s.trim().to_string()));
        }
        Ok(self.client_secret.as_ref().map(|s| s.0.clone()))
    }
}
