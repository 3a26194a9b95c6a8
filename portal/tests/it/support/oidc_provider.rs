//! A real OpenID Connect provider for the tests: LemonLDAP::NG 2.16 from Debian
//! (`liblemonldap-ng-portal-perl`), served by `starman`, configured from scratch in a
//! private temp folder (nothing under /etc or /var/lib is written).
//!
//! Facts about this provider that a relying party sees (checked with LLNG 2.16.1):
//! - `issuer` is `http://127.0.0.1:PORT` (no trailing slash); the endpoints are
//!   `{issuer}/oauth2/{authorize,token,userinfo,jwks,logout,introspect}`.
//! - The token endpoint accepts `client_secret_basic` and `client_secret_post`.
//! - PKCE is required (S256 or plain). A token request with a wrong `code_verifier` is
//!   answered 400 `invalid_grant` ("PKCE challenge failed" in the log) and the code is
//!   consumed: retrying it with the right verifier fails too. Codes live 60 s.
//! - The ID token (RS256, `kid` given, `aud` is an array with the client id, `azp` is
//!   the client id) carries `sub` (= login), `nonce` (when sent), `email`, `name`,
//!   `preferred_username` and `groups` (a JSON array of strings). The userinfo endpoint
//!   answers the same claims. A user without groups gets no `groups` claim at all (not
//!   an empty array).
//! - Groups are read from the user table when the user authenticates at the provider.
//!   While the browser still has an SSO session there (cookie `llng<PORT>`), a new
//!   authorization request reuses that session and its old groups; `set_groups` is seen
//!   after a fresh login: a new browser or cookie jar, after RP-initiated logout, or
//!   with `prompt=login` in the authorization request, which LLNG honours only for SSO
//!   sessions older than `portalForceAuthnInterval` (5 s), after a "renew session"
//!   page with one button (`Browser::login_at_provider` presses it).
//! - The token endpoint refuses a request that carries the provider's session cookie
//!   (400 "This endpoint is not supposed to be called by authenticated users"): the
//!   back channel must not share a cookie jar with the browser side.
//! - RP-initiated logout: discovery advertises `end_session_endpoint`
//!   (`{issuer}/oauth2/logout`) by default. It takes `id_token_hint`,
//!   `post_logout_redirect_uri` and `state`. The post-logout URI must be one of those
//!   passed to [`OidcProvider::start`] (exact string match); it is then answered with a
//!   302 to `post_logout_redirect_uri?state=STATE`. An unregistered URI is refused (the
//!   provider shows its own page). This client has `LogoutBypassConfirm`, so with an
//!   `id_token_hint` the logout happens at once; without one a logged-in user is shown
//!   a confirmation page first.

use std::collections::HashSet;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// The configuration that Debian's package installs; ours is derived from it.
const PACKAGED_CONF: &str = "/var/lib/lemonldap-ng/conf/lmConf-1.json";
const PORTAL_TEMPLATES: &str = "/usr/share/lemonldap-ng/portal/templates";
const PORTAL_STATIC: &str = "/usr/share/lemonldap-ng/portal/htdocs/static";

/// What LLNG needs at run time: (perl module, Debian package).
const PERL_MODULES: &[(&str, &str)] = &[
    ("Lemonldap::NG::Portal::Main", "liblemonldap-ng-portal-perl"),
    ("Plack::Builder", "libplack-perl"),
    ("GD::SecurityImage", "libgd-securityimage-perl"),
    ("Image::Magick", "libimage-magick-perl"),
    ("String::Random", "libstring-random-perl"),
    ("IO::String", "libio-string-perl"),
    ("Crypt::OpenSSL::Bignum", "libcrypt-openssl-bignum-perl"),
    ("Convert::Base32", "libconvert-base32-perl"),
    ("IPC::Run", "libipc-run-perl"),
    ("MIME::Entity", "libmime-tools-perl"),
    ("IO::Socket::Timeout", "libio-socket-timeout-perl"),
    ("Unicode::String", "libunicode-string-perl"),
    (
        "Apache::Session::Browseable",
        "libapache-session-browseable-perl",
    ),
    ("Email::Sender", "libemail-sender-perl"),
    ("Cookie::Baker::XS", "libcookie-baker-xs-perl"),
    ("DBI", "libdbi-perl"),
    ("DBD::SQLite", "libdbd-sqlite3-perl"),
    ("HTTP::Parser::XS", "libhttp-parser-xs-perl"),
    ("LWP::Protocol::https", "liblwp-protocol-https-perl"),
];

