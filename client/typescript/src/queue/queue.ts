/**
 * `SemaphoreQueue`: the job queue, as one loop per queue (the Rust
 * client's `queue/mod.rs`, in the event loop's terms).
 *
 * The application enqueues items `{id, key, group, body}`; the queue asks each
 * key's holder for permits, admits items under confirmed grant claims or drawn
 * lease permits by calling `admission.admit`, and returns each permit when the
 * application calls `release(id)`. Releases it never gets are recovered by
 * asking `admission.finished` periodically.
 *
 * All accounting lives in the synchronous `QueueState`; one step of the loop:
 * 1. `poll` the state (draws lease permits, decides each key's next message);
 * 2. write the changed records to the store and wait until they are durable,
 *    before anything leaves the process;
 * 3. hand admitted items to `admit`, send the messages (at most one in flight
 *    per key and lane): each key's `request` as its own call, and every `sync`
 *    of the step in one `batch` call; each answer is fed to the state and
 *    wakes the loop;
 * 4. sleep until an enqueue, a release, an answer or the next timer.
 */

import type { SemaphoreClient } from "../client.js";
import { MAX_BATCH_ITEMS, MAX_BATCH_KEYS } from "../wire.js";
import { changes, loadQueue, MemoryStore, type QueueStore } from "./store.js";
import {
  DEFAULT_STATE_CONFIG,
  laneOf,
  QueueState,
  type AdmittedItem,
  type ItemStatus,
  type Outgoing,
  type QueueCounts,
  type QueueItem,
  type ReleaseOutcome,
  type StateConfig,
} from "./state.js";

/**
 * Most JSON characters of the reports one batch call carries: half the
 * server's 1 MiB body limit, so a poll with many large reports is split
 * instead of refused whole (413).
 */
export const MAX_REPORT_BATCH_CHARS = 512 * 1024;

/** Default time between two `finished` checks, in ms. */
export const DEFAULT_FINISHED_INTERVAL_MS = 10_000;
/** Most ids one `finished` call is asked about. */
export const MAX_FINISHED_BATCH = 1_024;
/** Default time `shutdown` spends returning permits, in ms. */
export const DEFAULT_SHUTDOWN_TIMEOUT_MS = 5_000;

/** The application side of a queue. */
export interface Admission<T> {
  /** Starts work for admitted items; must be a no-op for an id already started (after a restart, admitted items come again). */
  admit(items: AdmittedItem<T>[]): void | Promise<void>;
  /** Of `ids` (admitted items), those whose work reached a terminal state; the queue releases them. */
  finished(ids: string[]): string[] | Promise<string[]>;
}

export interface QueueOptions {
  /** This runner's id towards the holder; stable across restarts of one store. */
  clientId: string;
  /** Where the queue lives; in memory by default. */
  store?: QueueStore;
  finishedIntervalMs?: number;
  shutdownTimeoutMs?: number;
  state?: Partial<StateConfig>;
  /** Called with failures the loop survives (a failed message, a failed write). */
  onError?: (error: unknown, context: string) => void;
}

export interface ShutdownReport {
  counts: QueueCounts;
  /** Keys whose final reports did not reach the holder in time. */
  unreportedKeys: number;
}

export class QueueShutdownError extends Error {
  constructor() {
    super("the queue is shut down");
    this.name = "QueueShutdownError";
  }
}

/**
 * The queue's store failed a write, so the queue stopped: it admits nothing and
 * sends nothing more (what it would send or admit could not be made durable,
 * and a crash would then lose a claim or a drawn permit). Every later call
 * fails with this error; `cause` is the store's. Start a new queue on a working
 * store: it reports and admits again what was durable.
 */
export class QueueStoreFailedError extends Error {
  constructor(cause: unknown) {
    super(`the queue stopped: its store failed: ${cause instanceof Error ? cause.message : String(cause)}`, { cause });
    this.name = "QueueStoreFailedError";
  }
}

export class SemaphoreQueue<T> {
  private stopping = false;
  /** Stopped at once by `halt`: the loop neither writes nor sends any more. */
  private halted = false;
  /** Every store write so far: resolved once they all are durable. */
  private written: Promise<void> = Promise.resolve();
  /** Set when a store write failed: the queue fails closed (see `QueueStoreFailedError`). */
  private failed: QueueStoreFailedError | undefined;
  private wakeLoop: (() => void) | undefined;
  /** A wake-up that came while the loop was not sleeping: the next sleep ends at once. */
  private wokenEarly = false;
  private readonly loop: Promise<number>;

  private constructor(
    private readonly client: SemaphoreClient,
    private readonly state: QueueState<T>,
    private readonly store: QueueStore,
    private readonly admission: Admission<T>,
    private readonly options: QueueOptions,
  ) {
    this.loop = this.run();
  }

