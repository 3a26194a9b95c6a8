//! The sender: a background task that queues new events' deliveries and sends the due
//! ones (step 3 of the module above). It only ever waits on the network in its own
//! task; a slow receiver delays other deliveries, never a request or a scheduler round.
//!
//! Invariants: a delivery is sent only while this replica holds its claim; its body and
//! `webhook-id` are the same on every try (receivers deduplicate by the id).

use super::{queue, targets, Settings};
use crate::config::{Config, NotifyConfig};
use crate::db::models::Job;
use crate::db::notifications::{self as store, DeliveryRow};
use crate::db::{self};
use crate::error::AppError;
use crate::service::Ctx;
use chrono::NaiveDateTime;
use lettre::message::{header::ContentType, Mailbox};
use lettre::{AsyncSmtpTransport, AsyncTransport, Tokio1Executor};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;

/// Deliveries taken per pass, and how long this replica holds them.
const CLAIM: i64 = 50;
const CLAIM_S: i64 = 60;
/// How long one try may take.
const SEND_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest wait between two tries.
const MAX_DELAY_S: u64 = 3600;
/// How often running interactive and app jobs are checked for a near time limit.
const ENDING_EVERY: Duration = Duration::from_secs(2);
/// How long finished deliveries stay in the log, in days.
pub const KEEP_DAYS: i64 = 30;

/// An e-mail as queued.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Mail {
    pub subject: String,
    pub text: String,
}

/// The message about `event` of `job`.
pub fn email_text(job: &Job, event: &str, message: &str, grace: Option<NaiveDateTime>) -> Mail {
    let name = job
        .name
        .as_deref()
        .map(|n| format!(" ({n})"))
        .unwrap_or_default();
    let mut text = format!("Job {}{name} {event}: {message}\n", job.id);
    if let Some(d) = grace {
        text.push_str(&format!(
            "\nIt has until {} UTC to write /checkpoint; it is then stopped and queued again.\n",
            d.format("%Y-%m-%d %H:%M:%S")
        ));
    }
    text.push_str(
        "\nChange which notifications you get on the portal's Settings page (/settings).\n",
    );
    Mail {
        subject: format!("[GPU Commons] job {}{name} {event}", job.id),
        text,
    }
}

/// What sends: the SMTP relay (when configured) and the rules for webhooks and retries.
#[derive(Clone)]
pub struct Sender {
    mailer: Option<(AsyncSmtpTransport<Tokio1Executor>, Mailbox)>,
    cfg: NotifyConfig,
}

impl Sender {
    pub fn from_config(config: &Config) -> anyhow::Result<Sender> {
        let mailer = match &config.smtp {
            Some(s) => {
                let t = AsyncSmtpTransport::<Tokio1Executor>::from_url(&s.url)
                    .map_err(|e| anyhow::anyhow!("[smtp] url is not valid: {e}"))?
                    .timeout(Some(SEND_TIMEOUT))
                    .build();
                let from: Mailbox = s
                    .from
                    .parse()
                    .map_err(|e| anyhow::anyhow!("[smtp] from {:?} is not valid: {e}", s.from))?;
                Some((t, from))
            }
            None => None,
        };
        Ok(Sender {
            mailer,
            cfg: config.notify.clone(),
        })
    }
}

/// The background task: forever, queue new events' deliveries (and, every few seconds,
/// the notices of jobs near their time limit), then send the due ones.
pub async fn run(ctx: Ctx, sender: Arc<Sender>) {
    let poll = Duration::from_millis(sender.cfg.poll_ms.max(50));
    let mut expired_at: Option<std::time::Instant> = None;
    let mut ending_at: Option<std::time::Instant> = None;
    loop {
        if ending_at.is_none_or(|t| t.elapsed() >= ENDING_EVERY) {
            ending_at = Some(std::time::Instant::now());
            let email_on = sender.mailer.is_some();
            if let Err(e) = ctx
                .db
                .run(move |c| super::ending::check_time_limits(c, email_on))
                .await
            {
                tracing::warn!("notifications: checking time limits: {e}");
            }
        }
        if expired_at.is_none_or(|t| t.elapsed() > Duration::from_secs(3600)) {
            expired_at = Some(std::time::Instant::now());
            let before = db::now() - chrono::Duration::days(KEEP_DAYS);
            match ctx
                .db
                .run(move |c| Ok::<_, AppError>(store::expire(c, before)?))
                .await
            {
                Ok(0) => {}
                Ok(n) => tracing::info!(deleted = n, "expired old notification deliveries"),
                Err(e) => tracing::warn!("expiring notification deliveries: {e}"),
            }
        }
        let busy = match pass(&ctx, &sender).await {
            Ok(busy) => busy,
            Err(e) => {
                tracing::warn!("notifications: {e}");
                false
            }
        };
        if !busy {
            tokio::time::sleep(poll).await;
        }
    }
}

