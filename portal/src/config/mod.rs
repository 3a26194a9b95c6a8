//! Portal configuration: a TOML file, then environment variables, then flags.
//! Validated once in `main` and passed down in `AppState`; no global config.

use anyhow::Context;
use serde::Deserialize;
use std::path::{Path, PathBuf};

mod access;
mod apps;
mod files;
mod notify;
mod sections;
pub use access::*;
pub use apps::AppsConfig;
pub use files::FilesConfig;
pub use notify::{NotifyConfig, SmtpConfig};
pub use sections::*;

/// Connections to PostgreSQL by default (`database_pool_size`): with `fsync` on,
/// concurrent commits share their WAL flushes, and the load test measured 594-645
/// submissions/s with a pool of 8 against 1,088-1,143/s with 16 (README, *Load test*).
pub const DEFAULT_DATABASE_POOL_SIZE: u32 = 16;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// `sqlite://PATH` (embedded default) or `postgres://...` (env `COMMONS_DATABASE_URL`).
    pub database_url: String,
    /// Connections the portal keeps open to PostgreSQL (env `COMMONS_DATABASE_POOL_SIZE`);
    /// every replica opens up to this many, and two more for the scheduler (its leader
    /// lock, and its rounds' own connection), so keep replicas x (pool size + 2) under the
    /// server's `max_connections`. SQLite always uses one connection.
    pub database_pool_size: u32,
    /// Address the HTTP server listens on (env `COMMONS_LISTEN`).
    pub listen: String,
    /// The URL users and agents reach the portal at (env `COMMONS_PUBLIC_URL`).
    pub public_url: Option<String>,
    /// Reverse proxies in front of the portal (addresses or ranges, e.g. `127.0.0.1` for
    /// nginx on the same machine): for a request from one of them, the client's address is
    /// the nearest one in `X-Forwarded-For` that is not a proxy. Empty: the header is
    /// ignored and the connection's peer is the client (nobody can claim an address).
    pub trusted_proxies: Vec<String>,
    /// Allow logging in as any existing user without a password. Local demos only: the
    /// portal refuses to start with it when `listen` is not a loopback address or campus
    /// SSO (`[oidc] issuer`) is configured.
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
    /// Users' and labs' file spaces (in the checkpoints' store) and their quotas.
    pub files: FilesConfig,
    /// The SSH gateway into running jobs.
    pub ssh: SshConfig,
    /// `/metrics` for Prometheus.
    pub metrics: MetricsConfig,
    /// The image allow-list's signatures.
    pub images: ImagesConfig,
    /// Jobs' GPU utilisation over time, from the agents' heartbeats.
    pub utilization: UtilizationConfig,
    /// The `commons` CLI's sign-in through the browser.
    pub cli_login: CliLoginConfig,
    /// The SMTP relay for e-mail notifications; none: no e-mail.
    pub smtp: Option<SmtpConfig>,
    /// Delivery of notifications (webhooks and e-mail).
    pub notify: NotifyConfig,
    /// Web apps that jobs serve, on origins of their own.
    pub apps: AppsConfig,
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
    /// How often, in seconds, the scheduler checks its world (kept in memory and updated
    /// from the change log each round) against a full read of the database, and repairs
    /// it with that read if they differ (logged, and counted in
    /// `commons_scheduler_world_mismatches_total`). 0: every round (the tests do).
    pub world_check_s: u64,
    /// False: every round reads the whole world again instead of the changes (what the
    /// scheduler did before the change log; for measuring the difference, or for doubt).
    pub incremental_world: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            database_url: "sqlite://commons.db".into(),
            database_pool_size: DEFAULT_DATABASE_POOL_SIZE,
            listen: "127.0.0.1:8080".into(),
            public_url: None,
            trusted_proxies: Vec::new(),
            insecure_dev_login: false,
            session_key_file: None,
            scheduler: SchedulerConfig::default(),
            policy: commons_sched::Policy::default(),
            oidc: OidcConfig::default(),
            session_idle_minutes: 8 * 60,
            session_absolute_hours: 7 * 24,
            checkpoints: CheckpointsConfig::default(),
            files: FilesConfig::default(),
            ssh: SshConfig::default(),
            metrics: MetricsConfig::default(),
            images: ImagesConfig::default(),
            utilization: UtilizationConfig::default(),
            cli_login: CliLoginConfig::default(),
            smtp: None,
            notify: NotifyConfig::default(),
            apps: AppsConfig::default(),
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
            world_check_s: 300,
            incremental_world: true,
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
        if let Ok(v) = std::env::var("COMMONS_DATABASE_POOL_SIZE") {
            c.database_pool_size = v.trim().parse().with_context(|| {
                format!("COMMONS_DATABASE_POOL_SIZE must be a whole number, got {v:?}")
            })?;
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

    /// Whether the HTTP listener is on a loopback address (127.0.0.0/8, ::1, `localhost`):
    /// reachable from this machine only, unless a reverse proxy here passes it on.
    pub fn listens_on_loopback(&self) -> bool {
        if let Ok(a) = self.listen.parse::<std::net::SocketAddr>() {
            return a.ip().is_loopback();
        }
        self.listen
            .rsplit_once(':')
            .is_some_and(|(host, _)| host.eq_ignore_ascii_case("localhost"))
    }

    /// What must not be reachable from the network: the development login, and
    /// `/metrics` without its scrape token.
    fn validate_exposure(&self) -> anyhow::Result<()> {
        let listen = &self.listen;
        if self.insecure_dev_login {
            anyhow::ensure!(
                self.oidc.issuer.is_none(),
                "insecure_dev_login cannot be on with campus SSO (oidc.issuer is set): anyone \
                 could log in as any user, SSO users included; turn insecure_dev_login off"
            );
            anyhow::ensure!(
                self.listens_on_loopback(),
                "insecure_dev_login lets anyone log in as any user: it needs a loopback listen \
                 address such as 127.0.0.1:8080, and listen is {listen:?}"
            );
        }
        if self.metrics.enabled {
            let token = self.metrics.token()?;
            anyhow::ensure!(
                token.is_some() || self.listens_on_loopback(),
                "/metrics would answer anyone who reaches {listen:?}: set [metrics] \
                 bearer_token_file (scrapers then send Authorization: Bearer <token>), or \
                 [metrics] enabled = false"
            );
        }
        Ok(())
    }

    /// [`Config::trusted_proxies`], parsed (checked at start by [`Config::validate`]).
    pub fn trusted_proxy_ranges(&self) -> Vec<ipnet::IpNet> {
        parse_ranges(&self.trusted_proxies, "trusted_proxies").unwrap_or_default()
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        self.validate_exposure()?;
        parse_ranges(&self.trusted_proxies, "trusted_proxies")?;
        self.cli_login.validate()?;
        self.apps.validate(self.public_url.as_deref())?;
        let url = &self.database_url;
        anyhow::ensure!(
            ["sqlite://", "postgres://", "postgresql://"]
                .iter()
                .any(|p| url.starts_with(p)),
            "database_url must start with sqlite:// or postgres://, got {url:?}"
        );
        anyhow::ensure!(
            (1..=1000).contains(&self.database_pool_size),
            "database_pool_size must be between 1 and 1000, got {}",
            self.database_pool_size
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
        self.validate_sso()?;
        self.checkpoints.validate(&self.database_url)?;
        self.files.validate()?;
        self.validate_ssh()
    }

    /// With SSO on: a client, its secret, and the public URL the provider redirects to.
    fn validate_sso(&self) -> anyhow::Result<()> {
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
        Ok(())
    }

    fn validate_ssh(&self) -> anyhow::Result<()> {
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
        anyhow::ensure!(
            self.ssh.auth_failures_per_address_per_minute >= self.ssh.auth_failures_per_minute,
            "ssh.auth_failures_per_address_per_minute ({}) must be at least \
             ssh.auth_failures_per_minute ({}): it caps a whole address, users behind a NAT included",
            self.ssh.auth_failures_per_address_per_minute,
            self.ssh.auth_failures_per_minute
        );
        crate::ssh::ciphers(&self.ssh.ciphers).map_err(|e| anyhow::anyhow!("ssh.ciphers: {e}"))?;
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
        assert_eq!(
            (c.cli_login.starts_per_address, c.cli_login.token_days),
            (20, 30)
        );
        assert_eq!(c.trusted_proxy_ranges().len(), 1);
        c.checkpoints.secret_access_key_file = Some(secret.clone());
        c.metrics.bearer_token_file = Some(secret);
        c.validate().unwrap();
        assert_eq!(c.oidc.secret().unwrap().as_deref(), Some("s3cret"));
        assert_eq!(c.checkpoints.secret().unwrap().unwrap().0, "s3cret");
        assert!(!format!("{c:?}").contains("s3cret"));
    }

    #[test]
    fn the_pool_size_is_read_and_bounded() {
        let c: Config = toml::from_str("database_pool_size = 32").unwrap();
        assert_eq!(c.database_pool_size, 32);
        c.validate().unwrap();
        for bad in [0, 1001] {
            let c = Config {
                database_pool_size: bad,
                ..Config::default()
            };
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains("database_pool_size"), "{e}");
        }
    }

    #[test]
    fn the_gateway_offers_aes_gcm_unless_told_otherwise_and_only_ciphers_it_speaks() {
        let c = Config::default();
        assert_eq!(c.ssh.ciphers, DEFAULT_SSH_CIPHERS);
        c.validate().unwrap();
        let c: Config =
            toml::from_str("[ssh]\nciphers = [\"chacha20-poly1305@openssh.com\", \"aes256-ctr\"]")
                .unwrap();
        c.validate().unwrap();
        for (bad, says) in [
            (
                r#"["aes256-gcm@openssh.com", "rot13"]"#,
                "\"rot13\" is not a cipher",
            ),
            (r#"["none"]"#, "\"none\" is not a cipher"),
            ("[]", "at least one cipher"),
        ] {
            let c: Config = toml::from_str(&format!("[ssh]\nciphers = {bad}")).unwrap();
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains("ssh.ciphers") && e.contains(says), "{bad}: {e}");
        }
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
        c.checkpoints.keep_per_job = 2;
        for (attempt_cap_gb, min_free_gb, min_free_percent, field) in [
            (0.0, 2.0, 5.0, "attempt_cap_gb"),
            (f64::NAN, 2.0, 5.0, "attempt_cap_gb"),
            (20.0, -1.0, 5.0, "min_free_gb"),
            (20.0, 2.0, 100.0, "min_free_percent"),
            (20.0, 2.0, -0.5, "min_free_percent"),
        ] {
            c.checkpoints.attempt_cap_gb = attempt_cap_gb;
            c.checkpoints.min_free_gb = min_free_gb;
            c.checkpoints.min_free_percent = min_free_percent;
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains(field), "{field}: {e}");
        }
        c.checkpoints = CheckpointsConfig {
            min_free_percent: 0.0,
            min_free_gb: 0.0,
            ..CheckpointsConfig::default()
        };
        c.validate().unwrap();
        assert!(toml::from_str::<Config>("[checkpoints]\nkeep = 3").is_err());
    }

    #[test]
    fn the_dev_login_stays_on_loopback_and_off_with_sso() {
        let dev = |listen: &str| Config {
            listen: listen.into(),
            insecure_dev_login: true,
            ..Config::default()
        };
        for ok in [
            "127.0.0.1:8080",
            "[::1]:8080",
            "localhost:8080",
            "127.0.0.2:0",
        ] {
            dev(ok).validate().unwrap();
        }
        for bad in [
            "0.0.0.0:8080",
            "[::]:8080",
            "192.0.2.7:8080",
            "gpu.campus.example:80",
        ] {
            let e = dev(bad).validate().unwrap_err().to_string();
            assert!(
                e.contains("insecure_dev_login") && e.contains("loopback"),
                "{e}"
            );
        }
        let mut c = dev("127.0.0.1:8080");
        c.public_url = Some("https://gpu.campus.example".into());
        c.oidc.issuer = Some("https://sso.campus.example".into());
        c.oidc.client_id = Some("gpu".into());
        c.oidc.client_secret = Some(Secret("s".into()));
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("insecure_dev_login") && e.contains("SSO"), "{e}");
        c.insecure_dev_login = false;
        c.validate().unwrap();
    }

    #[test]
    fn metrics_beyond_loopback_need_their_token() {
        let mut c = Config {
            listen: "0.0.0.0:8080".into(),
            ..Config::default()
        };
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("bearer_token_file"), "{e}");
        c.metrics.enabled = false;
        c.validate().unwrap();
        c.metrics.enabled = true;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("metrics.token");
        c.metrics.bearer_token_file = Some(file.clone());
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("metrics.bearer_token_file"), "unreadable: {e}");
        std::fs::write(&file, "\n").unwrap();
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("empty"), "{e}");
        std::fs::write(&file, "scrape-me\n").unwrap();
        c.validate().unwrap();
        let local = Config::default();
        assert!(local.listens_on_loopback() && local.metrics.bearer_token_file.is_none());
        local.validate().unwrap();
    }

    #[test]
    fn unknown_keys_are_refused() {
        assert!(toml::from_str::<Config>("databse_url = 'x'").is_err());
    }
}
