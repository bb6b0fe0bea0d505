//! Calls that name no key, in a cluster of several shards: the node called
//! covers every shard itself, one call per shard to that shard's leader with
//! [`headers::SHARD`] naming it, and merges the answers.
//!
//! - `GET /v1/semaphores`: each shard's first page after `after`, merged in
//!   key order and cut to the page size. The first `limit` keys of the union
//!   of every shard's first `limit` keys are the cluster's first `limit`, so a
//!   page is exactly what one shard holding every key would have answered.
//! - `POST /v1/batch`: the items split by their key's shard, one sub-batch per
//!   shard, the answers put back in item order. The whole batch is checked
//!   first (its size, its key count), so a batch refused as one call is
//!   refused here too. A sub-batch that fails as a whole (its shard has no
//!   leader, the leader changed) fails each of its items with that error,
//!   as each item's own call would have.
//! - `GET /cluster/snapshot`: one backup of every shard's keys, with the meta
//!   shard's defaults (`restore` splits it again, by any shard count: the way
//!   from S shards to S′, docs/operations.md).
//! - `POST /cluster/restore`: the backup's keys split by shard, each part
//!   restored by its shard's leader on its Raft listener (a backup may exceed
//!   the public body limit).
//! - `POST /cluster/members`: the change applied to every shard in order,
//!   the meta shard first; the answer is the meta shard's membership.
//!
//! Each call carries the caller's `Authorization`, so every shard's leader
//! decides for itself, as a forwarded call's leader does. A body that cannot
//! be split (a batch or a backup that does not parse) goes whole to the meta
//! shard's leader, which answers it as one call: the caller's token first
//! (401, 403), then the body's error (400), as at one shard; the node called
//! never answers a parse error to a caller no leader has let in.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::{to_bytes, Body, Bytes};
use axum::extract::{MatchedPath, Query, Request, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::future::join_all;
use permitd_core::contract::batch::{parse_batch, BatchItemAnswer, BatchResponse};
use permitd_core::contract::protocol::V1;
use permitd_core::contract::{headers, paths, ErrorAnswer, KeyList, ListQuery};
use permitd_core::engine::restore::{Backup, BackupFile, Restored, BACKUP_FORMAT};
use permitd_core::shard::shard_of;
use permitd_storage::ShardId;
use permitd_transport::Deadline;
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;

use super::deadline::deadline;
use super::{outgoing, ToLeader};
use crate::edge::api::semaphores::{DEFAULT_LIST_KEYS, MAX_LIST_KEYS};
use crate::edge::api::MAX_RAFT_BODY_BYTES;
use crate::edge::error::ApiError;
use crate::shard::META_SHARD;

/// The calls covered shard by shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scattered {
    List,
    Batch,
    Backup,
    Restore,
    Members,
}

impl Scattered {
    fn of(method: &Method, path: Option<&str>) -> Option<Self> {
        match (method, path?) {
            (&Method::GET, paths::SEMAPHORES) => Some(Self::List),
            (&Method::POST, paths::BATCH) => Some(Self::Batch),
            (&Method::GET, paths::CLUSTER_SNAPSHOT) => Some(Self::Backup),
            (&Method::POST, paths::CLUSTER_RESTORE) => Some(Self::Restore),
            (&Method::POST, paths::CLUSTER_MEMBERS) => Some(Self::Members),
            _ => None,
        }
    }
}

/// Middleware, outside [`super::to_leader`]: a call of [`Scattered`] that
/// names no shard, in a cluster of several, is covered shard by shard here;
/// everything else goes on.
pub async fn every_shard(
    State(to): State<Arc<ToLeader>>,
    request: Request,
    next: Next,
) -> Response {
    let path = request.extensions().get::<MatchedPath>();
    let scattered = Scattered::of(request.method(), path.map(MatchedPath::as_str));
    let (Some(scattered), false) = (scattered, request.headers().contains_key(headers::SHARD))
    else {
        return next.run(request).await;
    };
    if to.count() == 1 {
        return next.run(request).await;
    }
    let (mut parts, body) = request.into_parts();
    let Ok(body) = to_bytes(body, MAX_RAFT_BODY_BYTES).await else {
        return ApiError::PayloadTooLarge {
            max: MAX_RAFT_BODY_BYTES,
        }
        .into_response();
    };
    let may_wait = to.may_wait(&mut parts, &body).await;
    let call = Fanout {
        to: &to,
        parts: &parts,
        may_wait,
    };
    let answer = match scattered {
        Scattered::List => call.list().await,
        Scattered::Batch => call.batch(&body).await,
        Scattered::Backup => call.backup().await,
        Scattered::Restore => call.restore(&body).await,
        Scattered::Members => call.members(body).await,
    };
    let mut response = answer.unwrap_or_else(ShardAnswer::into_response);
    response
        .headers_mut()
        .insert(headers::SHARDS, HeaderValue::from(to.count()));
    response
}