/// A user of the provider (a row of its DBI user table).
#[derive(Debug, Clone)]
pub struct TestUser {
    pub login: String,
    pub password: String,
    pub name: String,
    pub mail: String,
    pub groups: Vec<String>,
}

impl TestUser {
    /// `login` with password `LOGIN-pw`, name `Login Test`, mail `LOGIN@campus.test`.
    #[allow(dead_code)]
    pub fn new(login: &str, groups: &[&str]) -> TestUser {
        let mut name: Vec<char> = login.chars().collect();
        if let Some(c) = name.first_mut() {
            *c = c.to_ascii_uppercase();
        }
        TestUser {
            login: login.into(),
            password: format!("{login}-pw"),
            name: format!("{} Test", name.into_iter().collect::<String>()),
            mail: format!("{login}@campus.test"),
            groups: groups.iter().map(|g| g.to_string()).collect(),
        }
    }
}

/// A free TCP port on 127.0.0.1, never the same twice in one test process.
pub fn free_port() -> u16 {
    static GIVEN: OnceLock<Mutex<HashSet<u16>>> = OnceLock::new();
    let mut given = GIVEN.get_or_init(Default::default).lock().unwrap();
    loop {
        let listener = std::net::TcpListener::bind(("127.0.0.1", 0)).expect("bind 127.0.0.1:0");
        let port = listener.local_addr().unwrap().port();
        if given.insert(port) {
            return port;
        }
    }
}

/// A running LemonLDAP::NG with one OpenID Connect client; stopped when dropped.
pub struct OidcProvider {
    /// `http://127.0.0.1:PORT`, exactly what discovery's `issuer` says.
    pub issuer: String,
    pub client_id: String,
    pub client_secret: String,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl OidcProvider {
    /// Configures LemonLDAP::NG in a fresh temp folder and starts it on 127.0.0.1:`port`.
    ///
    /// - `LLNG_DEFAULTCONFFILE` names `lemonldap-ng.ini` there, with a `File`
    ///   configuration backend over `conf/`; `conf/lmConf-1.json` is derived from the
    ///   packaged `/var/lib/lemonldap-ng/conf/lmConf-1.json`, with sessions, caches and
    ///   cookies (`llng<PORT>`) private to this instance.
    /// - An RS256 signing key pair made once per test process (`openssl genrsa`).
    /// - One relying party: `client_id`/`client_secret`, `redirect_uris`,
    ///   `post_logout_redirect_uris`, RequirePKCE, BypassConsent, LogoutBypassConfirm,
    ///   IDTokenSignAlg RS256, IDTokenForceClaims, and the claims `email`, `name`,
    ///   `preferred_username` and `groups` (an array).
    /// - `users` in an SQLite table read through the DBI backend (clear-text passwords).
    ///
    /// Then runs `starman --workers 4` and waits until discovery answers (under 1 s).
    /// A missing Debian package fails the test with the `apt-get install` that fixes it.
    ///
    /// End session (RP-initiated logout): LLNG advertises `end_session_endpoint`
    /// (`{issuer}/oauth2/logout`) by default; `post_logout_redirect_uri` must be one of
    /// `post_logout_redirect_uris` exactly, and `id_token_hint` skips the confirmation
    /// page (see the module's documentation).
    pub async fn start(
        port: u16,
        redirect_uris: &[String],
        post_logout_redirect_uris: &[String],
        users: &[TestUser],
    ) -> OidcProvider {
        let dir = tempfile::Builder::new()
            .prefix("llng-")
            .tempdir()
            .expect("temp dir");
        let issuer = format!("http://127.0.0.1:{port}");
        let client_id = "commons-portal".to_string();
        let client_secret = format!("secret-{:016x}", rand::random::<u64>());
        {
            let dir = dir.path().to_path_buf();
            let (issuer, id, secret) = (issuer.clone(), client_id.clone(), client_secret.clone());
            let (redirects, post_logout) =
                (redirect_uris.to_vec(), post_logout_redirect_uris.to_vec());
            let users = users.to_vec();
            let setup = tokio::task::spawn_blocking(move || {
                check_packages();
                write_config(&dir, port, &issuer, &id, &secret, &redirects, &post_logout);
                write_users(&dir.join("users.db"), &users);
            });
            if let Err(e) = setup.await {
                std::panic::resume_unwind(e.into_panic());
            }
        }

        let log = std::fs::File::create(dir.path().join("llng.log")).unwrap();
        let child = Command::new("starman")
            .args(["--workers", "4", "--listen"])
            .arg(format!("127.0.0.1:{port}"))
            .arg(dir.path().join("app.psgi"))
            .env("LLNG_DEFAULTCONFFILE", dir.path().join("lemonldap-ng.ini"))
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            // Its own process group: Drop stops the master and its workers together.
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run starman ({e}); {}", apt_hint(&["starman"])));
        let mut provider = OidcProvider {
            issuer,
            client_id,
            client_secret,
            dir,
            child: Some(child),
        };
        provider.wait_ready().await;
        provider
    }

    async fn wait_ready(&mut self) {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap();
        let url = format!("{}/.well-known/openid-configuration", self.issuer);
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!(
                    "LemonLDAP::NG (starman) exited with {status} before answering:\n{}",
                    self.log()
                );
            }
            let log = self.log();
            if log.contains("Error while loading") {
                panic!("LemonLDAP::NG does not load:\n{log}");
            }
            if let Ok(r) = http.get(&url).send().await {
                let status = r.status();
                let body = r.text().await.unwrap_or_default();
                if status.is_success() {
                    let v: Value = serde_json::from_str(&body)
                        .unwrap_or_else(|e| panic!("discovery is not JSON ({e}): {body}"));
                    assert_eq!(
                        v["issuer"], self.issuer,
                        "discovery's issuer differs: {body}"
                    );
                    return;
                }
                if status.is_server_error() {
                    panic!(
                        "LemonLDAP::NG answers discovery with {status}:\n{}",
                        self.log()
                    );
                }
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "LemonLDAP::NG did not answer {url} within 30 s:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Replaces a user's groups in the DBI table (the next login sees them).
    pub fn set_groups(&self, login: &str, groups: &[&str]) {
        use diesel::sql_types::Text;
        use diesel::{Connection, RunQueryDsl};
        let path = self.dir.path().join("users.db");
        let mut c = diesel::SqliteConnection::establish(path.to_str().unwrap()).unwrap();
        diesel::sql_query("PRAGMA busy_timeout = 10000")
            .execute(&mut c)
            .unwrap();
        let n = diesel::sql_query("UPDATE users SET groups = ? WHERE login = ?")
            .bind::<Text, _>(groups.join(GROUP_SEPARATOR))
            .bind::<Text, _>(login)
            .execute(&mut c)
            .unwrap();
        assert_eq!(n, 1, "set_groups: no user {login:?} at the provider");
    }

    /// The provider's log (for failure messages).
    pub fn log(&self) -> String {
        String::from_utf8_lossy(
            &std::fs::read(self.dir.path().join("llng.log")).unwrap_or_default(),
        )
        .into_owned()
    }
}

impl Drop for OidcProvider {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // The master and its workers share the process group the master leads.
            let group = format!("-{}", child.id());
            let _ = Command::new("kill").args(["-TERM", "--", &group]).status();
            let deadline = Instant::now() + Duration::from_secs(3);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            // Workers that outlive the master, or a master that ignored TERM.
            let _ = Command::new("kill")
                .args(["-KILL", "--", &group])
                .stderr(Stdio::null())
                .status();
            let _ = child.wait();
        }
    }
}

