//! The apps' listener: every job's web app on an origin of its own
//! (`[apps] url = "https://{host}.apps.campus.edu"`), relayed to the app's port in its
//! container through the job's agent (see [`proxy`]). Only the job's owner passes:
//! a browser proves it with this origin's cookie, got by way of the portal (a one-time
//! code, `/_commons/auth`); a script with the owner's access token. No request carries
//! the portal's cookies here: the origins differ.

mod pipe;
mod probe;
mod proxy;

use crate::error::AppError;
use crate::service::apps::{self as svc, Credentials, Pass, COOKIE};
use crate::state::AppState;
use actix_web::http::header;
use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use std::net::SocketAddr;

/// The running listener.
pub struct Listener {
    pub addr: SocketAddr,
    pub handle: actix_web::dev::ServerHandle,
    pub server: tokio::task::JoinHandle<std::io::Result<()>>,
    sweeper: tokio::task::JoinHandle<()>,
    prober: tokio::task::JoinHandle<()>,
}

impl Listener {
    pub async fn stop(self) {
        self.handle.stop(false).await;
        self.sweeper.abort();
        self.prober.abort();
        let _ = self.server.await;
    }
}

/// What every request of the listener needs beyond the portal's state.
#[derive(Clone)]
struct Origins {
    /// The portal's base URL, where a visitor without credentials is sent.
    portal: String,
    /// The apps are served over https: cookies are `Secure`.
    secure: bool,
}

/// Starts the listener when `[apps]` is set. `portal_addr`: where the portal listens,
/// for its URL when `public_url` is unset.
pub fn start(state: &AppState, portal_addr: SocketAddr) -> anyhow::Result<Option<Listener>> {
    let Some(listen) = state.config.apps.listen.clone() else {
        return Ok(None);
    };
    let portal = match &state.config.public_url {
        Some(u) => u.trim_end_matches('/').to_string(),
        None if portal_addr.ip().is_unspecified() => {
            format!("http://localhost:{}", portal_addr.port())
        }
        None => format!("http://{portal_addr}"),
    };
    let origins = Origins {
        portal,
        secure: state
            .config
            .apps
            .url
            .as_deref()
            .is_some_and(|u| u.starts_with("https://")),
    };
    let listener = std::net::TcpListener::bind(&listen)
        .map_err(|e| anyhow::anyhow!("cannot listen for apps on {listen}: {e}"))?;
    let addr = listener.local_addr()?;
    let data = web::Data::new(state.clone());
    let origins = web::Data::new(origins);
    let server = HttpServer::new(move || {
        App::new()
            .app_data(data.clone())
            .app_data(origins.clone())
            .default_service(web::to(serve))
    })
    .workers(2)
    .disable_signals()
    .listen(listener)?
    .run();
    let handle = server.handle();
    let server = tokio::spawn(server);
    let ctx = state.ctx.clone();
    let sweeper = tokio::spawn(async move {
        let mut every = tokio::time::interval(std::time::Duration::from_secs(600));
        loop {
            every.tick().await;
            if let Err(e) = svc::expire(&ctx).await {
                tracing::warn!("expiring app grants failed: {e}");
            }
        }
    });
    let prober = tokio::spawn(probe::run(state.clone()));
    tracing::info!("apps served on {addr} as {:?}", state.config.apps.url);
    Ok(Some(Listener {
        addr,
        handle,
        server,
        sweeper,
        prober,
    }))
}

/// Every request to an app origin.
async fn serve(
    req: HttpRequest,
    body: web::Payload,
    state: web::Data<AppState>,
    origins: web::Data<Origins>,
) -> HttpResponse {
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or_default();
    let Some(label) = svc::label_of(&state.apps, host) else {
        return text(404, "no app is served at this address");
    };
    if req.path() == "/_commons/auth" {
        return redeem(&state, &origins, &req, label).await;
    }
    let creds = credentials(&req);
    let used_bearer = creds.bearer.is_some();
    match svc::pass(&state, label.clone(), creds).await {
        Ok(Pass::SignIn) => {
            let next = req
                .uri()
                .path_and_query()
                .map_or("/".to_string(), |p| p.to_string());
            let to = format!(
                "{}/apps/open?host={label}&next={}",
                origins.portal,
                url::form_urlencoded::byte_serialize(next.as_bytes()).collect::<String>()
            );
            HttpResponse::Found()
                .insert_header((header::LOCATION, to))
                .insert_header((header::CACHE_CONTROL, "no-store"))
                .finish()
        }
        Ok(Pass::Through {
            job,
            port,
            node,
            attempt,
        }) => {
            let target = proxy::Target {
                job,
                port,
                node,
                attempt,
                strip_authorization: used_bearer,
                scheme: if origins.secure { "https" } else { "http" },
            };
            proxy::forward(&state, req, body, target).await
        }
        Err(e) => error(&e),
    }
}

/// The origin's session cookie and the bearer token, if the request has them.
fn credentials(req: &HttpRequest) -> Credentials {
    let bearer = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.strip_prefix("Bearer "))
        .map(|t| t.trim().to_string());
    let sessions = req
        .cookies()
        .map(|all| {
            all.iter()
                .filter(|c| c.name() == COOKIE)
                .map(|c| c.value().to_string())
                .collect()
        })
        .unwrap_or_default();
    Credentials { sessions, bearer }
}

/// `/_commons/auth?code=..&next=..`: a code from the portal becomes this origin's cookie.
async fn redeem(
    state: &AppState,
    origins: &Origins,
    req: &HttpRequest,
    label: String,
) -> HttpResponse {
    #[derive(serde::Deserialize)]
    struct Q {
        code: String,
        #[serde(default)]
        next: String,
    }
    let Ok(q) = web::Query::<Q>::from_query(req.query_string()) else {
        return text(400, "this sign-in link has no code");
    };
    match svc::redeem(state, label, q.code.clone()).await {
        Ok(Some(session)) => {
            let secure = if origins.secure { "; Secure" } else { "" };
            let cookie = format!(
                "{COOKIE}={session}; Path=/; HttpOnly; SameSite=Lax; Max-Age={}{secure}",
                svc::SESSION_TTL_S
            );
            HttpResponse::Found()
                .insert_header((header::SET_COOKIE, cookie))
                .insert_header((header::LOCATION, svc::safe_next(&q.next)))
                .insert_header((header::CACHE_CONTROL, "no-store"))
                .finish()
        }
        Ok(None) => text(
            403,
            "this sign-in link was used already or has expired: open the app again from its \
             job's page on the portal",
        ),
        Err(e) => error(&e),
    }
}

fn error(e: &AppError) -> HttpResponse {
    if let AppError::Internal(cause) = e {
        tracing::error!("apps: {cause:#}");
        return text(500, "the portal failed to serve this app; try again");
    }
    text(e.status().as_u16(), &e.to_string())
}

fn text(status: u16, message: &str) -> HttpResponse {
    let status = actix_web::http::StatusCode::from_u16(status)
        .unwrap_or(actix_web::http::StatusCode::INTERNAL_SERVER_ERROR);
    HttpResponse::build(status)
        .content_type("text/plain; charset=utf-8")
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .body(format!("GPU Commons: {message}\n"))
}
