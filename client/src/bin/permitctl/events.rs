//! `permitctl events [KEY] [--from N]`: lifecycle events as JSON lines, one per
//! event (`logIndex`, `key`, `type` and the event's fields), until interrupted.
//!
//! When the node serving the stream goes away, the stream is opened again on the
//! next endpoint that answers, right after the last event printed (its id, the
//! stream's cursor: one log index, or one per shard for every key at several
//! shards), so nothing is printed twice or skipped; a 410 `too_far_behind` ends
//! the command.

use std::io::Write;

use clap::Args;
use permitd_client::SemaphoreClient;

use super::CliResult;

#[derive(Debug, Args)]
pub struct EventsArgs {
    /// Only this key's events (every key's when omitted; a runner token must
    /// name a key).
    key: Option<String>,
    /// First log index to print (inclusive); only new events when omitted.
    #[arg(long)]
    from: Option<u64>,
}

pub async fn run(client: &SemaphoreClient, args: &EventsArgs) -> CliResult {
    let key = args.key.as_deref();
    // The last id printed: once there is one, resume after it.
    let mut after: Option<String> = None;
    let mut stdout = std::io::stdout();
    loop {
        let mut stream = match &after {
            Some(cursor) => client.events_after(key, cursor).await?,
            None => client.events(key, args.from).await?,
        };
        while let Some(message) = stream.next().await? {
            writeln!(stdout, "{}", message.data)?;
            stdout.flush()?;
            if message.cursor.is_some() {
                after = message.cursor;
            }
        }
        eprintln!("permitctl: the event stream closed; resuming after {after:?}");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}
