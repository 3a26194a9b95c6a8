//! Web apps that jobs serve (`app: {"port": N}`), on origins of their own: registering
//! an app at submission, the one-time code that takes its owner's browser from the
//! portal to the app's origin, the origin's session, and who may pass the proxy.
//!
//! Invariants:
//! - Only the job's owner passes; everyone else gets 403, and a visitor with no
//!   credential is sent to the portal to prove who they are.
//! - A code works once, within [`CODE_TTL_S`], and only on the origin of its job.
//! - Secrets are stored as SHA-256 only.

use super::{Actor, Ctx};
use crate::config::AppsConfig;
use crate::db::apps::{self as rows, AppRow, GrantKind};
use crate::db::{self, DbConn};
use crate::error::AppError;
use commons_api::web_app::AppSpec;
use commons_proto::Attempt;
use sha2::{Digest, Sha256};

/// How long a code minted by the portal is good for.
pub const CODE_TTL_S: i64 = 60;
/// How long an app origin's session lasts.
pub const SESSION_TTL_S: i64 = 12 * 3600;
/// Traffic is written down at most this often per app (the idle rule reads it).
const ACTIVITY_EVERY_S: i64 = 30;
/// The cookie of an app's origin (host-only, HttpOnly).
pub const COOKIE: &str = "commons_app";

