//! The Files page: one folder of the user's own space or of a lab's (`/files?lab=SLUG&
//! dir=data/`), its sub-folders and files, the space's use as a bar against its quota,
//! and (where the user may write) upload of several files or a folder with progress and
//! delete with confirmation.
//!
//! The page is rendered here; uploads and deletes are the API's (`/api/v1/files/...`),
//! called by `assets/files.js` with the session's cookie and its CSRF token in
//! `X-CSRF-Token`, as the API asks of browsers. Downloads are plain links to the API.

use super::charts::UseBar;
use super::Banner;
use crate::auth::CurrentUser;
use crate::error::WebError;
use crate::service::files::{self, FileEntry, Which};
use crate::state::AppState;
use actix_session::Session;
use actix_web::web;
use askama::Template;
use askama_web::WebTemplate;
use commons_api::files::{encode_path, human_bytes};
use serde::Deserialize;
use std::collections::BTreeMap;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/files", web::get().to(page));
}

#[derive(Debug, Deserialize)]
struct FilesQuery {
    /// A lab's space; the user's own without it.
    lab: Option<String>,
    /// The folder shown (`data/`); the top without it.
    #[serde(default)]
    dir: String,
}

/// A space the user may open: the tabs above the list.
struct Tab {
    label: String,
    href: String,
    current: bool,
}

/// A sub-folder of the folder shown.
struct Folder {
    name: String,
    href: String,
    files: usize,
    size: String,
}

/// A file of the folder shown.
pub(super) struct File {
    pub name: String,
    pub path: String,
    pub size: String,
    /// RFC 3339 (UTC), for `<time datetime>`.
    pub modified: String,
    pub href: String,
}

/// One step of the path to the folder shown.
struct Crumb {
    name: String,
    href: String,
}

#[derive(Template, WebTemplate)]
#[template(path = "files.html")]
struct FilesPage {
    banner: Banner,
    tabs: Vec<Tab>,
    /// "Your files" or the lab's name.
    title: String,
    crumbs: Vec<Crumb>,
    dir: String,
    folders: Vec<Folder>,
    files: Vec<File>,
    bar: UseBar,
    writable: bool,
    /// Where the API keeps this space: `/api/v1/files` or `/api/v1/labs/SLUG/files`.
    api: String,
    /// How an upload in parts names this space before a path: empty, or `lab:SLUG/`.
    space_ref: String,
}

/// `?lab=SLUG&dir=DIR` for a link to a folder of the space.
fn page_href(lab: Option<&str>, dir: &str) -> String {
    let mut q = Vec::new();
    if let Some(l) = lab {
        q.push(format!("lab={}", encode_path(l)));
    }
    if !dir.is_empty() {
        q.push(format!("dir={}", encode_path(dir).replace('/', "%2F")));
    }
    if q.is_empty() {
        "/files".into()
    } else {
        format!("/files?{}", q.join("&"))
    }
}

/// A file's row, named `name`, downloaded from the API's space `api`.
fn file_row(e: &FileEntry, name: &str, api: &str) -> File {
    File {
        name: name.to_string(),
        path: e.path.clone(),
        size: human_bytes(e.size),
        modified: e
            .modified
            .and_utc()
            .format("%Y-%m-%dT%H:%M:%SZ")
            .to_string(),
        href: format!("{api}/{}", encode_path(&e.path)),
    }
}

/// The folder `dir`'s sub-folders (with their files and bytes, all depths) and files.
fn split(
    entries: &[FileEntry],
    dir: &str,
    lab: Option<&str>,
    api: &str,
) -> (Vec<Folder>, Vec<File>) {
    let mut folders: BTreeMap<&str, (usize, u64)> = BTreeMap::new();
    let mut files = Vec::new();
    for e in entries {
        let rest = e.path.strip_prefix(dir).unwrap_or(&e.path);
        match rest.split_once('/') {
            Some((folder, _)) => {
                let f = folders.entry(folder).or_default();
                f.0 += 1;
                f.1 += e.size;
            }
            None => files.push(file_row(e, rest, api)),
        }
    }
    let folders = folders
        .into_iter()
        .map(|(name, (n, bytes))| Folder {
            name: name.to_string(),
            href: page_href(lab, &format!("{dir}{name}/")),
            files: n,
            size: human_bytes(bytes),
        })
        .collect();
    (folders, files)
}

