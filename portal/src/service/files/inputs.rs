//! A job's inputs: files and folders of its owner's space or of a lab's (`lab:SLUG/...`),
//! staged by the agent read-only under `/inputs` before the container starts (a lab's
//! under `/inputs/lab/SLUG/`).
//!
//! Who may do what:
//! - At submission every input must exist (a file, or a folder holding at least one
//!   file) in a space the submitter reads: their own, or a lab they are a member of.
//!   Anything else refuses the job (422 naming the input).
//! - The node a starting attempt is placed on lists the files to stage, each with a
//!   short-lived URL of its one object ([`super::signed`]: it holds no credential of the
//!   store), and reads each from it (or, an older agent, through the portal); the owner's
//!   membership of a lab is checked again then. It reports how far staging got, which
//!   the job's view and history show.

use super::download::{download_from, Download};
use super::outputs::held;
use super::Space;
use crate::db::{self, files as rows, DbConn};
use crate::domain::{AttemptStatus, JobState};
use crate::error::AppError;
use crate::service::{Actor, Ctx};
use commons_api::files::{human_bytes, parse_input, Input, Space as Named};
use commons_proto::{InputFile, Staging};

/// The space an input names, for the job's owner `user`; `member` says whether the user
/// may read lab `id` (checked by the caller's own means).
fn space_of(
    c: &mut DbConn,
    input: &Input,
    written: &str,
    user: i64,
    member: impl Fn(&mut DbConn, i64) -> Result<bool, AppError>,
) -> Result<Space, AppError> {
    let slug = match &input.space {
        Named::Mine => return Ok(Space::of_user(user)),
        Named::Lab(slug) => slug,
    };
    let refuse = |why: String| AppError::invalid("inputs", format!("input {written:?}: {why}"));
    let lab = db::users::find_lab(c, slug)?.ok_or_else(|| refuse(format!("no lab {slug:?}")))?;
    if !member(c, lab.id)? {
        return Err(refuse(format!(
            "only members of lab {slug} may read its files"
        )));
    }
    Ok(Space::of_lab(lab.id, &lab.slug))
}

/// The files of one input in `space`, as (path in the space, path under `/inputs`, row);
/// a refusal names the input when there are none.
fn files_of(
    c: &mut DbConn,
    space: &Space,
    input: &Input,
    written: &str,
) -> Result<Vec<(String, rows::FileRow)>, AppError> {
    let staged = input.staged_path();
    let found: Vec<_> = if input.folder {
        let prefix = input.prefix();
        rows::list(c, &space.key, &prefix)?
            .into_iter()
            .map(|r| {
                let rest = r.path[prefix.len()..].to_string();
                (format!("{staged}/{rest}"), r)
            })
            .collect()
    } else {
        rows::get(c, &space.key, &input.path)?
            .into_iter()
            .map(|r| (staged.clone(), r))
            .collect()
    };
    if found.is_empty() {
        let whose = match &input.space {
            Named::Mine => "your files".to_string(),
            Named::Lab(slug) => format!("lab {slug}'s files"),
        };
        let what = if input.folder {
            format!("no files under that folder in {whose}")
        } else {
            format!("no such file in {whose}")
        };
        return Err(AppError::invalid(
            "inputs",
            format!("input {written:?}: {what}"),
        ));
    }
    Ok(found)
}

/// Checks a submission's inputs: each well formed, in a space `actor` reads, and there.
pub fn check_for_submit(c: &mut DbConn, actor: &Actor, inputs: &[String]) -> Result<(), AppError> {
    let parsed = commons_api::files::check_inputs(inputs)?;
    for (input, written) in parsed.iter().zip(inputs) {
        let member = |_: &mut DbConn, lab: i64| Ok(actor.labs.iter().any(|(l, _)| l.id == lab));
        let space = space_of(c, input, written, actor.user.id, member)?;
        files_of(c, &space, input, written)?;
    }
    Ok(())
}

/// Every file the job's inputs name now: (the file as staged, its object in the store).
fn resolve(c: &mut DbConn, job: i64) -> Result<Vec<(InputFile, String)>, AppError> {
    let j = db::jobs::get(c, job)?;
    let user = j.user_id;
    let member = |c: &mut DbConn, lab: i64| Ok(db::users::membership(c, lab, user)?.is_some());
    let mut out = Vec::new();
    for written in &j.inputs.0 {
        let input = parse_input(written)?;
        let space = space_of(c, &input, written, user, member)?;
        for (staged, r) in files_of(c, &space, &input, written)? {
            let file = InputFile {
                path: staged,
                size: r.bytes.max(0) as u64,
                sha256: r.sha256,
                url: None,
                url_valid_s: None,
            };
            out.push((file, r.object));
        }
    }
    out.sort_by(|a, b| a.0.path.cmp(&b.0.path));
    out.dedup_by(|a, b| a.0.path == b.0.path);
    Ok(out)
}

