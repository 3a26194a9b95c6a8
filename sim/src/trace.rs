//! Reading a job trace (the Philly CSV layout) and turning it into the simulator's
//! workload for a given campus.
//!
//! The CSV has the header `job_id,submit_time_s,submit_timestamp,duration_s,num_gpus,vc,src_row`
//! (extra columns are ignored, `submit_timestamp` and `src_row` are informative only), and
//! optionally `interactive` (1 or 0; empty: the rule below).
//!
//! **Interactive jobs.** Philly records no job kind. A row without an `interactive` value
//! counts as interactive by [`is_interactive_by_rule`]: it asked for one GPU, ran between
//! 10 minutes and 4 hours (a session someone sits through; shorter Philly jobs are mostly
//! quick failures), and its trace id is a multiple of 5, a deterministic fifth of those
//! jobs. On the Sep-Oct 2017 trace that is 6,329 of 52,849 jobs (12 %), under 1 % of the
//! GPU-hours.
//! Invariants of a [`Workload`]:
//! - jobs are sorted by `(submit, trace id)` and `jobs[i].idx == i`;
//! - every job belongs to a lab of the campus and asks for 1..=`max_node_gpus` GPUs.
//!
//! Jobs wider than the widest node: the scheduler places a job on one node (gang
//! placement), and Philly has 12- to 128-GPU jobs while campus nodes have 8 GPUs. Such a
//! job is **capped** to the widest node's GPU count with its duration unchanged (it is
//! modelled as a shorter-lived, smaller gang), and counted in [`Workload::capped`]; no job
//! is dropped.

use crate::campus::Campus;
use serde::Deserialize;
use std::path::Path;

/// What can be wrong with a trace.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("cannot read trace {path}: {source}")]
    Read { path: String, source: csv::Error },
    #[error("trace line {line}: {message}")]
    Row { line: u64, message: String },
    #[error("trace line {line}: tenant (vc) \"{vc}\" belongs to no lab of the campus file; add it to some lab's `tenants`")]
    UnknownTenant { line: u64, vc: String },
    #[error("the trace has no jobs")]
    Empty,
    #[error("--from-s ({from}) must be below --until-s ({until})")]
    BadWindow { from: i64, until: i64 },
    #[error("no job of the trace was submitted in [{from}, {until}) seconds")]
    EmptyWindow { from: String, until: String },
}

/// One row of the trace.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct TraceJob {
    pub job_id: i64,
    /// Seconds after the first submission of the trace.
    pub submit_time_s: i64,
    /// Run time in seconds on the GPUs it asked for, without interruptions.
    pub duration_s: i64,
    pub num_gpus: u32,
    /// The tenant (Philly virtual cluster).
    pub vc: String,
    /// 1: interactive, 0: batch; absent or empty: [`is_interactive_by_rule`].
    #[serde(default)]
    pub interactive: Option<u8>,
    /// Line in the file (1 = header), for error messages.
    #[serde(skip)]
    pub line: u64,
}

/// Read a trace file. `limit` keeps only the first N rows (a quick slice).
pub fn read_trace(path: &Path, limit: Option<usize>) -> Result<Vec<TraceJob>, TraceError> {
    let read_err = |source| TraceError::Read {
        path: path.display().to_string(),
        source,
    };
    let mut reader = csv::Reader::from_path(path).map_err(read_err)?;
    parse_rows(&mut reader, limit)
}

/// Parse trace CSV text (with its header).
pub fn parse_trace(text: &str, limit: Option<usize>) -> Result<Vec<TraceJob>, TraceError> {
    let mut reader = csv::Reader::from_reader(text.as_bytes());
    parse_rows(&mut reader, limit)
}

fn parse_rows<R: std::io::Read>(
    reader: &mut csv::Reader<R>,
    limit: Option<usize>,
) -> Result<Vec<TraceJob>, TraceError> {
    let mut jobs = Vec::new();
    for (i, row) in reader.deserialize::<TraceJob>().enumerate() {
        if limit.is_some_and(|l| jobs.len() >= l) {
            break;
        }
        let line = i as u64 + 2;
        let mut job = row.map_err(|e| TraceError::Row {
            line,
            message: e.to_string(),
        })?;
        job.line = line;
        let bad = |message: &str| TraceError::Row {
            line,
            message: message.to_string(),
        };
        if job.submit_time_s < 0 {
            return Err(bad("submit_time_s must not be negative"));
        }
        if job.duration_s < 0 {
            return Err(bad("duration_s must not be negative"));
        }
        if job.num_gpus == 0 {
            return Err(bad("num_gpus must be at least 1"));
        }
        if job.interactive.is_some_and(|v| v > 1) {
            return Err(bad("interactive must be 1, 0 or empty"));
        }
        jobs.push(job);
    }
    if jobs.is_empty() {
        return Err(TraceError::Empty);
    }
    Ok(jobs)
}

