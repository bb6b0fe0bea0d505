//! `PERMITD_*` environment variables override settings of `cluster.toml`.
//!
//! The file is read as TOML, the overrides are written into it, and only then is
//! it checked and turned into a [`crate::config::ClusterConfig`], so an override
//! is validated exactly like the file. The mapping:
//!
//! | variable | setting |
//! |---|---|
//! | `PERMITD_SECRET` | `secret` |
//! | `PERMITD_<SECTION>_<FIELD>` | `[section] field`, e.g. `PERMITD_RAFT_RPC_TIMEOUT_MS` → `[raft] rpc_timeout_ms` |
//! | `PERMITD_DEFAULTS_<FIELD>` | `[defaults]` in camelCase: `PERMITD_DEFAULTS_ROUND_WAIT_MS` → `roundWaitMs` |
//! | `PERMITD_NODE_<ID>_<FIELD>` | the `[[node]]` with that id: `PERMITD_NODE_2_DATA_DIR` → its `data_dir` |
//!
//! Sections are those in [`SECTIONS`]. A value replaces a string setting as it
//! is; anything else is read as a TOML value (`5000`, `true`,
//! `{ provisioning = { mode = "strict" } }`) and as a string when it is not one.
//! Other `PERMITD_*` variables (`PERMITD_ENDPOINTS` of `permitctl`, the test
//! harness's) are not settings and are left alone; a `PERMITD_NODE_<ID>_…` naming
//! an id the file does not list is an error, not silently ignored.

use toml::{Table, Value};

/// The prefix of every override.
pub const PREFIX: &str = "PERMITD_";

/// The file's tables that variables may override.
pub const SECTIONS: &[&str] = &["raft", "defaults", "limits", "auth", "tls", "cluster"];

/// Why an override could not be applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvError {
    #[error("{variable}: no [[node]] with id {id} in the cluster file")]
    UnknownNode { variable: String, id: String },
    #[error("{variable}: name a field after the section or node id")]
    MissingField { variable: String },
    #[error("{variable}: [{section}] is not a table in the cluster file")]
    NotATable { variable: String, section: String },
}

/// Writes every override among `variables` into `document`; answers the names of
/// the variables applied, for the log (never their values: one is the secret).
pub fn apply(
    document: &mut Table,
    variables: impl IntoIterator<Item = (String, String)>,
) -> Result<Vec<String>, EnvError> {
    let mut applied = Vec::new();
    let mut variables: Vec<(String, String)> = variables
        .into_iter()
        .filter(|(name, _)| name.starts_with(PREFIX))
        .collect();
    // Ordered, so the outcome never depends on the environment's order.
    variables.sort();
    for (variable, value) in variables {
        let rest = &variable[PREFIX.len()..];
        let done = if rest == "SECRET" {
            set(document, "secret", &value);
            true
        } else if let Some(node) = rest.strip_prefix("NODE_") {
            apply_node(document, &variable, node, &value)?;
            true
        } else {
            apply_section(document, &variable, rest, &value)?
        };
        if done {
            applied.push(variable);
        }
    }
    Ok(applied)
}

fn apply_section(
    document: &mut Table,
    variable: &str,
    rest: &str,
    value: &str,
) -> Result<bool, EnvError> {
    let lower = rest.to_ascii_lowercase();
    let Some(section) = SECTIONS
        .iter()
        .find(|section| lower.starts_with(&format!("{section}_")) || lower == **section)
    else {
        return Ok(false);
    };
    let field = lower[section.len()..].trim_start_matches('_');
    if field.is_empty() {
        return Err(EnvError::MissingField {
            variable: variable.to_owned(),
        });
    }
    let field = if *section == "defaults" {
        camel_case(field)
    } else {
        field.to_owned()
    };
    let table = document
        .entry(section.to_string())
        .or_insert_with(|| Value::Table(Table::new()));
    let Value::Table(table) = table else {
        return Err(EnvError::NotATable {
            variable: variable.to_owned(),
            section: section.to_string(),
        });
    };
    set(table, &field, value);
    Ok(true)
}

fn apply_node(
    document: &mut Table,
    variable: &str,
    rest: &str,
    value: &str,
) -> Result<(), EnvError> {
    let (id, field) = rest.split_once('_').unwrap_or((rest, ""));
    if field.is_empty() {
        return Err(EnvError::MissingField {
            variable: variable.to_owned(),
        });
    }
    let unknown = || EnvError::UnknownNode {
        variable: variable.to_owned(),
        id: id.to_owned(),
    };
    let wanted: i64 = id.parse().map_err(|_| unknown())?;
    let node = document
        .get_mut("node")
        .and_then(Value::as_array_mut)
        .and_then(|nodes| {
            nodes.iter_mut().find_map(|node| {
                let table = node.as_table_mut()?;
                (table.get("id").and_then(Value::as_integer) == Some(wanted)).then_some(table)
            })
        })
        .ok_or_else(unknown)?;
    set(node, &field.to_ascii_lowercase(), value);
    Ok(())
}

/// Sets `table[field]`: as a string where the file has a string, else as TOML.
fn set(table: &mut Table, field: &str, value: &str) {
    let parsed = match table.get(field) {
        Some(Value::String(_)) => Value::String(value.to_owned()),
        _ => parse_value(value),
    };
    table.insert(field.to_owned(), parsed);
}

/// A TOML value, or the text as a string when it is not one.
fn parse_value(text: &str) -> Value {
    format!("value = {text}")
        .parse::<Table>()
        .ok()
        .and_then(|mut table| table.remove("value"))
        .unwrap_or_else(|| Value::String(text.to_owned()))
}

/// `round_wait_ms` → `roundWaitMs`.
fn camel_case(snake: &str) -> String {
    let mut out = String::with_capacity(snake.len());
    let mut upper = false;
    for c in snake.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.push(c.to_ascii_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_table_of_the_repository_file_has_a_section() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../cluster.toml");
        let document: Table = std::fs::read_to_string(path)
            .expect("cluster.toml")
            .parse()
            .expect("parses");
        for (name, value) in &document {
            if value.is_table() {
                assert!(
                    SECTIONS.contains(&name.as_str()),
                    "[{name}] has no PERMITD_ section"
                );
            }
        }
    }
}
