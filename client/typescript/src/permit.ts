/**
 * Permits as guards: `client.acquire(key, group, count)` and `client.withPermit(...)`.
 *
 * One acquisition (the same as the Rust client's `permit.rs`):
 * 1. a `request` with demand `{group, count, oldestAt}`; `oldestAt` stays the
 *    first ask's time so the caller keeps its place in line; repeated at the
 *    key's `nextRequestAt` until enough is granted (a round may grant part);
 * 2. every grant is claimed at once with a `sync`: the holder reclaims a grant
 *    not claimed by its claim deadline;
 * 3. the `Permit` holds the claimed grants. Claimed grants do not expire: a
 *    permit held for hours needs no heartbeat. `permit.fence` is the newest
 *    grant's fence, strictly increasing per key, for downstream checks;
 * 4. `permit.release()` reports every permit released. `await using permit =
 *    await client.acquire(...)` releases when the block ends.
 *
 * Giving up (the `signal` aborts, `timeoutMs` passes, a call fails) releases
 * whatever was granted before the promise rejects. A `request` in flight at
 * that moment is not cut off: what its round grants is released as soon as
 * its answer comes. Only a process that dies first leaves such a grant to the
 * holder, which reclaims it at its claim deadline (`grantTimeoutMs`).
 * JavaScript has no destructors: a `Permit` that is neither released nor
 * disposed stays held.
 */

import { sleep, type CallOptions, type SemaphoreClient } from "./client.js";
import { AcquireError } from "./errors.js";
import type { GrantReport, GrantedPermits } from "./wire.js";

export interface AcquireOptions {
  /** The `clientId` the grants belong to; a fresh `permit-{uuid}` by default. */
  clientId?: string;
  /** Give up after this long, in ms; by default wait until granted. */
  timeoutMs?: number;
  /** Give up when this aborts. */
  signal?: AbortSignal;
}

/** One grant a permit holds. */
export interface HeldGrant {
  grantId: string;
  claimed: number;
  fence: number;
}

export class Permit {
  private released = false;

  constructor(
    private readonly client: SemaphoreClient,
    readonly key: string,
    readonly group: string,
    readonly clientId: string,
    readonly grants: readonly HeldGrant[],
  ) {}

  /** Permits held. */
  get count(): number {
    return this.grants.reduce((sum, grant) => sum + grant.claimed, 0);
  }

  /** The newest grant's fence: strictly increasing per key. */
  get fence(): number {
    return Math.max(0, ...this.grants.map((grant) => grant.fence));
  }

  /** Reports every permit released; a second call does nothing. */
  async release(options: CallOptions = {}): Promise<void> {
    if (this.released) return;
    this.released = true;
    await releaseGrants(this.client, this.key, this.clientId, this.grants, options);
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.release();
  }
}

/** `client.acquire`: waits for `count` claimed permits of `key` for `group`. */
export async function acquire(
  client: SemaphoreClient,
  key: string,
  group: string,
  count: number,
  options: AcquireOptions = {},
): Promise<Permit> {
  if (!Number.isSafeInteger(count) || count < 1) {
    throw new AcquireError("zero_count", key, "a permit needs a count of at least 1");
  }
  const clientId = options.clientId ?? `permit-${crypto.randomUUID()}`;
  const controller = new AbortController();
  const timer =
    options.timeoutMs === undefined
      ? undefined
      : setTimeout(
          () => controller.abort(new AcquireError("timeout", key, `no permit of key ${key} within ${options.timeoutMs} ms`)),
          options.timeoutMs,
        );
  const onAbort = () =>
    controller.abort(new AcquireError("aborted", key, `acquiring a permit of key ${key} was aborted`));
  if (options.signal?.aborted) onAbort();
  options.signal?.addEventListener("abort", onAbort, { once: true });
  const held: HeldGrant[] = [];
  try {
    await gather(client, key, group, count, clientId, held, controller.signal);
    return new Permit(client, key, group, clientId, held);
  } catch (error) {
    await releaseGrants(client, key, clientId, held).catch(() => undefined);
    throw controller.signal.aborted ? controller.signal.reason : error;
  } finally {
    clearTimeout(timer);
    options.signal?.removeEventListener("abort", onAbort);
  }
}

