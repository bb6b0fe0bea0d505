/**
 * The queue's accounting: a synchronous, deterministic state machine, the same
 * rules as the Rust client's `queue/state/` (read its module docs for the why).
 *
 * No IO, no clock, no randomness: time comes in as `nowMs`, the holder's
 * answers as wire values; out come the next message per key (`poll`) and the
 * items to admit (`takeAdmits`). `queue.ts` only carries values between this,
 * the network, the application and the store.
 *
 * One item's life: `queued` → (a permit of a confirmed lease is drawn:
 * `admitted`) or (a grant arrives: `claiming` → the claim is confirmed:
 * `admitted`; came back `expired`/`not_found`: `queued` again) → `release(id)`.
 *
 * Each key has two independent lanes to the holder, each with at most one
 * message in flight (the Rust `queue/state/messages.rs`):
 * - the **demand** lane carries `request`s: demand only, no reports, sent when
 *   items are queued, `nextRequestAt` has come, no lease of the key awaits
 *   confirmation (its permits may serve the queued items; asking again could
 *   bring a second lease for them), and the same poll neither drew lease
 *   permits of the key nor hands out admits of it (the demand just changed);
 * - the **report** lane carries `sync`s: grant claims, lease claims, releases
 *   and heartbeats, sent as soon as they exist, never behind a request waiting
 *   for its round.
 * When a poll sends both and the reports only return permits (releases of
 * confirmed grant claims; no claim, no lease), the releases ride in the
 * request instead: the holder applies a request's grant reports with its next
 * entry, as a sync's, so nothing waits and one message is saved; the report
 * lane stays free for later reports. Claims always go in syncs: an item is
 * admitted only once its claim is confirmed, and a request is answered only
 * after its round.
 * Reports are cumulative, so the lanes may be answered in any order; what a
 * sync reported is kept so its answer is matched against what the holder saw.
 * A failed message frees its lane after `failureRetryMs`.
 *
 * Invariants:
 * - an item is admitted only under a confirmed grant claim or a permit drawn
 *   from a confirmed lease; each permit admits at most one item;
 * - `released <= claimed` per grant, `released <= drawn <= permits` per lease;
 * - reports are cumulative high-water marks: resending one is harmless;
 * - a grant is forgotten once all its claimed permits are released and the
 *   holder acknowledged that; a lease once the holder settled it;
 * - released ids are remembered (up to `MAX_RELEASED_REMEMBERED`).
 */

import { believedNextRequestAt } from "../next-request.js";
import type {
  GrantReport,
  GrantResult,
  GrantedPermits,
  LeaseGrant,
  LeaseReport,
  SemaphoreRequest,
  SemaphoreResponse,
} from "../wire.js";

/** Longest item id, key and group, in bytes of UTF-8 (as the server counts keys and groups). */
export const MAX_ITEM_ID_BYTES = 256;
export const MAX_KEY_BYTES = 256;
export const MAX_GROUP_BYTES = 256;
/** Released ids remembered for `status` and no-op re-enqueues. */
export const MAX_RELEASED_REMEMBERED = 100_000;
/** Caps of one message, as the server's limits (`core/src/limits.rs`). */
export const MAX_DEMAND_ENTRIES = 1_024;
export const MAX_GRANT_REPORTS = 4_096;
export const MAX_LEASE_REPORTS = 1_024;
/** Default wait after a failed message before the key's next one, in ms. */
export const DEFAULT_FAILURE_RETRY_MS = 1_000;
/** Default time a lease may sit with nothing queued in its group before its undrawn permits go back, in ms. */
export const DEFAULT_IDLE_LEASE_RETURN_MS = 30_000;

export interface StateConfig {
  failureRetryMs: number;
  /** `null` keeps idle leases until `contended` or expiry. */
  idleLeaseReturnMs: number | null;
}

export const DEFAULT_STATE_CONFIG: StateConfig = {
  failureRetryMs: DEFAULT_FAILURE_RETRY_MS,
  idleLeaseReturnMs: DEFAULT_IDLE_LEASE_RETURN_MS,
};

export interface QueueItem<T> {
  id: string;
  key: string;
  group: string;
  body: T;
}

/** The permit an item was admitted under. */
export type ItemPermit = { kind: "grant"; grantId: string; fence: number } | { kind: "lease"; leaseId: string };

export interface AdmittedItem<T> extends QueueItem<T> {
  permit: ItemPermit;
}

export type ItemStatus = "queued" | "admitted" | "released" | "unknown";
export type ReleaseOutcome = "released" | "cancelled" | "already_released" | "unknown";

