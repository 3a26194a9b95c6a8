//! Job names and tags (issue 30): stored and shown by the API, the job list and the job
//! page; the filters `?name=` and `?tag=k=v` of the API, the jobs page and `commons ls`;
//! bad input refused with 422 naming the field. No agent: the jobs only wait.

use crate::cli::Cli;
use crate::support::harness::TestPortal;
use crate::support::session::BrowserSession;
use serde_json::{json, Value};

fn job(name: &str, tags: Value) -> Value {
    json!({"image": "commons-demo:latest", "command": ["true"], "gpus": 1,
           "time_limit_minutes": 5, "name": name, "tags": tags})
}

fn ids(list: &Value) -> Vec<i64> {
    let mut v: Vec<i64> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["id"].as_i64().unwrap())
        .collect();
    v.sort();
    v
}

per_backend! {
    async fn names_and_tags_are_stored_shown_and_filtered(backend: Backend) {
        let p = TestPortal::start(backend).await;
        let a = p.submit(&p.alice, job("sweep-lr-0.1", json!({"lr": "0.1", "sweep": "s1"}))).await;
        let b = p.submit(&p.alice, job("sweep-lr-0.2", json!({"lr": "0.2", "sweep": "s1"}))).await;
        let e = p.submit(&p.alice, job("Eval", json!({"sweep": "s1", "stage": "eval"}))).await;
        // Someone else's job with the same tag is never in alice's list.
        p.submit(&p.bob, json!({"image": "commons-demo:latest", "gpus": 1,
            "time_limit_minutes": 5, "name": "sweep-lr-0.1", "tags": {"sweep": "s1"}})).await;

        let j = p.job(&p.alice, a).await;
        assert_eq!(j["name"], "sweep-lr-0.1", "[{backend:?}] {j}");
        assert_eq!(j["tags"], json!({"lr": "0.1", "sweep": "s1"}), "[{backend:?}]");

        let list = |q: &'static str| {
            let p = &p;
            async move { ids(&p.get_json(&p.alice, &format!("/api/v1/jobs{q}")).await) }
        };
        assert_eq!(list("?name=sweep-lr-0.1").await, vec![a], "[{backend:?}] exact name");
        assert_eq!(list("?name=eval").await, vec![e], "[{backend:?}] names ignore case");
        assert_eq!(list("?name=sweep-*").await, vec![a, b], "[{backend:?}] a prefix");
        assert_eq!(list("?tag=sweep=s1").await, vec![a, b, e], "[{backend:?}]");
        assert_eq!(list("?tag=sweep=s1&tag=lr=0.2").await, vec![b], "[{backend:?}] all tags");
        assert_eq!(list("?tag=lr=0.").await, Vec::<i64>::new(), "[{backend:?}] whole values");
        assert_eq!(list("?name=sweep-*&tag=lr=0.1").await, vec![a], "[{backend:?}]");
        // A lab admin's filtered list of the lab, with whose each job is.
        let lab = p.get_json(&p.carol, "/api/v1/jobs?lab=vision&tag=stage=eval").await;
        assert_eq!(ids(&lab), vec![e], "[{backend:?}]");
        assert_eq!(lab[0]["user"], "alice", "[{backend:?}]");

        // Bad input: 422 naming the field, nothing stored.
        let before = ids(&p.get_json(&p.alice, "/api/v1/jobs").await).len();
        for (body, field) in [
            (job(&"n".repeat(129), json!({})), "name"),
            (job("ok", json!({"bad key": "1"})), "tags"),
            (job("ok", json!({"k": "has space"})), "tags"),
            (job("ok", (0..17).map(|i| (format!("k{i}"), json!("v"))).collect::<serde_json::Map<_, _>>().into()), "tags"),
        ] {
            let (status, v) = p.post_json(&p.alice, "/api/v1/jobs", &body).await;
            assert_eq!(status, 422, "[{backend:?}] {v}");
            assert_eq!(v["field"], field, "[{backend:?}] {v}");
        }
        assert_eq!(ids(&p.get_json(&p.alice, "/api/v1/jobs").await).len(), before);
        for (q, field) in [("?tag=nokey", "tag"), ("?name=*", "name")] {
            let r = p.http.get(format!("{}/api/v1/jobs{q}", p.url)).bearer_auth(&p.alice)
                .send().await.unwrap();
            assert_eq!(r.status(), 422, "[{backend:?}] {q}");
            let v: Value = r.json().await.unwrap();
            assert_eq!(v["field"], field, "[{backend:?}] {v}");
        }

        // The pages: the list shows names and tags and filters by them; the job page
        // shows both above the details.
        let s = BrowserSession::login(&p, "alice").await;
        let page = s.page("/jobs?tag=stage%3Deval").await;
        assert!(page.contains("Eval") && page.contains("stage=eval"), "[{backend:?}]");
        assert!(page.contains(&format!("job-{e}")) && !page.contains(&format!("job-{a}<")),
            "[{backend:?}] only the tagged job");
        let page = s.page("/jobs?name=sweep-*").await;
        assert!(page.contains("sweep-lr-0.1") && page.contains("sweep-lr-0.2")
            && !page.contains(">Eval<"), "[{backend:?}]");
        let page = s.page(&format!("/jobs/{a}")).await;
        assert!(page.contains("<span id=\"job-name\">sweep-lr-0.1</span>"), "[{backend:?}]");
        assert!(page.contains("lr=0.1"), "[{backend:?}]");
        // The form submits them too; a bad tag is refused beside its field.
        let r = s.post_form("/jobs", &[("image", "commons-demo:latest"), ("gpus", "1"),
            ("time_limit_minutes", "5"), ("name", "from the form"), ("tags", "via=web x=1")]).await;
        assert_eq!(r.status(), 303, "[{backend:?}]");
        let mine = p.get_json(&p.alice, "/api/v1/jobs?tag=via=web").await;
        assert_eq!(mine[0]["name"], "from the form", "[{backend:?}] {mine}");
        let r = s.post_form("/jobs", &[("image", "commons-demo:latest"), ("gpus", "1"),
            ("time_limit_minutes", "5"), ("tags", "novalue")]).await;
        assert_eq!(r.status(), 422, "[{backend:?}]");
        assert!(r.text().await.unwrap().contains("id=\"tags-error\""), "[{backend:?}]");

        // The CLI: `run --name --tag`, `ls --name --tag`, and its own check of a bad tag.
        let cli = Cli::new();
        cli.ok(&["login", &p.url, "--token", &p.alice]).await;
        let r = cli.ok(&["run", "commons-demo:latest", "--name", "cli-run", "--tag", "via=cli",
            "--tag", "seed=7", "--", "true"]).await;
        let id: i64 = r.stdout.trim().parse().unwrap();
        let j = p.job(&p.alice, id).await;
        assert_eq!((j["name"].as_str(), &j["tags"]), (Some("cli-run"), &json!({"via": "cli", "seed": "7"})));
        let r = cli.ok(&["ls", "--tag", "via=cli", "--json"]).await;
        let listed: Value = serde_json::from_str(&r.stdout).unwrap();
        assert_eq!(ids(&listed), vec![id], "[{backend:?}] {r}");
        let r = cli.ok(&["ls", "--name", "sweep-*"]).await;
        assert!(r.stdout.contains("sweep-lr-0.1") && !r.stdout.contains("cli-run"), "[{backend:?}] {r}");
        let r = cli.run(&["run", "commons-demo:latest", "--tag", "oops", "--", "true"]).await;
        assert_eq!(r.code, 2, "[{backend:?}] {r}");
        assert!(r.stderr.contains("invalid tags"), "[{backend:?}] {r}");
        p.stop().await;
    }
}
