//! The Docker Engine's own timeline of the tests' containers (`docker events`), which the
//! tests that must never run a job twice judge: watched from before the submission, and
//! a judgement fails unless it saw every container it judges.

// `crate::cluster`: where the tests and the soak example both have it.
use crate::cluster::demo_image;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// The Docker Engine's own record of when each container of the tests' jobs ran:
/// `docker events` for every container labelled with a job, watched from before the job
/// is submitted, so no container can start unseen.
pub struct Timeline {
    child: Child,
    out: PathBuf,
    _dir: tempfile::TempDir,
}

/// One container: (attempt, start ns, end ns); still running ends at `u128::MAX`.
pub type Interval = (String, u128, u128);

impl Timeline {
    /// Starts watching, and returns once the stream demonstrably delivers: a marker
    /// container of its own (created, never started, removed) was seen. Start it before
    /// submitting the jobs it judges.
    pub fn start() -> Timeline {
        demo_image();
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("events");
        let file = std::fs::File::create(&out).unwrap();
        let child = Command::new("docker")
            .args([
                "events",
                "--filter",
                "label=commons.job",
                "--filter",
                "type=container",
                "--format",
                "{{.TimeNano}} {{.Action}} {{index .Actor.Attributes \"commons.job\"}} \
                 {{index .Actor.Attributes \"commons.attempt\"}} {{.Actor.ID}}",
            ])
            .stdout(file)
            .spawn()
            .unwrap();
        let t = Timeline {
            child,
            out,
            _dir: dir,
        };
        // `docker events` reports only what happens after it has subscribed, which a
        // busy machine may take a while to do: a marker container is made every few
        // seconds until one is reported.
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut markers = Vec::new();
        'seen: loop {
            let marker = format!("timeline-{:016x}", rand::random::<u64>());
            let created = Command::new("docker")
                .args(["create", "--name", &marker, "--label"])
                .arg(format!("commons.job={marker}"))
                .args(["commons-demo:latest", "true"])
                .output()
                .unwrap();
            assert!(
                created.status.success(),
                "docker create: {}",
                String::from_utf8_lossy(&created.stderr)
            );
            markers.push(marker);
            let next = Instant::now() + Duration::from_secs(3);
            while Instant::now() < next {
                let out = std::fs::read_to_string(&t.out).unwrap_or_default();
                if markers
                    .iter()
                    .any(|m| out.contains(&format!(" create {m} ")))
                {
                    break 'seen;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            assert!(
                Instant::now() < deadline,
                "docker events reported none of {} marker containers within 120 s",
                markers.len()
            );
        }
        for m in &markers {
            let _ = Command::new("docker").args(["rm", "-f", m]).output();
        }
        t
    }

    /// Each container of `job`: (attempt, start ns, end ns), in start order; one still
    /// running ends at `u128::MAX`.
    pub fn intervals(&self, job: i64) -> Vec<Interval> {
        let text = std::fs::read_to_string(&self.out).unwrap_or_default();
        let job = job.to_string();
        let mut by_id: BTreeMap<String, Interval> = BTreeMap::new();
        for line in text.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            let [t, action, j, attempt, id] = f[..] else {
                continue;
            };
            if j != job {
                continue;
            }
            let t: u128 = t.parse().unwrap_or(0);
            let e =
                by_id
                    .entry(id.to_string())
                    .or_insert((attempt.to_string(), u128::MAX, u128::MAX));
            match action {
                "start" => e.1 = e.1.min(t),
                "die" => e.2 = t,
                _ => {}
            }
        }
        let mut iv: Vec<Interval> = by_id
            .into_values()
            .filter(|(_, s, _)| *s != u128::MAX)
            .collect();
        iv.sort_by_key(|(_, s, _)| *s);
        iv
    }

    /// Waits up to `within` until the containers of `job` satisfy `ok`; returns them.
    pub async fn wait(
        &self,
        job: i64,
        within: Duration,
        what: &str,
        ok: impl Fn(&[Interval]) -> bool,
    ) -> Vec<Interval> {
        let deadline = Instant::now() + within;
        loop {
            let iv = self.intervals(job);
            if ok(&iv) {
                return iv;
            }
            assert!(
                Instant::now() < deadline,
                "job {job}: {what} not seen on the engine within {within:?}: {iv:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Asserts that exactly `containers` containers of `job` ran (waiting up to 30 s for
    /// the engine's events to show them all: fewer is a failure, never a pass), and no
    /// two at the same time.
    pub async fn assert_no_overlap(&self, job: i64, containers: usize) {
        self.assert_no_overlap_within(job, containers, Duration::from_secs(30))
            .await
    }

    /// The same, waiting up to `within` for the containers to show.
    pub async fn assert_no_overlap_within(&self, job: i64, containers: usize, within: Duration) {
        let iv = self
            .wait(job, within, &format!("{containers} containers"), |iv| {
                iv.len() >= containers
            })
            .await;
        assert_eq!(
            iv.len(),
            containers,
            "job {job} ran {} containers, not {containers}: {iv:?}",
            iv.len()
        );
        for w in iv.windows(2) {
            assert!(
                w[0].2 <= w[1].1,
                "attempts {} and {} of job {job} ran at the same time: {iv:?}",
                w[0].0,
                w[1].0
            );
        }
    }
}

impl Drop for Timeline {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts a container labelled as attempt `attempt` of `job` (as an agent would), running
/// `sleep 60`; its id.
fn labelled(job: i64, attempt: u32) -> String {
    let out = Command::new("docker")
        .args(["run", "-d", "--label"])
        .arg(format!("commons.job={job}"))
        .arg("--label")
        .arg(format!("commons.attempt={attempt}"))
        .args(["commons-demo:latest", "sleep", "60"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "docker run: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The judgement can fail: it sees a container started right after the watch began, it
/// fails when it saw fewer containers than it judges (it once passed with none or one),
/// and when two ran at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_judgement_fails_on_fewer_containers_than_judged_or_two_at_once() {
    let t = std::sync::Arc::new(Timeline::start());
    let job = 2_000_000_000 + i64::from(rand::random::<u32>() % 1_000_000_000);
    let first = labelled(job, 1);
    t.assert_no_overlap(job, 1).await;
    let fewer = {
        let t = t.clone();
        tokio::spawn(async move {
            t.assert_no_overlap_within(job, 2, Duration::from_secs(3))
                .await
        })
    };
    assert!(
        fewer.await.is_err_and(|e| e.is_panic()),
        "one container seen, two judged: a failure"
    );
    let second = labelled(job, 2);
    let both = {
        let t = t.clone();
        tokio::spawn(async move { t.assert_no_overlap(job, 2).await })
    };
    assert!(
        both.await.is_err_and(|e| e.is_panic()),
        "two at once: a failure"
    );
    for id in [first, second] {
        let _ = Command::new("docker").args(["rm", "-f", &id]).output();
    }
}
