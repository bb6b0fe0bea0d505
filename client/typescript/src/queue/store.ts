/**
 * Where a queue keeps its items and permit accounting: a pluggable store.
 *
 * A `QueueStore` is a small key-value interface with atomic batches, so it fits
 * a Durable Object's `storage` (`list`, and `put`/`delete` of many keys at
 * once), a file (`FileStore` in `@permitd/client/node`), or memory
 * (`MemoryStore`, which keeps nothing across restarts). The record layout
 * (the Rust queue's journal keeps the same records, one step per record):
 * - `m/client` → the client id the store belongs to;
 * - `i/{item id}` → an item record;
 * - `k/{semaphore key}` → a key record (grants and leases held);
 * - `r/{seq, 20 digits}` → a released item id, oldest first.
 *
 * The queue writes a step's changes and waits for `write` to resolve (durable)
 * before it sends the step's messages or admits its items, so a claim the
 * holder saw, or a lease permit drawn, is never lost to a crash.
 */

import type { Dirty, ItemRecord, KeyRecord, QueueState } from "./state.js";

export interface QueueStore {
  /** Every record. */
  load(): Promise<Map<string, unknown>>;
  /** Writes `puts` and removes `deletes` atomically; durable once resolved. */
  write(puts: Map<string, unknown>, deletes: string[]): Promise<void>;
}

/** Keeps records in memory: for tests, and runners that may lose their queue on restart. */
export class MemoryStore implements QueueStore {
  private readonly records = new Map<string, unknown>();

  async load(): Promise<Map<string, unknown>> {
    return new Map([...this.records].map(([name, value]) => [name, structuredClone(value)]));
  }

  async write(puts: Map<string, unknown>, deletes: string[]): Promise<void> {
    for (const name of deletes) this.records.delete(name);
    for (const [name, value] of puts) this.records.set(name, structuredClone(value));
  }
}

export const CLIENT_RECORD = "m/client";
const ITEM_PREFIX = "i/";
const KEY_PREFIX = "k/";
const RELEASED_PREFIX = "r/";

/** The store belongs to another client id: the holder would not know its grants. */
export class ClientIdMismatchError extends Error {
  constructor(
    readonly stored: string,
    readonly configured: string,
  ) {
    super(`the queue store belongs to client ${JSON.stringify(stored)}, not ${JSON.stringify(configured)}`);
    this.name = "ClientIdMismatchError";
  }
}

/** What a store holds, decoded. */
export interface Loaded<T> {
  items: ItemRecord<T>[];
  keys: [string, KeyRecord][];
  released: [number, string][];
}

/** Reads a store's records back, claiming an empty store for `clientId`. */
export async function loadQueue<T>(store: QueueStore, clientId: string): Promise<Loaded<T>> {
  const records = await store.load();
  const stored = records.get(CLIENT_RECORD);
  if (stored === undefined) {
    await store.write(new Map([[CLIENT_RECORD, clientId]]), []);
  } else if (stored !== clientId) {
    throw new ClientIdMismatchError(String(stored), clientId);
  }
  const loaded: Loaded<T> = { items: [], keys: [], released: [] };
  for (const [name, value] of records) {
    if (name.startsWith(ITEM_PREFIX)) loaded.items.push(value as ItemRecord<T>);
    else if (name.startsWith(KEY_PREFIX)) loaded.keys.push([name.slice(KEY_PREFIX.length), value as KeyRecord]);
    else if (name.startsWith(RELEASED_PREFIX)) loaded.released.push([Number(name.slice(RELEASED_PREFIX.length)), String(value)]);
  }
  return loaded;
}

/** The records `dirty` names, as `state` has them now; `undefined` when nothing changed. */
export function changes<T>(state: QueueState<T>, dirty: Dirty): { puts: Map<string, unknown>; deletes: string[] } | undefined {
  const puts = new Map<string, unknown>();
  const deletes: string[] = [];
  for (const id of dirty.items) {
    const item = state.item(id);
    if (item) puts.set(ITEM_PREFIX + id, structuredClone(item));
    else deletes.push(ITEM_PREFIX + id);
  }
  for (const key of dirty.keys) {
    const record = state.keyRecord(key);
    if (record) puts.set(KEY_PREFIX + key, structuredClone(record));
    else deletes.push(KEY_PREFIX + key);
  }
  for (const [seq, id] of dirty.releasedAdded) puts.set(releasedName(seq), id);
  for (const [seq] of dirty.releasedRemoved) {
    puts.delete(releasedName(seq));
    deletes.push(releasedName(seq));
  }
  return puts.size === 0 && deletes.length === 0 ? undefined : { puts, deletes };
}

function releasedName(seq: number): string {
  return RELEASED_PREFIX + String(seq).padStart(20, "0");
}
