//! The portal's pages over HTTP on a seeded campus: the overview's counts against the
//! API and against what the test set up, the jobs list's scopes, filters, search, order
//! and pages. (`pages_browser` drives the same pages in Chromium.)

use crate::support::harness::{wait_for, Backend, TestAgent, TestPortal};
use crate::support::session::BrowserSession;
use commons_portal::db::models::Role;
use commons_portal::db::users;
use serde_json::{json, Value};
use std::time::Duration;

const T: Duration = Duration::from_secs(60);

/// A job of the demo image asking for `gpus` GPUs (of `model`, when given) for lab `lab`.
pub fn job(cmd: &str, gpus: i64, model: Option<&str>, lab: &str) -> Value {
    json!({
        "image": "commons-demo:latest",
        "command": ["sh", "-c", cmd],
        "gpus": gpus,
        "gpu_models": model.map(|m| vec![m]).unwrap_or_default(),
        "cpus": 0.5,
        "memory_gb": 0.25,
        "time_limit_minutes": 30,
        "kind": "batch",
        "lab": lab,
    })
}

/// A campus with four labs' servers in every GPU state and jobs running and waiting:
/// - vision-server (2 x A100): alice's job (owner) and bob's (physics, a guest);
/// - physics-server (1 x RTX 4090): idle and lendable;
/// - chem-server (2 x L40S): lends never, so withheld;
/// - bio-server (1 x T4): offline;
/// - waiting: alice's 4-GPU job (vision) and dana's 3-GPU job (chem), which fit nowhere.
pub struct Campus {
    pub p: TestPortal,
    /// Kept so the servers stay up.
    pub _agents: Vec<TestAgent>,
    pub owner_job: i64,
    pub guest_job: i64,
    pub waiting: Vec<i64>,
}

pub async fn campus(backend: Backend) -> Campus {
    let p = TestPortal::start(backend).await;
    let db = p.portal.state.db.clone();
    let dana = tokio::task::spawn_blocking(move || {
        db.run_blocking(|c| {
            let chem = users::create_lab(c, "chem", "Chemistry Lab")?;
            users::create_lab(c, "bio", "Biology Lab")?;
            let d = users::create_user(c, "dana", "dana@campus.test", false)?;
            users::set_membership(c, d.id, chem.id, Role::Member)?;
            users::create_api_token(c, d.id, "test")
        })
        .unwrap()
    })
    .await
    .unwrap();
    let vision = p.agent("vision", "fake:2xA100-80GB").await;
    let physics = p.agent("physics", "fake:1xRTX4090-24GB").await;
    let chem = p.agent("chem", "fake:2xL40S-48GB").await;
    let bio = p.agent("bio", "fake:1xT4-16GB").await;
    let node_of = |nodes: &Value, lab: &str| {
        nodes
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["lab"] == lab)
            .unwrap()["id"]
            .as_i64()
            .unwrap()
    };
    let nodes = p.get_json(&p.olga, "/api/v1/nodes").await;
    let (status, v) = p
        .put_json(
            &p.olga,
            &format!("/api/v1/nodes/{}/lending", node_of(&nodes, "chem")),
            &json!({"mode": "never"}),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    drop(bio);
    let me = &p;
    wait_for(T, "bio-server offline", || async move {
        let nodes = me.get_json(&me.olga, "/api/v1/nodes").await;
        nodes
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n["lab"] == "bio" && n["online"] == false)
    })
    .await;

    let owner_job = p
        .submit(&p.alice, job("sleep 600", 1, Some("A100-80GB"), "vision"))
        .await;
    p.wait_state(&p.alice, owner_job, &["running"], T).await;
    let guest_job = p
        .submit(&p.bob, job("sleep 600", 1, Some("A100-80GB"), "physics"))
        .await;
    p.wait_state(&p.bob, guest_job, &["running"], T).await;
    let w1 = p
        .submit(&p.alice, job("train --big", 4, None, "vision"))
        .await;
    let w2 = p.submit(&dana, job("simulate", 3, None, "chem")).await;
    for (token, id) in [(&p.alice, w1), (&dana, w2)] {
        let me = &p;
        wait_for(T, "a reason for the waiting job", || async move {
            me.job(token, id).await["reason"].is_string()
        })
        .await;
    }
    Campus {
        _agents: vec![vision, physics, chem],
        owner_job,
        guest_job,
        waiting: vec![w1, w2],
        p,
    }
}

