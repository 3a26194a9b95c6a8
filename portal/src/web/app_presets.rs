//! The "App presets" console: the presets a user may see, and for operators (campus
//! presets and any lab's) and lab admins (their labs') a form to add one or change one,
//! and a remove button. Every rule is the service's (`service::app_presets`), as for the
//! API: the page only offers what the service would accept.

use super::{number, optional, Banner};
use crate::auth::{CsrfForm, CurrentUser, NoFields};
use crate::error::{AppError, WebError};
use crate::service::app_presets::{self, Choice};
use crate::state::AppState;
use actix_session::Session;
use actix_web::{web, HttpResponse};
use askama::Template;
use askama_web::WebTemplate;
use commons_api::app_preset::{PresetRequest, PresetView, DEFAULT_COLOUR, DEFAULT_IDLE_MINUTES};
use serde::Deserialize;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/app-presets", web::get().to(page))
        .route("/app-presets", web::post().to(add))
        .route("/app-presets/{id}", web::post().to(change))
        .route("/app-presets/{id}/remove", web::post().to(remove));
}

/// The preset form as typed (kept when refused).
#[derive(Debug, Clone, Deserialize)]
struct PresetForm {
    #[serde(default)]
    name: String,
    #[serde(default)]
    title: String,
    #[serde(default)]
    description: String,
    #[serde(default)]
    colour: String,
    #[serde(default)]
    image: String,
    /// Run with `sh -c`; `{port}` and `{base_url}` are filled in.
    #[serde(default)]
    command: String,
    #[serde(default)]
    port: String,
    #[serde(default)]
    gpus: String,
    #[serde(default)]
    max_gpus: String,
    #[serde(default)]
    hours: String,
    #[serde(default)]
    max_hours: String,
    #[serde(default)]
    cpus: String,
    #[serde(default)]
    max_cpus: String,
    #[serde(default)]
    memory_gb: String,
    #[serde(default)]
    max_memory_gb: String,
    /// The user may change these: a checkbox each (present when ticked).
    #[serde(default)]
    sets_gpus: Option<String>,
    #[serde(default)]
    sets_hours: Option<String>,
    #[serde(default)]
    sets_cpus: Option<String>,
    #[serde(default)]
    sets_memory_gb: Option<String>,
    #[serde(default)]
    idle_minutes: String,
    /// A lab's slug, or empty for a campus preset.
    #[serde(default)]
    lab: String,
}

impl Default for PresetForm {
    fn default() -> Self {
        PresetForm {
            name: String::new(),
            title: String::new(),
            description: String::new(),
            colour: DEFAULT_COLOUR.into(),
            image: String::new(),
            command: String::new(),
            port: "8888".into(),
            gpus: "1".into(),
            max_gpus: "1".into(),
            hours: "4".into(),
            max_hours: "12".into(),
            cpus: "4".into(),
            max_cpus: "4".into(),
            memory_gb: "16".into(),
            max_memory_gb: "16".into(),
            sets_gpus: None,
            sets_hours: Some("on".into()),
            sets_cpus: None,
            sets_memory_gb: None,
            idle_minutes: DEFAULT_IDLE_MINUTES.to_string(),
            lab: String::new(),
        }
    }
}

fn ticked(on: bool) -> Option<String> {
    on.then(|| "on".to_string())
}

impl PresetForm {
    /// The form filled from a stored preset.
    fn from_view(p: &PresetView) -> PresetForm {
        let s = &p.spec;
        let command = match s.command.as_slice() {
            [sh, c, script] if sh == "sh" && c == "-c" => script.clone(),
            other => other.join(" "),
        };
        PresetForm {
            name: s.name.clone(),
            title: s.title.clone(),
            description: s.description.clone(),
            colour: s.colour.clone(),
            image: s.image.clone(),
            command,
            port: s.port.to_string(),
            gpus: s.gpus.to_string(),
            max_gpus: s.max_gpus.to_string(),
            hours: s.hours.to_string(),
            max_hours: s.max_hours.to_string(),
            cpus: s.cpus.to_string(),
            max_cpus: s.max_cpus.to_string(),
            memory_gb: s.memory_gb.to_string(),
            max_memory_gb: s.max_memory_gb.to_string(),
            sets_gpus: ticked(p.offers(Choice::Gpus)),
            sets_hours: ticked(p.offers(Choice::Hours)),
            sets_cpus: ticked(p.offers(Choice::Cpus)),
            sets_memory_gb: ticked(p.offers(Choice::MemoryGb)),
            idle_minutes: s.idle_minutes.to_string(),
            lab: p.lab.clone().unwrap_or_default(),
        }
    }

    /// The form as an API request.
    fn request(&self) -> Result<PresetRequest, AppError> {
        let command = self.command.replace("\r\n", "\n");
        let command = if command.trim().is_empty() {
            Vec::new()
        } else {
            vec!["sh".into(), "-c".into(), command]
        };
        let user_sets = [
            (Choice::Gpus, &self.sets_gpus),
            (Choice::Hours, &self.sets_hours),
            (Choice::Cpus, &self.sets_cpus),
            (Choice::MemoryGb, &self.sets_memory_gb),
        ]
        .into_iter()
        .filter(|(_, on)| on.is_some())
        .map(|(c, _)| c)
        .collect();
        Ok(PresetRequest {
            name: self.name.trim().to_string(),
            title: self.title.clone(),
            description: self.description.clone(),
            colour: Some(self.colour.clone()),
            image: self.image.trim().to_string(),
            command,
            port: number("port", &self.port)?,
            gpus: number("gpus", &self.gpus)?,
            max_gpus: optional("max_gpus", &self.max_gpus)?,
            hours: number("hours", &self.hours)?,
            max_hours: optional("max_hours", &self.max_hours)?,
            cpus: optional("cpus", &self.cpus)?,
            max_cpus: optional("max_cpus", &self.max_cpus)?,
            memory_gb: optional("memory_gb", &self.memory_gb)?,
            max_memory_gb: optional("max_memory_gb", &self.max_memory_gb)?,
            user_sets,
            idle_minutes: optional("idle_minutes", &self.idle_minutes)?,
            lab: Some(self.lab.trim().to_string()).filter(|l| !l.is_empty()),
        })
    }
}