export interface QueueCounts {
  queued: number;
  claiming: number;
  admitted: number;
  released: number;
  grants: number;
  leases: number;
  drawable: number;
}

export type Phase =
  | { phase: "queued" }
  | { phase: "claiming"; grantId: string; releaseRequested: boolean }
  | { phase: "admitted"; permit: ItemPermit };

export interface ItemRecord<T> extends QueueItem<T> {
  enqueuedAtMs: number;
  order: number;
  phase: Phase;
}

export interface GrantHolding {
  group: string;
  permits: number;
  fence: number;
  claimed: number;
  claimConfirmed: boolean;
  claiming: string[];
  released: number;
  ackedReleased: number;
}

export interface LeaseHolding {
  group: string;
  permits: number;
  expiresAtMs: number;
  ttlMs: number;
  drawn: number;
  released: number;
  retired: boolean;
  confirmed: boolean;
  acked: LeaseReport | null;
  idleSinceMs: number | null;
}

/** One key's permits, as stored. */
export interface KeyRecord {
  grants: Record<string, GrantHolding>;
  leases: Record<string, LeaseHolding>;
  nextRequestAtMs: number;
}

/** A message to send for a key. */
export interface Outgoing {
  key: string;
  message: SemaphoreRequest;
}

/** Records changed since the store last saw them. */
export interface Dirty {
  items: Set<string>;
  keys: Set<string>;
  releasedAdded: [number, string][];
  releasedRemoved: [number, string][];
}

interface InFlight {
  grants: Map<string, GrantReport>;
  leases: Map<string, LeaseReport>;
}

/** One of a key's two lanes to the holder. */
export type Lane = "demand" | "report";

/** The lane a message travels on: `request`s on the demand lane, `sync`s on the report lane. */
export function laneOf(message: SemaphoreRequest): Lane {
  return message.type === "request" ? "demand" : "report";
}

interface KeyRuntime {
  demandInFlight: boolean;
  /** The releases riding in that request, to match its answer against. */
  riding: InFlight | null;
  /** A sync in flight, with what it reported. */
  reportInFlight: InFlight | null;
  demandRetryAtMs: number;
  reportRetryAtMs: number;
  /** Report every holding once (after a restart, or at shutdown). */
  forceReport: boolean;
}

const idleRuntime = (): KeyRuntime => ({ demandInFlight: false, riding: null, reportInFlight: null, demandRetryAtMs: 0, reportRetryAtMs: 0, forceReport: false });
const runtimeInFlight = (runtime: KeyRuntime) => Number(runtime.demandInFlight) + Number(runtime.reportInFlight !== null);

type QueuedEntry = { atMs: number; order: number; id: string };

const emptyDirty = (): Dirty => ({ items: new Set(), keys: new Set(), releasedAdded: [], releasedRemoved: [] });
const sortedEntries = <V>(record: Record<string, V>): [string, V][] =>
  Object.entries(record).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
const isEmptyRecord = (record: KeyRecord) =>
  Object.keys(record.grants).length === 0 && Object.keys(record.leases).length === 0;

const grantAwaitsConfirmation = (grant: GrantHolding) => !grant.claimConfirmed && grant.claimed > 0;
/** An unconfirmed claim, or releases beyond those acknowledged and those riding (up to `riding`) in the request in flight. */
const grantNeedsReport = (grant: GrantHolding, riding = 0) =>
  grantAwaitsConfirmation(grant) || grant.released > Math.max(grant.ackedReleased, riding);
const grantsNeedReport = (record: KeyRecord, runtime: KeyRuntime | undefined) =>
  Object.entries(record.grants).some(([grantId, grant]) => grantNeedsReport(grant, runtime?.riding?.grants.get(grantId)?.released ?? 0));
const byGrantId = (grants: GrantReport[]) => new Map(grants.map((report) => [report.grantId, report]));
const leaseAwaitsConfirmation = (lease: LeaseHolding) => !lease.confirmed && !lease.retired;
const leaseDrawable = (lease: LeaseHolding, nowMs: number) =>
  lease.confirmed && !lease.retired && lease.drawn < lease.permits && nowMs < lease.expiresAtMs;
const leaseHeartbeatDueMs = (lease: LeaseHolding): number | null =>
  !lease.retired && lease.drawn > lease.released ? Math.max(0, lease.expiresAtMs - Math.floor(lease.ttlMs / 2)) : null;
