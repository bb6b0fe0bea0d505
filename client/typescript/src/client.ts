/**
 * `SemaphoreClient`: every call of the v1 API against a list of nodes, over
 * `fetch` only (Node >= 20, Deno, Bun, Cloudflare Workers).
 *
 * One call is a loop of attempts inside a per-call deadline: pick a node (the
 * remembered leader first: for a call about a key, the leader of the key's
 * shard, see `leader.ts`), send, and on a retryable failure
 * (network error, attempt timeout, 429, 502, 503, 504) back off with capped
 * jittered exponential delays (`backoff.ts`), never sooner than the server's
 * `Retry-After`, and try again. Any other rejection ends the call with a
 * `RejectedError`. The caller's `AbortSignal` ends the call at once with the
 * signal's reason.
 *
 * Retries are safe: a `request` always carries a `requestId` (a fresh UUID
 * unless the caller set one), the same on every attempt, so the holder answers
 * a retry of a committed round with the original answer (so does each
 * `request` item of a `batch`); reports are cumulative. `request` waits for the key's `nextRequestAt` from the previous
 * answer before sending. A bearer `token` goes on every call.
 */

import { Backoff, DEFAULT_INITIAL_DELAY_MS, DEFAULT_MAX_DELAY_MS } from "./backoff.js";
import { believedNextRequestAt } from "./next-request.js";
import { DeadlineExceededError, RejectedError, UnexpectedAnswerError } from "./errors.js";
import { acquire, withPermit, type AcquireOptions, type Permit } from "./permit.js";
import { LEADER_HEADER, LeaderTracker, parseEndpoints, parseLeaderHint, type LeaderHint } from "./leader.js";
import { parseShardHint, SHARD_HEADER, SHARDS_HEADER, type ShardHint } from "./shard-leaders.js";
import {
  parseWire,
  WireError,
  type BatchItem,
  type BatchItemAnswer,
  type ClusterStatus,
  type ShardMap,
  type GroupConfig,
  type KeyConfig,
  type KeyConfigUpdate,
  type KeyDeleted,
  type KeyList,
  type PermitGrant,
  type PermitRequest,
  type PermitSync,
  type PermitSyncResult,
  type SemaphoreResponse,
  type Usage,
  type WireTypeName,
} from "./wire.js";

/** Default deadline of one call, retries included, in ms. */
export const DEFAULT_CALL_TIMEOUT_MS = 30_000;
/** Default limit of one HTTP attempt, in ms (a request waits for its round). */
export const DEFAULT_ATTEMPT_TIMEOUT_MS = 15_000;
/** Least time between two rounds of node-id discovery, in ms. */
const NODE_ID_DISCOVERY_INTERVAL_MS = 30_000;
/** Keys whose `nextRequestAt` is remembered before past entries are pruned. */
const MAX_REMEMBERED_KEYS = 100_000;
/** Answers retried: what a node marks retryable (429, 503, with `Retry-After`) and gateway failures (502, 504). */
export const RETRYABLE_STATUSES: readonly number[] = [429, 502, 503, 504];
/** Longest error body kept in an error message, in characters. */
const MAX_ERROR_BODY_CHARS = 512;

export interface ClientOptions {
  /** Node API base URLs (`http://127.0.0.1:7001`), a list or one comma-separated string. */
  endpoints: string | readonly string[];
  /** Sent as `Authorization: Bearer <token>` on every call. */
  token?: string;
  /** Deadline of one call, retries included, in ms. */
  callTimeoutMs?: number;
  /** Limit of one HTTP attempt, in ms. */
  attemptTimeoutMs?: number;
  backoffInitialMs?: number;
  backoffMaxMs?: number;
  /** The fetch to use (a Worker's service binding, say); the global one by default. */
  fetch?: typeof fetch;
  /** A random draw in [0, 1) for the jitter; `Math.random` by default. */
  random?: () => number;
}

/** Per-call settings. */
export interface CallOptions {
  /** Ends the call at once, with the signal's reason. */
  signal?: AbortSignal;
  /** This call's deadline, retries included, in ms. */
  timeoutMs?: number;
  /** A query string (without `?`) for the URL. */
  query?: string;
}

/** A request as the caller writes it: `v` and `requestId` are filled in. */
export type RequestInput = Omit<PermitRequest, "v"> & { v?: 1 };
export type SyncInput = Omit<PermitSync, "v"> & { v?: 1 };

