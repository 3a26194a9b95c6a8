//! The README's first command, `commons-portal demo` (issue 17), as a person runs it: the
//! built binary, with a data dir and a port of its own and the `--fast` timings of the
//! scripted workload. It prints the URL and whom to log in as; logged in as that user
//! through the development login, the test sees a guest job of the script preempted by
//! the owner's job, requeued and running again (through the API and the job page). Then
//! Ctrl-C (SIGINT) stops the demo, and no process or container it started is left.

use crate::support::cluster::{agent_binary, demo_image, portal_binary};
use crate::support::session::BrowserSession;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The `commons.agent` ids of the demo's servers (from their credentials).
fn agent_ids(data: &Path) -> Vec<String> {
    let mut ids = Vec::new();
    for e in std::fs::read_dir(data.join("agents")).unwrap().flatten() {
        let text = std::fs::read_to_string(e.path().join("node.json")).unwrap();
        let v: Value = serde_json::from_str(&text).unwrap();
        ids.push(v["agent_id"].as_str().unwrap().to_string());
    }
    ids.sort();
    ids
}

/// Containers (any state) labelled with one of the agent ids.
fn containers_of(ids: &[String]) -> Vec<String> {
    let mut all = Vec::new();
    for id in ids {
        let out = Command::new("docker")
            .args([
                "ps",
                "-aq",
                "--filter",
                &format!("label=commons.agent={id}"),
            ])
            .output()
            .unwrap();
        assert!(out.status.success(), "docker ps");
        all.extend(
            String::from_utf8_lossy(&out.stdout)
                .split_whitespace()
                .map(String::from),
        );
    }
    all
}

/// Processes whose command line names the demo's data dir (agents, attempt guards).
fn processes_under(data: &Path) -> Vec<String> {
    let needle = data.to_string_lossy().to_string();
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        if !e
            .file_name()
            .to_string_lossy()
            .chars()
            .all(|c| c.is_ascii_digit())
        {
            continue;
        }
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if cmd.contains(&needle) {
            found.push(format!("{}: {cmd}", e.file_name().to_string_lossy()));
        }
    }
    found
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_tells_its_story_and_leaves_nothing_behind() {
    demo_image();
    // The demo runs the agent binary beside its own.
    let (portal, agent) = (portal_binary(), agent_binary());
    assert_eq!(portal.parent(), agent.parent());
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("demo");
    let port = free_port();
    let stderr = std::fs::File::create(dir.path().join("stderr")).unwrap();
    let mut demo = Command::new(&portal)
        .args(["demo", "--listen", &format!("127.0.0.1:{port}"), "--fast"])
        .args(["--apps-listen", &format!("127.0.0.1:{}", free_port())])
        .arg("--data-dir")
        .arg(&data)
        // Not under cargo: the demo would build the agent first (a no-op here).
        .env_remove("CARGO")
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .unwrap();
    let out = Arc::new(Mutex::new(Vec::<String>::new()));
    {
        let out = out.clone();
        let stdout = demo.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                out.lock().unwrap().push(line);
            }
        });
    }
    let said = || out.lock().unwrap().join("\n");
    let told = || {
        format!(
            "stdout:\n{}\nstderr:\n{}",
            said(),
            std::fs::read_to_string(dir.path().join("stderr")).unwrap_or_default()
        )
    };

    // 1. The URL and whom to log in as.
    let deadline = Instant::now() + Duration::from_secs(300);
    let (url, user) = loop {
        let text = said();
        let url = text
            .lines()
            .find_map(|l| l.strip_prefix("GPU Commons demo is running: "))
            .map(|u| u.trim_end_matches('/').to_string());
        let user = text.lines().find_map(|l| {
            l.strip_prefix("Log in as ")
                .and_then(|r| r.split_whitespace().next())
                .map(String::from)
        });
        if let (Some(url), Some(user)) = (url, user) {
            break (url, user);
        }
        assert!(
            Instant::now() < deadline,
            "no URL and user printed:\n{}",
            told()
        );
        assert!(
            demo.try_wait().unwrap().is_none(),
            "the demo ended:\n{}",
            told()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(url, format!("http://127.0.0.1:{port}"));

    // 2. The development login, as the printed user.
    let b = BrowserSession::anonymous_at(&url);
    let r = b.sign_in(&user).await;
    assert_eq!(r.status(), 303, "logged in as {user}");

    // 3. One of the user's jobs ran as a guest on vision's server, was preempted when the
    //    owner (alice) submitted, was requeued, and runs again as attempt 2.
    let deadline = Instant::now() + Duration::from_secs(300);
    let (job, events) = 'found: loop {
        let jobs: Value = b
            .get(format!("{url}/api/v1/jobs"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        for j in jobs.as_array().unwrap() {
            if j["state"] != "running" || j["attempts"].as_i64() < Some(2) {
                continue;
            }
            let id = j["id"].as_i64().unwrap();
            let events: Value = b
                .get(format!("{url}/api/v1/jobs/{id}/events"))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            let states: Vec<&str> = events
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|e| e["state"].as_str())
                .collect();
            let preempted = states.iter().position(|s| *s == "preempting");
            let requeued = preempted.and_then(|p| {
                states[p..]
                    .iter()
                    .position(|s| *s == "queued")
                    .map(|q| p + q)
            });
            let again = requeued.and_then(|q| states[q..].iter().position(|s| *s == "running"));
            if again.is_some() {
                break 'found (j.clone(), events);
            }
        }
        assert!(
            Instant::now() < deadline,
            "no guest job of {user} preempted, requeued and running again: {jobs}\n{}",
            told()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let id = job["id"].as_i64().unwrap();
    assert_eq!(job["lab"], "physics", "{job}");
    let text = said();
    assert!(
        text.contains(&format!(
            "job {id} ({user}, physics) is preempted on vision-gpu1"
        )) && text.contains(&format!("job {id} ({user}, physics) is requeued")),
        "the narration tells it:\n{text}\n{events}"
    );
    assert!(
        text.contains("alice's job") && text.contains("the owner comes first"),
        "{text}"
    );
    let page = b
        .get(format!("{url}/jobs/{id}"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        page.contains("preempting"),
        "the job page shows the history"
    );

    // 4. Ctrl-C: everything the demo started goes.
    let ids = agent_ids(&data);
    assert_eq!(ids.len(), 3, "three servers");
    assert!(
        !containers_of(&ids).is_empty(),
        "the demo's jobs run in containers"
    );
    assert!(!processes_under(&data).is_empty(), "the agents run");
    let t0 = Instant::now();
    let pid = demo.id().to_string();
    assert!(Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .unwrap()
        .success());
    let status = loop {
        if let Some(s) = demo.try_wait().unwrap() {
            break s;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the demo did not stop:\n{}",
            told()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.success(), "a clean stop: {status}\n{}", told());
    assert!(said().contains("stopped"), "{}", told());
    assert_eq!(
        containers_of(&ids),
        Vec::<String>::new(),
        "no container left"
    );
    assert_eq!(
        processes_under(&data),
        Vec::<String>::new(),
        "no process left"
    );
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "the portal is gone"
    );
    println!(
        "FIGURE demo stop (Ctrl-C -> everything gone): {:.1} s",
        t0.elapsed().as_secs_f64()
    );
}
