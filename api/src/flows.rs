//! What ties jobs together into a researcher's workflow: a job's `name` and `tags` (to
//! find a sweep's runs again), the jobs it waits for (`after`), and the rules on them. The filters of the job list
//! (`?name=`, `?tag=k=v`) are checked here too, so the portal and the CLI refuse the same
//! input in the same words.
//!
//! Invariants: a tag key or value never holds a quote, a backslash or a space, so a tag
//! reads the same in a URL, a shell and the JSON the portal stores it in.

use crate::Invalid;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The longest job name, in characters.
pub const MAX_NAME_CHARS: usize = 128;
/// The most tags a job may have.
pub const MAX_TAGS: usize = 16;
/// The longest tag key, in characters.
pub const MAX_TAG_KEY: usize = 64;
/// The longest tag value, in characters.
pub const MAX_TAG_VALUE: usize = 128;

/// A job's name: 1 to 128 characters, none of them a control character. (Leading and
/// trailing spaces are trimmed by the portal.)
pub fn name(field: &str, name: &str) -> Result<(), Invalid> {
    let n = name.trim();
    if n.is_empty() {
        return Err(Invalid::new(
            field,
            "a name must not be empty; leave it out",
        ));
    }
    let chars = n.chars().count();
    if chars > MAX_NAME_CHARS {
        return Err(Invalid::new(
            field,
            format!("the name is {chars} characters; at most {MAX_NAME_CHARS} are allowed"),
        ));
    }
    if n.chars().any(char::is_control) {
        return Err(Invalid::new(field, "the name holds a control character"));
    }
    Ok(())
}

fn key_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "_.-".contains(c)
}

fn value_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "_.-:/@+%,".contains(c)
}

/// One tag: a key of 1 to 64 letters, digits, `_`, `.` and `-` (starting with a letter
/// or digit), and a value of at most 128 of those and `:/@+%,`.
pub fn tag(field: &str, key: &str, value: &str) -> Result<(), Invalid> {
    let key_ok = !key.is_empty()
        && key.len() <= MAX_TAG_KEY
        && key.chars().all(key_char)
        && key.starts_with(|c: char| c.is_ascii_alphanumeric());
    if !key_ok {
        return Err(Invalid::new(
            field,
            format!(
                "tag key {key:?}: use 1 to {MAX_TAG_KEY} letters, digits, '_', '.' and '-', \
                 starting with a letter or digit"
            ),
        ));
    }
    if value.len() > MAX_TAG_VALUE || !value.chars().all(value_char) {
        return Err(Invalid::new(
            field,
            format!(
                "tag {key}: the value {value:?} may have at most {MAX_TAG_VALUE} letters, \
                 digits and _.-:/@+%,"
            ),
        ));
    }
    Ok(())
}

/// A job's tags: at most 16, each a valid [`tag`].
pub fn tags(tags: &BTreeMap<String, String>) -> Result<(), Invalid> {
    if tags.len() > MAX_TAGS {
        return Err(Invalid::new(
            "tags",
            format!("{} tags; a job may have at most {MAX_TAGS}", tags.len()),
        ));
    }
    tags.iter().try_for_each(|(k, v)| tag("tags", k, v))
}

/// `key=value` (from `--tag`, `?tag=`) as a checked pair; the error names `field`.
pub fn parse_tag(field: &str, s: &str) -> Result<(String, String), Invalid> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| Invalid::new(field, format!("{s:?} is not key=value")))?;
    tag(field, k, v)?;
    Ok((k.to_string(), v.to_string()))
}

/// A name filter (`?name=`): the whole name, or with a trailing `*` its beginning.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NameFilter {
    Exactly(String),
    StartsWith(String),
}

impl NameFilter {
    pub fn parse(s: &str) -> Result<NameFilter, Invalid> {
        let s = s.trim();
        match s.strip_suffix('*') {
            Some("") => Err(Invalid::new("name", "name=*: give the name's beginning")),
            Some(prefix) => {
                name("name", prefix)?;
                Ok(NameFilter::StartsWith(prefix.to_string()))
            }
            None => {
                name("name", s)?;
                Ok(NameFilter::Exactly(s.to_string()))
            }
        }
    }
}