/// The number in the element with id `id` of an HTML page.
pub fn number_at(html: &str, id: &str) -> i64 {
    let key = format!("id=\"{id}\">");
    let at = html
        .find(&key)
        .unwrap_or_else(|| panic!("no #{id} on the page"))
        + key.len();
    html[at..]
        .split('<')
        .next()
        .unwrap()
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("#{id} is no number: {e}"))
}

/// The number of jobs the jobs list says match.
fn job_count(html: &str) -> i64 {
    let key = "id=\"job-count\">";
    let at = html.find(key).expect("the job count") + key.len();
    html[at..].split(' ').next().unwrap().parse().unwrap()
}

pub async fn page(b: &reqwest::Client, p: &TestPortal, path: &str) -> (u16, String) {
    let r = b.get(format!("{}{path}", p.url)).send().await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

per_backend! {
    async fn the_overview_counts_match_the_api_and_the_campus(backend: Backend) {
        let c = campus(backend).await;
        let p = &c.p;
        let api = p.get_json(&p.carol, "/api/v1/overview").await;
        let g = &api["gpus"];
        // What the test set up, GPU by GPU.
        assert_eq!(
            (
                g["total"].as_i64(),
                g["owner"].as_i64(),
                g["guest"].as_i64(),
                g["lendable"].as_i64(),
                g["withheld"].as_i64(),
                g["offline"].as_i64()
            ),
            (Some(6), Some(1), Some(1), Some(1), Some(3), Some(1)),
            "[{backend:?}] {api:#}"
        );
        assert_eq!(
            (api["waiting"].as_i64(), api["waiting_gpus"].as_i64()),
            (Some(2), Some(7))
        );
        assert!(
            api["typical_wait_s"].is_i64() && api["started_last_7_days"] == 2,
            "two jobs started: {api}"
        );
        // The same GPUs the nodes API lists.
        let nodes = p.get_json(&p.carol, "/api/v1/nodes").await;
        let listed: usize = nodes
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["gpus"].as_array().unwrap().len())
            .sum();
        assert_eq!(g["total"].as_u64(), Some(listed as u64));
        // The guest's cell names its job, user and lab.
        let cells: Vec<&Value> = api["servers"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|s| s["cells"].as_array().unwrap())
            .collect();
        let guest = cells.iter().find(|c| c["state"] == "guest").unwrap();
        assert_eq!(guest["job"].as_i64(), Some(c.guest_job));
        assert_eq!(
            (guest["user"].as_str(), guest["job_lab"].as_str()),
            (Some("bob"), Some("physics"))
        );
        let owner = cells.iter().find(|c| c["state"] == "owner").unwrap();
        assert_eq!(owner["job"].as_i64(), Some(c.owner_job));

        // The home page after login shows the API's numbers.
        let carol = BrowserSession::login(p, "carol").await;
        let r = carol.get(format!("{}/login", p.url)).send().await.unwrap();
        assert_eq!(r.status(), 200);
        let (status, html) = page(&carol, p, "/").await;
        assert_eq!(status, 200, "{html}");
        for (id, key) in [
            ("count-owner", "owner"),
            ("count-guest", "guest"),
            ("count-lendable", "lendable"),
            ("count-withheld", "withheld"),
            ("count-total", "total"),
        ] {
            assert_eq!(
                Some(number_at(&html, id)),
                g[key].as_i64(),
                "[{backend:?}] #{id}"
            );
        }
        assert_eq!(number_at(&html, "count-waiting"), 2);
        assert!(
            html.contains(&format!("job-{} of bob (lab physics)", c.guest_job)),
            "the map's cell says who holds the GPU"
        );
        // Lab admins' lab first; a member's lab first for them.
        let first_lab = |html: &str| {
            let at = html.find("data-lab=\"").unwrap() + "data-lab=\"".len();
            html[at..].split('"').next().unwrap().to_string()
        };
        assert_eq!(first_lab(&html), "vision");
        let bob = BrowserSession::login(p, "bob").await;
        let (_, html) = page(&bob, p, "/").await;
        assert_eq!(first_lab(&html), "physics");
        assert_eq!(
            api["labs"][0]["lab"], "vision",
            "the API orders as the page does"
        );

        // "Your use": alice's running GPU and her quota, as the API says too.
        let (status, v) = p
            .put_json(
                &p.carol,
                "/api/v1/labs/vision/members/alice/quota",
                &json!({"max_gpus": 2, "max_gpu_hours": 10}),
            )
            .await;
        assert_eq!(status, 200, "{v}");
        let mine = p.get_json(&p.alice, "/api/v1/overview").await["my_use"].clone();
        assert_eq!(mine[0]["lab"], "vision");
        assert_eq!(
            (mine[0]["gpus_now"].as_i64(), mine[0]["max_gpus"].as_i64()),
            (Some(1), Some(2))
        );
        let alice = BrowserSession::login(p, "alice").await;
        let (_, html) = page(&alice, p, "/").await;
        assert!(
            html.contains("1 in use of 2"),
            "[{backend:?}] your use against your quota"
        );
        assert!(html.contains("style=\"width: 50%\""), "as a bar");

        // Logged out: the home page sends to the login page.
        let r = BrowserSession::anonymous(p).fetch("/").await;
        assert_eq!(r.status(), 303);
        assert_eq!(r.headers()["location"], "/login");
        let r = p
            .http
            .get(format!("{}/api/v1/overview", p.url))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401, "the API needs a token");
    }
}

