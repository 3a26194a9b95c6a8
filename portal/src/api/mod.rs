//! The REST API (`/api/v1`), JSON in and out, authenticated by personal access tokens.

mod account;
mod app_presets;
mod arrays;
mod cli_login;
mod datasets;
mod files;
mod images;
mod jobs;
pub mod metrics;
mod nodes;
mod notifications;
mod openapi;
mod policy;
mod ssh_gateway;
mod ssh_keys;
mod uploads;
mod utilization;

use crate::error::{ApiError, AppError};
use actix_web::{dev::Payload, web, FromRequest, HttpRequest};
use serde::de::DeserializeOwned;
use std::future::Future;
use std::pin::Pin;

pub use openapi::{document as openapi_document, ApiDoc};

pub fn configure(cfg: &mut web::ServiceConfig) {
    // A query string or a path segment that does not parse is refused like any other
    // request, in JSON (actix answers in plain text otherwise).
    let query = web::QueryConfig::default().error_handler(|e, _| {
        ApiError::from(AppError::BadRequest(format!(
            "the query string is not valid for this request: {e}"
        )))
        .into()
    });
    let path = web::PathConfig::default()
        .error_handler(|_, _| ApiError::from(AppError::NotFound("resource")).into());
    cfg.service(
        web::scope("/api/v1")
            .app_data(query)
            .app_data(path)
            .configure(openapi::configure)
            .configure(account::configure)
            .configure(app_presets::configure)
            .configure(arrays::configure)
            .configure(cli_login::configure)
            .configure(datasets::configure)
            .configure(files::configure)
            .configure(images::configure)
            .configure(jobs::configure)
            .configure(nodes::configure)
            .configure(notifications::configure)
            .configure(policy::configure)
            .configure(ssh_gateway::configure)
            .configure(ssh_keys::configure)
            .configure(uploads::configure)
            .configure(utilization::configure),
    );
}

/// Most bytes a JSON request body may have.
const MAX_BODY: usize = 1024 * 1024;

/// A JSON body whose errors name the field at fault (`{"field": "gpus"}`), including
/// unknown fields and wrong types.
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned + 'static> FromRequest for ApiJson<T> {
    type Error = ApiError;
    type Future = Pin<Box<dyn Future<Output = Result<Self, ApiError>>>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let bytes = web::Bytes::from_request(req, payload);
        // JSON only: a form or text/plain body (what another site's page can send
        // without asking) is refused before it is read.
        let json = req
            .headers()
            .get("content-type")
            .and_then(|h| h.to_str().ok())
            .and_then(|h| h.split(';').next())
            .map(|m| {
                let m = m.trim().to_ascii_lowercase();
                m == "application/json" || (m.starts_with("application/") && m.ends_with("+json"))
            })
            .unwrap_or(false);
        Box::pin(async move {
            if !json {
                return Err(AppError::UnsupportedMediaType(
                    "send the body as JSON with Content-Type: application/json".into(),
                )
                .into());
            }
            let bytes = bytes
                .await
                .map_err(|e| AppError::BadRequest(format!("cannot read the request body: {e}")))?;
            if bytes.len() > MAX_BODY {
                return Err(
                    AppError::BadRequest("the request body is larger than 1 MiB".into()).into(),
                );
            }
            parse_json(&bytes).map(ApiJson).map_err(ApiError)
        })
    }
}

pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, AppError> {
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let message = e.inner().to_string();
        let path = e.path().to_string();
        // For an unknown field the path is its parent; the name is in the message.
        let named = |prefix: &str| {
            message
                .strip_prefix(prefix)
                .and_then(|m| m.split('`').next())
                .map(|f| match path.as_str() {
                    "." | "" => f.to_string(),
                    p if p == f || p.ends_with(&format!(".{f}")) => p.to_string(),
                    parent => format!("{parent}.{f}"),
                })
        };
        let field = named("unknown field `")
            .or_else(|| named("missing field `"))
            .unwrap_or(path);
        if field.is_empty() || field == "." {
            AppError::BadRequest(format!(
                "the body is not valid JSON for this request: {message}"
            ))
        } else {
            AppError::invalid(&field, message)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::JobRequest;

    #[test]
    fn json_errors_name_the_field() {
        let e = parse_json::<JobRequest>(
            br#"{"image":"x","gpus":1,"time_limit_minutes":1,"colour":1}"#,
        )
        .unwrap_err();
        assert_eq!(e.field(), Some("colour"));
        let e = parse_json::<JobRequest>(br#"{"image":"x","gpus":"two","time_limit_minutes":1}"#)
            .unwrap_err();
        assert_eq!(e.field(), Some("gpus"));
        let e = parse_json::<JobRequest>(br#"{"gpus":1,"time_limit_minutes":1}"#).unwrap_err();
        assert_eq!(e.field(), Some("image"), "{e}");
        let e = parse_json::<JobRequest>(b"not json").unwrap_err();
        assert_eq!(e.code(), "bad_request");
    }
}
