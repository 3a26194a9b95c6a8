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
        c.oidc.client_secret_file = Some(secret);
        c.validate().unwrap();
        assert_eq!(c.oidc.secret().unwrap().as_deref(), Some("s3cret"));
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
    fn unknown_keys_are_refused() {
        assert!(toml::from_str::<Config>("databse_url = 'x'").is_err());
    }
}
