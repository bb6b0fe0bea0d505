//! `permitctl run KEY -- CMD ARGS…`: a command run under a permit.
//!
//! The shell's way in, like `consul lock` or `flock`: acquire `count` permits
//! of `key` for `group` (waiting up to `--timeout`), start the command with the
//! permit's fence in `PERMITD_FENCE`, forward SIGINT, SIGTERM and SIGHUP to it,
//! and when it exits (by itself or killed by a signal) report the release and
//! wait for the holder to take it. The exit status is the command's own, or
//! `128 + signal` when a signal ended it, as shells report it.
//!
//! A Ctrl+C at a terminal reaches the whole foreground process group, so the
//! command may see SIGINT twice (from the terminal and forwarded); commands
//! treat a repeated SIGINT as one, and forwarding is what makes `kill` of
//! `permitctl` alone reach the command.
//!
//! Signals that arrive while waiting for the permit end the wait: what was
//! granted is released and `permitctl` exits with `128 + signal` without
//! starting the command (a grant of the round still in flight then, if any,
//! returns at its claim deadline: the process is gone before its answer). A `permitctl` killed with SIGKILL cannot release: its
//! claimed permits stay held (claimed grants do not expire), which is why
//! runners that must survive that use the queue and its `finished` check.

use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use clap::Args;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::signal::unix::{signal, SignalKind};

use crate::error::AcquireError;
use crate::permit::AcquireOptions;
use crate::SemaphoreClient;

/// The environment variable the command finds its permit's fence in.
pub const FENCE_ENV: &str = "PERMITD_FENCE";
/// Exit status when no permit came within `--timeout` (BSD's `EX_TEMPFAIL`).
pub const EXIT_TIMEOUT: i32 = 75;
/// Exit status when the permit could not be acquired for another reason, or the
/// command could not be started (as shells report a command that cannot run).
pub const EXIT_CANNOT_RUN: i32 = 126;
/// Shells report a command ended by signal `n` as `128 + n`.
const SIGNAL_EXIT_BASE: i32 = 128;
/// The signals forwarded to the command.
const FORWARDED: [Signal; 3] = [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP];

/// `permitctl run`'s arguments.
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// The semaphore key.
    pub key: String,
    /// The group within the key.
    #[arg(long, default_value = "default")]
    pub group: String,
    /// Permits to hold while the command runs.
    #[arg(long, default_value_t = 1)]
    pub count: u64,
    /// Give up waiting for the permit after this long (`500ms`, `30s`, `5m`,
    /// `1h`; a bare number is seconds). Default: wait until granted.
    #[arg(long, value_parser = parse_duration)]
    pub timeout: Option<Duration>,
    /// The clientId the grants belong to (default: a fresh `permit-{uuid}`).
    #[arg(long, env = "PERMITD_CLIENT_ID")]
    pub client_id: Option<String>,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, num_args = 1..)]
    pub command: Vec<OsString>,
}

/// Why `run` stopped before the command could finish.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Acquire(#[from] AcquireError),
    #[error("cannot start {command:?}: {source}")]
    Spawn {
        command: OsString,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot listen for signals: {0}")]
    Signals(std::io::Error),
}

impl RunError {
    /// The exit status `permitctl` ends with.
    pub fn exit_code(&self) -> i32 {
        match self {
            Self::Acquire(AcquireError::Timeout { .. }) => EXIT_TIMEOUT,
            _ => EXIT_CANNOT_RUN,
        }
    }
}

/// `permitctl run`: [`run`], with errors on stderr; answers the exit status.
pub async fn main(client: &SemaphoreClient, args: RunArgs) -> i32 {
    run(client, args).await.unwrap_or_else(|error| {
        eprintln!("permitctl run: {error}");
        error.exit_code()
    })
}

