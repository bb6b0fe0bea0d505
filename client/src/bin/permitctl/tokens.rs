//! `permitctl token create|list|revoke`: the cluster's API tokens (admin only).
//! A secret is printed once, by `create`; `list` shows everything but secrets.

use clap::Subcommand;
use permitd_client::SemaphoreClient;
use permitd_core::tokens::{Role, TokenInfo, TokenSpec};

use super::{print, table, CliResult};

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Creates a token and prints its secret, shown this once.
    Create {
        name: String,
        /// `runner`, `reader` or `admin`.
        #[arg(long)]
        role: String,
        /// Key patterns (exact, or a prefix ending in `*`); repeat or comma-separate.
        #[arg(long = "key", value_delimiter = ',')]
        keys: Vec<String>,
        /// clientId patterns a runner may send; repeat or comma-separate.
        #[arg(long = "client-id", value_delimiter = ',')]
        client_ids: Vec<String>,
    },
    /// Lists tokens, without secrets.
    List,
    /// Revokes a token.
    Revoke { id: u64 },
}

pub async fn run(client: &SemaphoreClient, json: bool, command: TokenCommand) -> CliResult {
    match command {
        TokenCommand::Create {
            name,
            role,
            keys,
            client_ids,
        } => {
            let role = serde_json::from_value(serde_json::Value::String(role))?;
            let spec = TokenSpec {
                name,
                role,
                keys,
                client_ids,
            };
            let created = client.create_token(&spec).await?;
            let shown = serde_json::json!({"id": created.info.id, "token": created.token});
            print(json, &shown, || {
                format!(
                    "token {} created; its secret, shown this once:\n{}\n",
                    created.info.id, created.token
                )
            })
        }
        TokenCommand::List => {
            let tokens = client.tokens().await?;
            print(json, &tokens, || tokens_table(&tokens))
        }
        TokenCommand::Revoke { id } => {
            client.revoke_token(id).await?;
            print(json, &serde_json::json!({"revoked": id}), || {
                format!("token {id} revoked\n")
            })
        }
    }
}

/// One row per token; an empty pattern list shows as `-`.
fn tokens_table(tokens: &[TokenInfo]) -> String {
    let rows: Vec<Vec<String>> = tokens
        .iter()
        .map(|token| {
            let spec = &token.spec;
            vec![
                token.id.to_string(),
                spec.name.clone(),
                role_name(spec.role),
                patterns(&spec.keys),
                patterns(&spec.client_ids),
            ]
        })
        .collect();
    table(&["ID", "NAME", "ROLE", "KEYS", "CLIENT IDS"], &rows)
}

/// The role as `--role` takes it: its wire name.
fn role_name(role: Role) -> String {
    match serde_json::to_value(role) {
        Ok(serde_json::Value::String(name)) => name,
        _ => format!("{role:?}"),
    }
}

fn patterns(list: &[String]) -> String {
    if list.is_empty() {
        "-".to_owned()
    } else {
        list.join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(id: u64, name: &str, role: Role, keys: &[&str], client_ids: &[&str]) -> TokenInfo {
        let owned = |list: &[&str]| list.iter().map(|item| item.to_string()).collect();
        TokenInfo {
            id,
            created_at_ms: 0,
            spec: TokenSpec {
                name: name.into(),
                role,
                keys: owned(keys),
                client_ids: owned(client_ids),
            },
        }
    }

    #[test]
    fn the_token_table_aligns_its_columns_and_names_roles_as_the_cli_takes_them() {
        let tokens = [
            token(7, "eu-runners", Role::Runner, &["acct-*", "x"], &["eu-*"]),
            token(12, "dashboards", Role::Reader, &[], &[]),
        ];
        assert_eq!(
            tokens_table(&tokens),
            "ID  NAME        ROLE    KEYS      CLIENT IDS\n\
             7   eu-runners  runner  acct-*,x  eu-*\n\
             12  dashboards  reader  -         -\n"
        );
    }
}
