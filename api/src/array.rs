//! Job arrays: one request that makes many tasks (`"array": "0-99%8"`), each a job of its
//! own with its index. The spec's syntax, its limits, what each task's request becomes
//! ([`task_request`]: `{index}` replaced, `COMMONS_ARRAY_*` set) and the array's view.
//!
//! Syntax (Slurm's `--array`): a comma-separated list of indices `7`, ranges `0-99`
//! and stepped ranges `0-98:2`, then optionally `%N`, the most tasks that run at once.
//!
//! Invariants: an array has 1 to [`MAX_TASKS`] tasks, each index at most [`MAX_INDEX`]
//! and listed once; the count is checked before a range is expanded, so `0-4000000000`
//! is refused without allocating it.

use crate::job::JobRequest;
use crate::Invalid;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The most tasks one array may have.
pub const MAX_TASKS: usize = 100_000;
/// The largest index a task may have.
pub const MAX_INDEX: u64 = 10_000_000;
/// What a task's command, environment values and input paths say for its index.
pub const INDEX_PLACEHOLDER: &str = "{index}";

/// Why an array spec is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArrayError {
    #[error("the array is empty: give indices such as 0-99, 1,3,5-9 or 0-98:2")]
    Empty,
    #[error("{0:?} is not an index, a range (0-99) or a stepped range (0-98:2)")]
    Malformed(String),
    #[error("the range {0:?} ends before it begins")]
    Backwards(String),
    #[error("the step in {0:?} must be at least 1")]
    ZeroStep(String),
    #[error("index {0} is larger than the largest allowed, {MAX_INDEX}")]
    IndexTooLarge(u64),
    #[error("the array has {0} tasks; at most {MAX_TASKS} are allowed")]
    TooMany(u64),
    #[error("index {0} is listed twice")]
    Duplicate(u64),
    #[error("the throttle {0:?} must be a whole number of at least 1 (as in 0-99%8)")]
    BadThrottle(String),
}

impl From<ArrayError> for Invalid {
    fn from(e: ArrayError) -> Invalid {
        Invalid::new("array", e.to_string())
    }
}

/// A parsed array: its indices in ascending order and its throttle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArraySpec {
    pub indices: Vec<u32>,
    /// At most this many tasks start or run at once; none: no limit.
    pub throttle: Option<u32>,
}

/// One element of the list: `7`, `0-99` or `0-98:2`, as (first, last, step).
fn element(s: &str) -> Result<(u64, u64, u64), ArrayError> {
    let bad = || ArrayError::Malformed(s.to_string());
    let num = |t: &str| -> Result<u64, ArrayError> {
        let t = t.trim();
        if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        let n: u64 = t.parse().map_err(|_| ArrayError::IndexTooLarge(u64::MAX))?;
        if n > MAX_INDEX {
            return Err(ArrayError::IndexTooLarge(n));
        }
        Ok(n)
    };
    let (range, step) = match s.split_once(':') {
        Some((r, st)) => (r, Some(st)),
        None => (s, None),
    };
    let (first, last) = match range.split_once('-') {
        Some((a, b)) => (num(a)?, num(b)?),
        None if step.is_none() => {
            let n = num(range)?;
            (n, n)
        }
        None => return Err(bad()),
    };
    if last < first {
        return Err(ArrayError::Backwards(s.to_string()));
    }
    let step = match step {
        Some(st) => {
            let st = st.trim();
            if st.is_empty() || !st.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            st.parse::<u64>().map_err(|_| bad())?
        }
        None => 1,
    };
    if step == 0 {
        return Err(ArrayError::ZeroStep(s.to_string()));
    }
    Ok((first, last, step))
}

/// Parses `0-99%8`, `1,3,5-9` or `0-98:2`.
pub fn parse(spec: &str) -> Result<ArraySpec, ArrayError> {
    let spec = spec.trim();
    let (list, throttle) = match spec.split_once('%') {
        Some((l, t)) => {
            let t = t.trim();
            let n = t
                .parse::<u32>()
                .ok()
                .filter(|&n| n >= 1 && t.bytes().all(|b| b.is_ascii_digit()))
                .ok_or_else(|| ArrayError::BadThrottle(t.to_string()))?;
            (l, Some(n))
        }
        None => (spec, None),
    };
    if list.trim().is_empty() {
        return Err(ArrayError::Empty);
    }
    let elements = list
        .split(',')
        .map(|e| element(e.trim()))
        .collect::<Result<Vec<_>, _>>()?;
    // Counted before anything is expanded.
    let total: u64 = elements
        .iter()
        .map(|&(first, last, step)| (last - first) / step + 1)
        .sum();
    if total > MAX_TASKS as u64 {
        return Err(ArrayError::TooMany(total));
    }
    let mut indices: Vec<u32> = Vec::with_capacity(total as usize);
    for (first, last, step) in elements {
        let mut i = first;
        while i <= last {
            indices.push(i as u32);
            i += step;
        }
    }
    indices.sort_unstable();
    if let Some(w) = indices.windows(2).find(|w| w[0] == w[1]) {
        return Err(ArrayError::Duplicate(w[0] as u64));
    }
    Ok(ArraySpec { indices, throttle })
}

