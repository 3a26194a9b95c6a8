//! The REST API's OpenAPI 3.1 document, generated from `commons_api`'s types and the
//! handlers' `#[utoipa::path]` attributes, served at `GET /api/v1/openapi.json` (no token
//! needed) and committed as `docs/openapi.json`.
//!
//! Invariant: the committed file is byte for byte what is served ([`document`]: pretty
//! JSON and a newline); a test fails when they differ. Regenerate it with
//! `cargo run -p commons-portal -- openapi > docs/openapi.json`.

use super::{
    account, app_presets, arrays, cli_login, datasets, files, images, jobs, nodes, policy,
    ssh_gateway, ssh_keys, uploads, utilization,
};
use actix_web::{web, HttpResponse};
use commons_api as api;
use std::sync::LazyLock;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::{Modify, OpenApi};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "GPU Commons API",
        description = "The REST API of a GPU Commons portal: submit and follow jobs, read \
            the campus's servers, manage a lab's images, quotas and lending. Every operation \
            but the CLI sign-in and this document needs a personal access token (the \
            portal's Tokens page, or `commons login`): `Authorization: Bearer TOKEN`. \
            Refusals answer `{\"error\": code, \"message\": why}`, and `field` when one \
            field of the request is at fault. Times are UTC without a zone."
    ),
    paths(
        jobs::submit, jobs::list, jobs::get, jobs::logs, jobs::events, jobs::cancel,
        jobs::extend, arrays::get, arrays::cancel, utilization::get,
        account::me, account::usage, account::sign_out,
        nodes::list, nodes::overview, nodes::drain, nodes::undrain, nodes::revoke,
        nodes::approve_inventory, nodes::dismiss_shared,
        policy::put_lending, policy::put_lab_quota, policy::put_member_quota,
        policy::put_member_default_quota, policy::put_interactive,
        images::list, images::add, images::remove, images::put_signed,
        ssh_keys::list, ssh_keys::add, ssh_keys::remove, ssh_gateway::get,
        cli_login::start, cli_login::token,
        super::notifications::get, super::notifications::put, super::notifications::deliveries,
        files::list, files::get, files::put, files::delete,
        files::lab_list, files::lab_get, files::lab_put, files::lab_delete,
        files::put_lab_quota, files::put_member_quota, files::job_outputs,
        uploads::start, uploads::list, uploads::show, uploads::put_part, uploads::complete,
        uploads::abort,
        datasets::list, datasets::list_lab, datasets::add, datasets::remove,
        app_presets::list, app_presets::get, app_presets::add, app_presets::put,
        app_presets::remove, app_presets::launch,
        openapi_json,
    ),
    components(schemas(api::LabJobView, api::JobState, api::ErrorBody)),
    modifiers(&BearerToken),
    security(("bearer_token" = [])),
    tags(
        (name = "jobs", description = "Submit, list, follow, cancel and extend jobs"),
        (name = "account", description = "Who the caller is, their quotas and usage"),
        (name = "nodes", description = "The campus's servers and the overview"),
        (name = "policy", description = "Lending rules and quotas (lab admins, operators)"),
        (name = "images", description = "The image allow-list"),
        (name = "files", description = "Files: your own space, your labs' shared ones, and their quotas"),
        (name = "ssh", description = "SSH keys and the SSH gateway into jobs"),
        (name = "cli-login", description = "The CLI's sign-in through the browser (RFC 8628)"),
        (name = "apps", description = "Web apps: presets to launch (JupyterLab, TensorBoard, ...)"),
        (name = "notifications", description = "E-mail and signed webhooks about your jobs"),
        (name = "meta", description = "This document"),
    )
)]
pub struct ApiDoc;

/// The security scheme every operation but the sign-in and this document uses.
struct BearerToken;

impl Modify for BearerToken {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let mut http = Http::new(HttpAuthScheme::Bearer);
        http.description = Some(
            "A personal access token, from the portal's Tokens page or `commons login`".into(),
        );
        doc.components
            .get_or_insert_with(Default::default)
            .add_security_scheme("bearer_token", SecurityScheme::Http(http));
    }
}

/// What the API's times look like: UTC without an offset (`2026-12-03T08:12:00.123456`),
/// as chrono writes a `NaiveDateTime`.
const NAIVE_TIME: &str =
    r#""pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}([.][0-9]+)?$""#;

/// The document as served and committed: pretty JSON and a newline.
pub fn document() -> &'static str {
    static DOC: LazyLock<String> = LazyLock::new(|| {
        // Serialising a document of plain maps and strings cannot fail; an empty one
        // would be caught by the test that compares it with docs/openapi.json.
        let text = ApiDoc::openapi().to_pretty_json().unwrap_or_default();
        // JSON Schema's `date-time` is RFC 3339's, which needs an offset that the API's
        // times do not have: they are described by their pattern instead. (Only a key and
        // its value can be written with bare quotes: inside a description they are escaped.)
        let mut text = text.replace(r#""format": "date-time""#, NAIVE_TIME);
        text.push('\n');
        text
    });
    &DOC
}

/// This document (OpenAPI 3.1).
#[utoipa::path(get, path = "/api/v1/openapi.json", tag = "meta", operation_id = "openapi",
    security(()),
    responses((status = 200, description = "The OpenAPI document", body = Object,
        content_type = "application/json")))]
pub(crate) async fn openapi_json() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/json")
        .body(document())
}

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/openapi.json", web::get().to(openapi_json));
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::test::{call_service, init_service, read_body, TestRequest};
    use actix_web::App;

    const COMMITTED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/openapi.json");

    #[actix_web::test]
    async fn the_served_document_is_the_committed_one() {
        let app =
            init_service(App::new().service(web::scope("/api/v1").configure(configure))).await;
        let req = TestRequest::get().uri("/api/v1/openapi.json").to_request();
        let resp = call_service(&app, req).await;
        assert!(resp.status().is_success());
        let served = String::from_utf8(read_body(resp).await.to_vec()).unwrap();
        let committed = std::fs::read_to_string(COMMITTED).unwrap_or_default();
        assert!(
            served == committed,
            "docs/openapi.json is not what the portal serves; regenerate it with\n  \
             cargo run -p commons-portal -- openapi > docs/openapi.json"
        );
    }

    #[test]
    fn every_operation_has_a_unique_id_and_a_refusal() {
        let doc: serde_json::Value = serde_json::from_str(document()).unwrap();
        assert_eq!(doc["openapi"], "3.1.0");
        let mut ids = std::collections::BTreeSet::new();
        for (path, item) in doc["paths"].as_object().unwrap() {
            assert!(path.starts_with("/api/v1/"), "{path}");
            for (method, op) in item.as_object().unwrap() {
                let id = op["operationId"].as_str().unwrap();
                assert!(ids.insert(id.to_string()), "{id} twice");
                if path != "/api/v1/openapi.json" {
                    assert!(op["responses"].get("4XX").is_some(), "{method} {path}");
                }
            }
        }
        assert_eq!(ids.len(), 66, "{ids:?}");
    }
}
