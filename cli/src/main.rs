//! `commons`: the GPU Commons command-line client, a REST API client of the portal.
//!
//! Every failure is one line on stderr (`commons: ...`) and an exit code from
//! [`error::exit`]; with `--follow` the exit code is the job's own. Bad input is refused
//! before anything is sent, by the same rules the portal applies (`commons_api`).

mod apps;
mod args;
mod client;
mod config;
mod error;
mod files;
mod flows;
mod follow;
mod info;
mod jobs;
mod login;
mod output;
mod parts;
mod ssh;

use args::{Cli, Command, Shell};
use clap::{CommandFactory, Parser};
use error::{CliError, Result};
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match dispatch(cli.command) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("commons: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

fn dispatch(command: Command) -> Result<u8> {
    match command {
        Command::Login(a) => login::login(a),
        Command::Logout => login::logout(),
        Command::Whoami(a) => info::whoami(a),
        Command::Run(a) => jobs::run(*a),
        Command::Submit(a) => jobs::submit(a),
        Command::Ls(a) => jobs::ls(a),
        Command::Show(a) => jobs::show(a),
        Command::Logs(a) => follow::logs(a),
        Command::Events(a) => jobs::events(a),
        Command::Cancel(a) => jobs::cancel(a),
        Command::Ssh(a) => ssh::ssh(a),
        Command::SshConfig(a) => ssh::ssh_config(a),
        Command::Notebook(a) => ssh::notebook(a),
        Command::Open(a) => apps::open(a),
        Command::Launch(a) => apps::launch(a),
        Command::Cp(a) => files::cp(a),
        Command::Files(c) => files::files(c),
        Command::Get(a) => files::get(a),
        Command::SshKey(c) => ssh::ssh_key(c),
        Command::Nodes(a) => info::nodes(a),
        Command::Datasets(a) => info::datasets(a),
        Command::Usage(a) => info::usage(a),
        Command::Completions(a) => {
            let shell = match a.shell {
                Shell::Bash => clap_complete::Shell::Bash,
                Shell::Zsh => clap_complete::Shell::Zsh,
                Shell::Fish => clap_complete::Shell::Fish,
                Shell::Elvish => clap_complete::Shell::Elvish,
                Shell::Powershell => clap_complete::Shell::PowerShell,
            };
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "commons",
                &mut std::io::stdout(),
            );
            Ok(0)
        }
        Command::Man(a) => {
            std::fs::create_dir_all(&a.dir)
                .map_err(|e| CliError::Usage(format!("cannot create {}: {e}", a.dir.display())))?;
            clap_mangen::generate_to(Cli::command(), &a.dir).map_err(|e| {
                CliError::Other(anyhow::anyhow!(
                    "writing man pages to {}: {e}",
                    a.dir.display()
                ))
            })?;
            eprintln!("man pages written to {}", a.dir.display());
            Ok(0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn run_reads_its_flags_into_the_api_request() {
        let cli = Cli::try_parse_from([
            "commons",
            "run",
            "commons-demo:latest",
            "--gpus",
            "2",
            "--time",
            "2h",
            "--lab",
            "vision",
            "-e",
            "A=1",
            "--gpu-model",
            "A100",
            "--input",
            "data/a.tar",
            "--input",
            "lab:vision/code/",
            "--dataset",
            "vision/imagenet:/data/in",
            "--",
            "sh",
            "-c",
            "echo hi",
        ])
        .unwrap();
        let Command::Run(a) = cli.command else {
            panic!("not run")
        };
        let req = jobs::run_request(&a).unwrap();
        assert_eq!(req.gpus, 2);
        assert_eq!(req.time_limit_minutes, 120);
        assert_eq!(req.lab.as_deref(), Some("vision"));
        assert_eq!(req.env["A"], "1");
        assert_eq!(req.gpu_models, vec!["A100".to_string()]);
        assert_eq!(req.command, vec!["sh", "-c", "echo hi"]);
        assert_eq!(req.inputs, ["data/a.tar", "lab:vision/code/"]);
        assert_eq!(req.datasets[0].key(), "vision/imagenet");
        assert_eq!(req.datasets[0].mount.as_deref(), Some("/data/in"));
    }
}
