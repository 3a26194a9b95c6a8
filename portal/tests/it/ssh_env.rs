//! An SSH session into a job runs with exactly the job's environment and limits (issue 29
//! §6; a known bypass in GPU-sharing systems is a session without the variables that
//! carry the limits): the real OpenSSH client, through the gateway, into a real
//! container. The client may add variables, never change one the job sets, and never set
//! what selects GPUs or their shares.

use crate::ssh::Rig;
use serde_json::json;
use std::collections::BTreeMap;
use std::time::Duration;

fn lines_to_env(s: &str) -> BTreeMap<String, String> {
    s.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_runs_with_the_jobs_environment_and_cgroups() {
    let rig = Rig::start(247).await;
    let job = rig
        .api
        .submit(json!({
            "image": "commons-demo:latest",
            "command": ["sh", "-c", "echo started; sleep 3600"],
            "gpus": 1,
            "time_limit_minutes": 30,
            "env": {"SHARE_LIMIT": "25", "DATA": "/inputs/a"},
        }))
        .await;
    rig.api
        .wait_job(job, Duration::from_secs(120), "running", |j| {
            j["state"] == "running"
        })
        .await;
    let key = rig.key();
    let script = "env; echo @@; tr '\\0' '\\n' < /proc/1/environ; echo @@; \
                  cat /proc/self/cgroup; echo @@; cat /proc/1/cgroup";
    let out = rig
        .ssh_opts(
            &key,
            job,
            &[
                "-o",
                "SetEnv=SHARE_LIMIT=100 EXTRA=1 CUDA_VISIBLE_DEVICES=0,1,2,3 \
                 CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100",
            ],
            &[script],
        )
        .output()
        .expect("OpenSSH client (apt-get install openssh-client)");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "ssh failed: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    let parts: Vec<&str> = text.split("@@\n").collect();
    assert_eq!(
        parts.len(),
        4,
        "the session's answer, in four parts: {text}"
    );
    let session = lines_to_env(parts[0]);
    let main = lines_to_env(parts[1]);
    assert!(
        main.contains_key("SHARE_LIMIT"),
        "the job's own env: {main:?}"
    );
    for (k, v) in &main {
        assert_eq!(
            session.get(k),
            Some(v),
            "{k} differs between the job's main process ({v}) and the SSH session"
        );
    }
    assert_eq!(session.get("EXTRA").map(String::as_str), Some("1"));
    assert!(
        !session.contains_key("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"),
        "a share's limit set by the client: {session:?}"
    );
    assert_eq!(
        parts[2], parts[3],
        "the session's cgroups are the job's (so its limits)"
    );
    crate::support::cluster::remove_containers(&[job]);
}
