//! The "Settings" page: the signed-in user's notifications (e-mail on or off, which
//! events, webhooks) and their delivery log. Every change goes through the same use case
//! as `PUT /api/v1/me/notifications`, so the page and the API refuse alike.

use super::Banner;
use crate::auth::{CsrfForm, CurrentUser, NoFields};
use crate::error::{AppError, WebError};
use crate::service::notify::{self, sign, Options};
use crate::state::AppState;
use actix_session::Session;
use actix_web::{web, HttpResponse};
use askama::Template;
use askama_web::WebTemplate;
use commons_api::notify::{
    Delivery, NotificationRequest, NotificationSettings, WebhookRequest, EVENTS,
};
use serde::Deserialize;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/settings", web::get().to(page))
        .route("/settings/notifications", web::post().to(save_preferences))
        .route("/settings/webhooks", web::post().to(add_webhook))
        .route(
            "/settings/webhooks/{id}/remove",
            web::post().to(remove_webhook),
        );
}

/// The preferences form: a checkbox for e-mail and one per event.
#[derive(Debug, Default, Deserialize)]
struct PreferencesForm {
    email: Option<String>,
    started: Option<String>,
    preempted: Option<String>,
    ending: Option<String>,
    succeeded: Option<String>,
    failed: Option<String>,
    cancelled: Option<String>,
    array_finished: Option<String>,
}

impl PreferencesForm {
    fn events(&self) -> Option<Vec<String>> {
        let on = [
            &self.started,
            &self.preempted,
            &self.ending,
            &self.succeeded,
            &self.failed,
            &self.cancelled,
            &self.array_finished,
        ];
        let chosen: Vec<String> = EVENTS
            .iter()
            .zip(on)
            .filter(|(_, v)| v.is_some())
            .map(|(e, _)| e.to_string())
            .collect();
        // All of them: "every event", so events added later are included too.
        (chosen.len() < EVENTS.len()).then_some(chosen)
    }
}

/// The add-a-webhook form as typed.
#[derive(Debug, Clone, Default, Deserialize)]
struct WebhookForm {
    #[serde(default)]
    url: String,
    #[serde(default)]
    secret: String,
}

#[derive(Template, WebTemplate)]
#[template(path = "settings.html")]
struct SettingsPage {
    banner: Banner,
    settings: NotificationSettings,
    /// (event, whether it is on)
    events: Vec<(&'static str, bool)>,
    deliveries: Vec<Delivery>,
    form: WebhookForm,
    url_error: Option<String>,
    secret_error: Option<String>,
    /// A secret the portal just made, shown this once.
    new_secret: Option<String>,
}

async fn render(
    state: &AppState,
    session: &Session,
    user: &CurrentUser,
    form: WebhookForm,
    error: Option<AppError>,
) -> Result<SettingsPage, WebError> {
    let settings = notify::get(state, user, Options::of(&state.config)).await?;
    let deliveries = notify::deliveries(state, user, 20).await?;
    let events = EVENTS
        .iter()
        .map(|e| {
            let on = settings
                .events
                .as_ref()
                .is_none_or(|l| l.iter().any(|x| x == e));
            (*e, on)
        })
        .collect();
    let (mut url_error, mut secret_error) = (None, None);
    if let Some(e) = error {
        let slot = match e.field() {
            Some(f) if f.ends_with(".secret") => &mut secret_error,
            _ => &mut url_error,
        };
        *slot = Some(e.to_string());
    }
    Ok(SettingsPage {
        banner: Banner::new(state, session, Some(user)),
        settings,
        events,
        deliveries,
        form,
        url_error,
        secret_error,
        new_secret: None,
    })
}

async fn page(
    state: web::Data<AppState>,
    session: Session,
    user: CurrentUser,
) -> Result<SettingsPage, WebError> {
    render(&state, &session, &user, WebhookForm::default(), None).await
}

/// The saved webhooks as a request that keeps their secrets.
fn kept(s: &NotificationSettings) -> Vec<WebhookRequest> {
    s.webhooks
        .iter()
        .map(|w| WebhookRequest {
            url: w.url.clone(),
            secret: None,
        })
        .collect()
}

fn back() -> HttpResponse {
    HttpResponse::SeeOther()
        .insert_header(("location", "/settings"))
        .finish()
}

async fn save_preferences(
    state: web::Data<AppState>,
    user: CurrentUser,
    form: CsrfForm<PreferencesForm>,
) -> Result<HttpResponse, WebError> {
    let opts = Options::of(&state.config);
    let now = notify::get(&state, &user, opts).await?;
    let req = NotificationRequest {
        email: form.0.email.is_some(),
        webhooks: kept(&now),
        events: form.0.events(),
    };
    notify::put(&state, &user, req, opts).await?;
    Ok(back())
}

async fn add_webhook(
    state: web::Data<AppState>,
    session: Session,
    user: CurrentUser,
    form: CsrfForm<WebhookForm>,
) -> Result<HttpResponse, WebError> {
    let form = form.0;
    let opts = Options::of(&state.config);
    let now = notify::get(&state, &user, opts).await?;
    let made = form.secret.trim().is_empty().then(sign::new_secret);
    let mut webhooks = kept(&now);
    webhooks.push(WebhookRequest {
        url: form.url.clone(),
        secret: Some(made.clone().unwrap_or_else(|| form.secret.clone())),
    });
    let req = NotificationRequest {
        email: now.email,
        webhooks,
        events: now.events.clone(),
    };
    match notify::put(&state, &user, req, opts).await {
        Ok(_) if made.is_some() => {
            let mut page = render(&state, &session, &user, WebhookForm::default(), None).await?;
            page.new_secret = made;
            super::html_page(actix_web::http::StatusCode::OK, &page)
        }
        Ok(_) => Ok(back()),
        Err(e @ AppError::Invalid { .. }) => {
            // The secret typed is not sent back into the page.
            let form = WebhookForm {
                url: form.url,
                secret: String::new(),
            };
            let page = render(&state, &session, &user, form, Some(e)).await?;
            super::html_page(actix_web::http::StatusCode::UNPROCESSABLE_ENTITY, &page)
        }
        Err(e) => Err(e.into()),
    }
}

async fn remove_webhook(
    state: web::Data<AppState>,
    user: CurrentUser,
    id: web::Path<String>,
    _form: CsrfForm<NoFields>,
) -> Result<HttpResponse, WebError> {
    let opts = Options::of(&state.config);
    let now = notify::get(&state, &user, opts).await?;
    let id = id.into_inner();
    let req = NotificationRequest {
        email: now.email,
        webhooks: now
            .webhooks
            .iter()
            .filter(|w| w.id != id)
            .map(|w| WebhookRequest {
                url: w.url.clone(),
                secret: None,
            })
            .collect(),
        events: now.events.clone(),
    };
    notify::put(&state, &user, req, opts).await?;
    Ok(back())
}
