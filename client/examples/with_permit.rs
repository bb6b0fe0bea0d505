//! One piece of work under a permit, the Rust way: `acquire` returns a guard
//! whose fence can be checked downstream; `with_permit` wraps a closure.
//!
//! ```text
//! permitd up --config cluster.toml &
//! cargo run -p permitd-client --example with_permit
//! ```

use permitd_client::{ClientConfig, SemaphoreClient};
use permitd_core::KeyConfigUpdate;

/// cluster.toml's admin token: configuring a key takes an admin.
const LOCAL_ADMIN_TOKEN: &str = "change-me-local-admin-token";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let endpoints = std::env::var("PERMITD_ENDPOINTS").unwrap_or_else(|_| {
        "http://127.0.0.1:7001,http://127.0.0.1:7002,http://127.0.0.1:7003".into()
    });
    let mut config = ClientConfig::new([endpoints]);
    config.token =
        Some(std::env::var("PERMITD_TOKEN").unwrap_or_else(|_| LOCAL_ADMIN_TOKEN.into()));
    let client = SemaphoreClient::new(config)?;
    let update = KeyConfigUpdate {
        limit: Some(2),
        ..KeyConfigUpdate::default()
    };
    client.set_key_config("acct-42", &update).await?;

    // A guard: released by `release().await`, or when dropped.
    let permit = client.acquire("acct-42", "nightly-report", 1).await?;
    println!(
        "holding {} permit of acct-42, fence {}",
        permit.count(),
        permit.fence()
    );
    println!("usage while held: {:?}", client.usage("acct-42").await?);
    permit.release().await?;

    // A closure: acquired before, released after, whatever it returns.
    let rows = client
        .with_permit("acct-42", "nightly-report", 2, |fence| async move {
            println!("running under fence {fence} with 2 permits");
            1_234
        })
        .await?;
    println!("report done: {rows} rows");
    println!("usage after: {:?}", client.usage("acct-42").await?);
    Ok(())
}
