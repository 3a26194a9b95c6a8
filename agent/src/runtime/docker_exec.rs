//! [`DockerRuntime`](super::DockerRuntime)'s processes in running containers (`docker
//! exec`), which the SSH relays start, and the host pid of a container's main process,
//! whose network namespace a port forward enters.
//!
//! Invariants: an exec runs as the container's own user (the engine's default), never
//! root; a start that is not attached is an error, never a process nobody reads.

use super::{ExecIo, ExecOutput, ExecRequest, ExecState, RuntimeError};
use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, ResizeExecOptions, StartExecOptions, StartExecResults};
use bollard::Docker;
use commons_proto::relay::RELAY_CHUNK_BYTES;
use futures_util::StreamExt;

pub async fn create(
    docker: &Docker,
    container: &str,
    req: &ExecRequest,
) -> Result<String, RuntimeError> {
    let created = docker
        .create_exec(
            container,
            CreateExecOptions {
                attach_stdin: Some(true),
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                tty: Some(req.tty),
                env: Some(req.env.clone()),
                cmd: Some(req.cmd.clone()),
                ..Default::default()
            },
        )
        .await?;
    Ok(created.id)
}

pub async fn start(docker: &Docker, exec: &str, tty: bool) -> Result<ExecIo, RuntimeError> {
    let started = docker
        .start_exec(
            exec,
            Some(StartExecOptions {
                detach: false,
                tty,
                output_capacity: Some(RELAY_CHUNK_BYTES),
            }),
        )
        .await?;
    let StartExecResults::Attached { output, input } = started else {
        return Err(RuntimeError::Engine(
            "the engine started the exec detached".into(),
        ));
    };
    let output = output
        .map(|chunk| {
            Ok(match chunk? {
                LogOutput::StdErr { message } => ExecOutput::Err(message),
                LogOutput::StdOut { message }
                | LogOutput::Console { message }
                | LogOutput::StdIn { message } => ExecOutput::Out(message),
            })
        })
        .boxed();
    Ok(ExecIo { output, input })
}

pub async fn resize(docker: &Docker, exec: &str, cols: u16, rows: u16) -> Result<(), RuntimeError> {
    let opts = ResizeExecOptions {
        height: rows,
        width: cols,
    };
    Ok(docker.resize_exec(exec, opts).await?)
}

pub async fn inspect(docker: &Docker, exec: &str) -> Result<ExecState, RuntimeError> {
    let i = docker.inspect_exec(exec).await?;
    Ok(ExecState {
        running: i.running,
        pid: i.pid,
        exit_code: i.exit_code,
    })
}

pub async fn main_pid(docker: &Docker, id: &str) -> Option<i64> {
    docker
        .inspect_container(id, None)
        .await
        .ok()
        .and_then(|c| c.state)
        .and_then(|s| s.pid)
        .filter(|p| *p > 0)
}