  /** Loads the store (if it holds a queue), restores items and permits, and starts the loop. */
  static async start<T>(client: SemaphoreClient, options: QueueOptions, admission: Admission<T>): Promise<SemaphoreQueue<T>> {
    const store = options.store ?? new MemoryStore();
    const config: StateConfig = { ...DEFAULT_STATE_CONFIG, ...options.state };
    const loaded = await loadQueue<T>(store, options.clientId);
    const state = QueueState.restore<T>(options.clientId, config, loaded.items, loaded.keys, loaded.released);
    return new SemaphoreQueue(client, state, store, admission, options);
  }

  /** Adds items (known ids are skipped); durable when it resolves. */
  async enqueue(items: QueueItem<T>[]): Promise<{ added: number; known: number }> {
    if (this.failed) throw this.failed;
    if (this.stopping) throw new QueueShutdownError();
    const outcome = this.state.enqueue(items, Date.now());
    await this.persist();
    this.wake();
    return outcome;
  }

  /** The item's work reached a terminal state; its permit returns with the next report. */
  release(id: string): ReleaseOutcome {
    if (this.failed) throw this.failed;
    if (this.halted) throw new QueueShutdownError();
    const outcome = this.state.release(id);
    if (this.stopping) this.persist().catch((error) => this.report(error, "persisting a release"));
    this.wake();
    return outcome;
  }

  status(id: string): ItemStatus {
    return this.state.status(id);
  }

  counts(): QueueCounts {
    return this.state.counts(Date.now());
  }

  /** Stops asking for permits, returns undrawn lease permits and reports every release (within the timeout). */
  async shutdown(): Promise<ShutdownReport> {
    this.stopping = true;
    this.wake();
    const unreportedKeys = await this.loop;
    if (this.failed) throw this.failed;
    await this.persist();
    return { counts: this.counts(), unreportedKeys };
  }

  /** The store failure that stopped the queue, if one did. */
  failure(): QueueStoreFailedError | undefined {
    return this.failed;
  }

  /**
   * Stops the loop at once, with no final reports and no more writes: what a
   * crash would leave. The next `start` on the same store reports what was
   * persisted and admits admitted items again. For tests and for processes
   * that exit without `shutdown`.
   */
  halt(): void {
    this.halted = true;
    this.stopping = true;
    this.wake();
  }

  private async run(): Promise<number> {
    const finishedInterval = this.options.finishedIntervalMs ?? DEFAULT_FINISHED_INTERVAL_MS;
    let finishedDue = Date.now() + finishedInterval;
    let finishedInFlight = false;
    let drainingUntil: number | undefined;
    for (;;) {
      if (drainingUntil === undefined && this.stopping) {
        this.state.retireAllLeases();
        drainingUntil = Date.now() + (this.options.shutdownTimeoutMs ?? DEFAULT_SHUTDOWN_TIMEOUT_MS);
      }
      if (this.halted || this.failed) return this.state.inFlight();
      const now = Date.now();
      const messages = drainingUntil === undefined ? this.state.poll(now) : this.state.pollReports(now);
      const admits = this.state.takeAdmits();
      try {
        // Durable before anything it records leaves the process.
        await this.persist();
      } catch {
        // Fails closed: this step's admits and messages are dropped.
        return this.state.inFlight();
      }
      if (this.halted || this.failed) return this.state.inFlight();
      const inFlight = this.state.inFlight();
      if (drainingUntil !== undefined && (inFlight === 0 || Date.now() >= drainingUntil)) return inFlight;
      if (admits.length > 0) {
        Promise.resolve()
          .then(() => this.admission.admit(admits))
          .catch((error) => this.report(error, "admit"));
      }
      this.sendAll(messages);
      if (drainingUntil === undefined && !finishedInFlight && Date.now() >= finishedDue) {
        finishedDue = Date.now() + finishedInterval;
        const ids = this.state.admittedIds(MAX_FINISHED_BATCH);
        if (ids.length > 0) {
          finishedInFlight = true;
          Promise.resolve()
            .then(() => this.admission.finished(ids))
            .then((done) => done.forEach((id) => this.state.release(id)))
            .catch((error) => this.report(error, "finished"))
            .finally(() => {
              finishedInFlight = false;
              this.wake();
            });
        }
      }
      let wakeAt = finishedDue;
      const due = this.state.nextWakeupMs(Date.now());
      if (due !== null) wakeAt = Math.min(wakeAt, due);
      if (drainingUntil !== undefined) wakeAt = Math.min(wakeAt, drainingUntil);
      await this.sleepUntil(wakeAt);
    }
  }