per_backend! {
    async fn the_jobs_list_filters_searches_sorts_and_pages(backend: Backend) {
        // No server: every job waits (with its reason and an unknown start).
        let p = TestPortal::start(backend).await;
        // A second image on the campus allow-list (pinned; no server runs it here).
        let (status, b) = p
            .post_json(
                &p.olga,
                "/api/v1/images",
                &json!({"name_tag": "pytorch/pytorch:2.4", "digest": format!("sha256:{}", "b".repeat(64))}),
            )
            .await;
        assert_eq!(status, 201, "{b}");
        let mut ids = Vec::new();
        for i in 0..27 {
            let mut j = job(
                &format!("python train.py --seed {i}"),
                1 + i % 2,
                None,
                "vision",
            );
            if i % 3 == 0 {
                j["image"] = json!("pytorch/pytorch:2.4");
            }
            if i == 5 {
                j["kind"] = json!("interactive");
                j["command"] = json!([]);
            }
            ids.push(p.submit(&p.alice, j).await);
        }
        p.submit(&p.bob, job("echo physics", 1, None, "physics"))
            .await;
        let (status, _) = p
            .post_json(
                &p.alice,
                &format!("/api/v1/jobs/{}/cancel", ids[0]),
                &json!({}),
            )
            .await;
        assert_eq!(status, 200);
        let me = &p;
        let last = *ids.last().unwrap();
        // Reasons are written each round, places in the queue at most every few seconds.
        wait_for(T, "the scheduler's reasons and places", || async move {
            let j = me.job(&me.alice, last).await;
            j["reason"].is_string() && j["queue_position"].is_number()
        })
        .await;

        let alice = BrowserSession::login(&p, "alice").await;
        let (status, html) = page(&alice, &p, "/jobs").await;
        assert_eq!(status, 200);
        assert!(
            html.contains("27 jobs, page 1 of 2"),
            "[{backend:?}] {html}"
        );
        assert_eq!(html.matches("<tr data-job=").count(), 25);
        assert!(
            html.contains(&format!("data-job=\"{last}\"")),
            "newest first"
        );
        assert!(
            html.contains("estimated start: unknown"),
            "waiting jobs say when they start"
        );
        assert!(
            html.contains("class=\"queue-place\""),
            "and their place in the queue"
        );
        assert!(html.contains("class=\"muted reason\""), "and why they wait");
        assert!(!html.contains("echo physics"), "only alice's jobs");
        let (_, html2) = page(&alice, &p, "/jobs?page=2").await;
        assert_eq!(html2.matches("<tr data-job=").count(), 2);
        assert!(
            html2.contains(&format!("data-job=\"{}\"", ids[0])),
            "oldest on the last page"
        );

        // Search by image or command, any case; filters by state and kind.
        let (_, html) = page(&alice, &p, "/jobs?q=PYTORCH").await;
        assert_eq!(job_count(&html), 9);
        let (_, html) = page(&alice, &p, "/jobs?q=--seed+13").await;
        assert_eq!(job_count(&html), 1);
        let (_, html) = page(&alice, &p, "/jobs?q=50%25_").await;
        assert!(html.contains("No jobs match"), "wildcards are literal");
        let (_, html) = page(&alice, &p, "/jobs?state=cancelled").await;
        assert_eq!(job_count(&html), 1);
        assert!(html.contains(&format!("data-job=\"{}\"", ids[0])));
        let (_, html) = page(&alice, &p, "/jobs?kind=interactive").await;
        assert_eq!(job_count(&html), 1);
        assert!(html.contains(&format!("data-job=\"{}\"", ids[5])));
        let (_, html) = page(&alice, &p, "/jobs?state=active&lab=vision&sort=oldest").await;
        assert_eq!(job_count(&html), 26);
        let first = html.find("<tr data-job=\"").unwrap() + "<tr data-job=\"".len();
        assert_eq!(
            html[first..].split('"').next(),
            Some(ids[1].to_string().as_str())
        );
        assert!(
            html.contains("state=active&#38;lab=vision&#38;sort=oldest&#38;page=2"),
            "pages keep the filters: {}",
            &html[html.find("class=\"pager\"").unwrap_or(0)..]
        );
        let (_, html) = page(&alice, &p, "/jobs?sort=gpus").await;
        let first = html.find("<tr data-job=\"").unwrap() + "<tr data-job=\"".len();
        let id: i64 = html[first..].split('"').next().unwrap().parse().unwrap();
        assert_eq!(p.job(&p.alice, id).await["gpus_requested"], 2);

        // Bad filters name their field.
        for (q, field) in [
            ("state=lost", "state"),
            ("sort=size", "sort"),
            ("page=0", "page"),
            ("kind=gpu", "kind"),
            ("scope=lab:", "scope"),
        ] {
            let (status, html) = page(&alice, &p, &format!("/jobs?{q}")).await;
            assert_eq!(status, 422, "{q}");
            assert!(
                html.contains(&format!("{field}:")) || html.contains(&format!("({field})")),
                "{q}: {html}"
            );
        }

        // Scopes: a lab's admins see its jobs, members do not; operators see all.
        let (status, _) = page(&alice, &p, "/jobs?scope=lab:vision").await;
        assert_eq!(status, 403, "a member is no admin");
        let (status, _) = page(&alice, &p, "/jobs?scope=all").await;
        assert_eq!(status, 403, "nor an operator");
        let carol = BrowserSession::login(&p, "carol").await;
        let (_, html) = page(&carol, &p, "/jobs").await;
        assert!(
            html.contains("href=\"/jobs?scope=lab:vision\""),
            "carol may switch to her lab"
        );
        let (status, html) = page(&carol, &p, "/jobs?scope=lab:vision").await;
        assert_eq!(status, 200);
        assert_eq!(job_count(&html), 27);
        assert!(html.contains("<td data-label=\"User\">alice</td>"));
        let (status, _) = page(&carol, &p, "/jobs?scope=lab:physics").await;
        assert_eq!(status, 403);
        let olga = BrowserSession::login(&p, "olga").await;
        let (_, html) = page(&olga, &p, "/jobs?scope=all").await;
        assert_eq!(job_count(&html), 28);
        assert!(html.contains("echo physics"));
    }
}

