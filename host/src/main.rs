//! The `ccfleet` command line.

use std::process::ExitCode;

use clap::Parser;

mod cli {
    pub mod agent;
    pub mod decode;
    pub mod demo;
    pub mod discover;
    pub mod plugin;
    pub mod server;
}

/// ccfleet: join a ClusterCockpit-style fleet and run sandboxed plugins.
#[derive(Debug, Parser)]
#[command(name = "ccfleet", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Run the agent: join the fleet and run the configured plugins until SIGINT/SIGTERM.
    Agent(cli::agent::Args),
    /// A whole fleet on loopback (server, agent, plugins, NATS if found), narrated.
    Demo(cli::demo::Args),
    /// Decode line protocol (files or stdin) into one JSON object per point.
    Decode(cli::decode::DecodeArgs),
    /// List the instances a service-discovery provider sees (once, or as they change).
    Discover(cli::discover::Args),
    /// Plugin tools: new, build, run (one plugin, no fleet), componentize, check.
    Plugin(cli::plugin::Args),
    /// Run a cc-backend-compatible fleet server.
    Server(cli::server::ServerArgs),
    /// Print a new Ed25519 key pair as JWT_PUBLIC_KEY= and JWT_PRIVATE_KEY= lines.
    Keygen(cli::server::KeygenArgs),
    /// Print an API token signed with JWT_PRIVATE_KEY.
    Token(cli::server::TokenArgs),
}

#[tokio::main]
async fn main() -> anyhow::Result<ExitCode> {
    let cli = Cli::parse();
    // The demo narrates on stdout; its logs would only repeat the story.
    let default_filter = match cli.command {
        Command::Demo(_) => "error",
        _ => "info",
    };
    // async-nats logs every reconnect attempt at info level; the programs' own NATS event
    // handlers say what matters (RUST_LOG=async_nats=debug shows it all).
    let default_filter = format!("{default_filter},async_nats=off");
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter)),
        )
        .with_writer(std::io::stderr)
        .init();
    let ok = |()| ExitCode::SUCCESS;
    match cli.command {
        Command::Agent(args) => cli::agent::run(args).await.map(ok),
        Command::Demo(args) => cli::demo::run(args).await.map(ok),
        Command::Decode(args) => {
            if cli::decode::run(args)? {
                // Some line was bad: the output says which; the status tells scripts.
                std::process::exit(1);
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Discover(args) => cli::discover::run(args).await.map(ok),
        Command::Plugin(args) => cli::plugin::run(args).await,
        Command::Server(args) => cli::server::run_server(args).await.map(ok),
        Command::Keygen(args) => cli::server::run_keygen(args).map(ok),
        Command::Token(args) => cli::server::run_token(args).map(ok),
    }
}