/// One round; true when there may be more to do at once.
async fn pass(ctx: &Ctx, sender: &Arc<Sender>) -> Result<bool, AppError> {
    let email_on = sender.mailer.is_some();
    let read = ctx.db.run(move |c| queue::pass(c, email_on)).await?;
    let due = ctx
        .db
        .run(|c| Ok::<_, AppError>(store::claim_due(c, CLAIM, CLAIM_S)?))
        .await?;
    let n = due.len();
    let tries = due.into_iter().map(|row| {
        let (ctx, sender) = (ctx.clone(), sender.clone());
        async move {
            let id = row.id;
            if let Err(e) = try_one(&ctx, &sender, row).await {
                tracing::warn!(delivery = id, "notification delivery: {e}");
            }
        }
    });
    futures_util::future::join_all(tries).await;
    Ok(read > 0 || n as i64 == CLAIM)
}

/// Sends one delivery and records how it went.
async fn try_one(ctx: &Ctx, sender: &Sender, row: DeliveryRow) -> Result<(), AppError> {
    let outcome = match row.channel.as_str() {
        "email" => send_email(sender, &row).await,
        _ => {
            let user = row.user_id;
            let s = ctx
                .db
                .run(move |c| Ok::<_, AppError>(store::settings(c, user)?))
                .await?;
            let hook = Settings::from_row(s)
                .webhooks
                .into_iter()
                .find(|w| w.id == row.target);
            match hook {
                Some(h) => send_webhook(sender, &row, &h.url, &h.secret).await,
                None => Err(Failure::Final("the webhook was removed".into())),
            }
        }
    };
    let (status, answer, next) = match outcome {
        Ok(answer) => ("sent", answer, None),
        Err(Failure::Final(answer)) => ("failed", answer, None),
        Err(Failure::Retry(answer)) => match retry_at(&sender.cfg, &row) {
            Some(t) => ("pending", answer, Some(t)),
            None => ("failed", format!("{answer} (gave up)"), None),
        },
    };
    tracing::info!(
        delivery = row.id,
        event = %row.event_id,
        channel = %row.channel,
        status,
        answer = %answer,
        "notification attempt"
    );
    let id = row.id;
    ctx.db
        .run(move |c| Ok::<_, AppError>(store::record_attempt(c, id, status, &answer, next)?))
        .await
}

/// When to try again after the attempt now failing, or None once the retry window ends.
pub fn retry_at(cfg: &NotifyConfig, row: &DeliveryRow) -> Option<NaiveDateTime> {
    let n = row.attempts.clamp(0, 20) as u32;
    let delay = cfg
        .retry_base_s
        .max(1)
        .saturating_mul(1 << n)
        .min(MAX_DELAY_S);
    let t = db::now() + chrono::Duration::seconds(delay as i64);
    let end = row.created_at + chrono::Duration::hours(cfg.retry_hours as i64);
    (t <= end).then_some(t)
}

enum Failure {
    /// Worth trying again (a 5xx, a timeout, a refused connection).
    Retry(String),
    /// Never going to work (no webhook any more, a refused address).
    Final(String),
}

async fn send_webhook(
    sender: &Sender,
    row: &DeliveryRow,
    url: &str,
    secret: &str,
) -> Result<String, Failure> {
    // Resolved and checked now, and connected to exactly the checked addresses.
    let target = targets::resolve(url, sender.cfg.allow_private_targets)
        .await
        .map_err(Failure::Retry)?;
    let host = target.url.host_str().unwrap_or_default().to_string();
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(SEND_TIMEOUT)
        .resolve_to_addrs(&host, &target.addrs)
        .user_agent("GPU-Commons-Webhooks/1")
        .build()
        .map_err(|e| Failure::Retry(format!("client: {e}")))?;
    let ts = chrono::Utc::now().timestamp();
    let sig = super::sign::signature(secret, &row.event_id, ts, &row.payload);
    let res = client
        .post(target.url)
        .header("content-type", "application/json")
        .header("webhook-id", &row.event_id)
        .header("webhook-timestamp", ts.to_string())
        .header("webhook-signature", sig)
        .body(row.payload.clone())
        .send()
        .await
        .map_err(|e| Failure::Retry(format!("no answer: {e}")))?;
    let status = res.status();
    let body = res.text().await.unwrap_or_default();
    let snippet: String = body.chars().take(200).collect();
    let answer = format!("{status} {}", snippet.trim()).trim().to_string();
    if status.is_success() {
        Ok(answer)
    } else {
        Err(Failure::Retry(answer))
    }
}

async fn send_email(sender: &Sender, row: &DeliveryRow) -> Result<String, Failure> {
    let Some((mailer, from)) = &sender.mailer else {
        return Err(Failure::Final(
            "e-mail is not configured on this portal".into(),
        ));
    };
    let mail: Mail = serde_json::from_str(&row.payload)
        .map_err(|e| Failure::Final(format!("stored message unreadable: {e}")))?;
    let to: Mailbox = row
        .target
        .parse()
        .map_err(|e| Failure::Final(format!("address {:?}: {e}", row.target)))?;
    let msg = lettre::Message::builder()
        .from(from.clone())
        .to(to)
        .subject(mail.subject)
        .header(ContentType::TEXT_PLAIN)
        .body(mail.text)
        .map_err(|e| Failure::Final(format!("message: {e}")))?;
    match mailer.send(msg).await {
        Ok(r) => Ok(format!(
            "{} {}",
            r.code(),
            r.message().collect::<Vec<_>>().join(" ")
        )),
        Err(e) if e.is_permanent() => Err(Failure::Final(format!("refused: {e}"))),
        Err(e) => Err(Failure::Retry(format!("relay: {e}"))),
    }
}
