//! The "Datasets" page: the lab datasets the signed-in user may mount, with how to name
//! them in a job and where they are (the servers that export a `node:` one, how many
//! servers cache the others). Lab admins register them through the API or the CLI.

use super::Banner;
use crate::auth::CurrentUser;
use crate::error::WebError;
use crate::service::datasets;
use crate::state::AppState;
use actix_session::Session;
use actix_web::web;
use askama::Template;
use askama_web::WebTemplate;
use commons_api::datasets::DatasetView;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/datasets", web::get().to(page));
}

#[derive(Template, WebTemplate)]
#[template(path = "datasets.html")]
struct DatasetsPage {
    banner: Banner,
    sets: Vec<DatasetView>,
}

async fn page(
    state: web::Data<AppState>,
    session: Session,
    user: CurrentUser,
) -> Result<DatasetsPage, WebError> {
    let sets = datasets::list(&state, &user, None).await?;
    Ok(DatasetsPage {
        banner: Banner::new(&state, &session, Some(&user)),
        sets,
    })
}