/** One item of `batch`: a key's `request` or `sync`, as `request` and `sync` take them. */
export type BatchInput = { key: string; message: ({ type: "request" } & RequestInput) | ({ type: "sync" } & SyncInput) };

/** One batch item's outcome: its answer, or the error its own call would have had. */
export type BatchResult = { ok: true; answer: SemaphoreResponse } | { ok: false; error: RejectedError };

type Attempt = { done: true; body: unknown } | { done: false; reason: string; retryAfterMs?: number };

/** Where one attempt went, and the key its call is about (its shard's leader is the one asked). */
type Sent = { endpoint: string; key: string | undefined };

export class SemaphoreClient {
  private readonly tracker: LeaderTracker;
  private readonly nextRequestAtMs = new Map<string, number>();
  private lastDiscoveryMs = -Infinity;
  private readonly fetch: typeof fetch;
  private readonly random: () => number;
  private readonly callTimeoutMs: number;
  private readonly attemptTimeoutMs: number;

  constructor(private readonly options: ClientOptions) {
    this.tracker = new LeaderTracker(parseEndpoints(options.endpoints));
    this.fetch = options.fetch ?? ((input, init) => globalThis.fetch(input, init));
    this.random = options.random ?? Math.random;
    this.callTimeoutMs = options.callTimeoutMs ?? DEFAULT_CALL_TIMEOUT_MS;
    this.attemptTimeoutMs = options.attemptTimeoutMs ?? DEFAULT_ATTEMPT_TIMEOUT_MS;
  }

  /** The node currently asked first for calls naming no key (the meta shard's leader). */
  leader(): string | undefined {
    return this.tracker.leader();
  }

  /** The node a call about `key` is sent to first: its shard's leader, once an answer named it and its endpoint is known. */
  leaderOfKey(key: string): string | undefined {
    return this.tracker.leaderOfKey(key);
  }

  /** The cluster's shard count, as the answers said (1 until one says otherwise). */
  shardCount(): number {
    return this.tracker.shardCount();
  }

  /** Every endpoint known (configured plus learned). */
  endpoints(): readonly string[] {
    return this.tracker.endpoints;
  }

  /** The key's `nextRequestAt` from its last answer, in ms since the epoch. */
  nextRequestAt(key: string): number | undefined {
    return this.nextRequestAtMs.get(key);
  }

  /** Waits for `count` claimed permits of `key` for `group` (see `permit.ts`). */
  acquire(key: string, group: string, count: number, options?: AcquireOptions): Promise<Permit> {
    return acquire(this, key, group, count, options);
  }

  /** Runs `work(fence)` under `count` permits and releases them when it settles. */
  withPermit<R>(
    key: string,
    group: string,
    count: number,
    work: (fence: number) => Promise<R>,
    options?: AcquireOptions,
  ): Promise<R> {
    return withPermit(this, key, group, count, work, options);
  }

  /**
   * Sends a `request` and waits for its round; waits for `nextRequestAt` first,
   * inside the call's deadline: when `nextRequestAt` falls after it, fails at
   * once with a `DeadlineExceededError` instead of sleeping past it.
   * `request` and `sync` are independent calls: claims and releases may be
   * synced while a request waits for its round (reports are cumulative).
   */
  async request(key: string, input: RequestInput, options: CallOptions = {}): Promise<PermitGrant> {
    const body = { type: "request", ...input, v: 1, requestId: input.requestId ?? crypto.randomUUID() };
    const deadlineMs = options.timeoutMs ?? this.callTimeoutMs;
    const deadline = Date.now() + deadlineMs;
    const wait = (this.nextRequestAtMs.get(key) ?? 0) - Date.now();
    if (wait > 0) {
      if (Date.now() + wait >= deadline) throw new DeadlineExceededError(deadlineMs, 0, `the key's nextRequestAt is ${wait} ms away`);
      await sleep(wait, options.signal);
    }
    const remaining = Math.max(1, deadline - Date.now());
    const answer = await this.call("POST", semaphorePath(key), body, "SemaphoreResponse", { ...options, timeoutMs: remaining });
    if (answer.type !== "grant") throw new UnexpectedAnswerError(`/v1/semaphores/${key}`, "a synced answer to a request");
    const { type: _type, ...grant } = answer;
    this.rememberNextRequestAt(key, grant.nextRequestAt);
    return grant;
  }

