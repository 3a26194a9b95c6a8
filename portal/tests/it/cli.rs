//! The `commons` CLI end to end: the real binary (built from `cli/`) against a real
//! portal and agent (fake GPUs, the real Docker Engine), checked against the API.

use crate::support::harness::{Backend, TestPortal};
use serde_json::Value;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Output, Stdio};
use std::time::Duration;

const T: Duration = Duration::from_secs(60);

/// The CLI with a configuration folder of its own (`XDG_CONFIG_HOME`).
pub struct Cli {
    pub bin: PathBuf,
    pub config: tempfile::TempDir,
    pub env: Vec<(String, String)>,
}

pub struct Ran {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl std::fmt::Display for Ran {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {}\n--- stdout\n{}--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

impl From<Output> for Ran {
    fn from(o: Output) -> Ran {
        Ran {
            code: o.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }
}

impl Cli {
    pub fn new() -> Cli {
        Cli {
            bin: crate::support::cluster::cli_binary(),
            config: tempfile::tempdir().unwrap(),
            env: Vec::new(),
        }
    }

    pub fn command(&self, args: &[&str]) -> tokio::process::Command {
        let mut c = tokio::process::Command::new(&self.bin);
        c.args(args)
            .env_remove("COMMONS_URL")
            .env_remove("COMMONS_TOKEN")
            .env_remove("NO_COLOR")
            .env_remove("BROWSER")
            .env_remove("DISPLAY")
            .env("XDG_CONFIG_HOME", self.config.path())
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .kill_on_drop(true);
        c
    }

    /// Runs `commons ARGS` to its end (at most two minutes).
    pub async fn run(&self, args: &[&str]) -> Ran {
        let out = tokio::time::timeout(Duration::from_secs(120), self.command(args).output())
            .await
            .unwrap_or_else(|_| panic!("commons {args:?} did not end within 2 minutes"))
            .unwrap();
        out.into()
    }

    /// The same, which must succeed.
    pub async fn ok(&self, args: &[&str]) -> Ran {
        let r = self.run(args).await;
        assert_eq!(r.code, 0, "commons {args:?}: {r}");
        r
    }

