//! `permitctl`: inspect and configure a permitd cluster.
//!
//! Human tables by default, `--json` for scripts. Endpoints come from
//! `--endpoints` or `PERMITD_ENDPOINTS` (comma-separated base URLs); the API
//! token from `--token` or `PERMITD_TOKEN`; for `https://` nodes, the cluster's
//! CA from `--ca-file` or `PERMITD_CA_FILE`.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

#[path = "permitctl/events.rs"]
mod events;
#[path = "permitctl/holders.rs"]
mod holders;
#[path = "permitctl/keys.rs"]
mod keys;
#[path = "permitctl/members.rs"]
mod members;
#[path = "permitctl/snapshot.rs"]
mod snapshot;
#[path = "permitctl/tokens.rs"]
mod tokens;

use clap::{Args, Parser, Subcommand};
use permitd_client::{ClientConfig, ClusterStatus, SemaphoreClient, ShardMap};
use permitd_core::config::LeasePolicy;
use permitd_core::{GroupConfig, KeyConfig, KeyConfigUpdate, Usage};
use serde::Serialize;

/// Inspect and configure a permitd cluster.
#[derive(Debug, Parser)]
#[command(name = "permitctl", version)]
struct Cli {
    /// Node API base URLs, comma-separated.
    #[arg(
        long,
        env = "PERMITD_ENDPOINTS",
        default_value = "http://127.0.0.1:7001"
    )]
    endpoints: String,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    json: bool,
    /// API token sent as `Authorization: Bearer …` (admin, reader or runner).
    #[arg(long, global = true, env = "PERMITD_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// PEM file of the CA that signed the nodes' certificates (`https://` nodes).
    #[arg(long, global = true, env = "PERMITD_CA_FILE")]
    ca_file: Option<std::path::PathBuf>,
    /// Deadline of one call, retries included, in ms.
    #[arg(long, global = true, default_value_t = 10_000)]
    timeout_ms: u64,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// A key's usage: limit, granted, leased, available, groups.
    Usage { key: String },
    /// A key's configuration.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// A group's cap and permission.
    #[command(subcommand)]
    Group(GroupCommand),
    /// Every key with its usage, page by page (`--limit` to stop early).
    Keys(keys::KeysArgs),
    /// The cluster: members, leader, term, indexes.
    Status,
    /// The leader map: every shard with its leader, term, applied index and voters.
    Shards,
    /// API tokens (admin only).
    #[command(subcommand)]
    Token(tokens::TokenCommand),
    /// Initialises a new cluster of every node in the asked node's cluster file
    /// (needs the admin `--token`); succeeds, saying so, when it already is.
    Init,
    /// The cluster's members: list, add a learner, promote, remove.
    #[command(subcommand)]
    Members(members::MembersCommand),
    /// Backups: `snapshot save FILE` (restore with `permitd restore --from FILE`).
    #[command(subcommand)]
    Snapshot(snapshot::SnapshotCommand),
    /// Who holds a key's permits (grants, leases) and who waits for them.
    Holders { key: String },
    /// Admin: drops one client's grants and leases on a key (a runner that died
    /// for good); its permits return to the key at once.
    Release { key: String, client_id: String },
    /// Lifecycle events (round, blocked, grant and lease changes) as JSON lines,
    /// live or from a log index, until interrupted.
    Events(events::EventsArgs),
    /// A key's usage, refreshed in place until interrupted.
    Watch {
        key: String,
        /// Refresh period, in ms.
        #[arg(long, default_value_t = 1_000)]
        interval_ms: u64,
    },
    /// Runs a command under a permit: `permitctl run KEY -- CMD ARGS…`.
    Run(permitd_client::run::RunArgs),
}

#[derive(Debug, Subcommand)]
enum ConfigCommand {
    Get {
        key: String,
    },
    /// Replaces the key's configuration; omitted fields take the cluster defaults.
    Set(ConfigSet),
    /// Admin: deletes the key's settings, groups and state; it follows the
    /// cluster defaults again. Refused while the key has grants, leases or
    /// waiting requests, unless `--force` (which releases them).
    Delete {
        key: String,
        /// Release the key's grants and leases instead of refusing.
        #[arg(long)]
        force: bool,
    },
}

#[derive(Debug, Args)]
struct ConfigSet {
    key: String,
    #[arg(long)]
    limit: Option<u64>,
    #[arg(long)]
    round_wait_ms: Option<u64>,
    #[arg(long)]
    round_period_ms: Option<u64>,
    #[arg(long)]
    grant_timeout_ms: Option<u64>,
    /// Lease policy as JSON (`{"provisioning":{"mode":"strict"},"ttlMs":60000}`),
    /// or `none` to disable leases. Omitted: the cluster default.
    #[arg(long)]
    leases: Option<String>,
}

#[derive(Debug, Subcommand)]
enum GroupCommand {
    /// Sets a group's cap (`--limit N` or `--unlimited`) and permission.
    Set {
        key: String,
        group: String,
        #[arg(
            long,
            conflicts_with = "unlimited",
            required_unless_present = "unlimited"
        )]
        limit: Option<u64>,
        #[arg(long)]
        unlimited: bool,
        #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
        permitted: bool,
    },
    /// Removes a group's settings (no cap, permitted).
    Delete { key: String, group: String },
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("permitctl: {error}");
            ExitCode::FAILURE
        }
    }
}

