//! Where a listed file (an input, a `lab:` dataset's file) is read from: the short-lived
//! URL of its one object that the portal put in the listing (the object store's own
//! presigned GET, or a signed portal URL), or, when there is none (an older portal),
//! the portal's per-file route with the node's credential.
//!
//! Invariants:
//! - Nothing of ours goes with a signed URL: no credential, wherever it points.
//! - A URL is used only while the listing that carried it is younger than the URL's
//!   life less [`MARGIN`]; past that, or after a read from it failed, the files are
//!   listed again and take the fresh URLs by path (a file no longer listed loses its
//!   URL, and the portal's route says why).
//! - A signed URL is a secret until it expires: it is logged, if ever, without its query
//!   ([`redacted`]), and never reaches a container.

use commons_proto::InputFile;
use std::time::{Duration, Instant};

/// How long before a URL's end it is no longer started on: a read that starts just in
/// time could meet a clock a little ahead at the other end.
pub const MARGIN: Duration = Duration::from_secs(30);

/// Where one read goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source<'a> {
    /// A path of the portal's agent API, read with the node's credential.
    Portal(&'a str),
    /// A signed URL (absolute, or relative to the portal), read with no credential.
    Signed(&'a str),
}

/// A listing and when it arrived.
#[derive(Debug, Clone)]
pub struct Listed {
    pub files: Vec<InputFile>,
    at: Instant,
}

impl Listed {
    /// A listing that arrived just now.
    pub fn new(files: Vec<InputFile>) -> Listed {
        Listed {
            files,
            at: Instant::now(),
        }
    }

    /// Whether file `i` has a URL too old to start a read on.
    pub fn stale(&self, i: usize) -> bool {
        let f = &self.files[i];
        f.url.is_some() && self.fresh_url(f).is_none()
    }

    fn fresh_url<'a>(&self, f: &'a InputFile) -> Option<&'a str> {
        let url = f.url.as_deref()?;
        let life = Duration::from_secs(f.url_valid_s.unwrap_or(0).into());
        (self.at.elapsed() + MARGIN < life).then_some(url)
    }

    /// Where file `i` is read from now: its URL while fresh, else `portal`'s route.
    pub fn source<'a>(&'a self, i: usize, portal: &'a str) -> Source<'a> {
        match self.fresh_url(&self.files[i]) {
            Some(url) => Source::Signed(url),
            None => Source::Portal(portal),
        }
    }

    /// Takes the URLs of a listing that arrived just now, by path.
    pub fn refresh(&mut self, fresh: Vec<InputFile>) {
        self.at = Instant::now();
        for f in &mut self.files {
            let again = fresh.iter().find(|n| n.path == f.path);
            f.url = again.and_then(|n| n.url.clone());
            f.url_valid_s = again.and_then(|n| n.url_valid_s);
        }
    }
}

/// `url` without its query (the signature): what may be logged.
pub fn redacted(url: &str) -> &str {
    url.split(['?', '#']).next().unwrap_or("")
}

/// A refusal of a signed URL as the job's owner and the log see it: an object store's XML
/// error (which may echo the request it refused) becomes its code alone; the portal's
/// own JSON message stays.
pub(crate) fn refusal(e: crate::checkpoint::ApiError) -> crate::checkpoint::ApiError {
    use crate::checkpoint::ApiError;
    match e {
        ApiError::Status {
            status, message, ..
        } if message.trim_start().starts_with('<') => {
            let code = message
                .split_once("<Code>")
                .and_then(|(_, rest)| rest.split_once("</Code>"))
                .map(|(code, _)| code.chars().take(64).collect::<String>());
            let said = code
                .as_deref()
                .map(|c| format!(" ({c})"))
                .unwrap_or_default();
            ApiError::Status {
                status,
                code: None,
                message: format!("the object store refused the signed URL{said}"),
            }
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, url: Option<&str>, valid: u32) -> InputFile {
        InputFile {
            path: path.into(),
            size: 1,
            sha256: "ab".into(),
            url: url.map(Into::into),
            url_valid_s: url.map(|_| valid),
        }
    }

    #[test]
    fn a_url_is_used_while_fresh_and_replaced_by_path() {
        let mut l = Listed::new(vec![
            file("a", Some("https://s3/a?X-Amz-Signature=1"), 300),
            file("b", None, 0),
            file("c", Some("/api/agent/v1/objects/k?sig=2"), 10),
        ]);
        assert_eq!(
            l.source(0, "/p/a"),
            Source::Signed("https://s3/a?X-Amz-Signature=1")
        );
        assert_eq!(
            l.source(1, "/p/b"),
            Source::Portal("/p/b"),
            "an older portal's"
        );
        assert!(!l.stale(1));
        // 10 s is within the margin: never started on.
        assert!(l.stale(2));
        assert_eq!(l.source(2, "/p/c"), Source::Portal("/p/c"));
        l.refresh(vec![
            file("c", Some("/api/agent/v1/objects/k?sig=3"), 300),
            file("b", Some("/api/agent/v1/objects/j?sig=4"), 300),
        ]);
        assert_eq!(
            l.source(0, "/p/a"),
            Source::Portal("/p/a"),
            "no longer listed"
        );
        assert_eq!(
            l.source(1, "/p/b"),
            Source::Signed("/api/agent/v1/objects/j?sig=4")
        );
        assert_eq!(
            l.source(2, "/p/c"),
            Source::Signed("/api/agent/v1/objects/k?sig=3")
        );
        assert_eq!(
            redacted("https://b.s3/files/x?X-Amz-Signature=abc"),
            "https://b.s3/files/x"
        );
        let xml = "<?xml version=\"1.0\"?><Error><Code>AccessDenied</Code>\
                   <Message>Request has expired</Message><X-Amz-Expires>300</X-Amz-Expires></Error>";
        let e = refusal(crate::checkpoint::ApiError::Status {
            status: 403,
            code: None,
            message: xml.into(),
        });
        assert_eq!(
            e.to_string(),
            "the portal answered 403: the object store refused the signed URL (AccessDenied)"
        );
    }
}
