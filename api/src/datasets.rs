//! Lab datasets: large read-only data a lab's admins register once
//! (`POST /api/v1/labs/{slug}/datasets`) and jobs mount (`datasets` in a job request).
//! The request and view types, and the rules a registration and a job's list must keep,
//! checked by the portal on every request and by the CLI before it sends one.
//!
//! Invariants: a source that passes [`parse_source`] is one of three forms, none of which
//! names a host path (a `node:` source names an export its server's owner chose); a mount
//! that passes [`check_mounts`] is an absolute, normalised path that neither hides nor
//! sits inside a path the container needs (`/proc`, `/inputs`, `/checkpoint`, ...), and no
//! two of a job's mounts nest.

use crate::Invalid;
use chrono::NaiveDateTime;
use serde::{Deserialize, Serialize};

/// The most datasets one job mounts.
pub const MAX_JOB_DATASETS: usize = 16;
/// The longest description.
pub const MAX_DESCRIPTION: usize = 1000;
/// Where a dataset is mounted when the job names no mount: `/datasets/NAME`.
pub const DEFAULT_ROOT: &str = "/datasets";

/// `POST /api/v1/labs/{slug}/datasets`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct DatasetRequest {
    /// 1 to 40 characters: lower-case letters, digits and `-`; unique in the lab.
    pub name: String,
    /// `lab:PREFIX` (a folder of the lab's file space), `https://HOST/PATH#sha256=HEX`
    /// (a `.tar.gz`, `.tgz` or `.tar` fetched once per server and verified), or
    /// `node:NAME` (a folder a server's owner exports with `commons-agent run --data
    /// NAME=/path`; jobs then run only on the lab's servers that export it).
    pub source: String,
    #[serde(default)]
    pub description: String,
    /// Who may mount it besides the lab's members: `"lab"` (nobody), `"campus"`
    /// (everyone), or a list of lab slugs.
    pub visibility: Visibility,
}

/// Who may use a dataset.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(untagged)]
pub enum Visibility {
    /// `"lab"` or `"campus"`.
    Word(String),
    /// These labs (by slug) besides the dataset's own.
    Labs(Vec<String>),
}

impl Visibility {
    /// Whether a member of the labs `member_of` (slugs) may use a dataset of `owner`.
    pub fn allows(&self, owner: &str, member_of: &[String]) -> bool {
        if member_of.iter().any(|l| l == owner) {
            return true;
        }
        match self {
            Visibility::Word(w) => w == "campus",
            Visibility::Labs(labs) => labs.iter().any(|l| member_of.contains(l)),
        }
    }
}

/// A registered dataset, as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DatasetView {
    /// The lab's slug.
    pub lab: String,
    pub name: String,
    pub source: String,
    pub description: String,
    pub visibility: Visibility,
    /// For a `node:` source: the lab's servers that export it now (by name).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exported_by: Vec<String>,
    /// How many servers hold it in their dataset cache now.
    pub cached_on: u32,
    pub created_by: String,
    pub created_at: NaiveDateTime,
}

/// One dataset a job mounts, as a job request names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct JobDataset {
    /// The lab that registered it (slug).
    pub lab: String,
    pub name: String,
    /// Where the job sees it, read-only; default `/datasets/NAME`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mount: Option<String>,
}

impl JobDataset {
    /// `LAB/NAME`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.lab, self.name)
    }

    /// Its mount, or the default.
    pub fn mount_or_default(&self) -> String {
        self.mount
            .clone()
            .unwrap_or_else(|| format!("{DEFAULT_ROOT}/{}", self.name))
    }
}

