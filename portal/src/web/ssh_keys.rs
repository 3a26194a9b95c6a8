//! The "SSH keys" page: the signed-in user's public keys, an add form (kept as typed
//! when refused, with the error beside its field; only a pasted private key is not sent
//! back), and a remove button per key.

use super::Banner;
use crate::auth::{CredentialsManager, CsrfForm, CurrentUser, NoFields};
use crate::db::models::SshKey;
use crate::error::{AppError, WebError};
use crate::pubkey::KeyError;
use crate::service::ssh_keys::{self, NewSshKey};
use crate::state::AppState;
use actix_session::Session;
use actix_web::{web, HttpResponse};
use askama::Template;
use askama_web::WebTemplate;
use serde::Deserialize;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/ssh-keys", web::get().to(page))
        .route("/ssh-keys", web::post().to(add))
        .route("/ssh-keys/{id}/remove", web::post().to(remove));
}

/// The add form as typed.
#[derive(Debug, Clone, Default, Deserialize)]
struct KeyForm {
    #[serde(default)]
    public_key: String,
    #[serde(default)]
    name: String,
}

#[derive(Template, WebTemplate)]
#[template(path = "ssh_keys.html")]
struct SshKeysPage {
    banner: Banner,
    keys: Vec<SshKey>,
    form: KeyForm,
    /// A refusal, shown beside the field it is about.
    key_error: Option<String>,
    name_error: Option<String>,
}

async fn render(
    state: &AppState,
    session: &Session,
    user: &CurrentUser,
    form: KeyForm,
    error: Option<AppError>,
) -> Result<SshKeysPage, WebError> {
    let keys = ssh_keys::list(state, user).await?;
    let (mut key_error, mut name_error) = (None, None);
    if let Some(e) = error {
        let slot = match e.field() {
            Some("name") => &mut name_error,
            _ => &mut key_error,
        };
        *slot = Some(e.to_string());
    }
    Ok(SshKeysPage {
        banner: Banner::new(state, session, Some(user)),
        keys,
        form,
        key_error,
        name_error,
    })
}

async fn page(
    state: web::Data<AppState>,
    session: Session,
    user: CurrentUser,
) -> Result<SshKeysPage, WebError> {
    render(&state, &session, &user, KeyForm::default(), None).await
}

async fn add(
    state: web::Data<AppState>,
    session: Session,
    user: CredentialsManager,
    form: CsrfForm<KeyForm>,
) -> Result<HttpResponse, WebError> {
    let form = form.0;
    let req = NewSshKey {
        public_key: form.public_key.clone(),
        name: Some(form.name.clone()).filter(|n| !n.trim().is_empty()),
    };
    match ssh_keys::add(&state, &user, req).await {
        Ok(_) => Ok(HttpResponse::SeeOther()
            .insert_header(("location", "/ssh-keys"))
            .finish()),
        Err(e @ AppError::Invalid { .. }) => {
            let mut form = form;
            if e.code() == KeyError::PrivateKey.code() {
                // The one input not kept: a secret must not travel back into the page.
                form.public_key.clear();
            }
            let page = render(&state, &session, &user, form, Some(e)).await?;
            super::html_page(actix_web::http::StatusCode::UNPROCESSABLE_ENTITY, &page)
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
    ssh_keys::remove(&state, &user, id.into_inner()).await?;
    Ok(HttpResponse::SeeOther()
        .insert_header(("location", "/ssh-keys"))
        .finish())
}
