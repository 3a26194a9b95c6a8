//! An SSH user's signals after their exec ended reach nothing (issue 26, section 5): the
//! exec's host pid, once free, is given to another process (`ns_last_pid`, as CRIU sets
//! pids; needs root), and a hang-up or kill the relay sends then must not touch it.

use super::{demo_image, new_agent_id};
use bollard::exec::{CreateExecOptions, StartExecOptions};
use commons_agent::relay::signals::ExecSignals;
use commons_agent::runtime::DockerRuntime;
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// A container of the demo image that sleeps; removed when dropped.
struct Sleeper(String);

impl Sleeper {
    fn start() -> Sleeper {
        demo_image();
        let out = Command::new("docker")
            .args([
                "run",
                "-d",
                "--label",
                &format!("commons.agent={}", new_agent_id()),
            ])
            .args(["commons-demo:latest", "sleep", "600"])
            .output()
            .expect("the docker CLI is needed");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        Sleeper(String::from_utf8(out.stdout).unwrap().trim().to_string())
    }
}

impl Drop for Sleeper {
    fn drop(&mut self) {
        let _ = Command::new("docker").args(["rm", "-f", &self.0]).output();
    }
}

/// A host process (`sleep 600`) with pid `pid`, made by setting the last pid handed out
/// just below it; `None` if other processes kept taking it.
fn process_with_pid(pid: i64) -> Option<Child> {
    for _ in 0..200 {
        std::fs::write("/proc/sys/kernel/ns_last_pid", (pid - 1).to_string())
            .expect("writing /proc/sys/kernel/ns_last_pid needs root");
        let mut child = Command::new("sleep").arg("600").spawn().unwrap();
        if i64::from(child.id()) == pid {
            return Some(child);
        }
        let _ = child.kill();
        let _ = child.wait();
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_after_the_exec_ended_reaches_no_process_that_took_its_pid() {
    let container = Sleeper::start();
    let docker = bollard::Docker::connect_with_local_defaults().unwrap();
    // The relay's signals go through the agent's runtime, as in a relay.
    let rt = DockerRuntime::connect(new_agent_id()).await.unwrap();
    let exec = docker
        .create_exec(
            &container.0,
            CreateExecOptions::<String> {
                cmd: Some(vec!["sleep".into(), "2".into()]),
                ..Default::default()
            },
        )
        .await
        .unwrap()
        .id;
    docker
        .start_exec(
            &exec,
            Some(StartExecOptions {
                detach: true,
                ..Default::default()
            }),
        )
        .await
        .unwrap();
    // A signal while it runs reaches it (SIGCONT: harmless), as a user's Ctrl-Z/fg would.
    let mut signals = ExecSignals::new(&exec);
    assert!(signals.send(&rt, libc::SIGCONT).await, "the running exec");
    let pid = docker.inspect_exec(&exec).await.unwrap().pid.unwrap();

    // The exec ends; its pid goes to another process.
    let deadline = Instant::now() + Duration::from_secs(30);
    while docker.inspect_exec(&exec).await.unwrap().running == Some(true) {
        assert!(Instant::now() < deadline, "the exec did not end");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut other = process_with_pid(pid).expect("a process with the exec's old pid");

    // The relay's hang-up and kill now, as when the user leaves after the command ended.
    let hup = signals.send(&rt, libc::SIGHUP).await;
    let kill = signals.send(&rt, libc::SIGKILL).await;
    // Then our own SIGTERM: the process dies of the relay's hang-up or kill if either
    // reached it (they came first), of SIGTERM if not.
    // SAFETY: kill(2) on our own child, which we have not reaped yet.
    unsafe {
        libc::kill(other.id() as i32, libc::SIGTERM);
    }
    let status = other.wait().unwrap();
    assert_eq!(
        status.signal(),
        Some(libc::SIGTERM),
        "the relay's signals reached pid {pid}, now another process: {status:?}"
    );
    assert!(!hup && !kill, "nothing was signalled");
}
