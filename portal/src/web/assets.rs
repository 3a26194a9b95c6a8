//! The UI's few static files, compiled in: scripts live in files, not inline, so the
//! Content-Security-Policy can forbid inline scripts; the stylesheet is a file as well.

use actix_web::{web, HttpResponse};

const FILES_JS: &str = include_str!("../../../templates/assets/files.js");
const JOB_JS: &str = include_str!("../../../templates/assets/job.js");
const PAGES_JS: &str = include_str!("../../../templates/assets/pages.js");
const PORTAL_CSS: &str = include_str!("../../../templates/assets/portal.css");

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/assets/files.js", web::get().to(|| asset(JS, FILES_JS)))
        .route("/assets/job.js", web::get().to(|| asset(JS, JOB_JS)))
        .route("/assets/pages.js", web::get().to(|| asset(JS, PAGES_JS)))
        .route(
            "/assets/portal.css",
            web::get().to(|| asset(CSS, PORTAL_CSS)),
        );
}

const JS: &str = "text/javascript; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";

async fn asset(content_type: &'static str, body: &'static str) -> HttpResponse {
    HttpResponse::Ok()
        .content_type(content_type)
        .insert_header(("cache-control", "public, max-age=300"))
        .body(body)
}

/// The Content-Security-Policy of every response: scripts from the portal itself only,
/// never inline; no framing (clickjacking); forms post to the portal only, and to the
/// campus SSO provider `sso_origin` (logging out redirects a form's answer there, which
/// `form-action` governs too). Inline styles are allowed (the pages carry a small
/// stylesheet).
pub fn csp(sso_origin: Option<&str>) -> String {
    let sso = sso_origin.map(|o| format!(" {o}")).unwrap_or_default();
    format!(
        "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; \
         img-src 'self' data:; object-src 'none'; base-uri 'none'; form-action 'self'{sso}; \
         frame-ancestors 'none'"
    )
}

/// The scheme, host and port of a URL (`https://idp.campus.edu:8443`).
pub fn origin(url: &str) -> Option<String> {
    let u = url::Url::parse(url).ok()?;
    let host = u.host_str()?;
    Some(match u.port() {
        Some(p) => format!("{}://{host}:{p}", u.scheme()),
        None => format!("{}://{host}", u.scheme()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms_may_go_to_the_sso_provider_only_besides_the_portal() {
        assert_eq!(
            origin("https://idp.campus.edu:8443/realms/x/").as_deref(),
            Some("https://idp.campus.edu:8443")
        );
        let p = csp(Some("https://idp.campus.edu"));
        assert!(
            p.contains("form-action 'self' https://idp.campus.edu;"),
            "{p}"
        );
        assert!(csp(None).contains("form-action 'self';"));
        assert!(
            !p.contains("unsafe-inline'; img") || p.contains("style-src 'self' 'unsafe-inline'")
        );
        assert!(p.contains("script-src 'self';"));
    }
}
