//! Notifications: a user's settings (e-mail, webhooks, which events), and the
//! background task that turns job events into deliveries and sends them.
//!
//! How an event travels (see [`queue`] and [`send`]):
//! 1. Every state change of a job is a `job_events` row, written where the change is
//!    made. The notifier reads the rows after its cursor, in id order; that read is the
//!    one place notifications are made, so no code path that changes a job's state can
//!    forget them, and no request or scheduler round waits for them.
//! 2. For each row of a notified state (running, preempting, succeeded, failed,
//!    cancelled) it queues one delivery per channel of the job's owner whose events
//!    include it (the job's own `notify` list replaces the owner's), with the stable id
//!    `evt_<row id>`, and moves the cursor, in one transaction.
//!    An array's tasks are the exception: they send nothing of their own, and the
//!    array sends one `array_finished` when its last task ends ([`array_done`]).
//!    Interactive jobs and apps near their time limit get `ending` ([`ending`]), from a
//!    check the same background task makes every 2 seconds.
//! 3. Due deliveries are claimed for a minute (so one replica sends each) and sent;
//!    a failure is retried with doubling delays for 24 h.
//!
//! Invariants: a webhook's secret never leaves the portal except as the HMAC it makes;
//! settings are checked whole before anything is stored.

pub mod array_done;
pub mod ending;
pub mod queue;
pub mod send;
pub mod sign;
pub mod targets;

use super::{Actor, Ctx};
use crate::db::{self, notifications as store};
use crate::error::AppError;
use commons_api::notify::{
    Delivery, NotificationRequest, NotificationSettings, WebhookView, MAX_WEBHOOKS,
};
use serde::{Deserialize, Serialize};

/// What the settings' rules need from the configuration.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Whether an SMTP relay is configured.
    pub email_available: bool,
    /// `[notify] allow_private_targets`.
    pub allow_private: bool,
}

impl Options {
    pub fn of(config: &crate::config::Config) -> Options {
        Options {
            email_available: config.smtp.is_some(),
            allow_private: config.notify.allow_private_targets,
        }
    }
}

/// A webhook as stored (in the settings row's JSON).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Webhook {
    pub id: String,
    pub url: String,
    pub secret: String,
}

/// A user's settings as the rules read them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Settings {
    pub email: bool,
    pub events: Option<Vec<String>>,
    pub webhooks: Vec<Webhook>,
}

impl Settings {
    pub fn from_row(row: Option<store::SettingsRow>) -> Settings {
        let Some(r) = row else {
            return Settings::default();
        };
        Settings {
            email: r.email,
            events: r.events.and_then(|e| serde_json::from_str(&e).ok()),
            webhooks: serde_json::from_str(&r.webhooks).unwrap_or_default(),
        }
    }

    /// Does the user want `event` (for a job with its own list `job_events`)?
    pub fn wants(&self, event: &str, job_events: Option<&[String]>) -> bool {
        match (job_events, &self.events) {
            (Some(j), _) => j.iter().any(|e| e == event),
            (None, Some(mine)) => mine.iter().any(|e| e == event),
            (None, None) => true,
        }
    }
}

fn hint(secret: &str) -> String {
    let tail: String = secret
        .chars()
        .rev()
        .take(4)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    format!("…{tail}")
}

fn view(actor: &Actor, s: &Settings, opts: Options) -> NotificationSettings {
    NotificationSettings {
        email: s.email,
        email_address: actor.user.email.clone(),
        email_available: opts.email_available,
        webhooks: s
            .webhooks
            .iter()
            .map(|w| WebhookView {
                id: w.id.clone(),
                url: w.url.clone(),
                secret_hint: hint(&w.secret),
            })
            .collect(),
        events: s.events.clone(),
    }
}

async fn load(ctx: &Ctx, user: i64) -> Result<Settings, AppError> {
    let row = ctx
        .db
        .run(move |c| Ok::<_, AppError>(store::settings(c, user)?))
        .await?;
    Ok(Settings::from_row(row))
}

/// The caller's settings (secrets shown by their last characters only).
pub async fn get(
    ctx: &Ctx,
    actor: &Actor,
    opts: Options,
) -> Result<NotificationSettings, AppError> {
    let s = load(ctx, actor.user.id).await?;
    Ok(view(actor, &s, opts))
}

