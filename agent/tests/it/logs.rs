//! A job's output against the real Docker Engine, through a small `--log-rate`: a flood
//! is held to the rate with markers that count what was left out, the job runs on, its
//! last words (after the flood) arrive before its end is reported, and `result.json`
//! keeps the real end of its output. And a job that prints steadily is read live.

use super::{demo_image, final_event, guard_exe, lease_from_hello, new_agent_id, spec};
use commons_agent::executor::Executor;
use commons_agent::outbox::{self, rate::LogLimit, throttle::END_KEEP};
use commons_agent::runtime::DockerRuntime;
use commons_agent::store::{self, ResultFile, Store};
use commons_proto::AttemptState;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_is_held_to_the_rate_and_the_last_words_arrive_before_the_end() {
    demo_image();
    let dir = tempfile::tempdir().unwrap();
    let rt = DockerRuntime::connect(new_agent_id())
        .await
        .expect("the Docker Engine must run");
    let limit = LogLimit::new(16 * 1024, 16 * 1024).unwrap();
    let (tx, mut rx) = outbox::channel(limit);
    let exec = Executor::new(rt, tx, Store::new(dir.path()).with_guard(Some(guard_exe())));
    let started = std::time::Instant::now();
    // 2,000 x a line, as fast as the shell goes, for 4 s; then the last words.
    let flood = "x=xxxxxxxxxxxxxxxxxxxx; x=$x$x$x$x$x; x=$x$x$x$x$x; x=$x$x$x$x; \
                 (while :; do echo $x; done) & sleep 4; kill $!; wait; echo the-last-words";
    exec.start(
        3,
        1,
        spec(flood, 120),
        vec![],
        lease_from_hello(&exec, 3600),
    );
    let end = final_event(&mut rx).await;
    let secs = started.elapsed().as_secs_f64();
    assert_eq!(
        (end.state, end.exit_code),
        (AttemptState::Exited, Some(0)),
        "the job ran to its end: {:?}",
        end.reason
    );
    let log = end.logs;
    assert!(
        log.ends_with("the-last-words\n"),
        "the last words came before the end: {:?}",
        &log[log.len().saturating_sub(300)..]
    );
    let markers: Vec<&str> = log.lines().filter(|l| l.starts_with("... ")).collect();
    assert!(!markers.is_empty(), "no marker in {} bytes", log.len());
    let mut dropped = 0u64;
    for m in &markers {
        let (n, why) = m[4..].split_once(' ').unwrap();
        assert_eq!(why, "bytes dropped: output over the rate limit (16 KiB/s)");
        dropped += n.parse::<u64>().unwrap();
    }
    // What passed: within the burst, the rate over the job's life and the kept end.
    let lines: Vec<&str> = log.lines().filter(|l| !l.starts_with("... ")).collect();
    let passed: u64 = lines.iter().map(|l| l.len() as u64 + 1).sum();
    eprintln!(
        "{secs:.1} s: {passed} bytes passed, {dropped} dropped, {} markers",
        markers.len()
    );
    let most = limit.burst + (limit.rate as f64 * secs) as u64 + END_KEEP as u64;
    assert!(
        passed <= most,
        "{passed} bytes passed in {secs:.1} s, most {most}"
    );
    assert!(
        dropped > 10 * passed,
        "the flood was mostly dropped: {dropped} dropped, {passed} passed"
    );
    assert!(
        lines
            .iter()
            .all(|l| *l == "the-last-words" || (l.len() == 2000 && l.bytes().all(|b| b == b'x'))),
        "whole lines only"
    );
    // result.json keeps the real end of the output, unaffected by the limit.
    let file: ResultFile =
        store::read_json(&store::attempt_dir(dir.path(), 3, 1).join(store::RESULT_FILE))
            .unwrap()
            .unwrap();
    assert!(
        file.log_tail.ends_with("x\nthe-last-words\n"),
        "{:?}",
        &file.log_tail[file.log_tail.len().saturating_sub(100)..]
    );
    assert!(file.log_tail.len() <= store::LOG_TAIL_MAX);
    assert!(
        !file.log_tail.contains("bytes dropped"),
        "the tail is the job's own output"
    );
}

/// A job printing a short line ten times a second never pauses long enough to flush on
/// quiet, nor fills a chunk for minutes: its lines still reach the portal within the
/// flush interval, while it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steady_output_arrives_while_the_job_runs() {
    let dir = tempfile::tempdir().unwrap();
    let (exec, mut rx, _rt) = super::docker_agent(&new_agent_id(), dir.path()).await;
    let ticks = "i=0; while :; do echo tick-$i; i=$((i+1)); sleep 0.1; done";
    exec.start(
        4,
        1,
        spec(ticks, 300),
        vec![],
        lease_from_hello(&exec, 3600),
    );
    let mut logs = String::new();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    while !logs.contains("tick-10\n") {
        let msg = tokio::time::timeout_at(deadline, rx.recv())
            .await
            .unwrap_or_else(|_| panic!("tick-10 not here within 30 s; got {logs:?}"))
            .unwrap();
        match msg {
            commons_proto::AgentMsg::Logs { chunk, .. } => logs.push_str(&chunk),
            commons_proto::AgentMsg::AttemptEvent { state, .. } => {
                assert!(!state.is_final(), "the job ended: {state:?}")
            }
            _ => {}
        }
    }
    assert!(logs.starts_with("tick-0\ntick-1\n"), "{logs:?}");
    exec.stop(4, 1, 0, commons_proto::StopReason::Cancelled, None);
    final_event(&mut rx).await;
}