const leaseReport = (leaseId: string, lease: LeaseHolding): LeaseReport => ({
  leaseId,
  drawn: lease.drawn,
  released: lease.released,
  retired: lease.retired,
});
function leaseNeedsReport(lease: LeaseHolding): boolean {
  if (leaseAwaitsConfirmation(lease) || lease.acked === null) return true;
  const acked = lease.acked;
  return acked.drawn !== lease.drawn || acked.released !== lease.released || (acked.retired ?? false) !== lease.retired;
}
const liveEcho = (echo: LeaseGrant, nowMs: number) => echo.permits > 0 && echo.group !== "" && echo.expiresAt > nowMs;

export class QueueState<T> {
  private readonly items = new Map<string, ItemRecord<T>>();
  /** key → group → queued items, oldest first. */
  private readonly queued = new Map<string, Map<string, QueuedEntry[]>>();
  private readonly keys = new Map<string, KeyRecord>();
  private readonly runtime = new Map<string, KeyRuntime>();
  private readonly released = new Map<string, number>();
  private readonly releasedBySeq = new Map<number, string>();
  private nextOrder = 0;
  private nextReleasedSeq = 0;
  private admits: AdmittedItem<T>[] = [];
  private dirty: Dirty = emptyDirty();

  constructor(
    readonly clientId: string,
    private readonly config: StateConfig = DEFAULT_STATE_CONFIG,
  ) {}

  /** A queue rebuilt from stored records: admitted items are admitted again, every holding reported once. */
  static restore<T>(
    clientId: string,
    config: StateConfig,
    items: ItemRecord<T>[],
    keys: [string, KeyRecord][],
    released: [number, string][],
  ): QueueState<T> {
    const state = new QueueState<T>(clientId, config);
    for (const [seq, id] of [...released].sort(([a], [b]) => a - b)) {
      state.nextReleasedSeq = Math.max(state.nextReleasedSeq, seq + 1);
      state.released.set(id, seq);
      state.releasedBySeq.set(seq, id);
    }
    for (const [key, record] of keys) {
      for (const lease of Object.values(record.leases)) lease.confirmed ||= lease.drawn > 0;
      if (!isEmptyRecord(record)) state.runtimeOf(key).forceReport = true;
      state.keys.set(key, record);
    }
    for (const item of [...items].sort((a, b) => a.order - b.order)) {
      state.nextOrder = Math.max(state.nextOrder, item.order + 1);
      if (item.phase.phase === "queued") state.indexQueued(item);
      if (item.phase.phase === "admitted") state.admits.push(admitted(item, item.phase.permit));
      state.items.set(item.id, item);
    }
    return state;
  }

  // ---- items ----------------------------------------------------------------

  /** Adds items; known ids are skipped. All or nothing: one invalid item rejects the batch. */
  enqueue(items: QueueItem<T>[], nowMs: number): { added: number; known: number } {
    for (const item of items) validateItem(item);
    const outcome = { added: 0, known: 0 };
    for (const item of items) {
      if (this.items.has(item.id) || this.released.has(item.id)) {
        outcome.known += 1;
        continue;
      }
      const record: ItemRecord<T> = { ...item, enqueuedAtMs: nowMs, order: this.nextOrder++, phase: { phase: "queued" } };
      this.indexQueued(record);
      this.items.set(record.id, record);
      this.dirty.items.add(record.id);
      outcome.added += 1;
    }
    return outcome;
  }

  /** The item's work reached a terminal state (or, if still queued, it is dropped). */
  release(id: string): ReleaseOutcome {
    const item = this.items.get(id);
    if (!item) return this.released.has(id) ? "already_released" : "unknown";
    switch (item.phase.phase) {
      case "queued":
        this.unindexQueued(item);
        this.forgetItem(id);
        return "cancelled";
      case "claiming":
        item.phase.releaseRequested = true;
        this.dirty.items.add(id);
        return "released";
      case "admitted":
        this.returnPermit(item.key, item.phase.permit);
        this.forgetItem(id);
        return "released";
    }
  }

  status(id: string): ItemStatus {
    const item = this.items.get(id);
    if (!item) return this.released.has(id) ? "released" : "unknown";
    return item.phase.phase === "admitted" ? "admitted" : "queued";
  }

