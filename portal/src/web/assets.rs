//! The UI's few static files, compiled in: scripts live in files, not inline, so the
//! Content-Security-Policy can forbid inline scripts.

use actix_web::{web, HttpResponse};

const JOB_JS: &str = include_str!("../../../templates/assets/job.js");

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/assets/job.js", web::get().to(job_js));
}

async fn job_js() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/javascript; charset=utf-8")
        .insert_header(("cache-control", "public, max-age=300"))
        .body(JOB_JS)
}

/// The Content-Security-Policy of every response: scripts from the portal itself only,
/// never inline; no framing (clickjacking); forms post back to the portal only. Inline
/// styles are allowed (the pages carry a small stylesheet).
pub const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; \
img-src 'self' data:; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";