/// The way from the top of the space to `dir`.
fn crumbs(top: &str, dir: &str, lab: Option<&str>) -> Vec<Crumb> {
    let mut out = vec![Crumb {
        name: top.to_string(),
        href: page_href(lab, ""),
    }];
    let mut at = String::new();
    for seg in dir.split('/').filter(|s| !s.is_empty()) {
        at.push_str(seg);
        at.push('/');
        out.push(Crumb {
            name: seg.to_string(),
            href: page_href(lab, &at),
        });
    }
    out
}

async fn page(
    state: web::Data<AppState>,
    session: Session,
    user: CurrentUser,
    query: web::Query<FilesQuery>,
) -> Result<FilesPage, WebError> {
    let FilesQuery { lab, mut dir } = query.into_inner();
    if !dir.is_empty() && !dir.ends_with('/') {
        dir.push('/');
    }
    let which = lab.clone().map_or(Which::Mine, Which::Lab);
    let listing = files::browse(&state, &user, which, dir.clone()).await?;
    let lab = lab.as_deref();
    let mut tabs = vec![Tab {
        label: "Your files".into(),
        href: "/files".into(),
        current: lab.is_none(),
    }];
    let mut title = "Your files".to_string();
    for (l, _) in &user.labs {
        let current = lab == Some(l.slug.as_str());
        if current {
            title = l.name.clone();
        }
        tabs.push(Tab {
            label: l.name.clone(),
            href: page_href(Some(&l.slug), ""),
            current,
        });
    }
    let api = match lab {
        Some(l) => format!("/api/v1/labs/{}/files", encode_path(l)),
        None => "/api/v1/files".into(),
    };
    let (folders, files) = split(&listing.files, &dir, lab, &api);
    let u = listing.space_use;
    let bar = UseBar::new(
        format!("{} used", human_bytes(u.used_bytes)),
        u.used_bytes as f64,
        Some(u.quota_bytes as f64),
        |q| format!("of {}", human_bytes(q as u64)),
    );
    Ok(FilesPage {
        banner: Banner::new(&state, &session, Some(&user)),
        crumbs: crumbs(&title, &dir, lab),
        tabs,
        title,
        dir,
        folders,
        files,
        bar,
        writable: listing.writable,
        api,
        space_ref: lab.map_or(String::new(), |l| format!("lab:{l}/")),
    })
}

/// The job page's outputs (for the job's owner): what the job kept under `jobs/{id}/`.
pub(super) struct OutputsBlock {
    pub files: Vec<File>,
    /// The Files page of the folder.
    pub folder: String,
    pub prefix: String,
}

/// The outputs block of job `job`, whose owner is `owner`: none for anyone else.
pub(super) async fn outputs_block(
    state: &AppState,
    user: &CurrentUser,
    job: i64,
    owner: i64,
) -> Result<Option<OutputsBlock>, WebError> {
    if owner != user.user.id {
        return Ok(None);
    }
    let kept = files::outputs::list(state, user, job).await?;
    let prefix = files::outputs::prefix(job);
    let files = kept
        .iter()
        .map(|e| {
            let name = e.path.strip_prefix(&prefix).unwrap_or(&e.path);
            file_row(e, name, "/api/v1/files")
        })
        .collect();
    Ok(Some(OutputsBlock {
        files,
        folder: page_href(None, &prefix),
        prefix,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(path: &str, size: u64) -> FileEntry {
        FileEntry {
            path: path.into(),
            size,
            modified: chrono::DateTime::from_timestamp(0, 0).unwrap().naive_utc(),
            sha256: String::new(),
        }
    }

    #[test]
    fn a_folder_shows_its_sub_folders_and_files() {
        let all = [
            entry("data/a.txt", 10),
            entry("data/raw/x.bin", 1_000),
            entry("data/raw/y/z.bin", 2_000),
        ];
        let (folders, files) = split(&all, "data/", Some("vision"), "/api/v1/labs/vision/files");
        assert_eq!(folders.len(), 1);
        assert_eq!((folders[0].name.as_str(), folders[0].files), ("raw", 2));
        assert_eq!(folders[0].size, "3 kB");
        assert_eq!(folders[0].href, "/files?lab=vision&dir=data%2Fraw%2F");
        assert_eq!(files.len(), 1);
        assert_eq!(files[0].href, "/api/v1/labs/vision/files/data/a.txt");
        assert_eq!(files[0].modified, "1970-01-01T00:00:00Z");
    }

    #[test]
    fn paths_are_encoded_for_links() {
        let c = crumbs("Your files", "data/raw/", None);
        let names: Vec<_> = c.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["Your files", "data", "raw"]);
        assert_eq!(c[2].href, "/files?dir=data%2Fraw%2F");
    }
}