  counts(nowMs: number): QueueCounts {
    const counts: QueueCounts = { queued: 0, claiming: 0, admitted: 0, released: this.released.size, grants: 0, leases: 0, drawable: 0 };
    for (const item of this.items.values()) {
      if (item.phase.phase === "admitted") counts.admitted += 1;
      else counts.queued += 1;
      if (item.phase.phase === "claiming") counts.claiming += 1;
    }
    for (const record of this.keys.values()) {
      counts.grants += Object.keys(record.grants).length;
      for (const lease of Object.values(record.leases)) {
        counts.leases += 1;
        if (leaseDrawable(lease, nowMs)) counts.drawable += lease.permits - lease.drawn;
      }
    }
    return counts;
  }

  /** Ids of admitted items, oldest first, at most `limit`: what to ask `finished` about. */
  admittedIds(limit: number): string[] {
    return [...this.items.values()]
      .filter((item) => item.phase.phase === "admitted")
      .sort((a, b) => a.order - b.order)
      .slice(0, limit)
      .map((item) => item.id);
  }

  takeAdmits(): AdmittedItem<T>[] {
    const admits = this.admits;
    this.admits = [];
    return admits;
  }

  takeDirty(): Dirty {
    const dirty = this.dirty;
    this.dirty = emptyDirty();
    return dirty;
  }

  item(id: string): ItemRecord<T> | undefined {
    return this.items.get(id);
  }

  keyRecord(key: string): KeyRecord | undefined {
    return this.keys.get(key);
  }

  private hasQueued(key: string): boolean {
    return (this.queued.get(key)?.size ?? 0) > 0;
  }

  private indexQueued(item: ItemRecord<T>): void {
    const groups = this.queued.get(item.key) ?? new Map<string, QueuedEntry[]>();
    this.queued.set(item.key, groups);
    const entries = groups.get(item.group) ?? [];
    groups.set(item.group, entries);
    const entry = { atMs: item.enqueuedAtMs, order: item.order, id: item.id };
    let at = entries.length;
    while (at > 0 && compareEntries(entries[at - 1]!, entry) > 0) at -= 1;
    entries.splice(at, 0, entry);
  }

  private unindexQueued(item: ItemRecord<T>): void {
    const entries = this.queued.get(item.key)?.get(item.group);
    const at = entries?.findIndex((entry) => entry.id === item.id) ?? -1;
    if (entries && at >= 0) entries.splice(at, 1);
    this.pruneQueued(item.key, item.group);
  }

  private pruneQueued(key: string, group: string): void {
    const groups = this.queued.get(key);
    if (!groups) return;
    if (groups.get(group)?.length === 0) groups.delete(group);
    if (groups.size === 0) this.queued.delete(key);
  }

  private returnPermit(key: string, permit: ItemPermit): void {
    const record = this.keys.get(key);
    if (!record) return;
    if (permit.kind === "grant") {
      const grant = record.grants[permit.grantId];
      if (grant) grant.released = Math.min(grant.released + 1, grant.claimed);
    } else {
      const lease = record.leases[permit.leaseId];
      if (lease) lease.released = Math.min(lease.released + 1, lease.drawn);
    }
    this.dirty.keys.add(key);
  }

  private forgetItem(id: string): void {
    this.items.delete(id);
    this.dirty.items.add(id);
    const seq = this.nextReleasedSeq++;
    this.released.set(id, seq);
    this.releasedBySeq.set(seq, id);
    this.dirty.releasedAdded.push([seq, id]);
    while (this.released.size > MAX_RELEASED_REMEMBERED) {
      const [oldest, forgotten] = this.releasedBySeq.entries().next().value as [number, string];
      this.releasedBySeq.delete(oldest);
      this.released.delete(forgotten);
      this.dirty.releasedRemoved.push([oldest, forgotten]);
    }
  }

  // ---- grants ---------------------------------------------------------------

  /** A new grant: the oldest queued items of its group claim its permits. */
  private acceptGrant(key: string, granted: GrantedPermits): void {
    const entries = this.queued.get(key)?.get(granted.group) ?? [];
    const claiming = entries.splice(0, granted.permits).map((entry) => entry.id);
    this.pruneQueued(key, granted.group);
    if (claiming.length === 0) return; // the holder reclaims it at the deadline
    for (const id of claiming) {
      this.items.get(id)!.phase = { phase: "claiming", grantId: granted.grantId, releaseRequested: false };
      this.dirty.items.add(id);
    }
    const record = this.recordOf(key);
    record.grants[granted.grantId] = {
      group: granted.group,
      permits: granted.permits,
      fence: granted.fence,
      claimed: claiming.length,
      claimConfirmed: false,
      claiming,
      released: 0,
      ackedReleased: 0,
    };
  }

