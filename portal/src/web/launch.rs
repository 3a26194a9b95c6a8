//! The "Launch" page: the web apps a user may launch (the campus's presets and their
//! labs'), each a short form with only what its preset lets them change, bounded by its
//! maxima. Launching submits an interactive job (`service::app_presets::launch`) and
//! goes to the job's page, which follows the job live to its **Open** button.

use super::Banner;
use crate::auth::{CsrfForm, CurrentUser};
use crate::error::{AppError, WebError};
use crate::service::app_presets::{self, Choice};
use crate::state::AppState;
use actix_session::Session;
use actix_web::{web, HttpResponse};
use askama::Template;
use askama_web::WebTemplate;
use commons_api::app_preset::{LaunchRequest, PresetView};
use serde::Deserialize;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/launch", web::get().to(page))
        .route("/launch/{id}", web::post().to(launch));
}

/// A launch form as typed (kept when refused).
#[derive(Debug, Clone, Default, Deserialize)]
struct LaunchForm {
    #[serde(default)]
    gpus: String,
    #[serde(default)]
    hours: String,
    #[serde(default)]
    cpus: String,
    #[serde(default)]
    memory_gb: String,
    #[serde(default)]
    lab: String,
}

impl LaunchForm {
    fn typed(&self, c: Choice) -> &str {
        match c {
            Choice::Gpus => &self.gpus,
            Choice::Hours => &self.hours,
            Choice::Cpus => &self.cpus,
            Choice::MemoryGb => &self.memory_gb,
        }
    }

    /// The form as a launch: empty fields take the preset's defaults.
    fn request(&self) -> Result<LaunchRequest, AppError> {
        fn opt<T: std::str::FromStr>(f: &str, t: &str) -> Result<Option<T>, AppError> {
            super::optional(f, t)
        }
        Ok(LaunchRequest {
            gpus: opt("gpus", &self.gpus)?,
            hours: opt("hours", &self.hours)?,
            cpus: opt("cpus", &self.cpus)?,
            memory_gb: opt("memory_gb", &self.memory_gb)?,
            lab: Some(self.lab.trim().to_string()).filter(|l| !l.is_empty()),
        })
    }
}

/// One setting the user may change.
struct Field {
    name: &'static str,
    label: &'static str,
    value: String,
    max: String,
    min: &'static str,
    step: &'static str,
}

/// One preset on the page.
struct Card {
    preset: PresetView,
    fields: Vec<Field>,
    /// What the preset fixes, in words ("1 GPU · 4 CPUs").
    fixed: String,
    /// A lab to choose for a campus preset when the user is in several.
    labs: Vec<String>,
    lab: String,
    error: Option<(String, String)>,
}

impl Card {
    fn new(preset: PresetView, user_labs: &[String], form: &LaunchForm) -> Card {
        let s = &preset.spec;
        let mut fields = Vec::new();
        let mut fixed = Vec::new();
        // (setting, label, default, most, least, step, the default in words)
        let all = [
            (
                Choice::Gpus,
                "GPUs",
                s.gpus.to_string(),
                s.max_gpus.to_string(),
                "1",
                "1",
                format!("{} GPU{}", s.gpus, if s.gpus == 1 { "" } else { "s" }),
            ),
            (
                Choice::Hours,
                "Hours",
                s.hours.to_string(),
                s.max_hours.to_string(),
                "1",
                "1",
                format!("{} h", s.hours),
            ),
            (
                Choice::Cpus,
                "CPUs",
                s.cpus.to_string(),
                s.max_cpus.to_string(),
                "0.01",
                "any",
                format!("{} CPUs", s.cpus),
            ),
            (
                Choice::MemoryGb,
                "Memory (GB)",
                s.memory_gb.to_string(),
                s.max_memory_gb.to_string(),
                "0.0625",
                "any",
                format!("{} GB memory", s.memory_gb),
            ),
        ];
        for (c, label, default, max, min, step, words) in all {
            if preset.offers(c) {
                let typed = form.typed(c).trim();
                let value = if typed.is_empty() {
                    default
                } else {
                    typed.to_string()
                };
                fields.push(Field {
                    name: c.as_str(),
                    label,
                    value,
                    max,
                    min,
                    step,
                });
            } else {
                fixed.push(words);
            }
        }
        let labs = if preset.lab.is_none() && user_labs.len() > 1 {
            user_labs.to_vec()
        } else {
            Vec::new()
        };
        Card {
            fields,
            fixed: fixed.join(" · "),
            labs,
            lab: form.lab.clone(),
            error: None,
            preset,
        }
    }

    fn error_for(&self, field: &str) -> Option<&str> {
        match &self.error {
            Some((f, m)) if f == field => Some(m),
            _ => None,
        }
    }

    /// A refusal about no field of this form.
    fn general_error(&self) -> Option<&str> {
        let shown = |f: &str| {
            self.fields.iter().any(|x| x.name == f) || (f == "lab" && !self.labs.is_empty())
        };
        match &self.error {
            Some((f, m)) if !shown(f) => Some(m),
            _ => None,
        }
    }
}

#[derive(Template, WebTemplate)]
#[template(path = "launch.html")]
struct LaunchPage {
    banner: Banner,
    cards: Vec<Card>,
    /// The user may write presets (an operator or a lab admin).
    manages: bool,
}

async fn render(
    state: &AppState,
    session: &Session,
    user: &CurrentUser,
    refused: Option<(i64, LaunchForm, AppError)>,
) -> Result<LaunchPage, WebError> {
    let presets = app_presets::list(state, user).await?;
    let labs: Vec<String> = user.labs.iter().map(|(l, _)| l.slug.clone()).collect();
    let cards = presets
        .into_iter()
        .map(|p| match &refused {
            Some((id, form, e)) if *id == p.id => {
                let mut card = Card::new(p, &labs, form);
                card.error = Some((e.field().unwrap_or("").to_string(), e.to_string()));
                card
            }
            _ => Card::new(p, &labs, &LaunchForm::default()),
        })
        .collect();
    let manages = user.user.is_operator || user.labs.iter().any(|(l, _)| user.admin_of(l.id));
    Ok(LaunchPage {
        banner: Banner::new(state, session, Some(user)),
        cards,
        manages,
    })
}

async fn page(
    state: web::Data<AppState>,
    session: Session,
    user: CurrentUser,
) -> Result<LaunchPage, WebError> {
    render(&state, &session, &user, None).await
}

async fn launch(
    state: web::Data<AppState>,
    session: Session,
    user: CurrentUser,
    id: web::Path<i64>,
    form: CsrfForm<LaunchForm>,
) -> Result<HttpResponse, WebError> {
    let id = id.into_inner();
    let form = form.0;
    let launched = match form.request() {
        Ok(req) => app_presets::launch(&state, &user, id, req).await,
        Err(e) => Err(e),
    };
    match launched {
        Ok(job) => Ok(HttpResponse::SeeOther()
            .insert_header(("location", format!("/jobs/{}", job.id)))
            .finish()),
        Err(
            e @ (AppError::Invalid { .. } | AppError::Forbidden(_) | AppError::Conflict { .. }),
        ) => {
            let status = e.status();
            let page = render(&state, &session, &user, Some((id, form, e))).await?;
            super::html_page(status, &page)
        }
        Err(e) => Err(e.into()),
    }
}