  /** Sends a `sync` (reports only); applied without waiting for a round. */
  async sync(key: string, input: SyncInput, options: CallOptions = {}): Promise<PermitSyncResult> {
    const answer = await this.call("POST", semaphorePath(key), { type: "sync", ...input, v: 1 }, "SemaphoreResponse", options);
    if (answer.type !== "synced") throw new UnexpectedAnswerError(`/v1/semaphores/${key}`, "a grant answer to a sync");
    const { type: _type, ...synced } = answer;
    return synced;
  }

  /**
   * Sends many `request`s and `sync`s, for many keys, in one call
   * (`POST /v1/batch`: at most `MAX_BATCH_ITEMS` items and `MAX_BATCH_KEYS`
   * keys) and returns each item's own outcome, in order: an item's error is a
   * `RejectedError` with the status its own call would have had, and never
   * fails its neighbours. Only the envelope (or the retries running out) fails
   * the whole call. `request` items get a `requestId` when they have none, the
   * same on every attempt, so a retried call replays them. The call is answered
   * when its slowest item is (a `request` when its key's round runs); unlike
   * `request` it does not wait for a key's `nextRequestAt` first, but it does
   * remember the `nextRequestAt` of each grant it gets.
   */
  async batch(items: readonly BatchInput[], options: CallOptions = {}): Promise<BatchResult[]> {
    const sent: BatchItem[] = items.map(({ key, message }) => ({
      key,
      message:
        message.type === "request"
          ? { ...message, v: 1, requestId: message.requestId ?? crypto.randomUUID() }
          : { ...message, v: 1 },
    }));
    const answer = await this.call("POST", ["v1", "batch"], { v: 1, items: sent }, "BatchResponse", options);
    const results = batchResults(sent, answer.items);
    results.forEach((result, index) => {
      if (result.ok && result.answer.type === "grant") this.rememberNextRequestAt(sent[index]!.key, result.answer.nextRequestAt);
    });
    return results;
  }

  /** The key's linearizable usage. */
  usage(key: string, options: CallOptions = {}): Promise<Usage> {
    return this.call("GET", semaphorePath(key, "usage"), undefined, "Usage", options);
  }

  keyConfig(key: string, options: CallOptions = {}): Promise<KeyConfig> {
    return this.call("GET", semaphorePath(key, "config"), undefined, "KeyConfig", options);
  }

  /** Replaces the key's configuration; answers the effective one once applied. */
  setKeyConfig(key: string, update: KeyConfigUpdate, options: CallOptions = {}): Promise<KeyConfig> {
    return this.call("PUT", semaphorePath(key, "config"), update, "KeyConfig", options);
  }

  async setGroup(key: string, group: string, config: GroupConfig, options: CallOptions = {}): Promise<void> {
    await this.call("PUT", [...semaphorePath(key, "groups"), group], config, undefined, options);
  }

  async deleteGroup(key: string, group: string, options: CallOptions = {}): Promise<void> {
    await this.call("DELETE", [...semaphorePath(key, "groups"), group], undefined, undefined, options);
  }

  /**
   * Admin: deletes the key's settings, groups and state; it follows the cluster defaults again.
   * A key with grants, leases or waiting requests is refused (`key_in_use`, 409) unless `force`,
   * which releases them. One `requestId` serves every attempt, so a retry after a lost answer
   * gets the first answer instead of deleting again.
   */
  deleteKey(key: string, deletion: { force?: boolean } = {}, options: CallOptions = {}): Promise<KeyDeleted> {
    const query = new URLSearchParams({ requestId: crypto.randomUUID() });
    if (deletion.force) query.set("force", "true");
    return this.call("DELETE", semaphorePath(key), undefined, "KeyDeleted", { ...options, query: query.toString() });
  }

  /** One page of the keys with state, in byte order, with their usage; pass `next` as `after` for the next page. */
  keys(page: { after?: string; limit?: number } = {}, options: CallOptions = {}): Promise<KeyList> {
    const query = new URLSearchParams();
    if (page.after !== undefined) query.set("after", page.after);
    if (page.limit !== undefined) query.set("limit", String(page.limit));
    return this.call("GET", ["v1", "semaphores"], undefined, "KeyList", { ...options, query: query.toString() });
  }

  clusterStatus(options: CallOptions = {}): Promise<ClusterStatus> {
    return this.call("GET", ["cluster", "status"], undefined, "ClusterStatus", options);
  }

