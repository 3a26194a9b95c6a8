//! The checkpoint store's caps as parts arrive, acting as the agent with a real node
//! credential: the attempt's cap, the lab's cap (also under concurrent uploads), and the
//! local store's free-space floor on a real small filesystem (a tmpfs mounted for the
//! test) holding the SQLite database too, as the default layout does.

use super::*;
use commons_portal::config::CheckpointsConfig;
use std::process::Command;

/// 40 kB parts: the caps below are a few of them.
const PART: usize = 40_000;

async fn lab_id(p: &TestPortal, slug: &'static str) -> i64 {
    run(p, move |c| db::users::lab_by_slug(c, slug)).await.id
}

per_backend! {
    /// An agent uploads more than its attempt's cap, part by part: the part that goes over
    /// is refused with the cap and the figures, and nothing of the upload is kept.
    async fn an_attempt_uploading_past_its_cap_in_parts_is_refused_and_nothing_is_kept(backend: Backend) {
        let (p, _dir) = portal_with(backend, &Kind::File, None, |k| {
            k.attempt_cap_gb = 0.0001;
        })
        .await;
        let (node, credential) = enrol(&p, "vision", "vision-a").await;
        let a = Agent { p: &p, credential };
        let job = running_job(&p, node).await;
        let data = archive(200_000, 1);
        // Two parts: 80 kB of the 100 kB cap. A part sent again counts once.
        a.upload(job, 1, &data, PART, Some(&[0, 1])).await;
        a.upload(job, 1, &data, PART, Some(&[1])).await;
        assert_eq!(staged(&p, job, 1).await, (2, 80_000), "[{backend:?}]");
        // The third would make 120 kB: refused, naming the cap and the figures.
        let third = &data[2 * PART..3 * PART];
        let (status, v) = a.put(job, 1, 2, third, &sha(third)).await;
        assert_eq!(
            (status, v["error"].as_str()),
            (409, Some("checkpoint_attempt_cap")),
            "[{backend:?}] {v}"
        );
        assert_eq!(
            v["message"],
            format!(
                "job {job} attempt 1's checkpoint would take 0.00012 GB, over the attempt's cap \
                 of 0.0001 GB: its upload is discarded"
            ),
            "[{backend:?}]"
        );
        // Nothing of it is kept: not the part, nor the upload it belonged to.
        assert_eq!(a.parts(job, 1).await, (200, json!([])), "[{backend:?}]");
        assert_eq!(staged(&p, job, 1).await, (0, 0), "[{backend:?}]");
        let store = p.portal.state.checkpoints.clone();
        let left = store.parts(&store::commit_prefix(job, 1, 1)).await.unwrap();
        assert!(left.is_empty(), "[{backend:?}] {left:?}");
        // A checkpoint within the cap is stored as before.
        let small = archive(90_000, 2);
        a.upload(job, 1, &small, PART, None).await;
        let (status, v) = a.commit(job, 1, 3, &small).await;
        assert_eq!(status, 200, "[{backend:?}] {v}");
        assert_eq!(
            staged(&p, job, 1).await,
            (0, 0),
            "committed: no longer staged"
        );
        p.stop().await;
    }
}

per_backend! {
    /// A lab's use is its committed checkpoints and its staged parts, counted as each part
    /// arrives: an agent that uploads past the lab's cap in parts is refused at the part
    /// that goes over. A job replacing its oldest checkpoint is not counted twice.
    async fn a_lab_past_its_cap_is_refused_part_by_part(backend: Backend) {
        let (p, _dir) = portal(backend, &Kind::File, None).await;
        let (node, credential) = enrol(&p, "vision", "vision-a").await;
        let a = Agent { p: &p, credential };
        let vision = lab_id(&p, "vision").await;
        run(&p, move |c| rows::set_lab_cap(c, vision, Some(0.0002))).await;
        let one = running_job(&p, node).await;
        let two = running_job(&p, node).await;
        // Job one keeps two checkpoints of 80 kB: 160 of the lab's 200 kB.
        for seed in [1, 2] {
            let d = archive(2 * PART, seed);
            a.upload(one, 1, &d, PART, None).await;
            assert_eq!(a.commit(one, 1, 2, &d).await.0, 200, "[{backend:?}]");
        }
        // Its third replaces the oldest at commit (keep_per_job = 2): 160 - 80 + 80.
        let d = archive(2 * PART, 3);
        a.upload(one, 1, &d, PART, None).await;
        assert_eq!(a.commit(one, 1, 2, &d).await.0, 200, "[{backend:?}]");
        // Job two: one part fits (200 kB), the next does not.
        let d = archive(3 * PART, 4);
        a.upload(two, 1, &d, PART, Some(&[0])).await;
        let second = &d[PART..2 * PART];
        let (status, v) = a.put(two, 1, 1, second, &sha(second)).await;
        assert_eq!(
            (status, v["error"].as_str()),
            (409, Some("checkpoint_cap")),
            "[{backend:?}] {v}"
        );
        assert_eq!(
            v["message"], "lab vision's checkpoints would use 0.00024 of 0.0002 GB",
            "[{backend:?}]"
        );
        assert_eq!(staged(&p, two, 1).await, (0, 0), "[{backend:?}] discarded");
        assert_eq!(a.parts(two, 1).await, (200, json!([])), "[{backend:?}]");
        // With the cap raised, the same upload goes through.
        run(&p, move |c| rows::set_lab_cap(c, vision, Some(0.0003))).await;
        a.upload(two, 1, &d, PART, None).await;
        assert_eq!(a.commit(two, 1, 3, &d).await.0, 200, "[{backend:?}]");
        p.stop().await;
    }
}