/// One call being covered shard by shard.
struct Fanout<'a> {
    to: &'a ToLeader,
    parts: &'a Parts,
    may_wait: std::time::Duration,
}

/// A shard's answer: its status, `Retry-After` and body.
struct ShardAnswer {
    status: StatusCode,
    retry_after: Option<HeaderValue>,
    body: Bytes,
}

impl ShardAnswer {
    /// The body as `T` when the shard answered 200; else the answer as the
    /// whole call's (an error the caller should see as it is).
    fn ok<T: DeserializeOwned>(self) -> Result<T, ShardAnswer> {
        if self.status != StatusCode::OK {
            return Err(self);
        }
        serde_json::from_slice(&self.body).map_err(|error| {
            ApiError::Internal(format!("a shard's answer did not parse: {error}")).into()
        })
    }

    fn into_response(self) -> Response {
        let json = [(header::CONTENT_TYPE, "application/json")];
        let mut response = (self.status, json, Body::from(self.body)).into_response();
        if let Some(retry_after) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, retry_after);
        }
        response
    }
}

impl From<ApiError> for ShardAnswer {
    /// The error as a shard's answer: what the node would answer for it.
    fn from(error: ApiError) -> Self {
        let body = serde_json::to_vec(&error.body()).unwrap_or_default();
        let response = error.into_response();
        Self {
            status: response.status(),
            retry_after: response.headers().get(header::RETRY_AFTER).cloned(),
            body: Bytes::from(body),
        }
    }
}

/// Which listener of the shard's leader a call goes to.
#[derive(Debug, Clone, Copy)]
enum Listener {
    Api,
    /// The Raft listener: its body limit takes a whole backup.
    Raft,
}

