//! `GET /v1/semaphores`: the keys with state, in byte order, with their usage.

use serde::{Deserialize, Serialize};

use crate::engine::usage::Usage;

/// The query of `GET /v1/semaphores`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Only keys sorting after this one (the previous page's `next`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
    /// Keys per page; the node clamps it to its own bounds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<usize>,
}

/// The query of `DELETE /v1/semaphores/{key}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
pub struct DeleteKeyQuery {
    /// Release the key's grants and leases (as a force release of each
    /// client does) instead of refusing with 409 `key_in_use`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub force: bool,
    /// Makes a retry safe: a delete asked again with the same `requestId`
    /// (within 10 minutes) gets the first answer and changes nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
}

/// One page of keys.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct KeyList {
    pub keys: Vec<KeyUsage>,
    /// Present when more keys follow: pass it as `after`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

/// One key and its usage.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct KeyUsage {
    pub key: String,
    pub usage: Usage,
}