/// What every subcommand returns.
type CliResult = Result<(), Box<dyn std::error::Error>>;

async fn run(cli: Cli) -> CliResult {
    let mut config = ClientConfig::new([cli.endpoints.clone()]);
    config.call_timeout = Duration::from_millis(cli.timeout_ms);
    config.attempt_timeout = config.call_timeout;
    config.token = cli.token.clone();
    config.ca_file = cli.ca_file.clone();
    let client = SemaphoreClient::new(config)?;
    let json = cli.json;
    match cli.command {
        Command::Usage { key } => {
            let usage = client.usage(&key).await?;
            print(json, &usage, || usage_table(&key, &usage))
        }
        Command::Config(ConfigCommand::Get { key }) => {
            let config = client.key_config(&key).await?;
            print(json, &config, || config_table(&key, &config))
        }
        Command::Config(ConfigCommand::Set(set)) => {
            let update = KeyConfigUpdate {
                limit: set.limit,
                round_wait_ms: set.round_wait_ms,
                round_period_ms: set.round_period_ms,
                grant_timeout_ms: set.grant_timeout_ms,
                leases: parse_leases(set.leases.as_deref())?,
            };
            let config = client.set_key_config(&set.key, &update).await?;
            print(json, &config, || config_table(&set.key, &config))
        }
        Command::Config(ConfigCommand::Delete { key, force }) => {
            let deleted = client.delete_key(&key, force).await?;
            print(json, &deleted, || deleted_text(&key, &deleted))
        }
        Command::Group(GroupCommand::Set {
            key,
            group,
            limit,
            unlimited,
            permitted,
        }) => {
            let config = GroupConfig {
                limit: if unlimited { None } else { limit },
                permitted,
            };
            let applied = client.set_group(&key, &group, &config).await?;
            print(json, &applied, || {
                let limit = applied
                    .limit
                    .map_or("none".into(), |limit| limit.to_string());
                format!(
                    "{key} / {group}: limit {limit}, permitted {}\n",
                    applied.permitted
                )
            })
        }
        Command::Group(GroupCommand::Delete { key, group }) => {
            client.delete_group(&key, &group).await?;
            print(json, &serde_json::json!({"deleted": true}), || {
                format!("{key} / {group}: settings removed\n")
            })
        }
        Command::Keys(args) => keys::run(&client, json, &args).await,
        Command::Init => {
            let created = client.init_cluster().await?;
            let state = if created {
                "initialised"
            } else {
                "already initialised"
            };
            print(json, &serde_json::json!({ "initialized": created }), || {
                format!("cluster {state}\n")
            })
        }
        Command::Members(command) => members::run(&client, json, command).await,
        Command::Snapshot(command) => snapshot::run(&client, json, command).await,
        Command::Holders { key } => holders::show(&client, json, &key).await,
        Command::Events(args) => events::run(&client, &args).await,
        Command::Release { key, client_id } => {
            holders::release(&client, json, &key, &client_id).await
        }
        Command::Status => {
            let status = client.cluster_status().await?;
            print(json, &status, || status_table(&status))
        }
        Command::Shards => {
            let map = client.cluster_shards().await?;
            print(json, &map, || shards_table(&map))
        }
        Command::Watch { key, interval_ms } => watch(&client, &key, json, interval_ms).await,
        Command::Token(command) => tokens::run(&client, json, command).await,
        Command::Run(args) => std::process::exit(permitd_client::run::main(&client, args).await),
    }
}

fn parse_leases(text: Option<&str>) -> Result<Option<Option<LeasePolicy>>, serde_json::Error> {
    match text {
        None => Ok(None),
        Some("none" | "null") => Ok(Some(None)),
        Some(text) => serde_json::from_str(text).map(|policy| Some(Some(policy))),
    }
}

fn print<V: Serialize>(json: bool, value: &V, table: impl FnOnce() -> String) -> CliResult {
    if json {
        println!("{}", serde_json::to_string_pretty(value)?);
    } else {
        print!("{}", table());
    }
    Ok(())
}

async fn watch(
    client: &SemaphoreClient,
    key: &str,
    json: bool,
    interval_ms: u64,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut ticker = tokio::time::interval(Duration::from_millis(interval_ms.max(100)));
    let mut lines_drawn = 0usize;
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
        let text = match client.usage(key).await {
            Ok(usage) if json => serde_json::to_string(&usage)? + "\n",
            Ok(usage) => usage_table(key, &usage),
            Err(error) => format!("{key}: {error}\n"),
        };
        let mut out = std::io::stdout().lock();
        if !json && lines_drawn > 0 {
            // Move up over the previous table and clear to the end of the screen.
            write!(out, "\x1b[{lines_drawn}A\x1b[J")?;
        }
        write!(out, "{text}")?;
        out.flush()?;
        lines_drawn = text.lines().count();
    }
}