impl Fanout<'_> {
    /// Sends the call, with `body`, to `shard`'s leader.
    async fn on_shard(
        &self,
        shard: ShardId,
        body: Bytes,
        listener: Listener,
    ) -> Result<ShardAnswer, ShardAnswer> {
        let leadership = *self.to.route(shard).leadership.borrow();
        let leader = leadership
            .leader
            .ok_or_else(|| ShardAnswer::from(ApiError::NoQuorum))?;
        let base = match listener {
            Listener::Api => self.to.base_of(leader),
            Listener::Raft => self.to.raft_base_of(leader),
        };
        let base = base.ok_or_else(|| ShardAnswer::from(ApiError::NoQuorum))?;
        let path = self
            .parts
            .uri
            .path_and_query()
            .map_or("/", |path| path.as_str());
        let limit = deadline(&self.to.timings, self.may_wait, body.len());
        let sent = match outgoing(self.parts, format!("{base}{path}"), body, Deadline(limit)) {
            Ok(mut request) => {
                let headers = request.headers_mut();
                headers.insert(headers::SHARD, HeaderValue::from(shard));
                self.to.transport.send(request).await
            }
            Err(unbuildable) => Err(unbuildable),
        };
        let unreached = |_| ShardAnswer::from(ApiError::LeaderUnreachable { leader });
        let answer = sent.map_err(unreached)?;
        let status = answer.status();
        let retry_after = answer.headers().get(header::RETRY_AFTER).cloned();
        let body = permitd_transport::collect(answer.into_body())
            .await
            .map_err(unreached)?;
        Ok(ShardAnswer {
            status,
            retry_after,
            body,
        })
    }

    /// The same call on every shard at once, the answers in shard order.
    async fn on_every_shard(&self, body: &Bytes) -> Vec<Result<ShardAnswer, ShardAnswer>> {
        let calls =
            (0..self.to.count()).map(|shard| self.on_shard(shard, body.clone(), Listener::Api));
        join_all(calls).await
    }

    async fn list(&self) -> Result<Response, ShardAnswer> {
        let Query(query) = Query::<ListQuery>::try_from_uri(&self.parts.uri)
            .map_err(|rejection| ShardAnswer::from(ApiError::BadRequest(rejection.body_text())))?;
        let limit = query
            .limit
            .unwrap_or(DEFAULT_LIST_KEYS)
            .clamp(1, MAX_LIST_KEYS);
        let mut keys = Vec::new();
        let mut more = false;
        for answer in self.on_every_shard(&Bytes::new()).await {
            let page: KeyList = answer?.ok()?;
            more |= page.next.is_some();
            keys.extend(page.keys);
        }
        keys.sort_by(|a, b| a.key.cmp(&b.key));
        more |= keys.len() > limit;
        keys.truncate(limit);
        let next = more
            .then(|| keys.last().map(|last| last.key.clone()))
            .flatten();
        Ok(Json(KeyList { keys, next }).into_response())
    }

    async fn batch(&self, body: &Bytes) -> Result<Response, ShardAnswer> {
        // The whole batch's own checks (size, keys), as one call's: by the
        // meta shard's leader when they fail, after the caller's token.
        let (Ok(parsed), Ok(raw)) = (
            parse_batch(body),
            serde_json::from_slice::<RawBatch<'_>>(body),
        ) else {
            return self.unsplit(body, Listener::Api).await;
        };
        // Item i goes to the shard of its key; an item whose key does not
        // parse to the meta shard, whose leader answers its error.
        let mut by_shard: BTreeMap<ShardId, Vec<usize>> = BTreeMap::new();
        for (index, item) in parsed.iter().enumerate() {
            let shard = match &item.message {
                Ok((key, _)) => shard_of(key, self.to.count()).unwrap_or(META_SHARD),
                Err(_) => META_SHARD,
            };
            by_shard.entry(shard).or_default().push(index);
        }
        let calls = by_shard.iter().map(|(shard, indexes)| {
            let items: Vec<&RawValue> = indexes.iter().map(|index| raw.items[*index]).collect();
            let body = serde_json::to_vec(&RawBatch { v: V1, items }).unwrap_or_default();
            self.on_shard(*shard, Bytes::from(body), Listener::Api)
        });
        let answers = join_all(calls).await;
        let mut items: Vec<Option<BatchItemAnswer>> = vec![None; parsed.len()];
        for ((_, indexes), answer) in by_shard.iter().zip(answers) {
            for (index, item) in indexes.iter().zip(sub_batch_items(answer, indexes.len())?) {
                items[*index] = Some(item);
            }
        }
        let items = items
            .into_iter()
            .map(|item| item.unwrap_or_else(|| BatchItemAnswer::failed(missing_item())))
            .collect();
        Ok(Json(BatchResponse { v: V1, items }).into_response())
    }

    async fn backup(&self) -> Result<Response, ShardAnswer> {
        let mut merged: Option<BackupFile> = None;
        for answer in self.on_every_shard(&Bytes::new()).await {
            let file: BackupFile = answer?.ok()?;
            match &mut merged {
                // The meta shard's, first: its defaults and applied index.
                None => merged = Some(file),
                Some(merged) => {
                    merged.state.last_now_ms = merged.state.last_now_ms.max(file.state.last_now_ms);
                    merged.state.keys.extend(file.state.keys);
                }
            }
        }
        let merged = merged.ok_or_else(|| ShardAnswer::from(ApiError::NoQuorum))?;
        tracing::info!(
            keys = merged.state.keys.len(),
            "backup of every shard saved"
        );
        Ok(Json(merged).into_response())
    }

    async fn restore(&self, body: &Bytes) -> Result<Response, ShardAnswer> {
        let file = match serde_json::from_slice::<BackupFile>(body) {
            Ok(file) if file.format == BACKUP_FORMAT => file,
            // Refused by the meta shard's leader, after the caller's token.
            _ => return self.unsplit(body, Listener::Raft).await,
        };
        let parts = split_backup(&file, self.to.count());
        let calls = parts.into_iter().enumerate().map(|(shard, part)| {
            let body = serde_json::to_vec(&part).unwrap_or_default();
            let shard = ShardId::try_from(shard).unwrap_or(META_SHARD);
            self.on_shard(shard, Bytes::from(body), Listener::Raft)
        });
        let mut restored_keys = 0;
        for answer in join_all(calls).await {
            let restored: Restored = answer?.ok()?;
            restored_keys += restored.restored_keys;
        }
        tracing::warn!(keys = restored_keys, "backup restored into every shard");
        Ok(Json(Restored { restored_keys }).into_response())
    }

    /// A body that cannot be split, sent whole to the meta shard's leader:
    /// it checks the caller's token before the body, as one call's leader
    /// does, and its answer is the call's.
    async fn unsplit(&self, body: &Bytes, listener: Listener) -> Result<Response, ShardAnswer> {
        let answer = self.on_shard(META_SHARD, body.clone(), listener).await?;
        Ok(answer.into_response())
    }

    async fn members(&self, body: Bytes) -> Result<Response, ShardAnswer> {
        let mut meta = None;
        for shard in 0..self.to.count() {
            let answer = self.on_shard(shard, body.clone(), Listener::Api).await?;
            if answer.status != StatusCode::OK {
                return Err(answer);
            }
            meta.get_or_insert(answer);
        }
        meta.map(ShardAnswer::into_response)
            .ok_or_else(|| ShardAnswer::from(ApiError::NoQuorum))
    }
}