per_backend! {
    async fn the_lab_console_saves_member_quotas_with_one_save_audited_and_exports_usage(backend: Backend) {
        let p = TestPortal::start(backend).await;
        let carol = BrowserSession::login(&p, "carol").await;
        let (status, html) = page(&carol, &p, "/labs/vision/admin").await;
        assert_eq!(status, 200);
        assert!(html.contains("This server") || html.contains("No server yet"));
        assert!(
            html.contains("<svg class=\"chart\""),
            "the usage chart is drawn on the server"
        );
        assert!(
            html.contains("name=\"max_gpus:alice\""),
            "quotas are edited in the table"
        );
        let save = |fields: Vec<(&'static str, &'static str)>| {
            let carol = &carol;
            async move {
                let r = carol.post_form("/labs/vision/member-quotas", &fields).await;
                (r.status().as_u16(), r.text().await.unwrap())
            }
        };
        // One bad field refuses the whole Save, naming the field and the member.
        let (status, body) = save(vec![
            ("max_gpus:alice", "2"),
            ("max_gpu_hours:alice", "40"),
            ("max_job_minutes:alice", ""),
            ("max_gpus:carol", "-1"),
            ("max_gpu_hours:carol", ""),
            ("max_job_minutes:carol", ""),
        ])
        .await;
        assert_eq!(status, 422, "[{backend:?}]");
        assert!(body.contains("max_gpus:carol"), "{body}");
        let (_, html) = page(&carol, &p, "/labs/vision/admin").await;
        assert!(
            html.contains("name=\"max_gpus:alice\" value=\"\""),
            "nothing was written"
        );
        // A good Save writes what changed, each change audited.
        let (status, _) = save(vec![
            ("max_gpus:alice", "2"),
            ("max_gpu_hours:alice", "40"),
            ("max_job_minutes:alice", ""),
            ("max_gpus:carol", ""),
            ("max_gpu_hours:carol", ""),
            ("max_job_minutes:carol", ""),
        ])
        .await;
        assert_eq!(status, 303, "[{backend:?}]");
        let (_, html) = page(&carol, &p, "/labs/vision/admin").await;
        assert!(html.contains("name=\"max_gpus:alice\" value=\"2\""));
        assert!(html.contains("name=\"max_gpu_hours:alice\" value=\"40\""));
        assert!(html.contains("0 in use of 2"), "use against the quota");
        let audit = &html[html.find("<h2>Audit log</h2>").unwrap()..];
        assert_eq!(
            audit.matches("set_member_quota").count(),
            1,
            "only alice changed"
        );
        assert!(audit.contains("member alice"));
        let (status, body) = save(vec![("max_cpus:alice", "3")]).await;
        assert_eq!(status, 422);
        assert!(body.contains("max_cpus:alice"));
        // Members cannot save quotas.
        let alice = BrowserSession::login(&p, "alice").await;
        let r = alice
            .post_form("/labs/vision/member-quotas", &[("max_gpus:alice", "9")])
            .await;
        assert_eq!(r.status(), 403);

        // The usage as CSV, for accounting; lab admins only.
        let r = carol
            .get(format!("{}/labs/vision/usage.csv", p.url))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        assert!(r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/csv"));
        let csv = r.text().await.unwrap();
        let mut lines = csv.lines();
        assert_eq!(lines.next(), Some("week_start,account,gpu_hours"));
        assert_eq!(csv.lines().count(), 1 + 26 * 3, "{csv}");
        assert!(csv.lines().skip(1).all(|l| l.split(',').count() == 3));
        let r = alice
            .get(format!("{}/labs/vision/usage.csv", p.url))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 403);
    }
}