  /** Every shard and its leader, as the answering node sees them (an admin token). */
  clusterShards(options: CallOptions = {}): Promise<ShardMap> {
    return this.call("GET", ["cluster", "shards"], undefined, "ShardMap", options);
  }

  /** One call: attempts inside the deadline, parsed as the wire type `shape`. */
  async call<N extends WireTypeName | undefined>(
    method: string,
    path: readonly string[],
    body: unknown,
    shape: N,
    options: CallOptions = {},
  ): Promise<N extends WireTypeName ? ReturnType<typeof parseWire<N>> : unknown> {
    const deadlineMs = options.timeoutMs ?? this.callTimeoutMs;
    const deadline = Date.now() + deadlineMs;
    const backoff = new Backoff(this.options.backoffInitialMs ?? DEFAULT_INITIAL_DELAY_MS, this.options.backoffMaxMs ?? DEFAULT_MAX_DELAY_MS);
    const text = body === undefined ? undefined : JSON.stringify(body);
    const key = keyOfPath(path);
    for (let attempts = 1; ; attempts++) {
      options.signal?.throwIfAborted();
      const endpoint = this.tracker.pickFor(key);
      const url = `${endpoint}/${path.map(encodeURIComponent).join("/")}${options.query ? `?${options.query}` : ""}`;
      const timeout = Math.max(1, Math.min(deadline - Date.now(), this.attemptTimeoutMs));
      const attempt = await this.attempt({ endpoint, key }, method, url, text, timeout, options.signal);
      if (attempt.done) {
        if (shape === undefined) return attempt.body as never;
        try {
          return parseWire(shape, attempt.body) as never;
        } catch (error) {
          if (error instanceof WireError) throw new UnexpectedAnswerError(url, error.message);
          throw error;
        }
      }
      const delay = backoff.nextDelayMs(this.random(), attempt.retryAfterMs);
      if (Date.now() + delay >= deadline) throw new DeadlineExceededError(deadlineMs, attempts, attempt.reason);
      await sleep(delay, options.signal);
    }
  }

  private async attempt(
    sent: Sent,
    method: string,
    url: string,
    body: string | undefined,
    timeoutMs: number,
    signal: AbortSignal | undefined,
  ): Promise<Attempt> {
    const headers: Record<string, string> = {};
    if (body !== undefined) headers["content-type"] = "application/json";
    if (this.options.token) headers.authorization = `Bearer ${this.options.token}`;
    const controller = new AbortController();
    const timer = setTimeout(() => controller.abort(new Error(`no answer within ${timeoutMs} ms`)), timeoutMs);
    const onAbort = () => controller.abort(signal?.reason);
    signal?.addEventListener("abort", onAbort, { once: true });
    let status: number;
    let hint: LeaderHint | undefined;
    let shard: ShardHint | undefined;
    let retryAfterMs: number | undefined;
    let text: string;
    const { endpoint, key } = sent;
    try {
      const response = await this.fetch(url, { method, headers, body, signal: controller.signal });
      status = response.status;
      hint = parseLeaderHint(response.headers.get(LEADER_HEADER));
      shard = parseShardHint(response.headers.get(SHARD_HEADER), response.headers.get(SHARDS_HEADER));
      retryAfterMs = parseRetryAfter(response.headers.get("retry-after"));
      text = await response.text();
    } catch (error) {
      signal?.throwIfAborted();
      this.tracker.failedFor(endpoint, key, hint, shard);
      return { done: false, reason: `${endpoint}: ${describe(error)}` };
    } finally {
      clearTimeout(timer);
      signal?.removeEventListener("abort", onAbort);
    }
    if (RETRYABLE_STATUSES.includes(status)) {
      if (status !== 429) this.tracker.failedFor(endpoint, key, hint, shard);
      return { done: false, reason: rejected(status, text).message, retryAfterMs };
    }
    if (status < 200 || status >= 300) throw rejected(status, text);
    this.tracker.answeredFor(endpoint, hint, shard);
    if (this.tracker.wantsNodeIds()) this.discoverNodeIds();
    try {
      return { done: true, body: text === "" ? null : JSON.parse(text) };
    } catch (error) {
      throw new UnexpectedAnswerError(url, describe(error));
    }
  }