/// The file staged at `staged` (a path under `/inputs`), if one of the job's inputs
/// names it now: its space and its path there. One read per input at most, however
/// many files its folders hold.
fn find_one(c: &mut DbConn, job: i64, staged: &str) -> Result<Option<(Space, String)>, AppError> {
    let j = db::jobs::get(c, job)?;
    let user = j.user_id;
    let member = |c: &mut DbConn, lab: i64| Ok(db::users::membership(c, lab, user)?.is_some());
    for written in &j.inputs.0 {
        let input = parse_input(written)?;
        let at = input.staged_path();
        let in_space = if input.folder {
            match staged.strip_prefix(&format!("{at}/")) {
                Some(rest) => format!("{}/{rest}", input.path),
                None => continue,
            }
        } else if staged == at {
            input.path.clone()
        } else {
            continue;
        };
        let space = space_of(c, &input, written, user, member)?;
        if rows::get(c, &space.key, &in_space)?.is_some() {
            return Ok(Some((space, in_space)));
        }
    }
    Ok(None)
}

const STARTING: [AttemptStatus; 1] = [AttemptStatus::Starting];

/// The files to stage, for `node`'s starting `attempt` of `job`, each with a short-lived
/// URL of its object ([`super::signed`]).
pub async fn list_for_node(
    ctx: &Ctx,
    node: i64,
    job: i64,
    attempt: i32,
) -> Result<Vec<InputFile>, AppError> {
    let mut files = ctx
        .db
        .run(move |c| {
            held(c, node, job, attempt, &STARTING)?;
            resolve(c, job)
        })
        .await?;
    super::signed::sign_all(ctx, node, job, attempt, &mut files).await?;
    Ok(files.into_iter().map(|f| f.0).collect())
}

/// One file to stage (`path` under `/inputs`), for `node`'s starting `attempt`.
pub async fn get_for_node(
    ctx: &Ctx,
    node: i64,
    job: i64,
    attempt: i32,
    path: &str,
) -> Result<Download, AppError> {
    super::check_path(path)?;
    let want = path.to_string();
    let (space, in_space) = ctx
        .db
        .run(move |c| {
            held(c, node, job, attempt, &STARTING)?;
            find_one(c, job, &want)?.ok_or(AppError::NotFound("file"))
        })
        .await?;
    download_from(ctx, space, in_space, None).await
}

/// Records how far `node`'s starting `attempt` staged its inputs; its first report, its
/// end and a failure go into the job's history.
pub async fn report(
    ctx: &Ctx,
    node: i64,
    job: i64,
    attempt: i32,
    s: Staging,
) -> Result<(), AppError> {
    let i = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    ctx.db
        .run(move |c| {
            held(c, node, job, attempt, &STARTING)?;
            let now = chrono::Utc::now().naive_utc();
            let (done, total) = (i(s.done_bytes), i(s.total_bytes));
            db::transaction(c, |c| {
                let before = db::staging::report(c, job, attempt, done, total, s.finished, now)?;
                let was_finished = before.as_ref().is_some_and(|b| b.finished);
                let total_h = human_bytes(s.total_bytes);
                let files = s.files;
                if before.is_none() {
                    let text = format!(
                        "attempt {attempt}: staging its inputs into /inputs ({files} files, {total_h})"
                    );
                    db::jobs::add_event(c, job, JobState::Starting, &text)?;
                }
                if s.finished && !was_finished {
                    let since = before.map_or(now, |b| b.started_at);
                    let secs = (now - since).num_milliseconds() as f64 / 1000.0;
                    let text = match &s.error {
                        None => format!(
                            "attempt {attempt}: inputs staged ({files} files, {total_h} in {secs:.1} s)"
                        ),
                        Some(e) => format!("attempt {attempt}: staging failed: {e}"),
                    };
                    db::jobs::add_event(c, job, JobState::Starting, &text)?;
                }
                Ok::<_, AppError>(())
            })
        })
        .await
}