  private applyGrantResults(key: string, sent: InFlight, results: GrantResult[]): void {
    for (const result of results) {
      const report = sent.grants.get(result.grantId);
      const record = this.keys.get(key);
      const grant = record?.grants[result.grantId];
      if (!report || !record || !grant) continue;
      if (result.status === "not_found") {
        delete record.grants[result.grantId];
        if (!grant.claimConfirmed) this.settleClaims(key, result.grantId, grant, 0);
        continue;
      }
      if (!grant.claimConfirmed && report.claimed === grant.claimed) {
        const confirmed = Math.min(result.claimed, grant.claimed);
        const claiming = grant.claiming;
        grant.claimed = confirmed;
        grant.claimConfirmed = true;
        grant.claiming = [];
        this.settleClaims(key, result.grantId, { ...grant, claiming }, confirmed);
      }
      grant.ackedReleased = Math.max(grant.ackedReleased, Math.min(report.released, grant.claimed));
      if (grant.claimConfirmed && grant.released >= grant.claimed && grant.ackedReleased >= grant.claimed) {
        delete record.grants[result.grantId];
      }
    }
  }

  /** Admits the first `confirmed` claiming items, requeues the rest; items released meanwhile are released. */
  private settleClaims(key: string, grantId: string, grant: GrantHolding, confirmed: number): void {
    const permit: ItemPermit = { kind: "grant", grantId, fence: grant.fence };
    grant.claiming.forEach((id, index) => {
      const item = this.items.get(id);
      if (!item || item.phase.phase !== "claiming") return;
      const releaseRequested = item.phase.releaseRequested;
      this.dirty.items.add(id);
      if (index < confirmed) {
        item.phase = { phase: "admitted", permit };
        if (releaseRequested) {
          this.returnPermit(key, permit);
          this.forgetItem(id);
        } else {
          this.admits.push(admitted(item, permit));
        }
      } else if (releaseRequested) {
        this.forgetItem(id);
      } else {
        item.phase = { phase: "queued" };
        this.indexQueued(item);
      }
    });
  }

  // ---- leases ---------------------------------------------------------------

  /** For shutdown: stop drawing from every lease and report every holding once more. */
  retireAllLeases(): void {
    for (const [key, record] of this.keys) {
      let changed = false;
      for (const lease of Object.values(record.leases)) {
        changed ||= !lease.retired;
        lease.retired = true;
      }
      if (changed) this.dirty.keys.add(key);
      const runtime = this.runtimeOf(key);
      runtime.forceReport = !isEmptyRecord(record);
      runtime.reportRetryAtMs = 0;
    }
  }

  private applyLeaseEchoes(key: string, sent: InFlight, echoes: LeaseGrant[], nowMs: number): void {
    const record = this.recordOf(key);
    for (const echo of echoes) {
      const lease = record.leases[echo.leaseId];
      const report = sent.leases.get(echo.leaseId);
      if (!lease) {
        if (liveEcho(echo, nowMs) && !report) {
          record.leases[echo.leaseId] = {
            group: echo.group,
            permits: echo.permits,
            expiresAtMs: echo.expiresAt,
            ttlMs: echo.expiresAt - nowMs,
            drawn: 0,
            released: 0,
            retired: false,
            confirmed: false,
            acked: null,
            idleSinceMs: null,
          };
        }
        continue;
      }
      const settled = report !== undefined && echo.permits <= report.released && report.released >= report.drawn && lease.drawn === report.drawn;
      if (settled) {
        delete record.leases[echo.leaseId];
        continue;
      }
      if (report) lease.acked = { ...report };
      // Only an echo of this client's own report confirms the lease.
      if (liveEcho(echo, nowMs) && report) lease.confirmed = true;
      const retiredByHolder = echo.group === "" || echo.expiresAt <= nowMs || echo.expiresAt < lease.expiresAtMs;
      if (retiredByHolder) lease.retired = true;
      else lease.expiresAtMs = echo.expiresAt;
    }
  }

  /** `contended`: stop drawing from leases whose group has nothing queued. */
  private returnIdleLeases(key: string): void {
    const groups = this.queued.get(key);
    for (const lease of Object.values(this.keys.get(key)?.leases ?? {})) {
      if (!groups?.has(lease.group)) lease.retired = true;
    }
  }