fn sha(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

fn secret() -> String {
    hex::encode(rand::random::<[u8; 32]>())
}

/// Refuses an app where the portal serves none, before anything is written.
pub fn check_offered(apps: &AppsConfig, app: Option<&AppSpec>) -> Result<(), AppError> {
    if app.is_some() && apps.url.is_none() {
        return Err(AppError::invalid(
            "app",
            "this portal serves no web apps (its operators have not set [apps] url); \
             reach the port with `commons notebook ID` or `ssh -L` instead",
        ));
    }
    Ok(())
}

/// Records `job`'s app under a fresh random label (in the submission's transaction).
pub fn register(
    c: &mut DbConn,
    apps: &AppsConfig,
    job: i64,
    app: &AppSpec,
) -> Result<(), AppError> {
    // 16 hex digits: 64 random bits, a valid DNS label on its own.
    let label = hex::encode(rand::random::<[u8; 8]>());
    let url = apps
        .url_for(&label)
        .ok_or_else(|| AppError::invalid("app", "this portal serves no web apps"))?;
    let port = i32::try_from(app.port).map_err(|_| AppError::invalid("app", "bad port"))?;
    let idle_minutes = app
        .idle_minutes
        .map(i32::try_from)
        .transpose()
        .map_err(|_| AppError::invalid("app.idle_minutes", "out of range"))?;
    let new = rows::NewApp {
        port,
        host: &label,
        url: &url,
        idle_minutes,
    };
    rows::insert(c, job, &new)?;
    Ok(())
}

/// The label of an app origin's host (`3f2a....apps.localhost:8081` -> `3f2a...`), if the
/// host is one of the apps' origins.
pub fn label_of(apps: &AppsConfig, host: &str) -> Option<String> {
    let suffix = apps.host_suffix()?;
    let host = host.to_ascii_lowercase();
    let name = match host.rsplit_once(':') {
        Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h.to_string(),
        _ => host,
    };
    let label = name.strip_suffix(&suffix)?;
    (!label.is_empty() && label.bytes().all(|b| b.is_ascii_hexdigit())).then(|| label.to_string())
}

/// Where the portal sends the owner's browser: the app's origin with a fresh one-time
/// code, then on to `next` (a path on that origin).
pub async fn open(
    ctx: &Ctx,
    actor: &Actor,
    label: String,
    next: String,
) -> Result<String, AppError> {
    let next = safe_next(&next);
    let user = actor.user.id;
    let now = db::now();
    ctx.db
        .run(move |c| {
            let app = rows::by_host(c, &label)?.ok_or(AppError::NotFound("app"))?;
            let job = db::jobs::get(c, app.job_id)?;
            if job.user_id != user {
                return Err(AppError::Forbidden(format!(
                    "job {}'s app is its owner's alone",
                    job.id
                )));
            }
            let code = secret();
            let until = now + chrono::Duration::seconds(CODE_TTL_S);
            rows::grant(c, GrantKind::Code, &sha(&code), job.id, user, until)?;
            let base = app.url.trim_end_matches('/');
            Ok(format!(
                "{base}/_commons/auth?code={code}&next={}",
                url::form_urlencoded::byte_serialize(next.as_bytes()).collect::<String>()
            ))
        })
        .await
}

/// A path on the app's origin to go on to: absolute, never to another host.
pub fn safe_next(next: &str) -> String {
    let ok = next.starts_with('/')
        && !next.starts_with("//")
        && !next.contains('\\')
        && !next.chars().any(char::is_control);
    if ok {
        next.to_string()
    } else {
        "/".to_string()
    }
}

/// Redeems a code on the origin `label`: the secret of a new session of that origin,
/// or `None` when the code is unknown, used, expired or another app's.
pub async fn redeem(ctx: &Ctx, label: String, code: String) -> Result<Option<String>, AppError> {
    let now = db::now();
    ctx.db
        .run(move |c| {
            let Some((job, user)) = rows::take_code(c, &sha(&code), now)? else {
                return Ok(None);
            };
            match rows::by_host(c, &label)? {
                Some(app) if app.job_id == job => {}
                _ => return Ok(None),
            }
            let session = secret();
            let until = now + chrono::Duration::seconds(SESSION_TTL_S);
            rows::grant(c, GrantKind::Session, &sha(&session), job, user, until)?;
            Ok(Some(session))
        })
        .await
}

/// What a request to an app's origin carries to prove who sends it.
#[derive(Debug, Clone, Default)]
pub struct Credentials {
    /// The origin's session cookies: every cookie of that name the browser sent (a
    /// script on another app's origin can plant one for the whole apps domain; it does
    /// not shadow the real one).
    pub sessions: Vec<String>,
    /// A personal access token (`Authorization: Bearer`).
    pub bearer: Option<String>,
}

/// Who may pass, and where to.
#[derive(Debug)]
pub enum Pass {
    /// The owner: relay to `port` of attempt `attempt` of `job` on `node`.
    Through {
        job: i64,
        port: u16,
        node: i64,
        attempt: Attempt,
    },
    /// No credential: send the browser to the portal to prove who it is.
    SignIn,
}

/// Decides whether a request to the origin `label` passes. Errors: 404 for no such
/// app, 403 for anyone but the owner, 503 while the job does not run.
pub async fn pass(ctx: &Ctx, label: String, creds: Credentials) -> Result<Pass, AppError> {
    let now = db::now();
    let since = now - chrono::Duration::seconds(ACTIVITY_EVERY_S);
    // One trip to the database for the whole decision: it is made for every request.
    let decided = ctx
        .db
        .run(move |c| {
            let app: AppRow = rows::by_host(c, &label)?.ok_or(AppError::NotFound("app"))?;
            let job = app.job_id;
            let Some(user) = user_of(c, job, creds, now)? else {
                return Ok(None);
            };
            let j = db::jobs::get(c, job)?;
            if j.user_id != user {
                return Err(AppError::Forbidden(format!(
                    "job {job}'s app is its owner's alone"
                )));
            }
            let (node, attempt) = super::ssh::attempt_of(&j).map_err(AppError::Unavailable)?;
            rows::touch(c, job, now, since)?;
            Ok::<_, AppError>(Some(Pass::Through {
                job,
                port: u16::try_from(app.port).unwrap_or(0),
                node,
                attempt,
            }))
        })
        .await?;
    Ok(decided.unwrap_or(Pass::SignIn))
}

/// Who the request's credentials say it is, for `job`'s origin: the token's holder, or
/// the user of one of the origin's sessions (of this job); none without either.
fn user_of(
    c: &mut DbConn,
    job: i64,
    creds: Credentials,
    now: chrono::NaiveDateTime,
) -> Result<Option<i64>, AppError> {
    if let Some(token) = creds.bearer {
        let (user, _, _) = db::users::token_holder(c, &token)?.ok_or_else(|| {
            AppError::Unauthenticated("the access token is unknown, expired or revoked".into())
        })?;
        return Ok(Some(user.id));
    }
    // At most a few: a browser sends each cookie of a name once per domain.
    for s in creds.sessions.iter().take(8) {
        if let Some((j, u)) = rows::session(c, &sha(s), now)? {
            if j == job {
                return Ok(Some(u));
            }
        }
    }
    Ok(None)
}

/// One of a user's apps that is up: its job, the job's name, where it is served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenApp {
    pub job: i64,
    pub name: Option<String>,
    pub url: String,
}

/// `user`'s running apps that answered during their current attempt (the overview's
/// Open buttons), newest first.
pub fn open_apps_of(c: &mut DbConn, user: i64) -> Result<Vec<OpenApp>, AppError> {
    Ok(rows::answered_of_user(c, user)?
        .into_iter()
        .map(|(job, name, url)| OpenApp { job, name, url })
        .collect())
}