/** `client.withPermit`: runs `work(fence)` under a permit and releases it after. */
export async function withPermit<R>(
  client: SemaphoreClient,
  key: string,
  group: string,
  count: number,
  work: (fence: number) => Promise<R>,
  options: AcquireOptions = {},
): Promise<R> {
  const permit = await acquire(client, key, group, count, options);
  try {
    return await work(permit.fence);
  } finally {
    await permit.release();
  }
}

async function gather(
  client: SemaphoreClient,
  key: string,
  group: string,
  count: number,
  clientId: string,
  held: HeldGrant[],
  signal: AbortSignal,
): Promise<void> {
  const oldestAt = Date.now();
  const heldCount = () => held.reduce((sum, grant) => sum + grant.claimed, 0);
  while (heldCount() < count) {
    const wait = (client.nextRequestAt(key) ?? 0) - Date.now();
    if (wait > 0) await sleep(wait, signal);
    const grants: GrantReport[] = held.map((grant) => ({ grantId: grant.grantId, claimed: grant.claimed, released: 0 }));
    // Not aborted mid-flight: if the acquisition is given up meanwhile, what
    // the round grants is released as soon as the answer comes.
    const sent = client.request(key, { clientId, demand: [{ group, count: count - heldCount(), oldestAt }], grants });
    let answer: Awaited<typeof sent>;
    try {
      answer = await untilAborted(sent, signal);
    } catch (error) {
      sent
        .then((late) => releaseGrants(client, key, clientId, claimAmounts(late.grants, Number.MAX_SAFE_INTEGER)))
        .catch(() => undefined);
      throw error;
    }
    const refused = answer.blocked.find((blocked) => blocked.reason === "not_permitted");
    if (refused) throw new AcquireError("not_permitted", key, `group ${refused.group} of key ${key} is not permitted`);
    const fresh = claimAmounts(answer.grants, count - heldCount());
    if (fresh.length === 0) continue;
    // Held before the claim is sent: giving up from here on releases them.
    held.push(...fresh);
    const synced = await client.sync(
      key,
      { clientId, grants: fresh.map((grant) => ({ grantId: grant.grantId, claimed: grant.claimed, released: 0 })) },
      { signal },
    );
    for (const result of synced.grantResults) {
      const index = held.findIndex((grant) => grant.grantId === result.grantId);
      if (index < 0) continue;
      const grant = held[index]!;
      grant.claimed = result.status === "not_found" ? 0 : Math.min(grant.claimed, result.claimed);
      if (grant.claimed === 0) held.splice(index, 1);
    }
  }
}

/** `promise`, or the signal's reason once it aborts (the promise runs on). */
function untilAborted<T>(promise: Promise<T>, signal: AbortSignal): Promise<T> {
  if (signal.aborted) return Promise.reject(signal.reason);
  return new Promise((resolve, reject) => {
    const onAbort = () => reject(signal.reason);
    signal.addEventListener("abort", onAbort, { once: true });
    promise.then(resolve, reject).finally(() => signal.removeEventListener("abort", onAbort));
  });
}

/** What to claim of a round's grants: each in full until `needed` is covered. */
export function claimAmounts(grants: readonly GrantedPermits[], needed: number): HeldGrant[] {
  const claimed: HeldGrant[] = [];
  for (const grant of grants) {
    if (needed <= 0) break;
    const take = Math.min(grant.permits, needed);
    needed -= take;
    claimed.push({ grantId: grant.grantId, claimed: take, fence: grant.fence });
  }
  return claimed;
}

async function releaseGrants(
  client: SemaphoreClient,
  key: string,
  clientId: string,
  grants: readonly HeldGrant[],
  options: CallOptions = {},
): Promise<void> {
  if (grants.length === 0) return;
  await client.sync(
    key,
    { clientId, grants: grants.map((grant) => ({ grantId: grant.grantId, claimed: grant.claimed, released: grant.claimed })) },
    options,
  );
}
