use super::*;

const GPU: &str = "GPU-a";

fn share(milli: u32, gb: u64) -> Hold {
    Hold {
        gpus: vec![GPU.into()],
        share: Some(GpuShare {
            milli,
            memory_mb: gb * 1024,
        }),
    }
}

fn whole(gpus: &[&str]) -> Hold {
    Hold {
        gpus: gpus.iter().map(|g| g.to_string()).collect(),
        share: None,
    }
}

fn forty(_: &str) -> Option<u64> {
    Some(40 * 1024)
}

#[test]
fn shares_fit_until_compute_or_memory_runs_out() {
    let mode = Some(ShareMode::Mps);
    let two = [share(500, 20), share(250, 10)];
    assert_eq!(admit(mode, &two, &share(250, 10), forty), Ok(()));
    let err = admit(mode, &two, &share(300, 5), forty).unwrap_err();
    assert_eq!(
        err,
        "not started: GPU GPU-a has 0.25 of its compute free, this share needs 0.3"
    );
    let err = admit(mode, &two, &share(100, 11), forty).unwrap_err();
    assert_eq!(
        err,
        "not started: GPU GPU-a has 10 GB of its memory free, this share needs 11 GB"
    );
    // Unknown memory: compute alone decides.
    assert_eq!(admit(mode, &two, &share(250, 100), |_| None), Ok(()));
    // Shares of another GPU take nothing from this one.
    let other = Hold {
        gpus: vec!["GPU-b".into()],
        ..share(900, 39)
    };
    assert_eq!(admit(mode, [&other], &share(900, 39), forty), Ok(()));
}

#[test]
fn whole_and_shared_never_meet_on_one_gpu() {
    let mode = Some(ShareMode::Timeslice);
    let err = admit(mode, &[whole(&["GPU-b", GPU])], &share(100, 1), forty).unwrap_err();
    assert_eq!(err, "not started: GPU GPU-a is held whole by another job");
    let err = admit(mode, &[share(100, 1)], &whole(&["GPU-b", GPU]), forty).unwrap_err();
    assert_eq!(
        err,
        "not started: GPU GPU-a carries 1 share(s) of other jobs, so it cannot be given whole"
    );
    // Whole beside whole is the portal's business, as before shares.
    assert_eq!(admit(None, &[whole(&[GPU])], &whole(&[GPU]), forty), Ok(()));
}

#[test]
fn an_agent_without_a_mode_takes_no_share_and_a_share_names_one_gpu() {
    let err = admit(None, &[], &share(500, 1), forty).unwrap_err();
    assert!(err.contains("without --share-mode"), "{err}");
    let two = Hold {
        gpus: vec![GPU.into(), "GPU-b".into()],
        ..share(500, 1)
    };
    let err = admit(Some(ShareMode::Mps), &[], &two, forty).unwrap_err();
    assert_eq!(
        err,
        "not started: a share names exactly one GPU, this one names 2"
    );
}

#[test]
fn memory_reads_in_sensible_gigabytes() {
    assert_eq!(gb(20 * 1024), "20 GB");
    assert_eq!(gb(23 * 1024 + 300), "23 GB");
    assert_eq!(gb(23 * 1024 + 600), "24 GB");
    assert_eq!(gb(1536), "1.5 GB");
    assert_eq!(gb(100), "0.1 GB");
    assert_eq!(
        over_memory(23 * 1024 + 100, 20 * 1024),
        "used 23 GB of its 20 GB GPU memory"
    );
    // Figures that would read the same get a decimal, then MiB.
    assert_eq!(
        over_memory(20 * 1024 + 300, 20 * 1024),
        "used 20.3 GB of its 20 GB GPU memory"
    );
    assert_eq!(
        over_memory(20 * 1024 + 1, 20 * 1024),
        "used 20481 MiB of its 20480 MiB GPU memory"
    );
}

#[test]
fn usage_sums_each_sharers_processes_by_cgroup_or_pid() {
    let id = |c: char| c.to_string().repeat(64);
    let sharers = vec![
        Sharer {
            key: 1,
            container: id('a'),
            pids: Default::default(),
            gpu: GPU.into(),
        },
        Sharer {
            key: 2,
            container: id('b'),
            pids: [77].into(),
            gpu: GPU.into(),
        },
        Sharer {
            key: 3,
            container: id('c'),
            pids: Default::default(),
            gpu: GPU.into(),
        },
    ];
    let p = |gpu: &str, pid, mb, cg: Option<String>| GpuProcess {
        gpu: gpu.into(),
        pid,
        used_memory_mb: mb,
        cgroup: cg,
    };
    let procs = vec![
        p(GPU, 10, 1000, Some(format!("0::/docker/{}\n", id('a')))),
        p(
            GPU,
            11,
            500,
            Some(format!("0::/system.slice/docker-{}.scope\n", id('a'))),
        ),
        // Found by pid: its cgroup could not be read.
        p(GPU, 77, 300, None),
        // Another GPU's process in a sharer's container is not this share's.
        p("GPU-z", 12, 9999, Some(format!("0::/docker/{}\n", id('a')))),
        // The owner's own process.
        p(
            GPU,
            13,
            4000,
            Some("0::/user.slice/session-3.scope\n".into()),
        ),
    ];
    let used = usage(&procs, &sharers);
    assert_eq!(used, [(1, 1500), (2, 300), (3, 0)].into());
}

#[test]
fn modes_parse_by_name() {
    assert_eq!(parse_mode("mps"), Ok(Some(ShareMode::Mps)));
    assert_eq!(parse_mode("timeslice"), Ok(Some(ShareMode::Timeslice)));
    assert_eq!(parse_mode("none"), Ok(None));
    assert!(parse_mode("MIG").unwrap_err().contains("--share-mode"));
}
