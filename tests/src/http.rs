//! HTTP and JSON helpers: the harness's client, one [`Answer`], and the
//! messages tests send.

use std::time::Duration;

use permitd_core::contract::headers;
use serde_json::{json, Value};

use crate::certs;

/// The harness's HTTP client: trusting only the test CA of a TLS cluster, and
/// sending `token` unless a request sets its own `Authorization`.
pub(crate) fn http_client(
    certs: Option<&certs::TestCerts>,
    token: Option<&str>,
) -> reqwest::Client {
    let mut builder = reqwest::Client::builder().timeout(Duration::from_secs(30));
    if let Some(token) = token {
        let mut headers = reqwest::header::HeaderMap::new();
        let value = format!("Bearer {token}").parse().expect("header value");
        headers.insert(reqwest::header::AUTHORIZATION, value);
        builder = builder.default_headers(headers);
    }
    certs::trusting(builder, certs)
        .build()
        .expect("http client")
}

/// One HTTP answer (an event stream's: its status and headers, body `null`).
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub body: Value,
    /// `x-permitd-leader`.
    pub leader: Option<u64>,
    /// `x-permitd-shard`: the shard that answered.
    pub shard: Option<u32>,
    pub retry_after: Option<String>,
}

impl Answer {
    pub(crate) async fn from(result: reqwest::Result<reqwest::Response>) -> Self {
        let answer = match result {
            Ok(answer) => answer,
            Err(error) => {
                return Self {
                    status: 0,
                    body: json!({"transport": error.to_string()}),
                    leader: None,
                    shard: None,
                    retry_after: None,
                }
            }
        };
        let header = |name: &str| {
            answer
                .headers()
                .get(name)
                .and_then(|value| value.to_str().ok())
                .map(str::to_owned)
        };
        let leader = header(headers::LEADER).and_then(|value| value.parse().ok());
        let shard = header(headers::SHARD).and_then(|value| value.parse().ok());
        let retry_after = header("retry-after");
        let status = answer.status().as_u16();
        // An event stream never ends: its status is the answer, its body unread
        // (dropping the answer closes the stream).
        let streaming =
            header("content-type").is_some_and(|value| value.starts_with("text/event-stream"));
        let body = if streaming {
            Value::Null
        } else {
            answer.json().await.unwrap_or(Value::Null)
        };
        Self {
            status,
            body,
            leader,
            shard,
            retry_after,
        }
    }

    /// The error code of a JSON error answer.
    pub fn code(&self) -> &str {
        self.body["error"]["code"].as_str().unwrap_or("")
    }
}

/// A `request` message.
pub fn request(client: &str, demand: &[(&str, u64, u64)]) -> Value {
    let demand: Vec<Value> = demand
        .iter()
        .map(|(group, count, oldest_at)| json!({"group": group, "count": count, "oldestAt": oldest_at}))
        .collect();
    json!({"type": "request", "v": 1, "clientId": client, "demand": demand})
}

/// Sum of the permits granted in a `grant` answer.
pub fn granted(answer: &Value) -> u64 {
    answer["grants"]
        .as_array()
        .map(|grants| grants.iter().filter_map(|g| g["permits"].as_u64()).sum())
        .unwrap_or(0)
}
