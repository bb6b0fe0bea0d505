/**
 * Capped exponential backoff with "equal jitter", as a pure value.
 *
 * The delay before retry `n` (from 0) is drawn from `[ceiling / 2, ceiling]`
 * where `ceiling = min(maxMs, initialMs * 2^n)`; a server's `Retry-After` is a
 * floor. The random draw is passed in, so the schedule is testable. Same
 * schedule as the Rust client's `backoff.rs`.
 */

/** Delay of the first retry, in ms. */
export const DEFAULT_INITIAL_DELAY_MS = 50;
/** Largest delay between two attempts, in ms. */
export const DEFAULT_MAX_DELAY_MS = 2_000;

export class Backoff {
  private retries = 0;
  private readonly initialMs: number;
  private readonly maxMs: number;

  constructor(initialMs = DEFAULT_INITIAL_DELAY_MS, maxMs = DEFAULT_MAX_DELAY_MS) {
    this.initialMs = Math.max(1, initialMs);
    this.maxMs = Math.max(this.initialMs, maxMs);
  }

  /** The nominal (un-jittered) delay of the next retry. */
  ceilingMs(): number {
    return Math.min(this.maxMs, this.initialMs * 2 ** Math.min(this.retries, 20));
  }

  /** The delay before the next retry; `unit` is a draw in `[0, 1)`. */
  nextDelayMs(unit: number, retryAfterMs?: number): number {
    const ceiling = this.ceilingMs();
    this.retries += 1;
    const draw = Number.isFinite(unit) ? Math.min(1, Math.max(0, unit)) : 0;
    const half = Math.floor(ceiling / 2);
    const jittered = Math.min(ceiling, half + Math.floor((ceiling - half) * draw));
    return Math.max(jittered, retryAfterMs ?? 0);
  }
}
