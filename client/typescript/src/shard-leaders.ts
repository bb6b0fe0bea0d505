/**
 * Which node leads each shard, as the answers said: the table behind a keyed
 * call's first pick in a cluster of several shards (`leader.ts` holds it).
 *
 * A cluster of S shards runs S Raft groups, each with its own leader, and a
 * key's calls are served by the leader of `shardOf(key, S)`. Every v1 answer
 * names the shard that answered (`x-permitd-shard`) and that shard's leader
 * (`x-permitd-leader`); answers of clusters of more than one shard add the
 * count (`x-permitd-shards`). This table remembers the count and one leader
 * per shard, so that a call for a key goes to its shard's leader instead of
 * taking a forwarding hop. Same rules as the Rust client's `shard_leaders.rs`.
 *
 * Invariants: the count is in `[1, MAX_SHARDS]`, 1 until an answer says
 * otherwise (a bigger or zero count is ignored, so the table never holds more
 * than `MAX_SHARDS` entries); there is one entry per shard of the current
 * count, and a new count forgets every entry.
 */

import { MAX_SHARDS, shardOf } from "./shard.js";

/** The response header naming the shard that answered. */
export const SHARD_HEADER = "x-permitd-shard";
/** The response header naming the cluster's shard count (absent: 1). */
export const SHARDS_HEADER = "x-permitd-shards";
/** The shard that serves calls naming no key: its leader is the one followed for them. */
export const META_SHARD = 0;

/** Where a shard's leader is: a node id (asked once an endpoint is known to be it), or an endpoint's position. */
export type ShardLeader = { nodeId: number } | { index: number };

/** What an answer's shard headers say: the shard that answered (none on an answer covering every shard) and the count. */
export interface ShardHint {
  shard?: number;
  shards: number;
}

/**
 * The answer's shard headers, or `undefined` when it carries neither, or a
 * value that is not a whole number. A shard without a count is of a cluster
 * of one shard.
 */
export function parseShardHint(shard: string | null, shards: string | null): ShardHint | undefined {
  const number = (value: string | null): number | undefined | null => {
    if (value === null) return undefined;
    const text = value.trim();
    return /^\d+$/.test(text) ? Number(text) : null;
  };
  const [answering, count] = [number(shard), number(shards)];
  if (answering === null || count === null) return undefined;
  if (answering === undefined && count === undefined) return undefined;
  return answering === undefined ? { shards: count ?? 1 } : { shard: answering, shards: count ?? 1 };
}

export class ShardLeaders {
  /** Position k holds shard k's leader, if known; as long as the count. */
  private leaders: (ShardLeader | undefined)[] = [undefined];

  /** The shard count the table follows. */
  count(): number {
    return this.leaders.length;
  }

  /**
   * Takes `count` as the cluster's shard count; a count outside `[1, MAX_SHARDS]`
   * is ignored. Returns whether the count changed (every entry was forgotten then).
   */
  learnCount(count: number): boolean {
    if (!Number.isInteger(count) || count < 1 || count > MAX_SHARDS || count === this.count()) return false;
    this.leaders = new Array<ShardLeader | undefined>(count).fill(undefined);
    return true;
  }

  /** The shard of `key` under the current count. */
  shardOf(key: string): number {
    return shardOf(key, this.count());
  }

  /** The known leader of `shard`, if any. */
  leader(shard: number): ShardLeader | undefined {
    return this.leaders[shard];
  }

  /** Records `leader` as the leader of `shard`; a shard outside the count is ignored. */
  set(shard: number, leader: ShardLeader): void {
    if (Number.isInteger(shard) && shard >= 0 && shard < this.leaders.length) this.leaders[shard] = leader;
  }

  /** Forgets the leader of `shard`. */
  forget(shard: number): void {
    if (shard >= 0 && shard < this.leaders.length) this.leaders[shard] = undefined;
  }

  /** Forgets every leader for which `matches` holds. */
  forgetWhere(matches: (leader: ShardLeader) => boolean): void {
    this.leaders = this.leaders.map((leader) => (leader !== undefined && matches(leader) ? undefined : leader));
  }

  /** Every known leader. */
  known(): ShardLeader[] {
    return this.leaders.filter((leader): leader is ShardLeader => leader !== undefined);
  }
}
