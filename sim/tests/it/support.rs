//! Helpers: campuses and traces written inline, and one-policy runs.

use commons_sim::engine::SimOutput;
use commons_sim::metrics::{summarize, PolicyMetrics};
use commons_sim::trace::parse_trace;
use commons_sim::{simulate, Campus, CampusFile, PolicyKind, SimOptions, Workload};

pub const HEADER: &str = "job_id,submit_time_s,submit_timestamp,duration_s,num_gpus,vc,src_row\n";

pub fn campus(toml: &str) -> Campus {
    CampusFile::parse(toml).unwrap().build().unwrap()
}

/// Rows of `(submit, duration, gpus, vc)`; job ids are the row numbers.
pub fn workload(campus: &Campus, rows: &[(i64, i64, u32, &str)]) -> Workload {
    let mut text = HEADER.to_string();
    for (i, (submit, duration, gpus, vc)) in rows.iter().enumerate() {
        text += &format!("{i},{submit},-,{duration},{gpus},{vc},{i}\n");
    }
    Workload::new(&parse_trace(&text, None).unwrap(), campus).unwrap()
}

pub fn run(campus: &Campus, work: &Workload, policy: PolicyKind) -> (SimOutput, PolicyMetrics) {
    let out = simulate(campus, work, &SimOptions::new(policy), &mut |_| {}).unwrap();
    let m = summarize(campus, work, &out);
    (out, m)
}

/// `(first start, finish)` of every job.
pub fn times(out: &SimOutput) -> Vec<(Option<i64>, Option<i64>)> {
    out.jobs.iter().map(|j| (j.first_start, j.finish)).collect()
}
