//! `permitctl keys`: every key with its usage, following the server's pages.
//!
//! The server answers at most one page per call and names the `next` key when
//! more follow; this walks the pages until `--limit` keys are printed or none
//! are left, and says on stderr when it stopped before the end.

use clap::Args;
use permitd_client::{KeyUsage, SemaphoreClient};

use super::{print, table, CliResult};

/// Keys asked for in one call when `--page-size` is not given (the server's
/// default page).
pub const DEFAULT_PAGE_SIZE: usize = 1_000;

#[derive(Debug, Args)]
pub struct KeysArgs {
    /// Print at most this many keys (all when omitted).
    #[arg(long)]
    limit: Option<usize>,
    /// Keys asked for per call; the server caps it.
    #[arg(long, default_value_t = DEFAULT_PAGE_SIZE)]
    page_size: usize,
}

/// What the walk over the pages found.
#[derive(Debug, PartialEq, Eq)]
pub struct Listing {
    pub keys: Vec<KeyUsage>,
    /// Set when `--limit` stopped the walk before the last key: the last key shown.
    pub truncated_after: Option<String>,
}

pub async fn run(client: &SemaphoreClient, json: bool, args: &KeysArgs) -> CliResult {
    let listing = list(client, args.limit, args.page_size.max(1)).await?;
    print(json, &listing.keys, || keys_table(&listing.keys))?;
    if let Some(last) = listing.truncated_after {
        eprintln!(
            "permitctl: stopped at --limit {} keys; more follow after {last:?}",
            listing.keys.len()
        );
    }
    Ok(())
}

/// Follows `next` until `limit` keys (if any) or the last page.
pub async fn list(
    client: &SemaphoreClient,
    limit: Option<usize>,
    page_size: usize,
) -> Result<Listing, permitd_client::ClientError> {
    let mut keys: Vec<KeyUsage> = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let wanted = limit.map_or(page_size, |limit| page_size.min(limit - keys.len()));
        let page = client.keys_page(after.as_deref(), Some(wanted)).await?;
        keys.extend(page.keys);
        let Some(next) = page.next else {
            return Ok(Listing {
                keys,
                truncated_after: None,
            });
        };
        if limit.is_some_and(|limit| keys.len() >= limit) {
            return Ok(Listing {
                keys,
                truncated_after: Some(next),
            });
        }
        after = Some(next);
    }
}

fn keys_table(keys: &[KeyUsage]) -> String {
    let rows: Vec<Vec<String>> = keys
        .iter()
        .map(|entry| {
            vec![
                entry.key.clone(),
                entry.usage.limit.to_string(),
                entry.usage.granted.to_string(),
                entry.usage.leased.to_string(),
                entry.usage.available.to_string(),
            ]
        })
        .collect();
    table(&["KEY", "LIMIT", "GRANTED", "LEASED", "AVAILABLE"], &rows)
}
