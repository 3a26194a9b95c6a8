//! Assembles the actix-web app and starts it with the scheduler loop.

use crate::config::Config;
use crate::db::Db;
use crate::service::files::signed::UrlSigner;
use crate::state::AppState;
use actix_session::config::{CookieContentSecurity, PersistentSession, TtlExtensionPolicy};
use actix_session::SessionMiddleware;
use actix_web::cookie::{Key, SameSite};
use actix_web::{web, App, HttpResponse, HttpServer};
use anyhow::Context;
use std::net::SocketAddr;
use std::sync::Arc;

/// A started portal: where it listens, its state, and the server task.
pub struct RunningPortal {
    pub addr: SocketAddr,
    pub state: AppState,
    /// Stops the server (gracefully or not).
    pub handle: actix_web::dev::ServerHandle,
    /// Ends when the server stops.
    pub server: tokio::task::JoinHandle<std::io::Result<()>>,
    /// The scheduler loop (runs until aborted).
    pub scheduler: tokio::task::JoinHandle<()>,
    /// The SSH gateway, when `[ssh] listen` is set.
    pub ssh: Option<crate::ssh::Gateway>,
    /// The apps' listener, when `[apps]` is set.
    pub apps: Option<crate::apps::Listener>,
    /// Passes other replicas' messages to the agents held here (PostgreSQL only).
    pub mail: Option<tokio::task::JoinHandle<()>>,
    /// Deletes utilisation samples past their retention, hourly.
    pub samples: tokio::task::JoinHandle<()>,
    /// Turns job events into notifications and sends them.
    pub notifier: tokio::task::JoinHandle<()>,
}

impl RunningPortal {
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A clean stop: the servers connected here get their attempts' leases extended by
    /// `shutdown_lease_s` (so no running job is stopped while the portal is away), then
    /// the scheduler and the server stop.
    pub async fn shutdown(self) {
        let state = self.state.clone();
        let extended = crate::broker::agent::extend_leases_for_shutdown(&state).await;
        tracing::info!(
            nodes = extended,
            lease_s = state.config.scheduler.shutdown_lease_s,
            "leases extended for the shutdown"
        );
        self.scheduler.abort();
        if let Some(g) = &self.ssh {
            g.task.abort();
        }
        if let Some(m) = &self.mail {
            m.abort();
        }
        self.samples.abort();
        self.notifier.abort();
        if let Some(a) = self.apps {
            a.stop().await;
        }
        self.handle.stop(true).await;
    }
}

/// Headers on every response: the Content-Security-Policy, no MIME sniffing, no framing,
/// no referrer outside the portal, no caching (pages and API answers hold people's data
/// and CSRF tokens; the static assets set their own), and HSTS when the portal is served
/// over https.
fn security_headers(hsts: bool, sso_origin: Option<&str>) -> actix_web::middleware::DefaultHeaders {
    let h = actix_web::middleware::DefaultHeaders::new()
        .add((
            "content-security-policy",
            crate::web::assets::csp(sso_origin),
        ))
        .add(("x-content-type-options", "nosniff"))
        .add(("x-frame-options", "DENY"))
        .add(("referrer-policy", "same-origin"))
        .add(("cache-control", "no-store"));
    if hsts {
        h.add(("strict-transport-security", "max-age=31536000"))
    } else {
        h
    }
}

/// The session cookies' key and the agents' object URL signer, both from
/// `session_key_file` (every replica shares it), or fresh when there is none.
fn session_key(config: &Config) -> anyhow::Result<(Key, UrlSigner)> {
    match &config.session_key_file {
        Some(path) => {
            let bytes =
                std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
            anyhow::ensure!(
                bytes.len() >= 64,
                "{} must hold at least 64 bytes",
                path.display()
            );
            Ok((Key::from(&bytes), UrlSigner::derive(&bytes)))
        }
        None => Ok((Key::generate(), UrlSigner::random())),
    }
}

/// The access log's request line: as sent (`GET /path?query HTTP/1.1`), but a signed
/// object URL's query (its signature: a grant until it expires) is left out.
fn request_line(req: &actix_web::dev::ServiceRequest) -> String {
    let query = match req.query_string() {
        "" => String::new(),
        _ if req.path().starts_with(commons_proto::OBJECTS_PATH) => "?<signed>".into(),
        q => format!("?{q}"),
    };
    format!("{} {}{query} {:?}", req.method(), req.path(), req.version())
}