/// LLNG's default `multiValuesSeparator`: how the groups column is split into the claim.
const GROUP_SEPARATOR: &str = "; ";

fn apt_hint(packages: &[&str]) -> String {
    format!(
        "install with: apt-get install -y --no-install-recommends {}",
        packages.join(" ")
    )
}

fn on_path(binary: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(binary).is_file()))
        .unwrap_or(false)
}

/// Fails the test, naming the packages to install, unless all that LLNG needs is here.
fn check_packages() {
    static RESULT: OnceLock<Result<(), String>> = OnceLock::new();
    let result = RESULT.get_or_init(|| {
        let mut missing: Vec<&str> = Vec::new();
        for (binary, package) in [
            ("perl", "perl"),
            ("starman", "starman"),
            ("openssl", "openssl"),
        ] {
            if !on_path(binary) {
                missing.push(package);
            }
        }
        if on_path("perl") {
            let out = Command::new("perl")
                .arg("-e")
                .arg(r#"for my $m (@ARGV) { eval "require $m; 1" or print "$m\n" }"#)
                .args(PERL_MODULES.iter().map(|(m, _)| *m))
                .stderr(Stdio::null())
                .output()
                .expect("perl runs");
            let absent = String::from_utf8_lossy(&out.stdout).into_owned();
            for module in absent.lines() {
                if let Some((_, package)) = PERL_MODULES.iter().find(|(m, _)| *m == module) {
                    missing.push(package);
                }
            }
        } else {
            missing.extend(PERL_MODULES.iter().map(|(_, p)| *p));
        }
        if missing.is_empty() && !Path::new(PACKAGED_CONF).is_file() {
            missing.push("liblemonldap-ng-portal-perl");
        }
        if missing.is_empty() {
            Ok(())
        } else {
            missing.dedup();
            Err(format!(
                "the OpenID Connect provider (LemonLDAP::NG) needs Debian packages that are \
                 missing: {}; {}",
                missing.join(", "),
                apt_hint(&missing)
            ))
        }
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// (private key PEM, public key PEM, key id), made once per test process.
fn signing_keys() -> &'static (String, String, String) {
    static KEYS: OnceLock<(String, String, String)> = OnceLock::new();
    KEYS.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let private = dir.path().join("private.pem");
        let public = dir.path().join("public.pem");
        let run = |args: &[&std::ffi::OsStr]| {
            let out = Command::new("openssl")
                .args(args)
                .output()
                .unwrap_or_else(|e| panic!("cannot run openssl ({e}); {}", apt_hint(&["openssl"])));
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        run(&[
            "genrsa".as_ref(),
            "-out".as_ref(),
            private.as_os_str(),
            "2048".as_ref(),
        ]);
        run(&[
            "rsa".as_ref(),
            "-in".as_ref(),
            private.as_os_str(),
            "-pubout".as_ref(),
            "-out".as_ref(),
            public.as_os_str(),
        ]);
        (
            std::fs::read_to_string(&private).unwrap(),
            std::fs::read_to_string(&public).unwrap(),
            format!("commons-test-{:08x}", rand::random::<u32>()),
        )
    })
}

fn write_config(
    dir: &Path,
    port: u16,
    issuer: &str,
    client_id: &str,
    client_secret: &str,
    redirect_uris: &[String],
    post_logout_redirect_uris: &[String],
) {
    let p = |sub: &str| -> String {
        let path: PathBuf = dir.join(sub);
        std::fs::create_dir_all(&path).unwrap();
        path.to_str().unwrap().to_string()
    };
    let conf_dir = p("conf");
    let cache = p("cache");
    let sessions = p("sessions");
    let sessions_lock = p("sessions/lock");
    let psessions = p("psessions");
    let psessions_lock = p("psessions/lock");
    let notifications = p("notifications");
    let db = dir.join("users.db");

    let packaged = std::fs::read_to_string(PACKAGED_CONF).unwrap_or_else(|e| {
        panic!(
            "cannot read {PACKAGED_CONF} ({e}); {}",
            apt_hint(&["liblemonldap-ng-portal-perl"])
        )
    });
    let mut conf: Value = serde_json::from_str(&packaged).expect("packaged lmConf-1.json");
    let (private, public, kid) = signing_keys();
    let settings = json!({
        "cfgNum": 1,
        "cfgAuthor": "commons-portal tests",
        "portal": format!("{issuer}/"),
        "domain": "127.0.0.1",
        "cookieName": format!("llng{port}"),
        "securedCookie": 0,
        "applicationList": {},
        "exportedHeaders": {},
        "reloadUrls": {},
        "locationRules": { "127.0.0.1": { "default": "accept" } },
        "notification": 0,
        "notificationStorageOptions": { "dirName": notifications },
        "loginHistoryEnabled": 0,
        // `prompt=login` always asks for the password again (by default only when the
        // SSO session is older than 5 s).
        "globalStorage": "Apache::Session::File",
        "globalStorageOptions": {
            "Directory": sessions,
            "LockDirectory": sessions_lock,
            "generateModule": "Lemonldap::NG::Common::Apache::Session::Generate::SHA256"
        },
        "persistentStorage": "Apache::Session::File",
        "persistentStorageOptions": { "Directory": psessions, "LockDirectory": psessions_lock },
        "localSessionStorage": "Cache::FileCache",
        "localSessionStorageOptions": {
            "cache_depth": 3,
            "cache_root": cache,
            "default_expires_in": 600,
            "directory_umask": "007",
            "namespace": "lemonldap-ng-sessions"
        },
    });
    // Users: an SQLite table through DBI.
    let users = json!({
        "authentication": "DBI",
        "userDB": "Same",
        "passwordDB": "DBI",
        "registerDB": "Null",
        "dbiAuthChain": format!("dbi:SQLite:dbname={}", db.display()),
        "dbiAuthUser": "",
        "dbiAuthPassword": "",
        "dbiAuthTable": "users",
        "dbiAuthLoginCol": "login",
        "dbiAuthPasswordCol": "password",
        "dbiAuthPasswordHash": "",
        "dbiMailCol": "mail",
        "dbiExportedVars": { "uid": "login", "cn": "name", "mail": "mail", "groups": "groups" },
        "multiValuesSeparator": GROUP_SEPARATOR,
    });
    // The OpenID Connect provider and its one client.
    let oidc = json!({
        "issuerDBOpenIDConnectActivation": 1,
        "oidcServiceMetaDataIssuer": issuer,
        "oidcServicePrivateKeySig": private,
        "oidcServicePublicKeySig": public,
        "oidcServiceKeyIdSig": kid,
        "oidcServiceIgnoreScopeForClaims": 1,
        "oidcRPMetaDataOptions": {
            "commons": {
                "oidcRPMetaDataOptionsDisplayName": "GPU Commons (tests)",
                "oidcRPMetaDataOptionsClientID": client_id,
                "oidcRPMetaDataOptionsClientSecret": client_secret,
                "oidcRPMetaDataOptionsPublic": 0,
                "oidcRPMetaDataOptionsRedirectUris": redirect_uris.join(" "),
                "oidcRPMetaDataOptionsPostLogoutRedirectUris": post_logout_redirect_uris.join(" "),
                "oidcRPMetaDataOptionsRequirePKCE": 1,
                "oidcRPMetaDataOptionsBypassConsent": 1,
                "oidcRPMetaDataOptionsLogoutBypassConfirm": 1,
                "oidcRPMetaDataOptionsIDTokenSignAlg": "RS256",
                "oidcRPMetaDataOptionsIDTokenForceClaims": 1,
                "oidcRPMetaDataOptionsUserIDAttr": "uid"
            }
        },
        "oidcRPMetaDataExportedVars": {
            "commons": {
                "email": "mail",
                "name": "cn",
                "preferred_username": "uid",
                "groups": "groups;string;always"
            }
        }
    });
    let target = conf.as_object_mut().unwrap();
    for part in [settings, users, oidc] {
        for (k, v) in part.as_object().unwrap() {
            target.insert(k.clone(), v.clone());
        }
    }
    target.remove("demoExportedVars");
    std::fs::write(
        Path::new(&conf_dir).join("lmConf-1.json"),
        serde_json::to_string_pretty(&conf).unwrap(),
    )
    .unwrap();

    let log_level = std::env::var("TEST_LLNG_LOG_LEVEL").unwrap_or_else(|_| "notice".into());
    let ini = format!(
        "[all]\n\
         logLevel = {log_level}\n\
         checkTime = 1\n\
         \n\
         [configuration]\n\
         type = File\n\
         dirName = {conf_dir}\n\
         localStorage = Cache::FileCache\n\
         localStorageOptions = {{ 'namespace' => 'lemonldap-ng-config', \
         'default_expires_in' => 600, 'cache_root' => '{cache}', 'cache_depth' => 3 }}\n\
         \n\
         [portal]\n\
         staticPrefix = /static\n\
         templateDir = {PORTAL_TEMPLATES}\n\
         languages = en\n\
         \n\
         [handler]\n\
         status = 0\n"
    );
    std::fs::write(dir.join("lemonldap-ng.ini"), ini).unwrap();

    let psgi = format!(
        "use Plack::Builder;\n\
         use Plack::App::File;\n\
         use Lemonldap::NG::Portal::Main;\n\
         builder {{\n\
         \x20   mount '/static' => Plack::App::File->new(root => '{PORTAL_STATIC}')->to_app;\n\
         \x20   mount '/' => Lemonldap::NG::Portal::Main->run({{}});\n\
         }};\n"
    );
    std::fs::write(dir.join("app.psgi"), psgi).unwrap();
}

fn write_users(path: &Path, users: &[TestUser]) {
    use diesel::sql_types::Text;
    use diesel::{Connection, RunQueryDsl};
    let mut c = diesel::SqliteConnection::establish(path.to_str().unwrap()).unwrap();
    diesel::sql_query(
        "CREATE TABLE users (login TEXT PRIMARY KEY, password TEXT NOT NULL, \
         name TEXT NOT NULL, mail TEXT NOT NULL, groups TEXT NOT NULL DEFAULT '')",
    )
    .execute(&mut c)
    .unwrap();
    for u in users {
        diesel::sql_query(
            "INSERT INTO users (login, password, name, mail, groups) VALUES (?, ?, ?, ?, ?)",
        )
        .bind::<Text, _>(&u.login)
        .bind::<Text, _>(&u.password)
        .bind::<Text, _>(&u.name)
        .bind::<Text, _>(&u.mail)
        .bind::<Text, _>(u.groups.join(GROUP_SEPARATOR))
        .execute(&mut c)
        .unwrap();
    }
}