/// `LAB/NAME` or `LAB/NAME:/MOUNT`, as the submit form and the CLI's `--dataset` take
/// it; the parts are checked by [`check_job_datasets`].
pub fn parse_written(s: &str) -> Result<JobDataset, Invalid> {
    let (key, mount) = match s.split_once(':') {
        Some((k, m)) => (k, Some(m.to_string())),
        None => (s, None),
    };
    let (lab, name) = key.split_once('/').ok_or_else(|| {
        Invalid::new(
            "datasets",
            format!("{s:?}: write a dataset as LAB/NAME or LAB/NAME:/MOUNT"),
        )
    })?;
    Ok(JobDataset {
        lab: lab.to_string(),
        name: name.to_string(),
        mount,
    })
}

/// The other way round: what [`parse_written`] reads back.
pub fn written(d: &JobDataset) -> String {
    match &d.mount {
        Some(m) => format!("{}:{m}", d.key()),
        None => d.key(),
    }
}

/// A parsed source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A folder of the lab's file space (no trailing `/`; empty: all of it).
    Lab {
        prefix: String,
    },
    Https {
        url: String,
        sha256: String,
    },
    Node {
        name: String,
    },
}

/// Parses and checks a source as written; a refusal names `source` and the rule.
pub fn parse_source(s: &str) -> Result<Source, Invalid> {
    let field = "source";
    if let Some(p) = s.strip_prefix("lab:") {
        let prefix = p.strip_suffix('/').unwrap_or(p);
        if !prefix.is_empty() {
            crate::files::check_path(field, prefix)?;
        }
        return Ok(Source::Lab {
            prefix: prefix.to_string(),
        });
    }
    if let Some(n) = s.strip_prefix("node:") {
        let ok = !n.is_empty()
            && n.len() <= 64
            && n.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            && !n.starts_with('.');
        if !ok {
            return Err(Invalid::new(
                field,
                "node:NAME takes 1 to 64 letters, digits, '-', '_' or '.' (the NAME a \
                 server's owner exports with --data NAME=/path)",
            ));
        }
        return Ok(Source::Node { name: n.into() });
    }
    if s.starts_with("https://") {
        return https_source(s);
    }
    Err(Invalid::new(
        field,
        "a source is lab:PREFIX, https://HOST/PATH#sha256=HEX or node:NAME",
    ))
}

fn https_source(s: &str) -> Result<Source, Invalid> {
    let field = "source";
    let (url, frag) = s.split_once('#').ok_or_else(|| {
        Invalid::new(
            field,
            "an https source ends in #sha256=HEX: the archive's SHA-256, which every \
             server checks",
        )
    })?;
    let hex = frag.strip_prefix("sha256=").unwrap_or("");
    if hex.len() != 64 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(Invalid::new(
            field,
            "#sha256= takes the archive's SHA-256 as 64 hex digits",
        ));
    }
    let host = url["https://".len()..].split('/').next().unwrap_or("");
    let ok_chars = url
        .chars()
        .all(|c| c.is_ascii_graphic() && !matches!(c, '"' | '<' | '>' | '\\' | '`'));
    if host.is_empty() || host.contains('@') || !ok_chars || url.len() > 2048 {
        return Err(Invalid::new(
            field,
            "the URL needs a host, no user:password@ and no spaces or quotes (at most 2,048 \
             characters)",
        ));
    }
    let lower = url.to_ascii_lowercase();
    let path = lower.split(['?']).next().unwrap_or("");
    if ![".tar.gz", ".tgz", ".tar"]
        .iter()
        .any(|e| path.ends_with(e))
    {
        return Err(Invalid::new(
            field,
            "an https source is an archive: its path ends in .tar.gz, .tgz or .tar",
        ));
    }
    Ok(Source::Https {
        url: url.to_string(),
        sha256: hex.to_ascii_lowercase(),
    })
}

