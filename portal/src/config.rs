//! Portal configuration: a TOML file, then environment variables, then flags.
//! Validated once in `main` and passed down in `AppState`; no global config.

use anyhow::Context;
use serde::Deserialize;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// `sqlite://PATH` (embedded default) or `postgres://...` (env `COMMONS_DATABASE_URL`).
    pub database_url: String,
    /// Address the HTTP server listens on (env `COMMONS_LISTEN`).
    pub listen: String,
    /// The URL users and agents reach the portal at (env `COMMONS_PUBLIC_URL`).
    pub public_url: Option<String>,
    /// Allow logging in as any existing user without a password. Local demos only.
    pub insecure_dev_login: bool,
    /// File with at least 64 random bytes that sign and encrypt session cookies; without
    /// it a fresh key is made at start (everyone is logged out on restart).
    pub session_key_file: Option<PathBuf>,
    pub scheduler: SchedulerConfig,
    /// Knobs of the scheduling policy (grace default, half-life, base share, ...).
    pub policy: commons_sched::Policy,
    /// Campus single sign-on (OpenID Connect).
    pub oidc: OidcConfig,
    /// A session ends after this many minutes without a request.
    pub session_idle_minutes: u64,
    /// ... and this many hours after login, whatever happens.
    pub session_absolute_hours: u64,
    /// Where jobs' `/checkpoint` archives are kept, and how many.
    pub checkpoints: CheckpointsConfig,
    /// The SSH gateway into running jobs.
    pub ssh: SshConfig,
    /// `/metrics` for Prometheus.
    pub metrics: MetricsConfig,
    /// The image allow-list's signatures.
    pub images: ImagesConfig,
    /// Jobs' GPU utilisation over time, from the agents' heartbeats.
    pub utilization: UtilizationConfig,
}

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
    /// File holding a bearer token that scrapers must send (`Authorization: Bearer ...`);
    /// unset: `/metrics` answers anyone who reaches the listener (block it at the reverse
    /// proxy then).
    pub bearer_token_file: Option<PathBuf>,
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
    /// Failed logins per source address per minute; past it the address is refused for a
    /// minute.
    pub auth_failures_per_minute: u32,
}

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

    fn validate(&self, database_url: &str) -> anyhow::Result<()> {
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

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SchedulerConfig {
    /// How often the scheduler runs without being woken, in milliseconds.
    pub tick_ms: u64,
    /// How often agents send heartbeats, in seconds.
    pub heartbeat_s: u64,
    /// How long an attempt's lease lasts without renewal, in seconds.
    pub lease_ttl_s: u64,
    /// Extra wait after a lease ran out before the job is requeued, in seconds.
    pub lease_margin_s: u64,
    /// A portal stopped cleanly (SIGTERM, Ctrl-C) first extends the leases of the
    /// attempts on its connected servers by this long, so a restart or an upgrade that
    /// takes longer than a lease stops no running job. A server that does not come back
    /// within it has its jobs requeued this much later.
    pub shutdown_lease_s: u64,
    /// Most jobs one scheduler round starts; the rest start in the next round, which
    /// follows at once. Keeps a round short when thousands of GPUs free up together (the
    /// load test measured a round starting about 5,000 jobs at over 20 s).
    pub max_starts_per_tick: usize,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            database_url: "sqlite://commons.db".into(),
            listen: "127.0.0.1:8080".into(),
            public_url: None,
            insecure_dev_login: false,
            session_key_file: None,
            scheduler: SchedulerConfig::default(),
            policy: commons_sched::Policy::default(),
            oidc: OidcConfig::default(),
            session_idle_minutes: 8 * 60,
            session_absolute_hours: 7 * 24,
            checkpoints: CheckpointsConfig::default(),
            ssh: SshConfig::default(),
            metrics: MetricsConfig::default(),
            images: ImagesConfig::default(),
            utilization: UtilizationConfig::default(),
        }
    }
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            tick_ms: 2000,
            heartbeat_s: 5,
            lease_ttl_s: 120,
            lease_margin_s: 30,
            shutdown_lease_s: 1800,
            max_starts_per_tick: 256,
        }
    }
}