pub use crate::db::apps::ToProbe;

/// The running jobs' apps that have not answered during their current attempt (see
/// `apps::probe`).
pub async fn to_probe(ctx: &Ctx) -> Result<Vec<ToProbe>, AppError> {
    Ok(ctx.db.run(rows::to_probe).await?)
}

/// Records that `job`'s app answered during `attempt`: from now its URL is shown.
pub async fn mark_ready(ctx: &Ctx, job: i64, attempt: Attempt) -> Result<(), AppError> {
    let now = db::now();
    Ok(ctx
        .db
        .run(move |c| rows::set_ready(c, job, attempt, now))
        .await?)
}

/// Notes use of `job`'s app now (written at most every 30 s; nothing for a job without
/// an app).
pub async fn touch(ctx: &Ctx, job: i64) -> Result<(), AppError> {
    touch_within(ctx, job, ACTIVITY_EVERY_S).await
}

/// Notes use of `job`'s app now unless it was noted in the last `every_s` seconds.
async fn touch_within(ctx: &Ctx, job: i64, every_s: i64) -> Result<(), AppError> {
    let now = db::now();
    let since = now - chrono::Duration::seconds(every_s);
    Ok(ctx.db.run(move |c| rows::touch(c, job, now, since)).await?)
}

/// How often lasting use (an open WebSocket, an SSH session) is written down. Each tick
/// writes (the throttle below it is shorter), so the idle clock of a job in use never
/// lags more than this: well inside the shortest warning time (45 s of a 1-minute limit).
/// A tick as long as the throttle would skip every other write (a 60 s gap).
const IN_USE_EVERY_S: u64 = 20;

/// Use of a job that lasts (an open WebSocket to its app, an SSH session into it): noted
/// every 20 s for as long as this lives, so the idle rule never ends a job in use.
pub struct InUse(tokio::task::JoinHandle<()>);

impl Drop for InUse {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Notes use of `job` now and then every 20 s until the returned guard is dropped.
pub fn in_use(ctx: &Ctx, job: i64) -> InUse {
    let ctx = ctx.clone();
    InUse(tokio::spawn(async move {
        let every = std::time::Duration::from_secs(IN_USE_EVERY_S);
        let mut tick = tokio::time::interval(every);
        loop {
            tick.tick().await;
            // Half the tick: this tick's write is never throttled by the last one.
            if let Err(e) = touch_within(&ctx, job, IN_USE_EVERY_S as i64 / 2).await {
                tracing::debug!(job, "noting an app's use failed: {e}");
            }
        }
    }))
}

/// Deletes expired codes and sessions.
pub async fn expire(ctx: &Ctx) -> Result<usize, AppError> {
    let now = db::now();
    Ok(ctx.db.run(move |c| rows::expire(c, now)).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn apps() -> AppsConfig {
        AppsConfig {
            url: Some("http://{host}.apps.localhost:8081".into()),
            listen: Some("127.0.0.1:8081".into()),
        }
    }

    #[test]
    fn labels_come_only_from_the_apps_origins() {
        let a = apps();
        assert_eq!(
            label_of(&a, "0a1b.apps.localhost:8081").as_deref(),
            Some("0a1b")
        );
        assert_eq!(label_of(&a, "0A1B.Apps.Localhost").as_deref(), Some("0a1b"));
        for host in [
            "localhost:8080",
            "apps.localhost:8081",
            ".apps.localhost",
            "x.y.apps.localhost",
            "zz.apps.localhost",
            "0a1b.apps.localhost.evil.test",
        ] {
            assert_eq!(label_of(&a, host), None, "{host}");
        }
        assert_eq!(
            label_of(&AppsConfig::default(), "0a1b.apps.localhost"),
            None
        );
    }

    #[test]
    fn next_stays_on_the_origin() {
        assert_eq!(safe_next("/lab?x=1"), "/lab?x=1");
        for bad in [
            "//evil.test/",
            "https://evil.test/",
            "/\\evil.test",
            "lab",
            "/a\nb",
        ] {
            assert_eq!(safe_next(bad), "/", "{bad:?}");
        }
    }

    #[test]
    fn an_app_needs_apps_configured() {
        let spec = AppSpec {
            port: 8888,
            idle_minutes: None,
        };
        let e = check_offered(&AppsConfig::default(), Some(&spec)).unwrap_err();
        assert_eq!(e.field(), Some("app"));
        assert!(check_offered(&apps(), Some(&spec)).is_ok());
        assert!(check_offered(&AppsConfig::default(), None).is_ok());
    }
}