  private retireStaleLeases(key: string, nowMs: number): void {
    const groups = this.queued.get(key);
    const idleMs = this.config.idleLeaseReturnMs;
    for (const lease of Object.values(this.keys.get(key)?.leases ?? {})) {
      if (lease.retired) continue;
      if (groups?.has(lease.group)) lease.idleSinceMs = null;
      else lease.idleSinceMs ??= nowMs;
      const idleExpired = lease.idleSinceMs !== null && idleMs !== null && nowMs >= lease.idleSinceMs + idleMs;
      if (nowMs >= lease.expiresAtMs || idleExpired) {
        lease.retired = true;
        this.dirty.keys.add(key);
      }
    }
  }

  /** Admits queued items under drawable lease permits, oldest first per group; whether it drew any. */
  private draw(key: string, nowMs: number): boolean {
    const record = this.keys.get(key);
    const groups = this.queued.get(key);
    if (!record || !groups) return false;
    let drew = false;
    for (const [leaseId, lease] of sortedEntries(record.leases)) {
      const entries = groups.get(lease.group);
      while (entries && entries.length > 0 && leaseDrawable(lease, nowMs)) {
        const { id } = entries.shift()!;
        lease.drawn += 1;
        drew = true;
        const permit: ItemPermit = { kind: "lease", leaseId };
        const item = this.items.get(id)!;
        item.phase = { phase: "admitted", permit };
        this.dirty.items.add(id);
        this.admits.push(admitted(item, permit));
      }
    }
    if (drew) {
      for (const [group, entries] of groups) if (entries.length === 0) groups.delete(group);
      if (groups.size === 0) this.queued.delete(key);
      this.dirty.keys.add(key);
    }
    return drew;
  }

  // ---- messages -------------------------------------------------------------

  /** Messages in flight, over every key and lane. */
  inFlight(): number {
    let count = 0;
    for (const runtime of this.runtime.values()) count += runtimeInFlight(runtime);
    return count;
  }

  /**
   * Advances time: draws, retires stale leases, and returns the messages now
   * due, at most one per key and lane (each takes its lane until `onAnswer` or
   * `onFailure`).
   */
  poll(nowMs: number): Outgoing[] {
    // Keys with admits not yet taken: the demand a request would carry just changed.
    const admitted = new Set(this.admits.map((item) => item.key));
    const outgoing: Outgoing[] = [];
    for (const key of this.activeKeys()) {
      const drew = this.draw(key, nowMs) || admitted.has(key);
      this.retireStaleLeases(key, nowMs);
      const report = this.reportLaneFree(key, nowMs) && this.reportsDue(key, nowMs);
      const demand = !drew && this.demandDue(key, nowMs);
      const ride = report && demand && this.onlyReleases(key);
      if (report && !ride) outgoing.push({ key, message: this.takeSync(key) });
      if (demand) outgoing.push({ key, message: this.takeRequest(key, ride) });
    }
    return outgoing;
  }

  /** Whether everything the key has to report returns permits: releases of confirmed claims, nothing forced, no lease. */
  private onlyReleases(key: string): boolean {
    const record = this.keys.get(key);
    if (!record || (this.runtime.get(key)?.forceReport ?? false)) return false;
    return Object.keys(record.leases).length === 0 && !Object.values(record.grants).some(grantAwaitsConfirmation);
  }

  /** Reports only (never demand) for every key with something to report: what shutdown sends. */
  pollReports(nowMs: number): Outgoing[] {
    const outgoing: Outgoing[] = [];
    for (const key of [...this.keys.keys()].sort()) {
      if (this.reportLaneFree(key, nowMs) && this.reportsDue(key, nowMs)) outgoing.push({ key, message: this.takeSync(key) });
    }
    return outgoing;
  }

  /** When `poll` may next have something to do, absent new items, releases or answers. */
  nextWakeupMs(nowMs: number): number | null {
    let wakeup: number | null = null;
    const consider = (at: number) => (wakeup = wakeup === null ? at : Math.min(wakeup, at));
    for (const key of this.activeKeys()) {
      const runtime = this.runtime.get(key) ?? idleRuntime();
      const record = this.keys.get(key);
      const leaseClaims = !!record && Object.values(record.leases).some(leaseAwaitsConfirmation);
      if (!runtime.demandInFlight && this.hasQueued(key) && !leaseClaims) {
        consider(Math.max(this.nextRequestAtMs(key), runtime.demandRetryAtMs));
      }
      if (!record) continue;
      const reportsFree = runtime.reportInFlight === null;
      const reportAt = (at: number) => Math.max(at, runtime.reportRetryAtMs);
      if (reportsFree && runtime.forceReport && !isEmptyRecord(record)) consider(reportAt(nowMs));
      if (reportsFree && grantsNeedReport(record, runtime)) consider(reportAt(nowMs));
      for (const lease of Object.values(record.leases)) {
        if (reportsFree && leaseNeedsReport(lease)) consider(reportAt(nowMs));
        const due = leaseHeartbeatDueMs(lease);
        if (reportsFree && due !== null) consider(reportAt(due));
        if (!lease.retired) {
          consider(lease.expiresAtMs);
          const idle = this.config.idleLeaseReturnMs;
          if (lease.idleSinceMs !== null && idle !== null) consider(lease.idleSinceMs + idle);
        }
      }
    }
    return wakeup === null ? null : Math.max(wakeup, nowMs);
  }