/// A registration: name, source, description and visibility.
pub fn check_request(req: &DatasetRequest) -> Result<Source, Invalid> {
    crate::rules::slug("name", &req.name)?;
    let source = parse_source(&req.source)?;
    if req.description.chars().count() > MAX_DESCRIPTION || req.description.contains('\0') {
        return Err(Invalid::new(
            "description",
            format!("at most {MAX_DESCRIPTION} characters"),
        ));
    }
    match &req.visibility {
        Visibility::Word(w) if w == "lab" || w == "campus" => {}
        Visibility::Word(_) => {
            return Err(Invalid::new(
                "visibility",
                "\"lab\", \"campus\" or a list of lab slugs",
            ))
        }
        Visibility::Labs(labs) => {
            if labs.is_empty() || labs.len() > 64 {
                return Err(Invalid::new(
                    "visibility",
                    "a list of 1 to 64 lab slugs (or \"lab\", \"campus\")",
                ));
            }
            for l in labs {
                crate::rules::slug("visibility", l)?;
            }
        }
    }
    Ok(source)
}

/// Paths a dataset may neither hide nor sit inside.
const RESERVED: &[&str] = &[
    "/bin",
    "/boot",
    "/checkpoint",
    "/dev",
    "/etc",
    "/inputs",
    "/lib",
    "/lib64",
    "/outputs",
    "/proc",
    "/run",
    "/sbin",
    "/sys",
    "/tmp",
    "/usr",
    "/var",
];

/// Whether `a` is `b` or under it.
fn within(a: &str, b: &str) -> bool {
    a == b || (a.starts_with(b) && a.as_bytes().get(b.len()) == Some(&b'/'))
}

/// One mount: absolute, normalised, at most 256 bytes, not `/`, clear of [`RESERVED`].
pub fn check_mount(m: &str) -> Result<(), Invalid> {
    let field = "datasets";
    let rest = m.strip_prefix('/').unwrap_or("");
    if rest.is_empty() || m.len() > 256 {
        return Err(Invalid::new(
            field,
            format!("mount {m:?}: an absolute path other than / (at most 256 bytes)"),
        ));
    }
    crate::files::check_path(field, rest)
        .map_err(|e| Invalid::new(field, format!("mount {m:?}: {}", e.message)))?;
    if let Some(r) = RESERVED.iter().find(|r| within(m, r) || within(r, m)) {
        return Err(Invalid::new(
            field,
            format!(
                "mount {m:?}: the container needs {r}; mount it elsewhere, e.g. under /datasets"
            ),
        ));
    }
    Ok(())
}