/// The variables every task gets besides its own.
pub fn task_env(array: i64, index: u32, count: usize) -> [(String, String); 3] {
    [
        ("COMMONS_ARRAY_ID".to_string(), array.to_string()),
        ("COMMONS_ARRAY_INDEX".to_string(), index.to_string()),
        ("COMMONS_ARRAY_COUNT".to_string(), count.to_string()),
    ]
}

/// What task `index` of an array runs: `{index}` replaced in its command and environment
/// values (the request's own variables; the `COMMONS_ARRAY_*` ones are the portal's).
pub fn substitute(
    command: &[String],
    env: &BTreeMap<String, String>,
    index: u32,
) -> (Vec<String>, BTreeMap<String, String>) {
    let i = index.to_string();
    let command = command
        .iter()
        .map(|a| a.replace(INDEX_PLACEHOLDER, &i))
        .collect();
    let env = env
        .iter()
        .map(|(k, v)| (k.clone(), v.replace(INDEX_PLACEHOLDER, &i)))
        .collect();
    (command, env)
}

/// Checks a request's `array` field (if any), with the rest of its rules.
pub fn check(req: &JobRequest) -> Result<Option<ArraySpec>, Invalid> {
    match &req.array {
        None => Ok(None),
        Some(s) => {
            if req.kind == crate::JobKind::Interactive {
                return Err(Invalid::new(
                    "array",
                    "an interactive job cannot be an array; submit a batch job",
                ));
            }
            Ok(Some(parse(s)?))
        }
    }
}

/// An array as `GET /api/v1/arrays/{id}` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ArrayView {
    /// The array's id (`COMMONS_ARRAY_ID`), not a job id.
    pub id: i64,
    /// The spec it was submitted with, e.g. `0-99%8`.
    pub spec: String,
    /// The name its tasks share, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Its lab's slug.
    pub lab: String,
    /// How many tasks it has.
    pub count: i64,
    /// The most tasks that start or run at once; none: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub throttle: Option<i64>,
    /// The first task's job id; the tasks' ids are consecutive in index order only when
    /// nothing else was submitted meanwhile: read `tasks` (or `?array=` on the job list).
    pub first_job: i64,
    /// Its tasks' job ids, in index order.
    pub tasks: Vec<i64>,
    /// How many tasks are in each state (`queued`, `running`, ...; states none is in are
    /// left out).
    pub states: BTreeMap<String, i64>,
    /// Every task has ended.
    pub finished: bool,
    pub created_at: chrono::NaiveDateTime,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_lists_steps_and_throttles_parse() {
        let a = parse("0-99%8").unwrap();
        assert_eq!((a.indices.len(), a.throttle), (100, Some(8)));
        assert_eq!(parse("1,3,5-9").unwrap().indices, vec![1, 3, 5, 6, 7, 8, 9]);
        let s = parse("0-98:2").unwrap();
        assert_eq!((s.indices.len(), s.indices[1], s.indices[48]), (50, 2, 96));
        assert_eq!(parse(" 7 ").unwrap().indices, vec![7]);
        assert_eq!(parse("0-99999").unwrap().indices.len(), MAX_TASKS);
    }

    #[test]
    fn bad_specs_say_what_is_wrong() {
        assert_eq!(parse("0-100000"), Err(ArrayError::TooMany(100_001)));
        assert_eq!(parse("0-4000000:1"), Err(ArrayError::TooMany(4_000_001)));
        for s in [
            "", "%3", "a-b", "1-", "-5", "1--2", "3:2", "1,,2", "0-9:x", "0x10",
        ] {
            let e = parse(s).unwrap_err();
            let inv: Invalid = e.clone().into();
            assert_eq!(inv.field, "array", "{s:?}: {e}");
        }
        assert_eq!(parse("9-1"), Err(ArrayError::Backwards("9-1".into())));
        assert_eq!(parse("0-9:0"), Err(ArrayError::ZeroStep("0-9:0".into())));
        assert_eq!(parse("0-9%0"), Err(ArrayError::BadThrottle("0".into())));
        assert_eq!(parse("0-9%x"), Err(ArrayError::BadThrottle("x".into())));
        assert_eq!(parse("0-5,3"), Err(ArrayError::Duplicate(3)));
        assert_eq!(
            parse("99999999999999999999"),
            Err(ArrayError::IndexTooLarge(u64::MAX))
        );
        assert!(parse("0-9%2")
            .map(|a| a.throttle == Some(2))
            .unwrap_or(false));
    }

    #[test]
    fn a_task_sees_its_index() {
        let env = BTreeMap::from([("OUT".to_string(), "/out/run-{index}".to_string())]);
        let (cmd, env) = substitute(&["echo".into(), "task {index}".into()], &env, 7);
        assert_eq!(cmd, vec!["echo", "task 7"]);
        assert_eq!(env["OUT"], "/out/run-7");
        let vars = task_env(3, 7, 20);
        assert_eq!(vars[1], ("COMMONS_ARRAY_INDEX".into(), "7".into()));
    }
}
