//! The agents' signed object route (`commons_proto::OBJECTS_PATH`): one object of a local
//! store, for the holder of a URL the portal signed when it listed a starting attempt's
//! inputs or `lab:` dataset (`service::files::signed` decides). No node credential: the
//! signature is the grant.
//!
//! Invariants:
//! - A URL that is not signed, is signed for something else, has expired, or names a
//!   node or attempt that no longer holds it is refused 403, saying which.
//! - The object streams from the store, whole or the one range asked for (`Range`, as the
//!   files API honours it), never held whole here.
//! - The URL's query is a secret until it expires: nothing here logs it.

use super::attempt_path::file_path_after;
use crate::error::{ApiError, AppError};
use crate::service::files::signed::{self, Query};
use crate::service::files::store::ObjectRead;
use crate::state::AppState;
use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};
use commons_api::ErrorBody;
use commons_proto::OBJECTS_PATH;
use futures_util::TryStreamExt;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route(&format!("{OBJECTS_PATH}/{{key:.*}}"), web::get().to(get));
}

async fn get(state: web::Data<AppState>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let object = file_path_after(&req, OBJECTS_PATH, 0)?;
    let q = web::Query::<Query>::from_query(req.query_string()).map_err(|e| {
        AppError::Forbidden(format!(
            "this object URL is not one the portal signed ({e})"
        ))
    })?;
    let range = req
        .headers()
        .get(header::RANGE)
        .and_then(|h| h.to_str().ok());
    Ok(response(
        signed::get(&state, object, q.into_inner(), range).await?,
    ))
}

fn response(got: ObjectRead) -> HttpResponse {
    let (size, range, body) = match got {
        ObjectRead::Unsatisfiable { size } => {
            return HttpResponse::RangeNotSatisfiable()
                .insert_header((header::CONTENT_RANGE, format!("bytes */{size}")))
                .json(ErrorBody {
                    error: "range_not_satisfiable".into(),
                    message: format!(
                        "the object has {size} bytes: the range asked for lies past its end"
                    ),
                    ..Default::default()
                });
        }
        ObjectRead::Body { size, range, body } => (size, range, body),
    };
    let mut res = match range {
        Some(_) => HttpResponse::PartialContent(),
        None => HttpResponse::Ok(),
    };
    res.content_type("application/octet-stream")
        .insert_header((header::ACCEPT_RANGES, "bytes"));
    let len = match range {
        Some((start, end)) => {
            res.insert_header((header::CONTENT_RANGE, format!("bytes {start}-{end}/{size}")));
            end - start + 1
        }
        None => size,
    };
    let body = body.map_err(|e| {
        tracing::error!("signed object read cut short: {e}");
        std::io::Error::other(e)
    });
    res.body(actix_web::body::SizedStream::new(len, body))
}
