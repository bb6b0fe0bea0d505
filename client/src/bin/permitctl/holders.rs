//! `permitctl holders KEY` and `permitctl release KEY CLIENT_ID`: who holds a
//! key's permits and waits for them, and the admin force release of one client.

use permitd_client::SemaphoreClient;
use permitd_core::engine::holders::KeyHolders;

use super::{print, table, CliResult};

pub async fn show(client: &SemaphoreClient, json: bool, key: &str) -> CliResult {
    let holders = client.holders(key).await?;
    print(json, &holders, || holders_table(&holders))
}

pub async fn release(
    client: &SemaphoreClient,
    json: bool,
    key: &str,
    client_id: &str,
) -> CliResult {
    let released = client.force_release(key, client_id).await?;
    print(json, &released, || {
        format!(
            "{key} / {client_id}: dropped {} grants and {} leases, {} permits returned\n",
            released.grants, released.leases, released.permits
        )
    })
}

/// One row per grant, lease or waiting group, grouped by client.
fn holders_table(holders: &KeyHolders) -> String {
    let mut rows: Vec<Vec<String>> = Vec::new();
    for (client_id, holding) in &holders.clients {
        for grant in &holding.grants {
            rows.push(vec![
                client_id.clone(),
                "grant".into(),
                grant.group.clone(),
                grant.permits.to_string(),
                format!(
                    "claimed {} released {} deadline {} fence {}",
                    grant.claimed, grant.released, grant.claim_deadline_ms, grant.fence
                ),
            ]);
        }
        for lease in &holding.leases {
            let state = if lease.retired { "retired" } else { "live" };
            rows.push(vec![
                client_id.clone(),
                "lease".into(),
                lease.group.clone(),
                lease.permits.to_string(),
                format!(
                    "drawn {} released {} expires {} {state}",
                    lease.drawn, lease.released, lease.expires_at_ms
                ),
            ]);
        }
        for waiting in &holding.waiting {
            rows.push(vec![
                client_id.clone(),
                "waiting".into(),
                waiting.group.clone(),
                waiting.count.to_string(),
                format!("{} requests", waiting.requests),
            ]);
        }
    }
    let mut text = format!("{}: {} clients\n", holders.key, holders.clients.len());
    text.push_str(&table(
        &["CLIENT", "KIND", "GROUP", "PERMITS", "DETAIL"],
        &rows,
    ));
    text
}
