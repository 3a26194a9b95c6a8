//! `commons-portal`: the server, the one-command demo, and the operator CLI.

use clap::{Parser, Subcommand};
use commons_portal::db::models::Role;
use commons_portal::db::Db;
use commons_portal::{admin, demo, Config};
use std::path::PathBuf;

#[derive(Parser)]
#[command(name = "commons-portal", version, about = "GPU Commons portal")]
struct Cli {
    /// Log lines for people (`text`) or one JSON object a line with the span fields
    /// (request, job, attempt and node ids) for a log pipeline (`json`).
    #[arg(
        long,
        global = true,
        value_enum,
        default_value = "text",
        env = "COMMONS_LOG_FORMAT"
    )]
    log_format: LogFormat,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(clap::Args)]
struct DbArgs {
    /// TOML configuration file.
    #[arg(long)]
    config: Option<PathBuf>,
    /// sqlite://PATH or postgres://... (overrides the file and COMMONS_DATABASE_URL).
    #[arg(long)]
    database_url: Option<String>,
}

impl DbArgs {
    fn config(&self) -> anyhow::Result<Config> {
        let mut c = Config::load(self.config.as_deref())?;
        if let Some(u) = &self.database_url {
            c.database_url = u.clone();
        }
        Ok(c)
    }
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the portal.
    Serve {
        #[command(flatten)]
        db: DbArgs,
        #[arg(long)]
        listen: Option<String>,
        /// Start the SSH gateway on this address (config `[ssh] listen`).
        #[arg(long)]
        ssh_listen: Option<String>,
        /// Serve jobs' web apps on this address (config `[apps] listen`; `[apps] url`
        /// says how users reach it).
        #[arg(long)]
        apps_listen: Option<String>,
        /// Log in as anyone without a password. Local demos only: never on a network.
        #[arg(long)]
        insecure_dev_login: bool,
    },
    /// Start a small campus locally: SQLite, three labs and their people, the demo image,
    /// an agent per lab's server with fake GPUs, and (unless --quiet) a scripted workload.
    /// Prints the URL and whom to log in as.
    Demo(demo::DemoArgs),
    /// Operator commands on the portal's database.
    Admin {
        #[command(flatten)]
        db: DbArgs,
        #[command(subcommand)]
        cmd: AdminCmd,
    },
    /// Print the REST API's OpenAPI document (what `GET /api/v1/openapi.json` serves):
    /// `commons-portal openapi > docs/openapi.json`.
    Openapi,
}

#[derive(Subcommand)]
enum AdminCmd {
    CreateLab {
        slug: String,
        #[arg(long)]
        name: String,
    },
    CreateUser {
        username: String,
        #[arg(long)]
        email: String,
        #[arg(long)]
        lab: Option<String>,
        #[arg(long, default_value = "member", value_parser = ["member", "admin"])]
        role: String,
        #[arg(long)]
        operator: bool,
    },
    /// Prints a new personal access token on stdout.
    ApiToken { username: String },
    /// Prints a one-time agent enrolment token for a lab.
    EnrolToken { slug: String },
    /// Ends every browser session of a user, on every replica (a lost laptop, a copied
    /// cookie); their personal access tokens are not touched.
    SignOut { username: String },
    /// Copies everything from a SQLite database into an empty PostgreSQL one, and
    /// verifies it (row counts and checksums per table). The portal must be stopped.
    MigrateDb {
        /// sqlite://PATH
        #[arg(long)]
        from: String,
        /// postgres://... (an empty database)
        #[arg(long)]
        to: String,
    },
    /// An online backup of the SQLite database into a new file (the portal may keep
    /// running). For PostgreSQL use pg_dump.
    Backup {
        #[arg(long)]
        to: PathBuf,
    },
    /// The image allow-list.
    Images {
        #[command(subcommand)]
        cmd: ImagesCmd,
    },
}

#[derive(Subcommand)]
enum ImagesCmd {
    /// Allows NAME:TAG, pinned to its image ID in the local Docker Engine (or --digest).
    Allow {
        name_tag: String,
        /// The lab's entry; without it, campus-wide.
        #[arg(long)]
        lab: Option<String>,
        #[arg(long)]
        description: Option<String>,
        /// Pin this digest instead of asking the local engine.
        #[arg(long)]
        digest: Option<String>,
        /// A file with the signature (`ssh-keygen -Y sign -n gpu-commons-image`).
        #[arg(long)]
        signature_file: Option<std::path::PathBuf>,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // The demo tells its story on stdout: only warnings in between, unless RUST_LOG asks.
    let default_filter = match cli.cmd {
        Cmd::Demo(_) => "warn",
        _ => "info,actix_server=warn",
    };
    init_logging(cli.log_format, default_filter);
    match cli.cmd {
        Cmd::Admin { db, cmd } => admin_command(db, cmd),
        Cmd::Serve {
            db,
            listen,
            ssh_listen,
            apps_listen,
            insecure_dev_login,
        } => {
            let mut config = db.config()?;
            if let Some(l) = listen {
                config.listen = l;
            }
            if let Some(l) = ssh_listen {
                config.ssh.listen = Some(l);
            }
            if let Some(l) = apps_listen {
                config.apps.listen = Some(l);
            }
            config.insecure_dev_login |= insecure_dev_login;
            serve(config)
        }
        Cmd::Demo(args) => runtime()?.block_on(demo::run(args)),
        Cmd::Openapi => {
            print!("{}", commons_portal::api::openapi_document());
            Ok(())
        }
    }
}

fn init_logging(format: LogFormat, default_filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| default_filter.into());
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .init(),
    }
}