  /** The holder answered the key's message in flight on the answer's lane (`grant`: demand, `synced`: report). */
  onAnswer(key: string, answer: SemaphoreResponse, nowMs: number): void {
    const runtime = this.runtime.get(key);
    if (!runtime) return;
    let sent: InFlight;
    if (answer.type === "grant") {
      if (!runtime.demandInFlight) return;
      runtime.demandInFlight = false;
      sent = runtime.riding ?? { grants: new Map(), leases: new Map() };
      runtime.riding = null;
    } else {
      if (!runtime.reportInFlight) return;
      sent = runtime.reportInFlight;
      runtime.reportInFlight = null;
    }
    this.dirty.keys.add(key);
    if (answer.type === "grant") {
      for (const granted of answer.grants) this.acceptGrant(key, granted);
      const record = this.recordOf(key);
      record.nextRequestAtMs = Math.max(record.nextRequestAtMs, believedNextRequestAt(answer.nextRequestAt, nowMs));
    }
    this.applyGrantResults(key, sent, answer.grantResults);
    this.applyLeaseEchoes(key, sent, answer.leases ?? [], nowMs);
    if (answer.contended) this.returnIdleLeases(key);
    this.draw(key, nowMs);
    this.dropIfEmpty(key);
  }

  /** The key's message in flight on `lane` failed (deadline passed, or rejected): the lane waits `failureRetryMs`. */
  onFailure(key: string, lane: Lane, nowMs: number): void {
    const runtime = this.runtime.get(key);
    if (!runtime) return;
    const retryAtMs = nowMs + this.config.failureRetryMs;
    if (lane === "demand") {
      runtime.demandInFlight = false;
      // Its releases are reported again, on the report lane.
      runtime.riding = null;
      runtime.demandRetryAtMs = retryAtMs;
    } else {
      runtime.reportInFlight = null;
      runtime.reportRetryAtMs = retryAtMs;
    }
  }

  private activeKeys(): string[] {
    return [...new Set([...this.keys.keys(), ...this.queued.keys()])].sort();
  }

  /** Whether the key has a message in flight on either lane. */
  private busy(key: string): boolean {
    const runtime = this.runtime.get(key);
    return runtime !== undefined && runtimeInFlight(runtime) > 0;
  }

  private nextRequestAtMs(key: string): number {
    return this.keys.get(key)?.nextRequestAtMs ?? 0;
  }

  private reportLaneFree(key: string, nowMs: number): boolean {
    const runtime = this.runtime.get(key);
    return !runtime || (runtime.reportInFlight === null && nowMs >= runtime.reportRetryAtMs);
  }

  /** Whether a request may leave now (see the module's rules for the demand lane). */
  private demandDue(key: string, nowMs: number): boolean {
    const runtime = this.runtime.get(key);
    const laneFree = !runtime || (!runtime.demandInFlight && nowMs >= runtime.demandRetryAtMs);
    const leaseClaims = Object.values(this.keys.get(key)?.leases ?? {}).some(leaseAwaitsConfirmation);
    return laneFree && !leaseClaims && this.hasQueued(key) && this.nextRequestAtMs(key) <= nowMs;
  }

  /** Whether the key has something to report now (public for the lane tests). */
  reportsDue(key: string, nowMs: number): boolean {
    const record = this.keys.get(key);
    if (!record || isEmptyRecord(record)) return false;
    return (
      (this.runtime.get(key)?.forceReport ?? false) ||
      grantsNeedReport(record, this.runtime.get(key)) ||
      Object.values(record.leases).some((lease) => {
        const due = leaseHeartbeatDueMs(lease);
        return leaseNeedsReport(lease) || (due !== null && due <= nowMs);
      })
    );
  }