impl Config {
    /// Reads the file (if any) and applies the environment.
    pub fn load(file: Option<&Path>) -> anyhow::Result<Self> {
        let mut c = match file {
            Some(p) => {
                let text = std::fs::read_to_string(p)
                    .with_context(|| format!("cannot read {}", p.display()))?;
                toml::from_str(&text).with_context(|| format!("{} is not valid", p.display()))?
            }
            None => Config::default(),
        };
        if let Ok(v) = std::env::var("COMMONS_DATABASE_URL") {
            c.database_url = v;
        }
        if let Ok(v) = std::env::var("COMMONS_LISTEN") {
            c.listen = v;
        }
        if let Ok(v) = std::env::var("COMMONS_PUBLIC_URL") {
            c.public_url = Some(v);
        }
        if let Ok(v) = std::env::var("COMMONS_OIDC_ISSUER") {
            c.oidc.issuer = Some(v);
        }
        if let Ok(v) = std::env::var("COMMONS_OIDC_CLIENT_ID") {
            c.oidc.client_id = Some(v);
        }
        if let Ok(v) = std::env::var("COMMONS_OIDC_CLIENT_SECRET") {
            c.oidc.client_secret = Some(Secret(v));
        }
        if let Ok(v) = std::env::var("COMMONS_OIDC_CLIENT_SECRET_FILE") {
            c.oidc.client_secret_file = Some(v.into());
        }
        if let Ok(v) = std::env::var("COMMONS_OIDC_GROUPS_CLAIM") {
            c.oidc.groups_claim = v;
        }
        if let Ok(v) = std::env::var("COMMONS_SSH_LISTEN") {
            c.ssh.listen = Some(v);
        }
        Ok(c)
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        let url = &self.database_url;
        anyhow::ensure!(
            ["sqlite://", "postgres://", "postgresql://"]
                .iter()
                .any(|p| url.starts_with(p)),
            "database_url must start with sqlite:// or postgres://, got {url:?}"
        );
        self.images.keys()?;
        let s = &self.scheduler;
        anyhow::ensure!(s.tick_ms >= 50, "scheduler.tick_ms must be at least 50");
        anyhow::ensure!(
            s.heartbeat_s >= 1,
            "scheduler.heartbeat_s must be at least 1"
        );
        anyhow::ensure!(
            s.lease_ttl_s >= 3 * s.heartbeat_s,
            "scheduler.lease_ttl_s must be at least three heartbeats"
        );
        anyhow::ensure!(
            self.utilization.sample_interval_s >= 1 && self.utilization.retention_days >= 1,
            "utilization.sample_interval_s and utilization.retention_days must be at least 1"
        );
        anyhow::ensure!(
            self.session_idle_minutes >= 1,
            "session_idle_minutes must be at least 1"
        );
        anyhow::ensure!(
            self.session_absolute_hours >= 1,
            "session_absolute_hours must be at least 1"
        );
        if let Some(issuer) = &self.oidc.issuer {
            url::Url::parse(issuer)
                .with_context(|| format!("oidc.issuer {issuer:?} is not a URL"))?;
            anyhow::ensure!(
                self.oidc.client_id.is_some(),
                "oidc.client_id is required when oidc.issuer is set"
            );
            anyhow::ensure!(
                self.oidc.secret()?.is_some(),
                "oidc.client_secret or oidc.client_secret_file is required when oidc.issuer is set"
            );
            let public = self
                .public_url
                .as_deref()
                .context("public_url is required with SSO: the provider redirects to <public_url>/auth/callback")?;
            url::Url::parse(public)
                .with_context(|| format!("public_url {public:?} is not a URL"))?;
        }
        self.checkpoints.validate(&self.database_url)?;
        if let Some(l) = &self.ssh.listen {
            anyhow::ensure!(
                l.parse::<std::net::SocketAddr>().is_ok(),
                "ssh.listen must be an address with a port, like 0.0.0.0:2222; got {l:?}"
            );
        }
        if let Some(u) = &self.ssh.relay_url {
            anyhow::ensure!(
                u.starts_with("http://") || u.starts_with("https://"),
                "ssh.relay_url must be an http:// or https:// URL; got {u:?}"
            );
        }
        anyhow::ensure!(
            self.ssh.connections_per_minute >= 1 && self.ssh.auth_failures_per_minute >= 1,
            "ssh.connections_per_minute and ssh.auth_failures_per_minute must be at least 1"
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn example_config_parses() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/portal.example.toml");
        let mut c = Config::load(Some(&path)).unwrap();
        assert!(c.oidc.issuer.is_some() && c.oidc.groups.lab_group_prefix.is_some());
        // The secret file of the example lives on the portal's server; use one of ours.
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, "s3cret\n").unwrap();
        c.oidc.client_secret_file = Some(secret.clone());
        assert_eq!(
            c.checkpoints.location(&c.database_url).unwrap(),
            CheckpointLocation::S3 {
                bucket: "gpu-commons-checkpoints".into(),
                prefix: "portal".into()
            }
        );
        assert_eq!((c.checkpoints.keep_per_job, c.checkpoints.part_mb), (2, 8));
        c.checkpoints.secret_access_key_file = Some(secret);
        c.validate().unwrap();
        assert_eq!(c.oidc.secret().unwrap().as_deref(), Some("s3cret"));
        assert_eq!(c.checkpoints.secret().unwrap().unwrap().0, "s3cret");
        assert!(!format!("{c:?}").contains("s3cret"));
    }