per_backend! {
    /// Twelve agents' parts of one lab at the same moment, each one fitting alone: exactly
    /// as many pass as the cap holds (the lab is locked while a part is counted and staged).
    /// Four rounds, the cap raised by what the last one staged: a race shows in most rounds.
    async fn concurrent_uploads_of_one_lab_cannot_pass_its_cap_together(backend: Backend) {
        let (p, _dir) = portal(backend, &Kind::File, None).await;
        let (node, credential) = enrol(&p, "vision", "vision-a").await;
        let a = Agent { p: &p, credential };
        let vision = lab_id(&p, "vision").await;
        let data = archive(30_000, 1);
        let sum = sha(&data);
        let store = p.portal.state.checkpoints.clone();
        for round in 0..4 {
            // 100 kB free this round: 3 parts of 30 kB fit, the 4th would not.
            let cap = 0.0001 + f64::from(round) * 0.00009;
            run(&p, move |c| rows::set_lab_cap(c, vision, Some(cap))).await;
            let mut jobs = Vec::new();
            for _ in 0..12 {
                jobs.push(running_job(&p, node).await);
            }
            let answers =
                futures_util::future::join_all(jobs.iter().map(|&j| a.put(j, 1, 0, &data, &sum)))
                    .await;
            let passed = answers.iter().filter(|(s, _)| *s == 200).count();
            let refused = answers
                .iter()
                .filter(|(s, v)| *s == 409 && v["error"] == "checkpoint_cap")
                .count();
            assert_eq!(
                (passed, refused),
                (3, 9),
                "[{backend:?}] round {round}: 3 parts of 30 kB fit in 100 kB: {answers:?}"
            );
            let staged_bytes = run(&p, move |c| {
                db::checkpoint_parts::staged_bytes_of_lab(c, vision)
            })
            .await;
            assert_eq!(staged_bytes, 90_000 * i64::from(round + 1), "[{backend:?}]");
            let mut objects = 0;
            for &j in &jobs {
                objects += store
                    .parts(&store::commit_prefix(j, 1, 1))
                    .await
                    .unwrap()
                    .len();
            }
            assert_eq!(
                objects, 3,
                "[{backend:?}] only the parts that passed are kept"
            );
        }
        p.stop().await;
    }
}

/// A tmpfs of `mib` MiB mounted on a fresh directory for the test; unmounted on drop.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(mib: u64) -> Tmpfs {
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(dir.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "the floor test mounts a small tmpfs (it needs root, or CAP_SYS_ADMIN): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs { dir }
    }

    fn path(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// (bytes free to the portal, bytes in all), as `df` would say.
    fn space(&self) -> (u64, u64) {
        let out = Command::new("df")
            .args(["--block-size=1", "--output=avail,size"])
            .arg(self.path())
            .output()
            .unwrap();
        assert!(out.status.success(), "df failed");
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let nums: Vec<u64> = text
            .lines()
            .nth(1)
            .unwrap_or_else(|| panic!("df said {text:?}"))
            .split_whitespace()
            .map(|n| n.parse().unwrap())
            .collect();
        (nums[0], nums[1])
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.path()).output();
    }
}

/// The default layout (the store beside the SQLite file) on a small filesystem: an agent
/// uploading part after part is refused with 507 before the store passes its floor, and
/// the database beside it still takes writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_at_its_floor_refuses_uploads_and_the_database_beside_it_keeps_working() {
    let fs = Tmpfs::mount(32);
    let url = format!("sqlite://{}", fs.path().join("commons.db").display());
    let p = TestPortal::builder(Backend::Sqlite)
        .config(|c| {
            c.database_url = url;
            c.checkpoints = CheckpointsConfig {
                part_mb: 1,
                min_free_gb: 0.0,
                min_free_percent: 50.0,
                ..Default::default()
            };
        })
        .start()
        .await;
    p.portal.scheduler.abort();
    let (node, credential) = enrol(&p, "vision", "vision-a").await;
    let a = Agent { p: &p, credential };
    let job = running_job(&p, node).await;
    let (_, size) = fs.space();
    let floor = size / 2;
    let mut n = 0u32;
    let (status, v) = loop {
        let data = archive(1 << 20, n as u8);
        let (status, v) = a.put(job, 1, n, &data, &sha(&data)).await;
        if status != 200 {
            break (status, v);
        }
        n += 1;
        assert!(
            n < 32,
            "never refused: the filesystem is full ({:?})",
            fs.space()
        );
    };
    let (free, _) = fs.space();
    println!("refused part {n} with {free} of {size} bytes free (floor {floor}): {status} {v}");
    assert_eq!(
        (status, v["error"].as_str()),
        (507, Some("insufficient_storage")),
        "{v}"
    );
    let message = v["message"].as_str().unwrap();
    assert!(
        message.contains("free") && message.contains("floor") && message.contains("50 %"),
        "{message}"
    );
    assert!(n >= 10, "parts went in until the floor came near: {n}");
    assert!(
        free + (1 << 20) >= floor,
        "refused before the floor: {free} free, floor {floor}"
    );
    // The refused part was not kept, the others are.
    let (status, listed) = a.parts(job, 1).await;
    assert_eq!(status, 200);
    assert_eq!(listed.as_array().unwrap().len(), n as usize, "{listed}");
    // The database beside the store still takes writes.
    let id = p
        .submit(
            &p.alice,
            json!({"image": "commons-demo:latest", "gpus": 1, "time_limit_minutes": 5}),
        )
        .await;
    assert!(id > job);
    p.stop().await;
}