  /** Learns which endpoint is which node id, in the background and rarely. */
  private discoverNodeIds(): void {
    if (Date.now() - this.lastDiscoveryMs < NODE_ID_DISCOVERY_INTERVAL_MS) return;
    this.lastDiscoveryMs = Date.now();
    for (const endpoint of [...this.tracker.endpoints]) {
      const headers: Record<string, string> = this.options.token ? { authorization: `Bearer ${this.options.token}` } : {};
      this.fetch(`${endpoint}/cluster/status`, { headers, signal: AbortSignal.timeout(3_000) })
        .then(async (response) => {
          if (!response.ok) return;
          const status = parseWire("ClusterStatus", await response.json());
          this.tracker.learnNodeId(endpoint, status.id);
        })
        .catch(() => undefined);
    }
  }

  /** Remembers the key's `nextRequestAt`, believed at most `MAX_NEXT_REQUEST_AHEAD_MS` ahead. */
  private rememberNextRequestAt(key: string, atMs: number): void {
    atMs = believedNextRequestAt(atMs, Date.now());
    if (this.nextRequestAtMs.size >= MAX_REMEMBERED_KEYS) {
      const now = Date.now();
      for (const [known, at] of this.nextRequestAtMs) if (at <= now) this.nextRequestAtMs.delete(known);
    }
    if (this.nextRequestAtMs.size < MAX_REMEMBERED_KEYS || this.nextRequestAtMs.has(key)) {
      this.nextRequestAtMs.set(key, atMs);
    }
  }
}

/** The key a call of `path` is about: the segment after `/v1/semaphores`. Listings, batches, tokens and cluster calls name none. */
export function keyOfPath(path: readonly string[]): string | undefined {
  return path.length >= 3 && path[0] === "v1" && path[1] === "semaphores" ? path[2] : undefined;
}

/** Path segments of `/v1/semaphores/{key}[/{tail}]`; each is percent-encoded when sent. */
export function semaphorePath(key: string, tail?: string): string[] {
  return tail === undefined ? ["v1", "semaphores", key] : ["v1", "semaphores", key, tail];
}

/**
 * Each item's outcome from a batch answer, checked against what was sent: one
 * answer per item, and a `request` answered by a `grant`, a `sync` by `synced`
 * (anything else is not this protocol: the whole answer is refused).
 */
export function batchResults(sent: readonly BatchItem[], answers: readonly BatchItemAnswer[]): BatchResult[] {
  if (answers.length !== sent.length) {
    throw new UnexpectedAnswerError("/v1/batch", `${answers.length} answers to ${sent.length} items`);
  }
  return answers.map((item, index) => {
    if (item.answer) {
      const expected = sent[index]!.message.type === "request" ? "grant" : "synced";
      if (item.answer.type !== expected) {
        throw new UnexpectedAnswerError("/v1/batch", `item ${index}: a ${item.answer.type} answer to a ${sent[index]!.message.type}`);
      }
      return { ok: true, answer: item.answer };
    }
    // An item with neither answer nor error is the server's fault, as Rust's `into_result` has it.
    const error = item.error ?? { code: "internal", message: "batch item answered neither an answer nor an error" };
    return { ok: false, error: new RejectedError(item.status, error.code, error.message, error.field) };
  });
}

/** The error of a non-success answer: the server's `{error: {code, message}}`, or the raw text. */
function rejected(status: number, text: string): RejectedError {
  try {
    const answer = parseWire("ErrorAnswer", JSON.parse(text));
    return new RejectedError(status, answer.error.code, answer.error.message, answer.error.field);
  } catch {
    return new RejectedError(status, `http_${status}`, text.slice(0, MAX_ERROR_BODY_CHARS));
  }
}

/** `Retry-After` in seconds or as an HTTP date, in ms. */
export function parseRetryAfter(value: string | null): number | undefined {
  if (value === null) return undefined;
  const seconds = Number(value.trim());
  if (Number.isFinite(seconds) && seconds >= 0) return seconds * 1_000;
  const at = Date.parse(value);
  return Number.isNaN(at) ? undefined : Math.max(0, at - Date.now());
}

/** Waits `ms`, or rejects with the signal's reason when it aborts first. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

function describe(error: unknown): string {
  if (error instanceof Error) {
    const cause = (error as { cause?: unknown }).cause;
    return cause instanceof Error ? `${error.message} (${cause.message})` : error.message;
  }
  return String(error);
}
