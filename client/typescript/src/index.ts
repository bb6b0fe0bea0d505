/**
 * `@permitd/client`: what job runners embed to run work under permitd's
 * concurrency budgets. `fetch` only: Node >= 20, Deno, Bun, Cloudflare Workers.
 *
 * - `SemaphoreClient` (`client.ts`): every v1 call against a list of nodes,
 *   with leader tracking (each key's calls to its shard's leader,
 *   `shard-leaders.ts`), retries with jitter honouring `Retry-After`, a
 *   `requestId` kept across retries, per-call deadlines and `AbortSignal`s,
 *   `nextRequestAt` per key, and a bearer token; `batch` sends many keys'
 *   requests and syncs in one `POST /v1/batch`, each item answered alone;
 * - `client.acquire` / `client.withPermit` (`permit.ts`): one piece of work under
 *   a permit;
 * - `SemaphoreQueue` (`queue/`): the job queue (two lanes per key; a poll's
 *   syncs in one batch call), over a pluggable
 *   `QueueStore` (`MemoryStore` here, `FileStore` in `@permitd/client/node`, or
 *   a Durable Object's storage);
 * - the wire types with runtime validators (`wire.ts`), checked against the
 *   Rust types by the tests;
 * - `shardOf` (`shard.ts`): the shard a key belongs to, the same function as
 *   the Rust core's, checked against its vectors by the tests.
 */

export * from "./backoff.js";
export * from "./client.js";
export * from "./errors.js";
export * from "./leader.js";
export * from "./next-request.js";
export * from "./permit.js";
export * from "./queue/index.js";
export * from "./shard.js";
export * from "./shard-leaders.js";
export * from "./wire.js";