/// The jobs submitted in `[from_s, until_s)` (seconds after the trace's first
/// submission, as in `submit_time_s`; `None`: unbounded), in their order. Times are
/// kept as they are (not shifted to start at 0), so a window of the trace replays on the
/// same clock, hours of the week included. Jobs submitted before `from_s` are left out
/// altogether, even those that would still run at `from_s`: a window starts on an idle
/// campus.
pub fn submitted_within(
    jobs: Vec<TraceJob>,
    from_s: Option<i64>,
    until_s: Option<i64>,
) -> Result<Vec<TraceJob>, TraceError> {
    if let (Some(from), Some(until)) = (from_s, until_s) {
        if from >= until {
            return Err(TraceError::BadWindow { from, until });
        }
    }
    let inside = |t: i64| from_s.is_none_or(|f| t >= f) && until_s.is_none_or(|u| t < u);
    let kept: Vec<TraceJob> = jobs
        .into_iter()
        .filter(|j| inside(j.submit_time_s))
        .collect();
    if kept.is_empty() {
        let bound = |b: Option<i64>, open: &str| b.map_or(open.to_string(), |v| v.to_string());
        return Err(TraceError::EmptyWindow {
            from: bound(from_s, "-inf"),
            until: bound(until_s, "inf"),
        });
    }
    Ok(kept)
}

/// A job as the simulator sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    /// Index in [`Workload::jobs`]; also the job id given to the scheduler.
    pub idx: usize,
    /// The id in the trace.
    pub trace_id: i64,
    pub lab: usize,
    pub submit: i64,
    /// Seconds of work (at least 1).
    pub duration: i64,
    /// GPUs it runs on (after capping).
    pub gpus: u32,
    /// GPUs the trace asked for.
    pub requested_gpus: u32,
    /// Someone waits for it at the screen (the trace's column, else the rule).
    pub interactive: bool,
}

/// Shortest and longest run of a job the rule counts as interactive.
pub const INTERACTIVE_DURATION_S: std::ops::RangeInclusive<i64> = 600..=4 * 3600;
/// The rule counts every this-many-th eligible job (by trace id) as interactive.
pub const INTERACTIVE_EVERY: i64 = 5;

/// The documented rule for traces without a job kind (see the module docs): one GPU,
/// 10 minutes to 4 hours, trace id a multiple of [`INTERACTIVE_EVERY`].
pub fn is_interactive_by_rule(t: &TraceJob) -> bool {
    t.num_gpus == 1
        && INTERACTIVE_DURATION_S.contains(&t.duration_s)
        && t.job_id.rem_euclid(INTERACTIVE_EVERY) == 0
}

/// The jobs of a trace, assigned to labs and sorted by submission.
#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    pub jobs: Vec<Job>,
    /// Jobs that asked for more GPUs than any node has and were capped.
    pub capped: u64,
    /// First and last submission time.
    pub span: (i64, i64),
}

