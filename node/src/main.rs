//! The `permitd` binary: parses the command line and hands over to [`permitd_node::cli`].

use std::process::ExitCode;

use clap::Parser;
use permitd_node::cli::{self, Cli, CliCommand};

/// mimalloc rather than glibc's malloc: under load a node allocates and frees
/// small buffers on every request from two worker threads, and glibc's arenas
/// took a fifth of a leader's CPU in the profile (`docs/architecture.md`,
/// "Memory").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let args = Cli::parse();
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if let Some(threads) = args.worker_threads {
        runtime.worker_threads(usize::from(threads));
    }
    match runtime.enable_all().build() {
        Ok(runtime) => runtime.block_on(run(args)),
        Err(error) => {
            eprintln!("permitd: cannot start the async runtime: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Cli) -> ExitCode {
    cli::init_tracing(args.log_format);
    let outcome = match args.command {
        CliCommand::Serve(serve) => cli::serve::run(serve).await.map_err(|e| e.to_string()),
        CliCommand::Up { config } => cli::up::run(&config, args.log_format, args.worker_threads)
            .await
            .map_err(|e| e.to_string()),
        CliCommand::Restore(restore) => cli::restore::run(restore).await.map_err(|e| e.to_string()),
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
