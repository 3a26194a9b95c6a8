//! Issue 30's "done when", tried as a new user would, with real parts: a 50-run sweep
//! launched with one command (`commons run --array 0-49%8`), watched as one line of
//! `commons ls` and one array in the API, an evaluation job that starts when the sweep has
//! succeeded (`--after-ok-array`), one e-mail (a real SMTP server, aiosmtpd) and one
//! signed webhook call when the sweep is done, and none per task. The user guide's
//! walkthrough (docs/src/user/arrays.md) follows these steps.

use crate::cli::Cli;
use crate::notifications::{test_portal, Receiver, SmtpServer, SECRET};
use crate::support::harness::Backend;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(180);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_then_an_evaluation_with_one_mail_and_one_webhook() {
    let began = Instant::now();
    let smtp = SmtpServer::start();
    let port = smtp.port;
    let p = test_portal(Backend::Sqlite)
        .config(move |c| {
            c.smtp = Some(commons_portal::config::SmtpConfig {
                url: format!("smtp://127.0.0.1:{port}"),
                from: "GPU Commons <gpu@campus.test>".into(),
            })
        })
        .start()
        .await;
    let rx = Receiver::start(0);
    // E-mail and the lab's chat, every event.
    let (s, v) = p
        .put_json(
            &p.alice,
            "/api/v1/me/notifications",
            &json!({"email": true, "webhooks": [{"url": rx.url, "secret": SECRET}]}),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    let _agent = p.agent("vision", "fake:8xA100-80GB").await;

    // 1. The sweep: one command.
    let cli = Cli::new();
    cli.ok(&["login", &p.url, "--token", &p.alice]).await;
    let r = cli
        .ok(&[
            "run",
            "--array",
            "0-49%8",
            "--name",
            "sweep",
            "--cpus",
            "0.1",
            "--memory",
            "0.125",
            "commons-demo:latest",
            "--",
            "sh",
            "-c",
            "echo seed={index}",
        ])
        .await;
    let sweep: i64 = r.stdout.trim().parse().unwrap();
    assert!(r.stderr.contains("50 tasks"), "{r}");

    // 2. The evaluation waits for the whole sweep to succeed.
    let r = cli
        .ok(&[
            "run",
            "--name",
            "eval",
            "--cpus",
            "0.1",
            "--memory",
            "0.125",
            "--after-ok-array",
            &sweep.to_string(),
            "commons-demo:latest",
            "--",
            "echo",
            "evaluating",
        ])
        .await;
    let eval: i64 = r.stdout.trim().parse().unwrap();
    let j = p.job(&p.alice, eval).await;
    assert_eq!(
        j["reason"],
        format!("waiting for array {sweep} to succeed"),
        "{j}"
    );

    // 3. Watched as one line (`commons ls`) and as one array (`/api/v1/arrays/ID`).
    let r = cli.ok(&["ls"]).await;
    assert_eq!(
        r.stdout.matches(&format!("array-{sweep} ")).count(),
        1,
        "{r}"
    );
    assert_eq!(
        r.stdout.matches("sweep").count(),
        1,
        "one line for 50 tasks: {r}"
    );
    let deadline = Instant::now() + T;
    let a = loop {
        let a = p
            .get_json(&p.alice, &format!("/api/v1/arrays/{sweep}"))
            .await;
        if a["finished"] == true {
            break a;
        }
        assert!(Instant::now() < deadline, "the sweep never finished: {a}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert_eq!(a["states"], json!({"succeeded": 50}), "{a}");

    // 4. The evaluation ran after the last task.
    let j = p
        .wait_state(&p.alice, eval, &["succeeded", "failed"], T)
        .await;
    assert_eq!(j["state"], "succeeded", "{j}");
    assert_eq!(p.logs(&p.alice, eval).await.trim(), "evaluating");
    let tasks = p
        .get_json(&p.alice, &format!("/api/v1/jobs?array={sweep}"))
        .await;
    let last_end = tasks
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["finished_at"].as_str().unwrap().to_string())
        .max()
        .unwrap();
    assert!(
        j["started_at"].as_str().unwrap() >= last_end.as_str(),
        "{j} {last_end}"
    );

    // 5. One e-mail and one webhook call for the sweep; none for its tasks (the
    //    evaluation's own start and end are the only others).
    let calls = rx
        .wait("the sweep's call and the evaluation's end", |c| {
            c.iter().any(|g| g.body.contains("array.finished"))
                && c.iter().any(|g| g.body.contains("job.succeeded"))
        })
        .await;
    let sweep_calls: Vec<_> = calls
        .iter()
        .filter(|g| g.id == format!("arr_{sweep}"))
        .collect();
    assert_eq!(sweep_calls.len(), 1, "{calls:#?}");
    let e: Value = serde_json::from_str(&sweep_calls[0].body).unwrap();
    assert_eq!(e["data"]["array"]["succeeded"], 50, "{e}");
    for g in &calls {
        let e: Value = serde_json::from_str(&g.body).unwrap();
        let about = e["data"]["job"]["id"].as_i64();
        assert!(
            g.id.starts_with("arr_") || about == Some(eval),
            "a call for a task: {e}"
        );
    }
    let subject = format!("Subject: [GPU Commons] array {sweep} (sweep) finished: 50 succeeded");
    let deadline = Instant::now() + T;
    let mails = loop {
        let m = smtp.messages();
        if m.iter().any(|m| m.contains(&subject)) && m.len() >= 3 {
            break m;
        }
        assert!(Instant::now() < deadline, "no sweep e-mail: {m:#?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        mails.iter().filter(|m| m.contains(&subject)).count(),
        1,
        "{mails:#?}"
    );
    for m in &mails {
        assert!(
            m.contains(&subject) || m.contains(&format!("job {eval} (eval)")),
            "an e-mail for a task: {m}"
        );
    }
    assert!(mails.iter().all(|m| m.contains("To: alice@campus.test")));
    eprintln!(
        "the walkthrough took {:.1} s",
        began.elapsed().as_secs_f64()
    );
}
