//! The `permitd` binary: parses the command line and hands over to [`permitd_node::cli`].

use std::process::ExitCode;

use clap::Parser;
use permitd_node::cli::{self, Cli, Command};

/// mimalloc rather than glibc's malloc: under load a node allocates and frees
/// small buffers on every request from two worker threads, and glibc's arenas
/// took a fifth of a leader's CPU in the profile (`docs/architecture.md`,
/// "Memory").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> ExitCode {
    let args = Cli::parse();
    cli::init_tracing(args.log_format);
    let outcome = match args.command {
        Command::Serve(serve) => cli::serve::run(serve).await.map_err(|e| e.to_string()),
        Command::Up { config } => cli::up::run(&config, args.log_format)
            .await
            .map_err(|e| e.to_string()),
        Command::Restore(restore) => cli::restore::run(restore).await.map_err(|e| e.to_string()),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(%error, "permitd failed");
            eprintln!("permitd: {error}");
            ExitCode::FAILURE
        }
    }
}