    #[test]
    fn sso_needs_its_settings() {
        let mut c = Config {
            public_url: Some("https://gpu.campus.example".into()),
            ..Config::default()
        };
        c.oidc.issuer = Some("https://sso.campus.example".into());
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("oidc.client_id"), "{e}");
        c.oidc.client_id = Some("gpu".into());
        c.oidc.client_secret = Some(Secret("hidden-value".into()));
        c.validate().unwrap();
        assert!(
            !format!("{c:?}").contains("hidden-value"),
            "secrets never print"
        );
        c.public_url = None;
        assert!(c.validate().unwrap_err().to_string().contains("public_url"));
    }

    #[test]
    fn checkpoint_stores() {
        let c = CheckpointsConfig::default();
        assert_eq!(
            c.location("sqlite:///var/lib/commons/commons.db").unwrap(),
            CheckpointLocation::Dir("/var/lib/commons/checkpoints".into())
        );
        let cwd = std::env::current_dir().unwrap();
        assert_eq!(
            c.location("postgres://db/commons").unwrap(),
            CheckpointLocation::Dir(cwd.join("checkpoints"))
        );
        let s3 = |store: &str| CheckpointsConfig {
            store: Some(store.into()),
            ..Default::default()
        };
        assert_eq!(
            s3("s3://ckpt/campus/").location("").unwrap(),
            CheckpointLocation::S3 {
                bucket: "ckpt".into(),
                prefix: "campus".into()
            }
        );
        assert!(s3("s3://").location("").is_err());
        assert!(s3("file://relative").location("").is_err());
        assert!(s3("/tmp/x").location("").is_err());
        let mut c = Config {
            checkpoints: s3("s3://ckpt"),
            ..Config::default()
        };
        c.checkpoints.endpoint = Some("http://127.0.0.1:9000".into());
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("allow_http"), "{e}");
        c.checkpoints.allow_http = true;
        c.checkpoints.access_key_id = Some("key".into());
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("go together"), "{e}");
        c.checkpoints.secret_access_key = Some(Secret("very-secret".into()));
        c.validate().unwrap();
        assert!(!format!("{c:?}").contains("very-secret"));
        c.checkpoints.keep_per_job = 0;
        assert!(c.validate().is_err());
        assert!(toml::from_str::<Config>("[checkpoints]\nkeep = 3").is_err());
    }

    #[test]
    fn unknown_keys_are_refused() {
        assert!(toml::from_str::<Config>("databse_url = 'x'").is_err());
    }
}
