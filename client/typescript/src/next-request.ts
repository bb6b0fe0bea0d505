/**
 * How far ahead a client believes a key's `nextRequestAt`: shared by
 * `SemaphoreClient` and the queue's state, which both wait for it.
 */

/**
 * Furthest in the future a `nextRequestAt` is believed, in ms from receipt. A
 * later one (a node's clock far ahead, a huge `roundPeriodMs`) is taken as this:
 * asking sooner than the holder's round only waits at the holder, while
 * believing it could stall a key for days.
 */
export const MAX_NEXT_REQUEST_AHEAD_MS = 60_000;

/** The `nextRequestAt` a client acts on: the holder's, but at most `MAX_NEXT_REQUEST_AHEAD_MS` after `nowMs`. */
export function believedNextRequestAt(atMs: number, nowMs: number): number {
  return Math.min(atMs, nowMs + MAX_NEXT_REQUEST_AHEAD_MS);
}