/// A job's datasets: at most [`MAX_JOB_DATASETS`], each named well, none twice, mounts
/// valid and none inside another.
pub fn check_job_datasets(ds: &[JobDataset]) -> Result<(), Invalid> {
    let field = "datasets";
    if ds.len() > MAX_JOB_DATASETS {
        return Err(Invalid::new(
            field,
            format!(
                "a job mounts at most {MAX_JOB_DATASETS} datasets, not {}",
                ds.len()
            ),
        ));
    }
    let mut mounts: Vec<String> = Vec::new();
    let mut keys: Vec<String> = Vec::new();
    for d in ds {
        crate::rules::slug(field, &d.lab)
            .map_err(|e| Invalid::new(field, format!("lab {:?}: {}", d.lab, e.message)))?;
        crate::rules::slug(field, &d.name)
            .map_err(|e| Invalid::new(field, format!("name {:?}: {}", d.name, e.message)))?;
        if keys.contains(&d.key()) {
            return Err(Invalid::new(field, format!("{} is named twice", d.key())));
        }
        keys.push(d.key());
        let m = d.mount_or_default();
        check_mount(&m)?;
        if let Some(o) = mounts.iter().find(|o| within(&m, o) || within(o, &m)) {
            return Err(Invalid::new(
                field,
                format!("mounts {o:?} and {m:?} overlap: give each dataset a place of its own"),
            ));
        }
        mounts.push(m);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(source: &str) -> DatasetRequest {
        DatasetRequest {
            name: "imagenet".into(),
            source: source.into(),
            description: String::new(),
            visibility: Visibility::Word("lab".into()),
        }
    }

    #[test]
    fn written_forms_read_back() {
        for s in ["vision/imagenet", "vision/imagenet:/data/in"] {
            assert_eq!(written(&parse_written(s).unwrap()), s);
        }
        assert_eq!(parse_written("imagenet").unwrap_err().field, "datasets");
    }

    #[test]
    fn sources_take_three_forms() {
        let sha = "a".repeat(64);
        assert_eq!(
            parse_source("lab:datasets/cifar/").unwrap(),
            Source::Lab {
                prefix: "datasets/cifar".into()
            }
        );
        assert_eq!(
            parse_source("node:imagenet").unwrap(),
            Source::Node {
                name: "imagenet".into()
            }
        );
        let https = format!("https://data.campus.edu/x/set.tar.gz#sha256={sha}");
        assert!(matches!(
            parse_source(&https).unwrap(),
            Source::Https { .. }
        ));
        for bad in [
            "/mnt/imagenet".to_string(),
            "lab:../x".into(),
            "node:".into(),
            "node:../x".into(),
            "node:/mnt".into(),
            "http://x/a.tar.gz".into(),
            "https://x/a.tar.gz".into(),
            "https://x/a.tar.gz#sha256=12".into(),
            format!("https://u:p@x/a.tar.gz#sha256={sha}"),
            format!("https://x/a.zip#sha256={sha}"),
            format!("https:///a.tar#sha256={sha}"),
        ] {
            let e = parse_source(&bad).unwrap_err();
            assert_eq!(e.field, "source", "{bad}");
        }
    }

    #[test]
    fn registrations_name_the_wrong_field() {
        assert!(check_request(&req("lab:d")).is_ok());
        let mut r = req("lab:d");
        r.name = "Image Net".into();
        assert_eq!(check_request(&r).unwrap_err().field, "name");
        let mut r = req("lab:d");
        r.visibility = Visibility::Word("world".into());
        assert_eq!(check_request(&r).unwrap_err().field, "visibility");
        r.visibility = Visibility::Labs(vec![]);
        assert_eq!(check_request(&r).unwrap_err().field, "visibility");
        r.visibility = Visibility::Labs(vec!["nlp".into()]);
        assert!(check_request(&r).is_ok());
        r.description = "x".repeat(1001);
        assert_eq!(check_request(&r).unwrap_err().field, "description");
    }

    #[test]
    fn visibility_lets_in_the_lab_and_whom_it_names() {
        let lab = Visibility::Word("lab".into());
        assert!(lab.allows("vision", &["vision".into()]));
        assert!(!lab.allows("vision", &["nlp".into()]));
        assert!(Visibility::Word("campus".into()).allows("vision", &[]));
        let some = Visibility::Labs(vec!["nlp".into()]);
        assert!(some.allows("vision", &["bio".into(), "nlp".into()]));
        assert!(!some.allows("vision", &["bio".into()]));
    }

    #[test]
    fn mounts_stay_clear_of_what_the_container_needs() {
        let d = |m: Option<&str>, name: &str| JobDataset {
            lab: "vision".into(),
            name: name.into(),
            mount: m.map(Into::into),
        };
        assert!(check_job_datasets(&[d(None, "imagenet"), d(Some("/data/coco"), "coco")]).is_ok());
        for bad in [
            "/",
            "relative",
            "/proc/x",
            "/inputs",
            "/a/../b",
            "/a//b",
            "/usr/local/x",
        ] {
            let e = check_job_datasets(&[d(Some(bad), "x")]).unwrap_err();
            assert_eq!(e.field, "datasets", "{bad}");
        }
        let nested = [d(Some("/data"), "a"), d(Some("/data/b"), "b")];
        assert!(check_job_datasets(&nested)
            .unwrap_err()
            .message
            .contains("overlap"));
        let twice = [d(None, "a"), d(Some("/x"), "a")];
        assert!(check_job_datasets(&twice)
            .unwrap_err()
            .message
            .contains("twice"));
        let many: Vec<_> = (0..17).map(|i| d(None, &format!("d{i}"))).collect();
        assert!(check_job_datasets(&many).is_err());
        assert!(check_job_datasets(&many[..16]).is_ok());
    }
}