/// A batch with its items left as they were sent.
#[derive(serde::Serialize, serde::Deserialize)]
struct RawBatch<'a> {
    v: V1,
    #[serde(borrow)]
    items: Vec<&'a RawValue>,
}

/// A sub-batch's answers, `count` of them: its items' own when its shard
/// answered, else its error for each. A 401 or 403 is the whole call's
/// answer: the caller's token and role are the same for every shard.
fn sub_batch_items(
    answer: Result<ShardAnswer, ShardAnswer>,
    count: usize,
) -> Result<Vec<BatchItemAnswer>, ShardAnswer> {
    let answer = match answer {
        // Who the caller is, and whether it may batch at all, is the same on
        // every shard: the whole call's answer, as one leader would give it.
        Ok(answer)
            if answer.status == StatusCode::UNAUTHORIZED
                || answer.status == StatusCode::FORBIDDEN =>
        {
            return Err(answer)
        }
        Ok(answer) => answer,
        Err(failed) => return Ok(vec![BatchItemAnswer::failed(unanswered(failed)); count]),
    };
    if answer.status == StatusCode::OK {
        let response: BatchResponse = answer.ok()?;
        return Ok(response.items);
    }
    let error =
        serde_json::from_slice::<ErrorAnswer>(&answer.body).unwrap_or_else(|_| missing_item());
    Ok(vec![BatchItemAnswer::failed(error); count])
}

/// The error of a sub-batch that got no answer.
fn unanswered(failed: ShardAnswer) -> ErrorAnswer {
    serde_json::from_slice(&failed.body).unwrap_or_else(|_| ApiError::LeaderChanged.body())
}

fn missing_item() -> ErrorAnswer {
    ApiError::Internal("a shard answered fewer items than it was sent".into()).body()
}

/// `file` as one backup per shard of `count`: each shard's keys, and every
/// part with the defaults and the clock.
pub fn split_backup(file: &BackupFile, count: u32) -> Vec<BackupFile> {
    let mut parts: Vec<BackupFile> = (0..count)
        .map(|_| BackupFile {
            format: file.format.clone(),
            applied_index: file.applied_index,
            state: Backup {
                defaults: file.state.defaults.clone(),
                last_now_ms: file.state.last_now_ms,
                keys: BTreeMap::new(),
            },
        })
        .collect();
    for (key, image) in &file.state.keys {
        let shard = shard_of(key, count).unwrap_or(META_SHARD) as usize;
        parts[shard].state.keys.insert(key.clone(), image.clone());
    }
    parts
}
