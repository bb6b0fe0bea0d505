//! `/v1/tokens`: create (the secret is answered once), list (no secrets) and
//! revoke API tokens. Admin only (the auth layer checks); runs on the leader.
//!
//! A new token is `pmt_` + 256 bits from the OS random source in hex. Only its
//! SHA-256 goes into the log entry, so no replica, log or snapshot holds it.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use permitd_core::contract::{paths, ErrorAnswer, ErrorCode};
use permitd_core::limits::MAX_TOKENS;
use permitd_core::tokens::{validate_token_spec, CreatedToken, TokenInfo, TokenList, TokenSpec};
use permitd_storage::Command;

use super::extract::{ApiJson, ApiPath};
use super::semaphores::{linearizable, write};
use crate::app::App;
use crate::credentials::admin::hash_token;
use crate::credentials::random_hex;
use crate::credentials::secret::to_hex;
use crate::edge::error::ApiError;

/// What every generated token starts with, so a leaked one is recognisable.
pub const TOKEN_PREFIX: &str = "pmt_";
/// Random bytes in a generated token.
pub const TOKEN_RANDOM_BYTES: usize = 32;

/// A fresh token secret.
pub fn generate_token() -> Result<String, ApiError> {
    let random = random_hex(TOKEN_RANDOM_BYTES)
        .map_err(|error| ApiError::Internal(format!("OS random source: {error}")))?;
    Ok(format!("{TOKEN_PREFIX}{random}"))
}

/// `POST /v1/tokens`.
#[utoipa::path(
    post, path = paths::TOKENS, tag = "tokens",
    request_body = TokenSpec,
    responses(
        (status = 201, description = "The new token; its secret is shown this once.", body = CreatedToken),
        (status = 409, description = "`too_many_tokens`.", body = ErrorAnswer),
    ),
)]
pub async fn create(
    State(app): State<App>,
    ApiJson(spec): ApiJson<TokenSpec>,
) -> Result<(StatusCode, Json<CreatedToken>), ApiError> {
    validate_token_spec(&spec)?;
    let meta = app.meta();
    if meta.state.read_tokens(|tokens| tokens.len()) >= MAX_TOKENS {
        return Err(ApiError::Conflict {
            code: ErrorCode::TooManyTokens,
            message: format!("the cluster already holds {MAX_TOKENS} tokens; revoke one first"),
        });
    }
    let token = generate_token()?;
    let command = Command::CreateToken {
        now_ms: app.seams.clock.now_ms(),
        hash: to_hex(&hash_token(&token)),
        spec,
    };
    let info = write(meta, command).await?.into_token_created()?;
    tracing::info!(id = info.id, name = %info.spec.name, role = ?info.spec.role, "token created");
    Ok((StatusCode::CREATED, Json(CreatedToken { token, info })))
}

/// `GET /v1/tokens`, linearizable.
#[utoipa::path(
    get, path = paths::TOKENS, tag = "tokens",
    responses((status = 200, description = "Every live token, without secrets or hashes.", body = TokenList)),
)]
pub async fn list(State(app): State<App>) -> Result<Json<TokenList>, ApiError> {
    linearizable(app.meta()).await?;
    let tokens = app
        .meta()
        .state
        .read_tokens(|tokens| tokens.list().map(TokenInfo::from).collect());
    Ok(Json(TokenList { tokens }))
}

/// `DELETE /v1/tokens/{id}`.
#[utoipa::path(
    delete, path = paths::TOKEN, tag = "tokens",
    params(("id" = u64, Path, description = "The token's id.")),
    responses(
        (status = 204, description = "The token is revoked."),
        (status = 404, description = "`not_found`: no such token.", body = ErrorAnswer),
    ),
)]
pub async fn revoke(
    State(app): State<App>,
    ApiPath(id): ApiPath<u64>,
) -> Result<StatusCode, ApiError> {
    let known = app
        .meta()
        .state
        .read_tokens(|tokens| tokens.list().any(|token| token.id == id));
    if !known {
        return Err(ApiError::NotFound(format!("no token {id}")));
    }
    write(app.meta(), Command::RevokeToken { id })
        .await?
        .into_done()?;
    tracing::info!(id, "token revoked");
    Ok(StatusCode::NO_CONTENT)
}