  private takeReports(key: string): { grants: GrantReport[]; leases: LeaseReport[] } {
    const runtime = this.runtimeOf(key);
    const forced = runtime.forceReport;
    runtime.forceReport = false;
    const record = this.keys.get(key);
    const grants = this.grantReports(key, forced);
    // Unconfirmed leases first: one left out until its claim deadline is reclaimed.
    const leaseEntries = sortedEntries(record?.leases ?? {});
    const leases = [...leaseEntries.filter(([, lease]) => !lease.confirmed), ...leaseEntries.filter(([, lease]) => lease.confirmed)]
      .slice(0, MAX_LEASE_REPORTS)
      .map(([leaseId, lease]) => leaseReport(leaseId, lease));
    runtime.reportInFlight = {
      grants: byGrantId(grants),
      leases: new Map(leases.map((report) => [report.leaseId, report])),
    };
    return { grants, leases };
  }

  /** Reports of every grant that needs one (every grant when `forced`), capped. */
  private grantReports(key: string, forced: boolean): GrantReport[] {
    return sortedEntries(this.keys.get(key)?.grants ?? {})
      .filter(([, grant]) => forced || grantNeedsReport(grant))
      .slice(0, MAX_GRANT_REPORTS)
      .map(([grantId, grant]) => ({ grantId, claimed: grant.claimed, released: grant.released }));
  }

  /** The key's request; with its releases riding if `ride` (see the module). */
  private takeRequest(key: string, ride: boolean): SemaphoreRequest {
    const demand = [...(this.queued.get(key) ?? new Map<string, QueuedEntry[]>())]
      .filter(([, entries]) => entries.length > 0)
      .map(([group, entries]) => ({ group, count: entries.length, oldestAt: entries[0]!.atMs }))
      .sort((a, b) => a.oldestAt - b.oldestAt || (a.group < b.group ? -1 : a.group > b.group ? 1 : 0))
      .slice(0, MAX_DEMAND_ENTRIES);
    const runtime = this.runtimeOf(key);
    runtime.demandInFlight = true;
    // `leases` present, though empty: this client takes leases.
    const request: SemaphoreRequest = { type: "request", v: 1, clientId: this.clientId, demand, leases: [] };
    if (!ride) return request;
    const grants = this.grantReports(key, false);
    runtime.riding = { grants: byGrantId(grants), leases: new Map() };
    return { ...request, grants };
  }

  private takeSync(key: string): SemaphoreRequest {
    const { grants, leases } = this.takeReports(key);
    return { type: "sync", v: 1, clientId: this.clientId, grants, leases };
  }

  private dropIfEmpty(key: string): void {
    const record = this.keys.get(key);
    if (record && isEmptyRecord(record) && !this.hasQueued(key) && !this.busy(key)) {
      this.keys.delete(key);
      this.runtime.delete(key);
      this.dirty.keys.add(key);
    }
  }

  private recordOf(key: string): KeyRecord {
    let record = this.keys.get(key);
    if (!record) {
      record = { grants: {}, leases: {}, nextRequestAtMs: 0 };
      this.keys.set(key, record);
    }
    return record;
  }

  private runtimeOf(key: string): KeyRuntime {
    let runtime = this.runtime.get(key);
    if (!runtime) {
      runtime = idleRuntime();
      this.runtime.set(key, runtime);
    }
    return runtime;
  }
}

function compareEntries(a: QueuedEntry, b: QueuedEntry): number {
  return a.atMs - b.atMs || a.order - b.order;
}

function admitted<T>(item: ItemRecord<T>, permit: ItemPermit): AdmittedItem<T> {
  return { id: item.id, key: item.key, group: item.group, body: item.body, permit };
}

/** Why an enqueued item was refused. */
export class InvalidItemError extends Error {
  constructor(
    readonly id: string,
    readonly reason: string,
  ) {
    super(`invalid item ${JSON.stringify(id.slice(0, 64))}: ${reason}`);
    this.name = "InvalidItemError";
  }
}

function validateItem<T>(item: QueueItem<T>): void {
  const utf8 = (text: string) => new TextEncoder().encode(text).length;
  if (typeof item.id !== "string" || item.id.length === 0 || utf8(item.id) > MAX_ITEM_ID_BYTES) {
    throw new InvalidItemError(String(item.id), "id must be 1 to 256 bytes");
  }
  if (typeof item.key !== "string" || item.key.length === 0 || utf8(item.key) > MAX_KEY_BYTES) {
    throw new InvalidItemError(item.id, "key must be 1 to 256 bytes");
  }
  if (typeof item.group !== "string" || utf8(item.group) > MAX_GROUP_BYTES) {
    throw new InvalidItemError(item.id, "group must be at most 256 bytes");
  }
}
