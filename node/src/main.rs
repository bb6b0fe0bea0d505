//! The `permitd` binary: parses the command line and hands over to [`permitd_node::cli`].

use std::process::ExitCode;

use clap::Parser;
use permitd_node::cli::{self, Cli, CliCommand};
use permitd_node::raft::runtime::{self, RaftRuntime};

/// mimalloc rather than glibc's malloc: under load a node allocates and frees
/// small buffers on every request from two worker threads, and glibc's arenas
/// took a fifth of a leader's CPU in the profile (`docs/architecture.md`,
/// "Memory").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let args = Cli::parse();
    // Built first, on this thread, so that its threads keep the process's CPU
    // priority while the API runtime's are lowered (`permitd_node::raft::runtime`).
    let raft_runtime = match &args.command {
        CliCommand::Serve(_) => match RaftRuntime::start() {
            Ok(runtime) => Some(runtime),
            Err(error) => return fail("cannot start the Raft runtime", error),
        },
        _ => None,
    };
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if let Some(threads) = args.worker_threads {
        runtime.worker_threads(usize::from(threads));
    }
    if raft_runtime.is_some() {
        runtime.on_thread_start(runtime::lower_this_threads_priority);
    }
    match runtime.enable_all().build() {
        Ok(runtime) => runtime.block_on(run(args, raft_runtime)),
        Err(error) => fail("cannot start the async runtime", error),
    }
}

fn fail(what: &str, error: std::io::Error) -> ExitCode {
    eprintln!("permitd: {what}: {error}");
    ExitCode::FAILURE
}

async fn run(args: Cli, raft_runtime: Option<RaftRuntime>) -> ExitCode {
    cli::init_tracing(args.log_format);
    let outcome = match (args.command, raft_runtime) {
        (CliCommand::Serve(serve), Some(raft_runtime)) => cli::serve::run(serve, raft_runtime)
            .await
            .map_err(|e| e.to_string()),
        (CliCommand::Serve(_), None) => unreachable!("built above for serve"),
        (CliCommand::Up { config }, _) => {
            cli::up::run(&config, args.log_format, args.worker_threads)
                .await
                .map_err(|e| e.to_string())
        }
        (CliCommand::Restore(restore), _) => {
            cli::restore::run(restore).await.map_err(|e| e.to_string())
        }
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