/// The form's fields, for telling a refusal about one of them from the others.
const FIELDS: [&str; 17] = [
    "name",
    "title",
    "description",
    "colour",
    "image",
    "command",
    "port",
    "gpus",
    "max_gpus",
    "hours",
    "max_hours",
    "cpus",
    "max_cpus",
    "memory_gb",
    "max_memory_gb",
    "idle_minutes",
    "lab",
];

/// One preset in the list, with whether this user may change it.
struct Row {
    preset: PresetView,
    editable: bool,
}

#[derive(Template, WebTemplate)]
#[template(path = "app_presets.html")]
struct PresetsPage {
    banner: Banner,
    rows: Vec<Row>,
    /// Where the user may add presets: "" (campus, operators) and lab slugs.
    targets: Vec<String>,
    form: PresetForm,
    /// The preset the form changes; `None`: a new one.
    editing: Option<i64>,
    error: Option<(String, String)>,
}

impl PresetsPage {
    fn error_for(&self, field: &str) -> Option<&str> {
        match &self.error {
            Some((f, m)) if f == field => Some(m),
            _ => None,
        }
    }

    fn general_error(&self) -> Option<&str> {
        match &self.error {
            Some((f, m)) if !FIELDS.contains(&f.as_str()) => Some(m),
            _ => None,
        }
    }
}

async fn render(
    state: &AppState,
    session: &Session,
    user: &CurrentUser,
    form: PresetForm,
    editing: Option<i64>,
    error: Option<AppError>,
) -> Result<PresetsPage, WebError> {
    let rows = app_presets::console(state, user)
        .await?
        .into_iter()
        .map(|(preset, editable)| Row { preset, editable })
        .collect();
    let mut targets = Vec::new();
    if user.user.is_operator {
        targets.push(String::new());
    }
    targets.extend(
        user.labs
            .iter()
            .filter(|(l, _)| user.admin_of(l.id))
            .map(|(l, _)| l.slug.clone()),
    );
    Ok(PresetsPage {
        banner: Banner::new(state, session, Some(user)),
        rows,
        targets,
        form,
        editing,
        error: error.map(|e| (e.field().unwrap_or("").to_string(), e.to_string())),
    })
}

#[derive(Deserialize)]
struct PageQuery {
    /// Fill the form from this preset, to change it.
    #[serde(default)]
    edit: Option<i64>,
}

async fn page(
    state: web::Data<AppState>,
    session: Session,
    user: CurrentUser,
    q: web::Query<PageQuery>,
) -> Result<PresetsPage, WebError> {
    let (form, editing) = match q.edit {
        Some(id) => {
            let p = app_presets::get(&state, &user, id).await?;
            (PresetForm::from_view(&p), Some(id))
        }
        None => (PresetForm::default(), None),
    };
    render(&state, &session, &user, form, editing, None).await
}

/// Answers a write: back to the list, or the page again with the refusal beside its
/// field.
async fn answer(
    state: &AppState,
    session: &Session,
    user: &CurrentUser,
    form: PresetForm,
    editing: Option<i64>,
    done: Result<(), AppError>,
) -> Result<HttpResponse, WebError> {
    match done {
        Ok(()) => Ok(HttpResponse::SeeOther()
            .insert_header(("location", "/app-presets"))
            .finish()),
        Err(
            e @ (AppError::Invalid { .. } | AppError::Forbidden(_) | AppError::Conflict { .. }),
        ) => {
            let status = e.status();
            let page = render(state, session, user, form, editing, Some(e)).await?;
            super::html_page(status, &page)
        }
        Err(e) => Err(e.into()),
    }
}

async fn add(
    state: web::Data<AppState>,
    session: Session,
    user: CurrentUser,
    form: CsrfForm<PresetForm>,
) -> Result<HttpResponse, WebError> {
    let form = form.0;
    let done = match form.request() {
        Ok(req) => app_presets::create(&state, &user, req).await.map(|_| ()),
        Err(e) => Err(e),
    };
    answer(&state, &session, &user, form, None, done).await
}

async fn change(
    state: web::Data<AppState>,
    session: Session,
    user: CurrentUser,
    id: web::Path<i64>,
    form: CsrfForm<PresetForm>,
) -> Result<HttpResponse, WebError> {
    let id = id.into_inner();
    let form = form.0;
    let done = match form.request() {
        Ok(req) => app_presets::update(&state, &user, id, req)
            .await
            .map(|_| ()),
        Err(e) => Err(e),
    };
    answer(&state, &session, &user, form, Some(id), done).await
}

async fn remove(
    state: web::Data<AppState>,
    user: CurrentUser,
    id: web::Path<i64>,
    _form: CsrfForm<NoFields>,
) -> Result<HttpResponse, WebError> {
    app_presets::delete(&state, &user, id.into_inner()).await?;
    Ok(HttpResponse::SeeOther()
        .insert_header(("location", "/app-presets"))
        .finish())
}