  /**
   * Sends one step's messages. Each key's request is its own call: a batch is
   * answered when its slowest item is, so demand for several keys in one call
   * would tie every key's grant to the slowest round (and a held request may
   * wait its `waitMs`). Every sync of the step goes in one batch call instead:
   * a sync is answered with the next log entry whatever it travels with, so
   * batching them delays nothing and saves a call per key.
   */
  private sendAll(messages: Outgoing[]): void {
    const reports: Outgoing[] = [];
    for (const outgoing of messages) {
      if (laneOf(outgoing.message) === "demand") this.sendRequest(outgoing);
      else reports.push(outgoing);
    }
    for (const batch of reportBatches(reports)) this.sendReports(batch);
  }

  private sendRequest({ key, message }: Outgoing): void {
    if (message.type !== "request") return;
    this.client
      .request(key, withoutType(message))
      .then((grant) => {
        if (!this.halted && !this.failed) this.state.onAnswer(key, { type: "grant", ...grant }, Date.now());
      })
      .catch((error) => {
        this.report(error, `request for key ${key}; will retry`);
        this.state.onFailure(key, "demand", Date.now());
      })
      .finally(() => this.wake());
  }

  /** One batch call of syncs: a failed call fails every item's report lane, a failed item only its own key's. */
  private sendReports(batch: Outgoing[]): void {
    this.client
      .batch(batch)
      .then(
        (results) =>
          results.forEach((result, index) => {
            const { key } = batch[index]!;
            if (!result.ok) {
              this.report(result.error, `report for key ${key}; will retry`);
              this.state.onFailure(key, "report", Date.now());
            } else if (!this.halted && !this.failed) {
              this.state.onAnswer(key, result.answer, Date.now());
            }
          }),
        (error) => {
          this.report(error, `report batch of ${batch.length} keys; will retry`);
          for (const { key } of batch) this.state.onFailure(key, "report", Date.now());
        },
      )
      .finally(() => this.wake());
  }

  /**
   * Writes the state's changes and waits until every write so far is durable;
   * a failed write stops the queue for good and throws. It waits even when
   * this call has nothing to write: an `enqueue` writes every pending change,
   * the loop's too (an answer that admitted items), and admitting them before
   * that write resolved could lose the admission to a power cut (the Rust
   * queue's power-loss test caught it there).
   */
  private async persist(): Promise<void> {
    if (this.halted) return;
    if (this.failed) throw this.failed;
    const changed = changes(this.state, this.state.takeDirty());
    if (changed) {
      this.written = Promise.all([this.written, this.store.write(changed.puts, changed.deletes)]).then(() => undefined);
    }
    try {
      await this.written;
    } catch (error) {
      this.failed ??= new QueueStoreFailedError(error);
      this.report(this.failed, "writing the queue store; the queue stopped");
      this.wake();
      throw this.failed;
    }
  }

  private wake(): void {
    if (this.wakeLoop) this.wakeLoop();
    else this.wokenEarly = true;
  }

  private sleepUntil(atMs: number): Promise<void> {
    if (this.wokenEarly) {
      this.wokenEarly = false;
      return Promise.resolve();
    }
    return new Promise((resolve) => {
      const timer = setTimeout(done, Math.max(0, atMs - Date.now()));
      const self = this;
      function done() {
        clearTimeout(timer);
        self.wakeLoop = undefined;
        resolve();
      }
      this.wakeLoop = done;
    });
  }

  private report(error: unknown, context: string): void {
    this.options.onError?.(error, context);
  }
}

/**
 * Splits report messages into batch calls within the envelope's limits
 * (`MAX_BATCH_ITEMS` items, `MAX_BATCH_KEYS` keys) and `MAX_REPORT_BATCH_CHARS`;
 * one poll has at most one report per key, so most polls make one call.
 */
export function reportBatches(reports: readonly Outgoing[], maxChars = MAX_REPORT_BATCH_CHARS): Outgoing[][] {
  const batches: Outgoing[][] = [];
  let current: Outgoing[] = [];
  let keys = new Set<string>();
  let chars = 0;
  for (const report of reports) {
    const size = JSON.stringify(report).length;
    const newKey = !keys.has(report.key);
    const full =
      current.length >= MAX_BATCH_ITEMS || (newKey && keys.size >= MAX_BATCH_KEYS) || (current.length > 0 && chars + size > maxChars);
    if (full) {
      batches.push(current);
      current = [];
      keys = new Set();
      chars = 0;
    }
    current.push(report);
    keys.add(report.key);
    chars += size;
  }
  if (current.length > 0) batches.push(current);
  return batches;
}

function withoutType<M extends { type: string }>(message: M): Omit<M, "type"> {
  const { type: _type, ...rest } = message;
  return rest;
}