/// Runs the portal until it ends or is told to stop.
fn serve(config: Config) -> anyhow::Result<()> {
    // A key made at start would log everyone out at each restart, and replicas
    // would not accept each other's cookies.
    anyhow::ensure!(
        config.insecure_dev_login || config.session_key_file.is_some(),
        "session_key_file is not set: make one with `head -c 64 /dev/urandom > \
         /etc/gpu-commons/session.key` (mode 0600, the same file on every replica) and \
         set session_key_file; only --insecure-dev-login runs without one"
    );
    runtime()?.block_on(async {
        if config.insecure_dev_login {
            tracing::warn!("INSECURE development login is on: anyone can log in as anyone");
        }
        let mut portal = commons_portal::start(config).await?;
        println!("GPU Commons portal listening on {}", portal.url());
        if let Some(g) = &portal.ssh {
            println!("SSH gateway listening on {}", g.addr);
        }
        if let Some(a) = &portal.apps {
            println!("Web apps served on {}", a.addr);
        }
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        // A clean stop (Ctrl-C, SIGTERM from systemd) extends the running jobs'
        // leases first, so a restart or an upgrade stops none of them.
        let ended = tokio::select! {
            r = &mut portal.server => Some(r),
            _ = tokio::signal::ctrl_c() => None,
            _ = term.recv() => None,
        };
        match ended {
            Some(r) => r??,
            None => portal.shutdown().await,
        }
        Ok(())
    })
}

/// The operator commands: the two that copy a database work on files, the rest on an
/// open pool.
fn admin_command(db: DbArgs, cmd: AdminCmd) -> anyhow::Result<()> {
    match cmd {
        AdminCmd::MigrateDb { from, to } => {
            let copied = commons_portal::db::copy::sqlite_to_postgres(&from, &to)?;
            for (table, rows, sum) in &copied.tables {
                println!("{table:<28} {rows:>9} rows  sha256 {sum}");
            }
            println!(
                "copied and verified {} tables, {} rows",
                copied.tables.len(),
                copied.tables.iter().map(|t| t.1).sum::<usize>()
            );
        }
        AdminCmd::Backup { to } => {
            let config = db.config()?;
            let bytes = commons_portal::db::copy::sqlite_backup(&config.database_url, &to)?;
            println!(
                "backed up {} to {} ({bytes} bytes)",
                config.database_url,
                to.display()
            );
        }
        cmd => {
            let config = db.config()?;
            config.validate()?;
            let db = Db::open_with(&config.database_url, config.database_pool_size)?;
            println!("{}", admin_on_db(&db, &config, cmd)?);
        }
    }
    Ok(())
}

fn admin_on_db(db: &Db, config: &Config, cmd: AdminCmd) -> anyhow::Result<String> {
    Ok(match cmd {
        AdminCmd::CreateLab { slug, name } => admin::create_lab(db, &slug, &name)?,
        AdminCmd::CreateUser {
            username,
            email,
            lab,
            role,
            operator,
        } => admin::create_user(
            db,
            &username,
            &email,
            lab.as_deref(),
            role.parse::<Role>()
                .map_err(|e| anyhow::anyhow!("--role: {e} (member or admin)"))?,
            operator,
        )?,
        AdminCmd::ApiToken { username } => admin::api_token(db, &username)?,
        AdminCmd::EnrolToken { slug } => admin::enrol_token(db, &slug)?,
        AdminCmd::SignOut { username } => admin::sign_out(db, &username)?,
        AdminCmd::MigrateDb { .. } | AdminCmd::Backup { .. } => {
            anyhow::bail!("handled in admin_command")
        }
        AdminCmd::Images {
            cmd:
                ImagesCmd::Allow {
                    name_tag,
                    lab,
                    description,
                    digest,
                    signature_file,
                },
        } => {
            let signature = match signature_file {
                Some(f) => Some(
                    std::fs::read_to_string(&f)
                        .map_err(|e| anyhow::anyhow!("--signature-file {}: {e}", f.display()))?,
                ),
                None => None,
            };
            let image = commons_portal::service::images::NewImage {
                name_tag,
                digest,
                lab,
                description,
                signature,
            };
            admin::allow_image(db, &config.images.keys()?, image)?
        }
    })
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}