/// The most jobs one job may wait for.
pub const MAX_AFTER: usize = 64;

/// What the job waited for must have done for this one to start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum When {
    /// It succeeded (`afterok`).
    Ok,
    /// It failed (`afternotok`; a cancelled job did not fail).
    Fail,
    /// It ended, however (`afterany`).
    Any,
}

impl When {
    /// As the JSON writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            When::Ok => "ok",
            When::Fail => "fail",
            When::Any => "any",
        }
    }

    /// "succeed", "fail", "end": what the other job must do.
    pub fn verb(self) -> &'static str {
        match self {
            When::Ok => "succeed",
            When::Fail => "fail",
            When::Any => "end",
        }
    }
}

/// A job this one waits for: `{"job": 41, "when": "ok"}`, an array as a whole:
/// `{"array": 3, "when": "ok"}`, or, for the tasks of an array, each its own task of
/// another array with the same indices: `{"array": 3, "when": "ok", "per_index": true}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct After {
    /// The job's id: an existing job of yours (or of your lab, for its admins); left
    /// out (0) for an array.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub job: i64,
    /// Or an array's id: `ok` once every task succeeded (and unmet as soon as one fails
    /// or is cancelled), `fail` once all ended with at least one failed, `any` once all
    /// ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array: Option<i64>,
    /// `ok` (the default): it must succeed; `fail`: fail; `any`: end, however.
    #[serde(default = "when_ok")]
    pub when: When,
    /// With `array`, on an array's request only: task k waits for task k of that array
    /// (which must have the same indices), with `when` applied per task.
    #[serde(default, skip_serializing_if = "is_false")]
    pub per_index: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn when_ok() -> When {
    When::Ok
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

/// How a job that another one waits for has ended, as far as the wait is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    Succeeded,
    Failed,
    Cancelled,
}

impl After {
    /// A wait for job `job`.
    pub fn job(job: i64, when: When) -> After {
        After {
            job,
            array: None,
            when,
            per_index: false,
        }
    }

    /// A wait for array `array` as a whole.
    pub fn array(array: i64, when: When) -> After {
        After {
            job: 0,
            array: Some(array),
            when,
            per_index: false,
        }
    }

    /// A wait of each task for its own task of array `array` (the same index).
    pub fn per_index(array: i64, when: When) -> After {
        After {
            per_index: true,
            ..After::array(array, when)
        }
    }

    /// "job 41" or "array 3".
    pub fn what(&self) -> String {
        match self.array {
            Some(a) => format!("array {a}"),
            None => format!("job {}", self.job),
        }
    }

    /// What task `index` waits for: "task 3 of array 7" for a per-index wait, else as
    /// [`After::what`].
    pub fn what_for(&self, index: Option<i64>) -> String {
        match (self.array, index) {
            (Some(a), Some(i)) if self.per_index => format!("task {i} of array {a}"),
            _ => self.what(),
        }
    }

    /// "waiting for task 3 of array 7 to succeed" (per index) or "waiting for array 7 to
    /// succeed"; a wait for a job reads as the scheduler's reasons do.
    pub fn waiting_for(&self, index: Option<i64>) -> String {
        format!(
            "waiting for {} to {}",
            self.what_for(index),
            self.when.verb()
        )
    }

    /// Whether the job it names ending so lets this one start.
    pub fn met_by(&self, ended: Ended) -> bool {
        match self.when {
            When::Ok => ended == Ended::Succeeded,
            When::Fail => ended == Ended::Failed,
            When::Any => true,
        }
    }

    /// Why a job must fail when this wait can no longer be met: "job 41 failed; this job
    /// needed it to succeed".
    pub fn unmet(&self, ended: Ended) -> String {
        self.unmet_for(None, ended)
    }

    /// As [`After::unmet`], for task `index` of an array: a per-index wait reads "task 3
    /// of array 7 failed; this task needed it to succeed".
    pub fn unmet_for(&self, index: Option<i64>, ended: Ended) -> String {
        let how = match ended {
            Ended::Succeeded => "succeeded",
            Ended::Failed => "failed",
            Ended::Cancelled => "was cancelled",
        };
        let this = if self.per_index { "task" } else { "job" };
        format!(
            "{} {how}; this {this} needed it to {}",
            self.what_for(index),
            self.when.verb()
        )
    }
}

