//! The "Images" page: the allow-list a user's jobs may name (campus entries and their
//! labs'), an add form for those who may add (operators: campus or any lab; lab admins:
//! their labs), a remove button on each entry the user may remove, and each administered
//! lab's "signed images only" switch. Every rule is the service's (`service::images`), as
//! for the API: the page only offers what the service would accept.

use super::Banner;
use crate::auth::{CsrfForm, CurrentUser, NoFields};
use crate::error::{AppError, WebError};
use crate::service::images::{self, ImageView, NewImage};
use crate::state::AppState;
use actix_session::Session;
use actix_web::{web, HttpResponse};
use askama::Template;
use askama_web::WebTemplate;
use serde::Deserialize;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/images", web::get().to(page))
        .route("/images", web::post().to(add))
        .route("/images/{id}/remove", web::post().to(remove))
        .route("/images/signed/{slug}", web::post().to(set_signed));
}

/// The add form as typed (kept when refused).
#[derive(Debug, Clone, Default, Deserialize)]
struct ImageForm {
    #[serde(default)]
    name_tag: String,
    #[serde(default)]
    digest: String,
    /// A lab's slug, or empty for a campus entry.
    #[serde(default)]
    lab: String,
    #[serde(default)]
    description: String,
    #[serde(default)]
    signature: String,
}

/// An administered lab's switch.
struct LabSwitch {
    slug: String,
    require_signed: bool,
}

/// One entry, with whether this user may remove it.
struct Row {
    entry: ImageView,
    removable: bool,
}

#[derive(Template, WebTemplate)]
#[template(path = "images.html")]
struct ImagesPage {
    banner: Banner,
    rows: Vec<Row>,
    /// Where the user may add entries: "" (campus, operators) and lab slugs.
    targets: Vec<String>,
    labs: Vec<LabSwitch>,
    form: ImageForm,
    /// A refusal: (field, message); shown beside the field, or above the form.
    error: Option<(String, String)>,
}

impl ImagesPage {
    fn error_for(&self, field: &str) -> Option<&str> {
        match &self.error {
            Some((f, m)) if f == field => Some(m),
            _ => None,
        }
    }

    /// A refusal that is about no field of the form.
    fn general_error(&self) -> Option<&str> {
        const FIELDS: [&str; 5] = ["name_tag", "digest", "lab", "description", "signature"];
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
    form: ImageForm,
    error: Option<AppError>,
) -> Result<ImagesPage, WebError> {
    let entries = images::list(state, user).await?;
    let rows = entries
        .into_iter()
        .map(|entry| {
            let removable = match &entry.lab {
                None => user.user.is_operator,
                Some(slug) => {
                    user.user.is_operator
                        || user
                            .labs
                            .iter()
                            .any(|(l, _)| &l.slug == slug && user.admin_of(l.id))
                }
            };
            Row { entry, removable }
        })
        .collect();
    let labs: Vec<LabSwitch> = user
        .labs
        .iter()
        .filter(|(l, _)| user.admin_of(l.id))
        .map(|(l, _)| LabSwitch {
            slug: l.slug.clone(),
            require_signed: l.require_signed_images,
        })
        .collect();
    let mut targets = Vec::new();
    if user.user.is_operator {
        targets.push(String::new());
    }
    targets.extend(labs.iter().map(|l| l.slug.clone()));
    let error = error.map(|e| (e.field().unwrap_or("").to_string(), e.to_string()));
    Ok(ImagesPage {
        banner: Banner::new(state, session, Some(user)),
        rows,
        targets,
        labs,
        form,
        error,
    })
}

async fn page(
    state: web::Data<AppState>,
    session: Session,
    user: CurrentUser,
) -> Result<ImagesPage, WebError> {
    render(&state, &session, &user, ImageForm::default(), None).await
}

fn some_text(s: &str) -> Option<String> {
    Some(s.trim().to_string()).filter(|s| !s.is_empty())
}

async fn add(
    state: web::Data<AppState>,
    session: Session,
    user: CurrentUser,
    form: CsrfForm<ImageForm>,
) -> Result<HttpResponse, WebError> {
    let form = form.0;
    let req = NewImage {
        name_tag: form.name_tag.trim().to_string(),
        digest: some_text(&form.digest),
        lab: some_text(&form.lab),
        description: some_text(&form.description),
        signature: some_text(&form.signature),
    };
    match images::add(&state, &user, req).await {
        Ok(_) => Ok(HttpResponse::SeeOther()
            .insert_header(("location", "/images"))
            .finish()),
        Err(e @ (AppError::Invalid { .. } | AppError::Forbidden(_))) => {
            let status = if matches!(e, AppError::Forbidden(_)) {
                actix_web::http::StatusCode::FORBIDDEN
            } else {
                actix_web::http::StatusCode::UNPROCESSABLE_ENTITY
            };
            let page = render(&state, &session, &user, form, Some(e)).await?;
            super::html_page(status, &page)
        }
        Err(e) => Err(e.into()),
    }
}

async fn remove(
    state: web::Data<AppState>,
    user: CurrentUser,
    id: web::Path<i64>,
    _form: CsrfForm<NoFields>,
) -> Result<HttpResponse, WebError> {
    images::remove(&state, &user, id.into_inner()).await?;
    Ok(HttpResponse::SeeOther()
        .insert_header(("location", "/images"))
        .finish())
}

#[derive(Debug, Deserialize)]
struct SignedForm {
    /// "on" or "off".
    require_signed: String,
}

async fn set_signed(
    state: web::Data<AppState>,
    user: CurrentUser,
    slug: web::Path<String>,
    form: CsrfForm<SignedForm>,
) -> Result<HttpResponse, WebError> {
    let on = match form.0.require_signed.as_str() {
        "on" => true,
        "off" => false,
        other => {
            return Err(AppError::invalid(
                "require_signed",
                format!("expected on or off, got {other:?}"),
            )
            .into())
        }
    };
    images::set_require_signed(&state, &user, slug.into_inner(), on).await?;
    Ok(HttpResponse::SeeOther()
        .insert_header(("location", "/images"))
        .finish())
}