/// Replaces the caller's settings after checking all of them: event names, at most 5
/// webhooks, each http(s) to a public address with a secret (one left out keeps the
/// secret saved for the same URL). A refusal names the field (`webhooks[0].url`).
pub async fn put(
    ctx: &Ctx,
    actor: &Actor,
    req: NotificationRequest,
    opts: Options,
) -> Result<NotificationSettings, AppError> {
    let old = load(ctx, actor.user.id).await?;
    let events = match &req.events {
        Some(e) => Some(commons_api::notify::events("events", e)?),
        None => None,
    };
    if req.webhooks.len() > MAX_WEBHOOKS {
        return Err(AppError::invalid(
            "webhooks",
            format!("at most {MAX_WEBHOOKS} webhooks"),
        ));
    }
    let mut webhooks = Vec::new();
    for (i, w) in req.webhooks.iter().enumerate() {
        let field = format!("webhooks[{i}].url");
        let target = targets::resolve(&w.url, opts.allow_private)
            .await
            .map_err(|m| AppError::invalid(&field, m))?;
        let url = target.url.to_string();
        let kept = old.webhooks.iter().find(|o| o.url == url);
        let secret =
            match (&w.secret, kept) {
                (Some(s), _) => check_secret(&format!("webhooks[{i}].secret"), s)?,
                (None, Some(k)) => k.secret.clone(),
                (None, None) => return Err(AppError::invalid(
                    &format!("webhooks[{i}].secret"),
                    "a new webhook needs a secret (whsec_ and base64, or 16 characters or more)",
                )),
            };
        let id = kept
            .map(|k| k.id.clone())
            .unwrap_or_else(|| format!("wh_{}", hex::encode(rand::random::<[u8; 6]>())));
        webhooks.push(Webhook { id, url, secret });
    }
    let new = Settings {
        email: req.email,
        events,
        webhooks,
    };
    let user = actor.user.id;
    let stored = new.clone();
    ctx.db
        .run(move |c| {
            let events = stored
                .events
                .as_ref()
                .map(serde_json::to_string)
                .transpose()
                .map_err(db::DbError::from)?;
            let hooks = serde_json::to_string(&stored.webhooks).map_err(db::DbError::from)?;
            Ok::<_, AppError>(store::put_settings(
                c,
                user,
                stored.email,
                events.as_deref(),
                &hooks,
            )?)
        })
        .await?;
    tracing::info!(
        user,
        webhooks = new.webhooks.len(),
        email = new.email,
        "notification settings saved"
    );
    Ok(view(actor, &new, opts))
}

fn check_secret(field: &str, s: &str) -> Result<String, AppError> {
    let s = s.trim();
    let key = sign::key(s);
    if key.len() < 16 || s.len() > 256 {
        return Err(AppError::invalid(
            field,
            "the secret must give 16 to 256 bytes: whsec_ and base64 (Standard Webhooks), or \
             16 characters or more",
        ));
    }
    Ok(s.to_string())
}

/// The caller's latest deliveries (at most `limit`), newest first.
pub async fn deliveries(ctx: &Ctx, actor: &Actor, limit: i64) -> Result<Vec<Delivery>, AppError> {
    let user = actor.user.id;
    let (rows, settings) = ctx
        .db
        .run(move |c| {
            Ok::<_, AppError>((
                store::deliveries(c, user, limit)?,
                store::settings(c, user)?,
            ))
        })
        .await?;
    let hooks = Settings::from_row(settings).webhooks;
    Ok(rows
        .into_iter()
        .map(|r| {
            let target = if r.channel == "webhook" {
                hooks
                    .iter()
                    .find(|h| h.id == r.target)
                    .map(|h| h.url.clone())
                    .unwrap_or_else(|| format!("{} (removed)", r.target))
            } else {
                r.target.clone()
            };
            Delivery {
                event_id: r.event_id,
                job: r.job_id,
                event: r.event,
                channel: r.channel,
                target,
                next_at: (r.status == "pending").then_some(r.next_at),
                status: r.status,
                attempts: r.attempts,
                created_at: r.created_at,
                last_at: r.last_at,
                last_answer: r.last_answer,
            }
        })
        .collect())
}

/// Stores a job's own `notify` list (already expanded), at submission.
pub fn set_job_events(c: &mut db::DbConn, job: i64, events: &[String]) -> Result<(), AppError> {
    let events = serde_json::to_string(events).map_err(db::DbError::from)?;
    Ok(store::set_job_events(c, job, &events)?)
}