/// `41` (wait for it to succeed), `41:ok`, `41:fail` or `41:any`, as a form or a command
/// line writes a wait; the error names `after`.
pub fn parse_after(s: &str) -> Result<After, Invalid> {
    let (id, when) = s.split_once(':').unwrap_or((s, "ok"));
    let job = id
        .trim()
        .parse()
        .map_err(|_| Invalid::new("after", format!("{s:?}: give a job id, e.g. 41 or 41:fail")))?;
    let when = match when.trim() {
        "ok" => When::Ok,
        "fail" => When::Fail,
        "any" => When::Any,
        other => {
            return Err(Invalid::new(
                "after",
                format!("{other:?}: wait for ok, fail or any"),
            ))
        }
    };
    Ok(After::job(job, when))
}

/// At most 64 jobs, each named once, with valid ids; `per_index` only for an array
/// (`is_array`: the request makes one) waiting for an array (the error names
/// `after[i].per_index`).
pub fn after(list: &[After], is_array: bool) -> Result<(), Invalid> {
    if list.len() > MAX_AFTER {
        return Err(Invalid::new(
            "after",
            format!("a job may wait for at most {MAX_AFTER} jobs"),
        ));
    }
    let mut seen = std::collections::BTreeSet::new();
    for (i, a) in list.iter().enumerate() {
        if a.per_index && (a.array.is_none() || !is_array) {
            return Err(Invalid::new(
                &format!("after[{i}].per_index"),
                if a.array.is_none() {
                    "per_index waits for an array's tasks: name the array (\"array\": ID)"
                } else {
                    "per_index is for an array's tasks: give this request an array of the \
                     same indices, or wait for the array as a whole"
                },
            ));
        }
        match a.array {
            Some(_) if a.job != 0 => {
                return Err(Invalid::new(
                    "after",
                    "name a job or an array in each wait, not both",
                ))
            }
            Some(id) if id < 1 => {
                return Err(Invalid::new("after", format!("{id} is not an array id")))
            }
            None if a.job < 1 => {
                return Err(Invalid::new("after", format!("{} is not a job id", a.job)))
            }
            _ => {}
        }
        if !seen.insert((a.job, a.array)) {
            return Err(Invalid::new(
                "after",
                format!("{} is named twice", a.what()),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_short_printable_and_not_empty() {
        assert!(name("name", "sweep lr=0.01 (run 3)").is_ok());
        assert!(
            name("name", &"é".repeat(128)).is_ok(),
            "characters, not bytes"
        );
        assert_eq!(name("name", &"x".repeat(129)).unwrap_err().field, "name");
        assert!(name("name", "  ").is_err());
        assert!(name("name", "a\nb").is_err());
    }

    #[test]
    fn tags_have_plain_keys_and_values() {
        let mut t = BTreeMap::new();
        t.insert("lr".to_string(), "0.001".to_string());
        t.insert("dataset".to_string(), "imagenet-1k".to_string());
        t.insert("empty".to_string(), String::new());
        assert!(tags(&t).is_ok());
        for (k, v) in [
            ("", "x"),
            ("-k", "x"),
            ("k k", "x"),
            ("k", "a b"),
            ("k", "a\"b"),
            ("k", "a\\b"),
        ] {
            let e = tag("tags", k, v).unwrap_err();
            assert_eq!(e.field, "tags", "{k:?}={v:?}");
        }
        let many: BTreeMap<String, String> = (0..17)
            .map(|i| (format!("k{i}"), "v".to_string()))
            .collect();
        assert!(tags(&many).unwrap_err().message.contains("at most 16"));
    }

    #[test]
    fn waits_are_met_or_say_why_not() {
        let ok = After::job(41, When::Ok);
        assert!(ok.met_by(Ended::Succeeded) && !ok.met_by(Ended::Cancelled));
        assert_eq!(
            ok.unmet(Ended::Failed),
            "job 41 failed; this job needed it to succeed"
        );
        let fail = After::job(7, When::Fail);
        assert!(fail.met_by(Ended::Failed) && !fail.met_by(Ended::Cancelled));
        assert!(After::job(7, When::Any).met_by(Ended::Cancelled));
        assert_eq!(parse_after("41").unwrap(), ok);
        assert_eq!(parse_after("7:fail").unwrap(), fail);
        assert_eq!(parse_after("x").unwrap_err().field, "after");
        assert_eq!(parse_after("7:later").unwrap_err().field, "after");
        let parsed: After = serde_json::from_str(r#"{"job": 3}"#).unwrap();
        assert_eq!(parsed.when, When::Ok, "ok is the default");
        assert!(serde_json::from_str::<After>(r#"{"job": 3, "when": "maybe"}"#).is_err());
        assert_eq!(after(&[ok, ok], false).unwrap_err().field, "after");
        assert_eq!(
            after(&[After::job(0, When::Any)], false).unwrap_err().field,
            "after"
        );
    }

    #[test]
    fn an_array_is_waited_for_as_a_whole() {
        let a: After = serde_json::from_str(r#"{"array": 3, "when": "ok"}"#).unwrap();
        assert_eq!((a.job, a.array), (0, Some(3)));
        assert_eq!(
            serde_json::to_string(&a).unwrap(),
            r#"{"array":3,"when":"ok"}"#
        );
        assert_eq!(
            a.unmet(Ended::Failed),
            "array 3 failed; this job needed it to succeed"
        );
        assert!(after(&[a, After::job(3, When::Ok)], false).is_ok());
        assert_eq!(after(&[a, a], false).unwrap_err().field, "after");
        let both: After = serde_json::from_str(r#"{"job": 1, "array": 3}"#).unwrap();
        assert!(after(&[both], false)
            .unwrap_err()
            .message
            .contains("not both"));
        let job: After = serde_json::from_str(r#"{"job": 41}"#).unwrap();
        assert_eq!(
            serde_json::to_string(&job).unwrap(),
            r#"{"job":41,"when":"ok"}"#
        );
    }

    #[test]
    fn a_per_index_wait_is_for_an_arrays_tasks_and_says_which_task() {
        let a: After =
            serde_json::from_str(r#"{"array": 7, "when": "ok", "per_index": true}"#).unwrap();
        assert_eq!(a, After::per_index(7, When::Ok));
        assert_eq!(
            serde_json::to_string(&a).unwrap(),
            r#"{"array":7,"when":"ok","per_index":true}"#
        );
        assert_eq!(
            a.waiting_for(Some(3)),
            "waiting for task 3 of array 7 to succeed"
        );
        assert_eq!(
            a.unmet_for(Some(3), Ended::Failed),
            "task 3 of array 7 failed; this task needed it to succeed"
        );
        assert!(after(&[a], true).is_ok());
        let e = after(&[After::job(1, When::Ok), a], false).unwrap_err();
        assert_eq!(e.field, "after[1].per_index", "{}", e.message);
        let on_job: After = serde_json::from_str(r#"{"job": 4, "per_index": true}"#).unwrap();
        assert_eq!(
            after(&[on_job], true).unwrap_err().field,
            "after[0].per_index"
        );
        assert_eq!(
            After::array(7, When::Any).waiting_for(Some(3)),
            "waiting for array 7 to end",
            "a wait for the whole array names no task"
        );
    }

    #[test]
    fn tag_and_name_filters_parse() {
        assert_eq!(
            parse_tag("tag", "lr=0.1").unwrap(),
            ("lr".into(), "0.1".into())
        );
        assert_eq!(parse_tag("tag", "lr").unwrap_err().field, "tag");
        assert_eq!(
            NameFilter::parse("sweep-*").unwrap(),
            NameFilter::StartsWith("sweep-".into())
        );
        assert_eq!(
            NameFilter::parse("eval").unwrap(),
            NameFilter::Exactly("eval".into())
        );
        assert_eq!(NameFilter::parse("*").unwrap_err().field, "name");
    }
}
