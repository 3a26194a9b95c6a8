//! `[apps]`: web apps that jobs serve, each on an origin of its own.

use serde::Deserialize;

/// Where the portal serves jobs' web apps. Unset `url`: no job may ask for an app.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct AppsConfig {
    /// The apps' URL with `{host}`, a random label per job, as the first label of the
    /// host: `https://{host}.apps.gpu.campus.edu` (wildcard DNS and certificate), or
    /// `http://{host}.apps.localhost:8081` on one machine (browsers resolve `*.localhost`
    /// to loopback). Never the portal's own host: an app's scripts must not run on the
    /// portal's origin.
    pub url: Option<String>,
    /// The address the apps' listener binds, e.g. `0.0.0.0:8081` (flag `--apps-listen`);
    /// behind a TLS proxy for the wildcard name in production.
    pub listen: Option<String>,
}

impl AppsConfig {
    /// The host suffix after `{host}` (`.apps.localhost`), lower-case, without a port;
    /// `None` when apps are off.
    pub fn host_suffix(&self) -> Option<String> {
        let url = self.url.as_deref()?;
        let rest = url.split_once("://")?.1;
        let authority = rest.split('/').next().unwrap_or_default();
        let host = authority.rsplit_once(':').map_or(authority, |(h, _)| h);
        Some(host.strip_prefix("{host}")?.to_ascii_lowercase())
    }

    /// The app origin for `label`.
    pub fn url_for(&self, label: &str) -> Option<String> {
        Some(self.url.as_deref()?.replace("{host}", label))
    }

    pub(super) fn validate(&self, portal_public: Option<&str>) -> anyhow::Result<()> {
        let Some(url) = self.url.as_deref() else {
            anyhow::ensure!(
                self.listen.is_none(),
                "[apps] listen is set but [apps] url is not: say where users reach the apps"
            );
            return Ok(());
        };
        anyhow::ensure!(
            url.starts_with("http://") || url.starts_with("https://"),
            "[apps] url must start with http:// or https://, got {url:?}"
        );
        let suffix = self
            .host_suffix()
            .filter(|s| s.starts_with('.') && s.len() > 1);
        let Some(suffix) = suffix else {
            anyhow::bail!(
                "[apps] url must begin its host with `{{host}}.` (a label per job, e.g. \
                 https://{{host}}.apps.campus.edu), got {url:?}"
            );
        };
        anyhow::ensure!(
            url.matches("{host}").count() == 1,
            "[apps] url names {{host}} once, got {url:?}"
        );
        if let Some(public) = portal_public {
            let portal_host = public
                .split_once("://")
                .map(|(_, r)| r.split(['/', ':']).next().unwrap_or_default())
                .unwrap_or_default()
                .to_ascii_lowercase();
            anyhow::ensure!(
                !portal_host.is_empty() && portal_host != suffix.trim_start_matches('.'),
                "[apps] url must not be the portal's own host ({portal_host}): apps get \
                 origins of their own, e.g. https://{{host}}.apps.{portal_host}"
            );
        }
        anyhow::ensure!(
            self.listen.is_some(),
            "[apps] url is set but [apps] listen is not: give the address the apps' \
             listener binds (e.g. 0.0.0.0:8081)"
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn apps(url: &str) -> AppsConfig {
        AppsConfig {
            url: Some(url.into()),
            listen: Some("127.0.0.1:0".into()),
        }
    }

    #[test]
    fn the_suffix_is_the_host_after_the_label() {
        assert_eq!(
            apps("http://{host}.apps.localhost:8081")
                .host_suffix()
                .as_deref(),
            Some(".apps.localhost")
        );
        assert_eq!(
            apps("https://{host}.Apps.Campus.edu/")
                .host_suffix()
                .as_deref(),
            Some(".apps.campus.edu")
        );
        assert_eq!(
            apps("https://{host}.a.b").url_for("x1").as_deref(),
            Some("https://x1.a.b")
        );
    }

    #[test]
    fn bad_urls_are_refused_naming_the_rule() {
        for (url, words) in [
            ("ftp://{host}.a.b", "http"),
            ("https://apps.b/{host}", "begin its host"),
            ("https://x{host}.a.b", "begin its host"),
            ("https://{host}.a.b/{host}", "once"),
            ("https://{host}.portal.campus.edu", "portal's own host"),
        ] {
            let e = apps(url)
                .validate(Some("https://portal.campus.edu"))
                .unwrap_err()
                .to_string();
            assert!(e.contains(words), "{url}: {e}");
        }
        let no_listen = AppsConfig {
            url: Some("https://{host}.a.b".into()),
            listen: None,
        };
        assert!(no_listen.validate(None).is_err());
        assert!(AppsConfig::default().validate(None).is_ok());
        assert!(apps("http://{host}.apps.localhost:8081")
            .validate(Some("http://localhost:8080"))
            .is_ok());
    }
}