/// Runs the command under a permit; answers the exit status to end with.
pub async fn run(client: &SemaphoreClient, args: RunArgs) -> Result<i32, RunError> {
    let mut signals = Signals::listen().map_err(RunError::Signals)?;
    let options = AcquireOptions {
        client_id: args.client_id.clone(),
        timeout: args.timeout,
    };
    let mut interrupted = None;
    let cancel = async { interrupted = Some(signals.next().await) };
    let acquired = client
        .acquire_until(&args.key, &args.group, args.count, options, cancel)
        .await;
    let permit = match acquired {
        Ok(permit) => permit,
        Err(AcquireError::Cancelled { .. }) => {
            let signal = interrupted.expect("only a signal cancels");
            return Ok(SIGNAL_EXIT_BASE + signal as i32);
        }
        Err(error) => return Err(error.into()),
    };
    let (program, rest) = args.command.split_first().expect("clap requires one");
    let spawned = tokio::process::Command::new(program)
        .args(rest)
        .env(FENCE_ENV, permit.fence().to_string())
        .spawn();
    let status = match spawned {
        Ok(child) => supervise(child, &mut signals).await,
        Err(source) => Err(source),
    };
    if let Err(error) = permit.release().await {
        eprintln!("permitctl: releasing the permit failed, it stays held: {error}");
    }
    let status = status.map_err(|source| RunError::Spawn {
        command: program.clone(),
        source,
    })?;
    Ok(exit_code(status))
}

/// Waits for the child, forwarding every signal we receive meanwhile.
async fn supervise(
    mut child: tokio::process::Child,
    signals: &mut Signals,
) -> std::io::Result<ExitStatus> {
    let pid = child.id().map(|id| Pid::from_raw(id as i32));
    loop {
        tokio::select! {
            status = child.wait() => return status,
            signal = signals.next() => {
                if let Some(pid) = pid {
                    // The child may have exited just now: nothing to forward to.
                    let _ = kill(pid, signal);
                }
            }
        }
    }
}

/// The status a shell would report for `status`.
pub fn exit_code(status: ExitStatus) -> i32 {
    match (status.code(), status.signal()) {
        (Some(code), _) => code,
        (None, Some(signal)) => SIGNAL_EXIT_BASE + signal,
        (None, None) => EXIT_CANNOT_RUN,
    }
}

/// The three forwarded signals, as one stream.
struct Signals {
    streams: Vec<(Signal, tokio::signal::unix::Signal)>,
}

impl Signals {
    fn listen() -> std::io::Result<Self> {
        let streams = FORWARDED
            .iter()
            .map(|&which| Ok((which, signal(SignalKind::from_raw(which as i32))?)))
            .collect::<std::io::Result<_>>()?;
        Ok(Self { streams })
    }

    /// The next signal received.
    async fn next(&mut self) -> Signal {
        let [(a, first), (b, second), (c, third)] = &mut self.streams[..] else {
            unreachable!("three signals are listened to");
        };
        tokio::select! {
            _ = first.recv() => *a,
            _ = second.recv() => *b,
            _ = third.recv() => *c,
        }
    }
}

/// Parses `500ms`, `30s`, `5m`, `1h`, or a bare number of seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let amount: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a duration such as 30s"))?;
    let millis = match unit {
        "ms" => Some(amount),
        "" | "s" => amount.checked_mul(1_000),
        "m" => amount.checked_mul(60_000),
        "h" => amount.checked_mul(3_600_000),
        other => return Err(format!("unknown unit {other:?}: use ms, s, m or h")),
    };
    millis
        .map(Duration::from_millis)
        .ok_or_else(|| format!("{text:?} is too long"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_units_and_default_to_seconds() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3_600)));
        for bad in ["", "s", "3d", "-1s", "1.5s"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn signalled_commands_exit_with_128_plus_the_signal() {
        assert_eq!(exit_code(ExitStatus::from_raw(3 << 8)), 3);
        assert_eq!(exit_code(ExitStatus::from_raw(15)), 128 + 15);
        assert_eq!(exit_code(ExitStatus::from_raw(0)), 0);
    }
}