impl Workload {
    /// Assign trace jobs to the campus' labs. Fails on a tenant that no lab lists.
    pub fn new(trace: &[TraceJob], campus: &Campus) -> Result<Workload, TraceError> {
        let tenants = campus.lab_of_tenant();
        let cap = campus.max_node_gpus().max(1);
        let mut rows: Vec<&TraceJob> = trace.iter().collect();
        rows.sort_by_key(|j| (j.submit_time_s, j.job_id));
        let mut jobs = Vec::with_capacity(rows.len());
        let mut capped = 0;
        for (idx, t) in rows.into_iter().enumerate() {
            let lab = *tenants
                .get(t.vc.as_str())
                .ok_or_else(|| TraceError::UnknownTenant {
                    line: t.line,
                    vc: t.vc.clone(),
                })?;
            if t.num_gpus > cap {
                capped += 1;
            }
            jobs.push(Job {
                idx,
                trace_id: t.job_id,
                lab,
                submit: t.submit_time_s,
                duration: t.duration_s.max(1),
                gpus: t.num_gpus.min(cap),
                requested_gpus: t.num_gpus,
                interactive: t
                    .interactive
                    .map_or_else(|| is_interactive_by_rule(t), |v| v == 1),
            });
        }
        let first = jobs.first().ok_or(TraceError::Empty)?.submit;
        let last = jobs.last().ok_or(TraceError::Empty)?.submit;
        Ok(Workload {
            jobs,
            capped,
            span: (first, last),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::campus::CampusFile;

    const HEADER: &str = "job_id,submit_time_s,submit_timestamp,duration_s,num_gpus,vc,src_row\n";

    #[test]
    fn parses_and_caps_wide_jobs() {
        let text = format!("{HEADER}1,10,x,100,16,a,0\n0,0,x,50,1,b,1\n");
        let trace = parse_trace(&text, None).unwrap();
        let campus = CampusFile::parse(
            "[[lab]]\nname = \"A\"\ntenants = [\"a\"]\nnodes = 1\n[[lab]]\nname = \"B\"\ntenants = [\"b\"]\n",
        )
        .unwrap()
        .build()
        .unwrap();
        let w = Workload::new(&trace, &campus).unwrap();
        assert_eq!(w.capped, 1);
        assert_eq!(w.span, (0, 10));
        assert_eq!(w.jobs[0].trace_id, 0);
        assert_eq!(w.jobs[0].lab, 1);
        assert_eq!(w.jobs[1].gpus, 8);
        assert_eq!(w.jobs[1].requested_gpus, 16);
    }

    #[test]
    fn bad_rows_name_the_line() {
        let e = parse_trace(&format!("{HEADER}0,0,x,5,0,a,0\n"), None).unwrap_err();
        assert!(e.to_string().contains("line 2") && e.to_string().contains("num_gpus"));
        let e = parse_trace(&format!("{HEADER}0,0,x,5,1,a,0\n1,zz,x,5,1,a,0\n"), None).unwrap_err();
        assert!(e.to_string().contains("line 3"), "{e}");
        assert!(matches!(parse_trace(HEADER, None), Err(TraceError::Empty)));
    }

    #[test]
    fn interactive_jobs_by_column_or_by_rule() {
        let text =
            "job_id,submit_time_s,submit_timestamp,duration_s,num_gpus,vc,src_row,interactive\n\
                    5,0,x,3600,1,a,0,\n\
                    6,0,x,3600,1,a,0,\n\
                    10,0,x,300,1,a,0,\n\
                    15,0,x,3600,2,a,0,\n\
                    20,0,x,20000,1,a,0,\n\
                    7,0,x,30,4,a,0,1\n\
                    25,0,x,3600,1,a,0,0\n";
        let trace = parse_trace(text, None).unwrap();
        let campus = CampusFile::parse("[[lab]]\nname = \"A\"\ntenants = [\"a\"]\nnodes = 1\n")
            .unwrap()
            .build()
            .unwrap();
        let w = Workload::new(&trace, &campus).unwrap();
        let kinds: Vec<(i64, bool)> = w.jobs.iter().map(|j| (j.trace_id, j.interactive)).collect();
        assert_eq!(
            kinds,
            [
                (5, true),   // the rule: 1 GPU, an hour, id a multiple of 5
                (6, false),  // not a multiple of 5
                (7, true),   // the column says so
                (10, false), // too short
                (15, false), // two GPUs
                (20, false), // too long
                (25, false), // the column says batch
            ]
        );
        let e = parse_trace(&text.replace("a,0,1", "a,0,2"), None).unwrap_err();
        assert!(e.to_string().contains("interactive"), "{e}");
        // A trace without the column reads as before, with the rule.
        let plain = parse_trace(&format!("{HEADER}5,0,x,3600,1,a,0\n"), None).unwrap();
        assert_eq!(plain[0].interactive, None);
    }

    #[test]
    fn a_window_keeps_the_jobs_submitted_inside_it() {
        let text =
            format!("{HEADER}0,0,x,5,1,a,0\n1,100,x,5,1,a,0\n2,200,x,5,1,a,0\n3,300,x,5,1,a,0\n");
        let trace = parse_trace(&text, None).unwrap();
        let ids = |w: &[TraceJob]| w.iter().map(|j| j.job_id).collect::<Vec<_>>();
        let all = submitted_within(trace.clone(), None, None).unwrap();
        assert_eq!(ids(&all), [0, 1, 2, 3]);
        // [from, until): 100 is in, 300 is out; times are not shifted.
        let mid = submitted_within(trace.clone(), Some(100), Some(300)).unwrap();
        assert_eq!(ids(&mid), [1, 2]);
        assert_eq!(mid[0].submit_time_s, 100);
        assert_eq!(
            ids(&submitted_within(trace.clone(), Some(101), None).unwrap()),
            [2, 3]
        );
        assert_eq!(
            ids(&submitted_within(trace.clone(), None, Some(100)).unwrap()),
            [0]
        );
        let e = submitted_within(trace.clone(), Some(300), Some(300)).unwrap_err();
        assert!(
            e.to_string()
                .contains("--from-s (300) must be below --until-s (300)"),
            "{e}"
        );
        let e = submitted_within(trace, Some(301), None).unwrap_err();
        assert!(e.to_string().contains("[301, inf)"), "{e}");
    }

    #[test]
    fn unknown_tenant_is_an_error() {
        let trace = parse_trace(&format!("{HEADER}0,0,x,5,1,zz,0\n"), None).unwrap();
        let campus = CampusFile::parse("[[lab]]\nname = \"A\"\nnodes = 1\n")
            .unwrap()
            .build()
            .unwrap();
        let e = Workload::new(&trace, &campus).unwrap_err();
        assert!(e.to_string().contains("\"zz\""), "{e}");
    }
}
