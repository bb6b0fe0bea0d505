//! The command line: `permitd serve` (one node), `permitd up` (a whole cluster
//! of child processes) and `permitd restore` (a backup into a new cluster).

pub mod restore;
pub mod serve;
pub mod up;

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

use crate::observe::expected_warnings::ExpectedWarnings;

/// permitd: a Raft-replicated concurrency-budget service.
#[derive(Debug, Parser)]
#[command(name = "permitd", version, about)]
pub struct Cli {
    /// Log line format; the filter comes from RUST_LOG (default `info`).
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,
    /// Threads of the async runtime (default: one per core). Nodes that share a
    /// machine do better with their share of the cores: `up` gives each node
    /// `cores / nodes` (at least 1) unless this is set. See docs/operations.md.
    #[arg(long, env = "PERMITD_WORKER_THREADS", global = true,
          value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub worker_threads: Option<u16>,
    #[command(subcommand)]
    pub command: CliCommand,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum CliCommand {
    /// Run one node. Without --config: a single self-initialising node in ./data.
    Serve(serve::ServeArgs),
    /// Start every node of a cluster file as a child process; Ctrl+C stops them all.
    Up {
        #[arg(long, default_value = "cluster.toml")]
        config: PathBuf,
    },
    /// Write a backup (`permitctl snapshot save`) into a new, running cluster.
    Restore(restore::RestoreArgs),
}

/// Installs the tracing subscriber: `RUST_LOG` filter, text or JSON lines,
/// without the warnings that are expected ([`ExpectedWarnings`]).
pub fn init_tracing(format: LogFormat) {
    use tracing_subscriber::filter::FilterExt;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::{fmt, EnvFilter, Layer, Registry};
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,openraft=warn"));
    let filter = filter.and(ExpectedWarnings);
    // Colours only on a terminal: a file, a pipe or journald would keep the
    // escape codes, and formatting them cost the leader's threads CPU on
    // every span.
    let on_terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let lines = fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(on_terminal);
    let lines: Box<dyn Layer<Registry> + Send + Sync> = match format {
        LogFormat::Text => lines.with_filter(filter).boxed(),
        LogFormat::Json => lines.json().flatten_event(true).with_filter(filter).boxed(),
    };
    tracing_subscriber::registry().with(lines).init();
}