per_backend! {
    async fn saved_job_templates_fill_the_form_and_are_each_users_own(backend: Backend) {
        let p = TestPortal::start(backend).await;
        let alice = BrowserSession::login(&p, "alice").await;
        let fields = |name: &'static str, command: &'static str| {
            [
                ("image", "commons-demo:latest"),
                ("command", command),
                ("env", "SEED=7"),
                ("gpus", "2"),
                ("cpus", "0.5"),
                ("memory_gb", "1"),
                ("time_limit_minutes", "90"),
                ("kind", "batch"),
                ("lab", "vision"),
                ("template_name", name),
                ("save_template", "1"),
            ]
        };
        let post = |form: [(&'static str, &'static str); 11]| {
            let alice = &alice;
            async move { alice.post_form("/jobs", &form).await }
        };
        // A name is needed; the error is beside its field and nothing is lost.
        let r = post(fields(" ", "python train.py")).await;
        assert_eq!(r.status(), 422, "[{backend:?}]");
        let body = r.text().await.unwrap();
        assert!(body.contains("id=\"template_name-error\""), "{body}");
        assert!(body.contains("python train.py"));
        // Saved, not submitted; the form comes back filled from it.
        let r = post(fields("resnet", "python train.py")).await;
        assert_eq!(r.status(), 303);
        let to = r.headers()["location"].to_str().unwrap().to_string();
        assert!(to.starts_with("/jobs/new?template="), "{to}");
        assert_eq!(
            p.get_json(&p.alice, "/api/v1/jobs").await,
            json!([]),
            "no job was submitted"
        );
        let (status, html) = page(&alice, &p, &to).await;
        assert_eq!(status, 200);
        assert!(
            html.contains(">python train.py</textarea>") && html.contains(">SEED=7</textarea>"),
            "{html}"
        );
        assert!(html.contains("name=\"gpus\" value=\"2\"") && html.contains("value=\"90\""));
        assert!(
            html.contains(">resnet</a>"),
            "listed under the user's templates"
        );
        // The same name replaces it.
        let r = post(fields("resnet", "python train.py --epochs 3")).await;
        assert_eq!(
            r.headers()["location"].to_str().unwrap(),
            to,
            "the same template"
        );
        let (_, html) = page(&alice, &p, &to).await;
        assert!(html.contains("--epochs 3"));
        assert_eq!(html.matches(">resnet</a>").count(), 1);
        // Another user's template is not found; deleting removes it.
        let bob = BrowserSession::login(&p, "bob").await;
        let (status, _) = page(&bob, &p, &to).await;
        assert_eq!(status, 404, "[{backend:?}]");
        let id = to.trim_start_matches("/jobs/new?template=");
        let delete = format!("/jobs/templates/{id}/delete");
        let r = bob.post_form(&delete, &[]).await;
        assert_eq!(r.status(), 404, "bob cannot delete alice's template");
        let r = alice.post_form(&delete, &[]).await;
        assert_eq!(r.status(), 303);
        let (status, _) = page(&alice, &p, &to).await;
        assert_eq!(status, 404, "deleted");
    }
}