/// Opens the database (migrating it), binds the listener and spawns the server and the
/// scheduler loop on the current tokio runtime.
pub async fn start(config: Config) -> anyhow::Result<RunningPortal> {
    config.validate()?;
    let url = config.database_url.clone();
    let pool_size = config.database_pool_size;
    let db = tokio::task::spawn_blocking(move || Db::open_with(&url, pool_size)).await??;
    let (key, signer) = session_key(&config)?;
    let checkpoints = crate::service::checkpoints::Store::from_config(&config)?;
    let state = AppState {
        ctx: crate::service::Ctx {
            db,
            agents: Default::default(),
            wake: Default::default(),
            files: crate::service::files::Files::new(checkpoints.clone(), &config.files, signer),
            checkpoints,
            relays: Default::default(),
            metrics: Default::default(),
            image_authorities: std::sync::Arc::new(config.images.keys()?),
            apps: Arc::new(config.apps.clone()),
        },
        config: Arc::new(config.clone()),
        oidc: crate::auth::oidc::Oidc::from_config(&config)?.map(Arc::new),
    };
    state.db.observe_waits(state.metrics.db_pool_wait.clone());
    let listener = std::net::TcpListener::bind(&state.config.listen)
        .with_context(|| format!("cannot listen on {}", state.config.listen))?;
    let addr = listener.local_addr()?;
    let server = http_server(&state, key, listener)?;
    let handle = server.handle();
    // The server only serves while its future is polled.
    let server = tokio::spawn(server);
    let scheduler = tokio::spawn(crate::broker::tick::run(state.clone()));
    let mail = (state.db.backend == crate::db::Backend::Postgres)
        .then(|| tokio::spawn(crate::service::agents::forward_mail(state.ctx.clone())));
    let samples = tokio::spawn(crate::service::samples::expire_loop(
        state.ctx.clone(),
        state.config.utilization.clone(),
    ));
    let sender = std::sync::Arc::new(crate::service::notify::send::Sender::from_config(
        &state.config,
    )?);
    let notifier = tokio::spawn(crate::service::notify::send::run(state.ctx.clone(), sender));
    let ssh = match crate::ssh::start(state.clone()).await {
        Ok(g) => g,
        Err(e) => {
            handle.stop(false).await;
            scheduler.abort();
            samples.abort();
            notifier.abort();
            return Err(e);
        }
    };
    let apps = match crate::apps::start(&state, addr) {
        Ok(a) => a,
        Err(e) => {
            handle.stop(false).await;
            scheduler.abort();
            samples.abort();
            return Err(e);
        }
    };
    Ok(RunningPortal {
        addr,
        state,
        handle,
        server,
        scheduler,
        ssh,
        apps,
        mail,
        samples,
        notifier,
    })
}

/// The web server: the pages, the API and the agents' endpoints, behind the session,
/// security-header, logging and metrics middleware.
fn http_server(
    state: &AppState,
    key: Key,
    listener: std::net::TcpListener,
) -> anyhow::Result<actix_web::dev::Server> {
    let config = &state.config;
    // Secure cookies need HTTPS: off for the dev login and for a portal served over http.
    let secure_cookies = !config.insecure_dev_login
        && !config
            .public_url
            .as_deref()
            .is_some_and(|u| u.starts_with("http://"));
    if !secure_cookies && !config.insecure_dev_login {
        tracing::warn!("public_url is plain http: session cookies are not marked Secure");
    }
    let idle = actix_web::cookie::time::Duration::minutes(config.session_idle_minutes as i64);
    let sessions = crate::auth::store::DbSessionStore::new(state.db.clone());
    let hsts = config
        .public_url
        .as_deref()
        .is_some_and(|u| u.starts_with("https://"));
    let sso_origin = config
        .oidc
        .issuer
        .as_deref()
        .and_then(crate::web::assets::origin);
    let data = web::Data::new(state.clone());
    Ok(HttpServer::new(move || {
        App::new()
            .app_data(data.clone())
            // Forms as long as the API's bodies (a 64 KiB command, URL-encoded).
            .app_data(web::FormConfig::default().limit(1024 * 1024))
            // Inside the session middleware, so it can read the session.
            .wrap(actix_web::middleware::from_fn(crate::web::error_pages))
            .wrap(
                SessionMiddleware::builder(sessions.clone(), key.clone())
                    .cookie_name("commons_session".into())
                    .cookie_secure(secure_cookies)
                    .cookie_http_only(true)
                    .cookie_same_site(SameSite::Lax)
                    .cookie_content_security(CookieContentSecurity::Private)
                    // Idle expiry: every request pushes the end out again.
                    .session_lifecycle(
                        PersistentSession::default()
                            .session_ttl(idle)
                            .session_ttl_extension_policy(TtlExtensionPolicy::OnEveryRequest),
                    )
                    .build(),
            )
            .wrap(security_headers(hsts, sso_origin.as_deref()))
            .wrap(
                actix_web::middleware::Logger::new("%{request}xi %s %Dms")
                    .custom_request_replace("request", request_line)
                    .exclude("/healthz"),
            )
            // Outermost: times every request and gives it an id (the span around the rest).
            .wrap(actix_web::middleware::from_fn(crate::api::metrics::track))
            .route(
                "/healthz",
                web::get().to(|| async { HttpResponse::Ok().body("ok") }),
            )
            .configure(crate::api::metrics::configure)
            .configure(crate::broker::agent::configure)
            .configure(crate::broker::checkpoints::configure)
            .configure(crate::broker::control::configure)
            .configure(crate::broker::inputs::configure)
            .configure(crate::broker::datasets::configure)
            .configure(crate::broker::objects::configure)
            .configure(crate::broker::outputs::configure)
            .configure(crate::broker::relay::configure)
            .configure(crate::api::configure)
            .configure(crate::web::configure)
    })
    .workers(2)
    // No Nagle: an SSH relay's small frames (keystrokes, SFTP requests) go out at once.
    .tcp_nodelay(true)
    .disable_signals()
    .listen(listener)?
    .run())
}

#[cfg(test)]
mod tests {
    use super::request_line;
    use actix_web::test::TestRequest;

    #[test]
    fn the_access_log_leaves_out_a_signed_urls_query_only() {
        let signed = TestRequest::get()
            .uri("/api/agent/v1/objects/files/users/1/ab?node=1&job=2&attempt=1&expires=9&sig=cafe")
            .to_srv_request();
        let line = request_line(&signed);
        assert_eq!(
            line,
            "GET /api/agent/v1/objects/files/users/1/ab?<signed> HTTP/1.1"
        );
        let other = TestRequest::get()
            .uri("/api/v1/files?prefix=a")
            .to_srv_request();
        assert_eq!(request_line(&other), "GET /api/v1/files?prefix=a HTTP/1.1");
    }
}