    pub fn credentials(&self) -> PathBuf {
        self.config
            .path()
            .join("gpu-commons")
            .join("credentials.toml")
    }
}

/// `commons ARGS` must fail with `code` and say it in one line that contains `says`.
pub async fn refused(cli: &Cli, args: &[&str], code: i32, says: &str) -> Ran {
    let r = cli.run(args).await;
    assert_eq!(r.code, code, "commons {args:?}: {r}");
    assert_eq!(
        r.stderr.lines().count(),
        1,
        "one line: commons {args:?}: {r}"
    );
    assert!(
        r.stderr.starts_with("commons: ") && r.stderr.contains(says),
        "commons {args:?} should say {says:?}: {r}"
    );
    r
}

const RES: [&str; 6] = ["--cpus", "0.5", "--memory", "0.25", "--time", "5m"];

fn run_args(follow: bool, cmd: &str) -> Vec<&str> {
    let mut v = vec!["run", "commons-demo:latest"];
    v.extend(RES);
    if follow {
        v.push("--follow");
    }
    v.extend(["--", "sh", "-c", cmd]);
    v
}

pub async fn signed_in(p: &TestPortal, token: &str) -> Cli {
    let cli = Cli::new();
    let r = cli.ok(&["login", &p.url, "--token", token]).await;
    assert!(r.stderr.contains("signed in to"), "{r}");
    cli
}

per_backend! {
    async fn cli_runs_follows_lists_and_cancels_as_the_api_says(backend: Backend) {
        let p = TestPortal::start(backend).await;
        let _agent = p.agent("vision", "fake:2xA100-80GB").await;
        let cli = signed_in(&p, &p.alice).await;

        // The credential is the user's alone.
        let mode = std::fs::metadata(cli.credentials())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "[{backend:?}]");
        let dir_mode = std::fs::metadata(cli.credentials().parent().unwrap())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(dir_mode & 0o777, 0o700);
        let me: Value = serde_json::from_str(&cli.ok(&["whoami", "--json"]).await.stdout).unwrap();
        assert_eq!(me["username"], "alice");
        assert_eq!(me["labs"][0]["slug"], "vision");
        let who = cli.ok(&["whoami"]).await;
        assert!(
            who.stdout.contains("alice") && who.stdout.contains("vision"),
            "{who}"
        );

        // run --follow: the job's output on stdout, its states on stderr, its exit code.
        let r = cli
            .run(&run_args(
                true,
                "echo hello from the job; echo to stderr >&2; exit 3",
            ))
            .await;
        assert_eq!(r.code, 3, "[{backend:?}] the job's exit code: {r}");
        assert!(r.stdout.contains("hello from the job"), "{r}");
        assert!(r.stdout.contains("to stderr"), "{r}");
        for s in ["queued", "running", "failed"] {
            assert!(r.stderr.contains(s), "[{backend:?}] state {s} shown: {r}");
        }
        assert!(
            !r.stdout.contains('\x1b') && !r.stderr.contains('\x1b'),
            "no colour off a terminal"
        );
        let r = cli.run(&run_args(true, "echo fine")).await;
        assert_eq!(r.code, 0, "{r}");
        assert_eq!(r.stdout, "fine\n", "stdout is the job's output only");

        // logs -f follows a job that is still writing, to its end; it agrees with the API.
        let id: i64 = cli
            .ok(&run_args(
                false,
                "for i in 1 2 3; do echo line$i; sleep 1; done",
            ))
            .await
            .stdout
            .trim()
            .parse()
            .unwrap();
        let r = cli.ok(&["logs", "-f", &id.to_string()]).await;
        assert_eq!(r.stdout, "line1\nline2\nline3\n", "[{backend:?}] {r}");
        assert_eq!(p.logs(&p.alice, id).await, r.stdout);
        assert_eq!(cli.ok(&["logs", &id.to_string()]).await.stdout, r.stdout);

        // A job that runs: ls, show and events agree with the API.
        let sleeper: i64 = cli
            .ok(&run_args(false, "echo sleeping; sleep 300"))
            .await
            .stdout
            .trim()
            .parse()
            .unwrap();
        p.wait_state(&p.alice, sleeper, &["running"], T).await;
        let listed: Value = serde_json::from_str(&cli.ok(&["ls", "--json"]).await.stdout).unwrap();
        let api = p.get_json(&p.alice, "/api/v1/jobs").await;
        let ids = |v: &Value| -> Vec<(i64, String)> {
            v.as_array()
                .unwrap()
                .iter()
                .map(|j| {
                    (
                        j["id"].as_i64().unwrap(),
                        j["state"].as_str().unwrap().to_string(),
                    )
                })
                .collect()
        };
        assert_eq!(ids(&listed), ids(&api), "[{backend:?}]");
        assert_eq!(listed.as_array().unwrap().len(), 4);
        let table = cli.ok(&["ls"]).await.stdout;
        let header = table.lines().next().unwrap();
        assert!(header.starts_with("ID") && header.contains("STATE") && header.contains("NODE"));
        let row = table
            .lines()
            .find(|l| l.starts_with(&format!("{sleeper} ")))
            .unwrap_or_else(|| panic!("job {sleeper} listed:\n{table}"));
        assert!(
            row.contains("running") && row.contains("vision-server"),
            "{row}"
        );
        // The columns line up: each column starts at the same place in every line.
        let state_at = header.find("STATE").unwrap();
        assert!(
            table
                .lines()
                .skip(1)
                .all(|l| l[state_at..].starts_with(|c: char| c.is_ascii_lowercase())),
            "{table}"
        );
        let running = cli.ok(&["ls", "--state", "running", "--json"]).await.stdout;
        let running: Value = serde_json::from_str(&running).unwrap();
        assert_eq!(ids(&running), vec![(sleeper, "running".to_string())]);

        let shown: Value = serde_json::from_str(
            &cli.ok(&["show", &sleeper.to_string(), "--json"])
                .await
                .stdout,
        )
        .unwrap();
        let api = p.job(&p.alice, sleeper).await;
        for k in [
            "id", "state", "node", "gpus", "attempts", "image", "command", "lab",
        ] {
            assert_eq!(shown[k], api[k], "[{backend:?}] show's {k}");
        }
        let text = cli.ok(&["show", &sleeper.to_string()]).await.stdout;
        assert!(
            text.contains("running") && text.contains("vision-server"),
            "{text}"
        );
        assert!(
            !text.contains("estimated start"),
            "only while it waits: {text}"
        );

        // A job that waits for both GPUs: show prints the scheduler's estimated start,
        // the API's time (the sleeper's 5-minute limit bounds it).
        let mut wide = vec!["run", "commons-demo:latest", "--gpus", "2"];
        wide.extend(RES);
        wide.extend(["--", "true"]);
        let waiter: i64 = cli.ok(&wide).await.stdout.trim().parse().unwrap();
        let me = &p;
        crate::support::harness::wait_for(T, "an estimated start", || async move {
            me.job(&me.alice, waiter).await["estimated_start_at"].is_string()
        })
        .await;
        let api = p.job(&p.alice, waiter).await;
        assert_eq!(api["state"], "queued", "[{backend:?}] {api}");
        let shown: Value = serde_json::from_str(
            &cli.ok(&["show", &waiter.to_string(), "--json"])
                .await
                .stdout,
        )
        .unwrap();
        assert_eq!(shown["estimated_start_at"], api["estimated_start_at"]);
        let at = chrono::NaiveDateTime::parse_from_str(
            api["estimated_start_at"].as_str().unwrap(),
            "%Y-%m-%dT%H:%M:%S%.f",
        )
        .unwrap();
        let text = cli.ok(&["show", &waiter.to_string()]).await.stdout;
        let line = text
            .lines()
            .find(|l| l.starts_with("estimated start"))
            .unwrap_or_else(|| panic!("[{backend:?}] no estimated start shown:\n{text}"));
        let want = at.format("%Y-%m-%d %H:%M:%S UTC").to_string();
        assert!(line.ends_with(&want), "[{backend:?}] {line} is not {want}");
        cli.ok(&["cancel", &waiter.to_string()]).await;
        p.wait_state(&p.alice, waiter, &["cancelled"], T).await;
        let events: Value =
            serde_json::from_str(&cli.ok(&["events", &id.to_string(), "--json"]).await.stdout)
                .unwrap();
        assert_eq!(
            events,
            p.get_json(&p.alice, &format!("/api/v1/jobs/{id}/events"))
                .await
        );

        // cancel: the API says cancelled; a second cancel is refused in one line.
        let r = cli.ok(&["cancel", &sleeper.to_string()]).await;
        assert!(
            r.stdout.contains(&format!("job {sleeper} cancelled")),
            "{r}"
        );
        let j = p.wait_state(&p.alice, sleeper, &["cancelled"], T).await;
        assert_eq!(j["state"], "cancelled");
        let r = cli.run(&["cancel", &sleeper.to_string()]).await;
        assert_eq!(r.code, 1, "{r}");
        assert_eq!(r.stderr.lines().count(), 1, "{r}");
        // Another user's job is not found, in one line.
        refused(&cli, &["show", "999999"], 1, "not found").await;

        // Nodes: the agent's server with its GPUs.
        let nodes = cli.ok(&["nodes"]).await.stdout;
        assert!(
            nodes.contains("vision-server") && nodes.contains("2x A100"),
            "{nodes}"
        );
        let usage: Value =
            serde_json::from_str(&cli.ok(&["usage", "--json"]).await.stdout).unwrap();
        assert_eq!(usage[0]["lab"], "vision");
        assert!(
            usage[0]["members"][0]["gpu_hours"][0].as_f64().unwrap() > 0.0,
            "{usage}"
        );

        // A lab admin lists the lab's jobs with their owners; a member may not.
        let carol = signed_in(&p, &p.carol).await;
        let all = carol.ok(&["ls", "--all"]).await.stdout;
        assert!(all.lines().next().unwrap().contains("USER"), "{all}");
        assert!(
            all.contains("alice") && all.contains(&sleeper.to_string()),
            "{all}"
        );
        refused(&cli, &["ls", "--all", "--lab", "vision"], 5, "forbidden").await;
        refused(
            &cli,
            &["usage", "--lab", "vision"],
            5,
            "only the lab's admins",
        )
        .await;
        let lab: Value = serde_json::from_str(
            &carol
                .ok(&["usage", "--lab", "vision", "--json"])
                .await
                .stdout,
        )
        .unwrap();
        assert!(lab[0]["weeks"][0]["used"].as_f64().unwrap() > 0.0, "{lab}");
        p.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_refuses_bad_input_before_sending_naming_the_field() {
    let p = TestPortal::start(Backend::Sqlite).await;
    let cli = signed_in(&p, &p.alice).await;
    let base = ["run", "commons-demo:latest"];
    for (extra, field) in [
        (vec!["--gpus", "0"], "invalid gpus"),
        (vec!["--gpus", "17"], "invalid gpus"),
        (vec!["--time", "0"], "invalid time_limit_minutes"),
        (vec!["--time", "2x"], "invalid time_limit_minutes"),
        (vec!["-e", "COMMONS_JOB=1"], "invalid env"),
        (vec!["-e", "NOEQUALS"], "invalid env"),
        (vec!["--cpus", "0"], "invalid cpus"),
        (vec!["--memory", "0"], "invalid memory_gb"),
        (vec!["--lab", "Not A Lab"], "invalid lab"),
        (
            vec!["--checkpoint-minutes", "0"],
            "invalid checkpoint_minutes",
        ),
    ] {
        let mut args: Vec<&str> = base.to_vec();
        args.extend(extra);
        args.extend(["--", "true"]);
        refused(&cli, &args, 2, field).await;
    }
    refused(
        &cli,
        &["run", "Not An Image", "--", "true"],
        2,
        "invalid image",
    )
    .await;
    // Nothing reached the portal.
    assert_eq!(
        p.get_json(&p.alice, "/api/v1/jobs").await,
        serde_json::json!([])
    );
    // A rule only the portal can check comes back with its field, the same way.
    refused(
        &cli,
        &[
            "run",
            "commons-demo:latest",
            "--lab",
            "physics",
            "--",
            "true",
        ],
        2,
        "invalid lab: you are not a member of lab \"physics\"",
    )
    .await;

    // Job files: the API's fields; unknown keys and bad values named, with the line.
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    };
    let typo = file(
        "typo.toml",
        "image = \"commons-demo:latest\"\ngpus = 1\ntime_limit_minutes = 5\ngpu_model = \"A100\"\n",
    );
    refused(
        &cli,
        &["submit", &typo],
        2,
        "line 4: unknown field `gpu_model`",
    )
    .await;
    let bad = file(
        "bad.toml",
        "image = \"commons-demo:latest\"\ngpus = 0\ntime_limit_minutes = 5\n",
    );
    refused(&cli, &["submit", &bad], 2, "invalid gpus").await;
    let wrong_type = file(
        "type.toml",
        "image = \"commons-demo:latest\"\ngpus = \"one\"\ntime_limit_minutes = 5\n",
    );
    refused(&cli, &["submit", &wrong_type], 2, "line 2 (gpus)").await;
    assert_eq!(
        p.get_json(&p.alice, "/api/v1/jobs").await,
        serde_json::json!([])
    );
    let good = file(
        "job.toml",
        "image = \"commons-demo:latest\"\ncommand = [\"sh\", \"-c\", \"echo from a file\"]\ngpus = 1\n\
         time_limit_minutes = 5\ncpus = 0.5\nmemory_gb = 0.25\n[env]\nGREETING = \"hi\"\n",
    );
    let r = cli.ok(&["submit", &good, "--json"]).await;
    let job: Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(job["state"], "queued");
    assert_eq!(job["command"][2], "echo from a file");
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_failures_are_one_clear_line_and_a_nonzero_exit() {
    let p = TestPortal::start(Backend::Sqlite).await;
    let fresh = Cli::new();
    refused(
        &fresh,
        &["ls"],
        4,
        "not signed in: run `commons login URL` first",
    )
    .await;

    // A portal that cannot be reached.
    let mut down = Cli::new();
    down.env = vec![
        ("COMMONS_URL".into(), "http://127.0.0.1:9".into()),
        ("COMMONS_TOKEN".into(), "gcp_whatever".into()),
    ];
    refused(
        &down,
        &["ls"],
        3,
        "cannot reach the portal at http://127.0.0.1:9",
    )
    .await;
    refused(
        &fresh,
        &["login", "http://127.0.0.1:9", "--token", "x"],
        3,
        "cannot reach",
    )
    .await;

    // An expired token, at login and once stored; a revoked one.
    let db = p.portal.state.db.clone();
    let (expired, revoked) = db
        .run_blocking(|c| {
            let alice = commons_portal::db::users::user_by_name(c, "alice")?.unwrap();
            let past = commons_portal::db::now() - chrono::Duration::days(1);
            Ok::<_, commons_portal::error::AppError>((
                commons_portal::db::users::create_api_token_until(c, alice.id, "old", Some(past))?,
                commons_portal::db::users::create_api_token(c, alice.id, "to revoke")?,
            ))
        })
        .unwrap();
    let cli = Cli::new();
    refused(
        &cli,
        &["login", &p.url, "--token", &expired],
        4,
        "the portal refused the token (the access token is unknown, expired or revoked)",
    )
    .await;
    assert!(!cli.credentials().exists(), "a refused token is not stored");
    std::fs::create_dir_all(cli.credentials().parent().unwrap()).unwrap();
    std::fs::write(
        cli.credentials(),
        format!("url = \"{}\"\ntoken = \"{expired}\"\n", p.url),
    )
    .unwrap();
    refused(
        &cli,
        &["ls"],
        4,
        &format!("sign in again: commons login {}", p.url),
    )
    .await;
    cli.ok(&["login", &p.url, "--token", &revoked]).await;
    cli.ok(&["ls"]).await;
    db.run_blocking(|c| {
        let alice = commons_portal::db::users::user_by_name(c, "alice")?.unwrap();
        let tokens = commons_portal::db::users::tokens_of(c, alice.id)?;
        let t = tokens.iter().find(|t| t.name == "to revoke").unwrap();
        commons_portal::db::users::revoke_token(c, alice.id, t.id)
    })
    .unwrap();
    refused(&cli, &["ls"], 4, "the portal refused the token").await;

    // 403: a member asking for what only admins may see.
    let alice = signed_in(&p, &p.alice).await;
    refused(&alice, &["usage", "--lab", "vision"], 5, "forbidden: ").await;
    refused(&alice, &["ls", "--all"], 5, "you administer no lab").await;

    // Logout forgets the credential.
    alice.ok(&["logout"]).await;
    assert!(!alice.credentials().exists());
    refused(&alice, &["ls"], 4, "not signed in").await;

    // Completions and man pages.
    let bash = fresh.ok(&["completions", "bash"]).await.stdout;
    assert!(
        bash.contains("commons") && bash.contains("ssh-config"),
        "bash completion"
    );
    let man = tempfile::tempdir().unwrap();
    fresh
        .ok(&["man", "--dir", man.path().to_str().unwrap()])
        .await;
    for page in ["commons.1", "commons-run.1", "commons-login.1"] {
        assert!(man.path().join(page).exists(), "{page}");
    }
    p.stop().await;
}