/// Renders rows as left-aligned columns under a header.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|cell| cell.len()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.len());
        }
    }
    let mut text = String::new();
    let header: Vec<String> = header.iter().map(|cell| cell.to_string()).collect();
    for row in std::iter::once(&header).chain(rows) {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        text.push_str(cells.join("  ").trim_end());
        text.push('\n');
    }
    text
}

fn usage_table(key: &str, usage: &Usage) -> String {
    let mut text = table(
        &["KEY", "LIMIT", "GRANTED", "LEASED", "AVAILABLE"],
        &[vec![
            key.to_string(),
            usage.limit.to_string(),
            usage.granted.to_string(),
            usage.leased.to_string(),
            usage.available.to_string(),
        ]],
    );
    if !usage.groups.is_empty() {
        let rows: Vec<Vec<String>> = usage
            .groups
            .iter()
            .map(|(group, usage)| {
                vec![
                    group.clone(),
                    usage.granted.to_string(),
                    usage.limit.map_or("-".into(), |limit| limit.to_string()),
                ]
            })
            .collect();
        text.push('\n');
        text.push_str(&table(&["GROUP", "GRANTED", "LIMIT"], &rows));
    }
    text
}

/// What `config delete` says when not asked for JSON.
fn deleted_text(key: &str, deleted: &permitd_core::engine::delete_key::KeyDeleted) -> String {
    if !deleted.existed {
        return format!("{key}: nothing was kept for it; it follows the defaults\n");
    }
    let released = deleted.released;
    format!(
        "{key}: deleted at log index {}; released {} grants and {} leases ({} permits) of {} clients\n",
        deleted.log_index, released.grants, released.leases, released.permits, deleted.clients
    )
}

fn config_table(key: &str, config: &KeyConfig) -> String {
    let leases = match &config.leases {
        None => "none".to_string(),
        Some(policy) => serde_json::to_string(policy).unwrap_or_default(),
    };
    table(
        &[
            "KEY",
            "LIMIT",
            "ROUND WAIT MS",
            "ROUND PERIOD MS",
            "GRANT TIMEOUT MS",
            "LEASES",
        ],
        &[vec![
            key.to_string(),
            config.limit.to_string(),
            config.round_wait_ms.to_string(),
            config.round_period_ms.to_string(),
            config.grant_timeout_ms.to_string(),
            leases,
        ]],
    )
}

fn status_table(status: &ClusterStatus) -> String {
    let optional = |value: Option<u64>| value.map_or("-".into(), |value| value.to_string());
    let mut text = table(
        &["NODE", "LEADER", "TERM", "LAST LOG INDEX", "LAST APPLIED"],
        &[vec![
            status.id.to_string(),
            optional(status.leader),
            status.term.to_string(),
            optional(status.last_log_index),
            optional(status.last_applied),
        ]],
    );
    let rows: Vec<Vec<String>> = status
        .members
        .iter()
        .map(|member| {
            vec![
                member.id.to_string(),
                member.addr.clone(),
                member.raft_addr.clone(),
                member.role.as_str().to_owned(),
            ]
        })
        .collect();
    text.push('\n');
    text.push_str(&table(&["MEMBER", "ADDR", "RAFT ADDR", "ROLE"], &rows));
    text
}

fn shards_table(map: &ShardMap) -> String {
    let optional = |value: Option<u64>| value.map_or("-".into(), |value| value.to_string());
    let rows: Vec<Vec<String>> = map
        .shards
        .iter()
        .map(|shard| {
            let voters: Vec<String> = shard.members.iter().map(u64::to_string).collect();
            vec![
                shard.shard.to_string(),
                optional(shard.leader),
                shard.term.to_string(),
                optional(shard.applied_index),
                voters.join(","),
            ]
        })
        .collect();
    table(&["SHARD", "LEADER", "TERM", "APPLIED", "VOTERS"], &rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_columns() {
        let text = table(&["A", "LONG"], &[vec!["xyz".into(), "1".into()]]);
        assert_eq!(text, "A    LONG\nxyz  1\n");
    }

    #[test]
    fn leases_flag_parses_none_and_json() {
        assert_eq!(parse_leases(None).unwrap(), None);
        assert_eq!(parse_leases(Some("none")).unwrap(), Some(None));
        let policy = parse_leases(Some(r#"{"provisioning":{"mode":"strict"}}"#)).unwrap();
        assert_eq!(policy.unwrap().unwrap().permits_per_lease, 64);
        assert!(parse_leases(Some("{")).is_err());
    }

    #[test]
    fn group_set_needs_a_limit_or_unlimited() {
        assert!(Cli::try_parse_from(["permitctl", "group", "set", "k", "g"]).is_err());
        let cli = Cli::try_parse_from([
            "permitctl",
            "group",
            "set",
            "k",
            "g",
            "--unlimited",
            "--permitted",
            "false",
        ])
        .unwrap();
        assert!(matches!(
            cli.command,
            Command::Group(GroupCommand::Set {
                unlimited: true,
                permitted: false,
                ..
            })
        ));
    }
}
