/**
 * Which node to ask next: the remembered leader first, then the others in turn.
 *
 * Any node accepts any call (a follower forwards to the leader), so the leader
 * is an optimisation that saves a hop. permitd names the leader's node id in
 * the `x-permitd-leader` header of every v1 answer (and of a `not_leader` 503);
 * a URL there is accepted too. An id maps to an endpoint once the endpoints'
 * ids are known: the client asks each node's `/cluster/status` when an unknown
 * id shows up. A node that failed is skipped until the others were tried.
 *
 * In a cluster of several shards each shard has a leader of its own. The
 * tracker then keeps two things apart: the leader it follows for calls that
 * name no key (the meta shard's, learned from answers of that shard and from
 * answers that name no shard, as before shards), and one leader per shard
 * (`ShardLeaders`), learned from each answer's leader and shard headers. A
 * call for a key asks its shard's leader first, else goes where a call naming
 * no key would. An answer that fails for a shard (`not_leader`,
 * `leader_changed`, a node unreachable) replaces that shard's leader with the
 * one the answer named, or forgets it, as it does the followed leader.
 * Same rules as the Rust client's `leader.rs`.
 */

import { META_SHARD, ShardLeaders, type ShardHint, type ShardLeader } from "./shard-leaders.js";

/** The response header naming the leader. */
export const LEADER_HEADER = "x-permitd-leader";
/** Most endpoints one client remembers (configured plus learned). */
export const MAX_ENDPOINTS = 64;

/** Normalises a node URL; `host:port` without a scheme means `http://`. */
export function parseEndpoint(text: string): string {
  const trimmed = text.trim().replace(/\/+$/, "");
  if (trimmed === "") throw new TypeError("empty endpoint");
  const url = new URL(trimmed.includes("://") ? trimmed : `http://${trimmed}`);
  if (url.protocol !== "http:" && url.protocol !== "https:") {
    throw new TypeError(`unsupported scheme ${url.protocol} in ${text}`);
  }
  if (url.search || url.hash || url.username || url.password) {
    throw new TypeError(`a base URL takes no query, fragment or credentials: ${text}`);
  }
  return url.toString().replace(/\/+$/, "");
}

/** Parses a comma- or space-separated endpoint list, dropping duplicates. */
export function parseEndpoints(texts: string | readonly string[]): string[] {
  const parts = (typeof texts === "string" ? [texts] : texts).flatMap((text) => text.split(/[\s,]+/));
  const endpoints: string[] = [];
  for (const part of parts) {
    if (part === "") continue;
    const endpoint = parseEndpoint(part);
    if (!endpoints.includes(endpoint)) endpoints.push(endpoint);
  }
  if (endpoints.length === 0) throw new TypeError("no endpoints configured");
  return endpoints;
}

/** What a leader header says: a node id or a base URL. */
export type LeaderHint = { nodeId: number } | { url: string };

export function parseLeaderHint(value: string | null): LeaderHint | undefined {
  if (value === null) return undefined;
  const text = value.trim();
  if (/^\d+$/.test(text)) return { nodeId: Number(text) };
  try {
    return { url: parseEndpoint(text) };
  } catch {
    return undefined;
  }
}

export class LeaderTracker {
  readonly endpoints: string[];
  private readonly nodeIds: (number | undefined)[];
  /** The node asked first for calls naming no key: the meta shard's leader. */
  private leaderIndex: number | undefined;
  private unmappedLeader: number | undefined;
  private cursor = 0;
  /** The shard count and each shard's leader. */
  private readonly shards = new ShardLeaders();
  /** Some shard's leader is a node id that no endpoint is known to have. */
  private unmappedShardLeader = false;

  constructor(endpoints: readonly string[]) {
    if (endpoints.length === 0) throw new TypeError("no endpoints configured");
    this.endpoints = [...new Set(endpoints)].slice(0, MAX_ENDPOINTS);
    this.nodeIds = this.endpoints.map(() => undefined);
  }

  /** The node asked first for calls naming no key, if one is remembered. */
  leader(): string | undefined {
    return this.leaderIndex === undefined ? undefined : this.endpoints[this.leaderIndex];
  }

  /** The known leader of `key`'s shard, if its endpoint is known. */
  leaderOfKey(key: string): string | undefined {
    const leader = this.shards.leader(this.shards.shardOf(key));
    const index = leader && this.indexOf(leader);
    return index === undefined ? undefined : this.endpoints[index];
  }

  /** The shard count the tracker follows (1 until an answer names another). */
  shardCount(): number {
    return this.shards.count();
  }

  /** A leader id was named that no endpoint is known to have. */
  wantsNodeIds(): boolean {
    return this.unmappedLeader !== undefined || this.unmappedShardLeader;
  }

  learnNodeId(endpoint: string, id: number): void {
    const index = this.endpoints.indexOf(endpoint);
    if (index < 0) return;
    this.nodeIds.forEach((known, other) => {
      if (other !== index && known === id) this.nodeIds[other] = undefined;
    });
    this.nodeIds[index] = id;
    if (this.unmappedLeader === id) {
      this.unmappedLeader = undefined;
      this.leaderIndex = index;
    }
    this.unmappedShardLeader = this.shards.known().some((leader) => this.indexOf(leader) === undefined);
  }

  /** The node to ask next for a call naming no key: the leader if known, else the next in turn. */
  pick(): string {
    const index = this.leaderIndex ?? this.cursor % this.endpoints.length;
    return this.endpoints[index]!;
  }

  /** The node to ask next for a call about `key` (none: naming no key): its shard's leader if known, else as `pick`. */
  pickFor(key: string | undefined): string {
    return (key === undefined ? undefined : this.leaderOfKey(key)) ?? this.pick();
  }

  /** `endpoint` answered; `hint` is its leader header, if any. */
  answered(endpoint: string, hint: LeaderHint | undefined): void {
    const named = hint && this.resolve(hint);
    if (named !== undefined) {
      this.leaderIndex = named;
      return;
    }
    const index = this.endpoints.indexOf(endpoint);
    if (index >= 0) this.leaderIndex = index;
  }

  /**
   * `answered` for an answer with shard headers (`shard`): the count is learned,
   * and the answering shard's leader is the node `hint` names (else the node
   * that answered). Only the meta shard's answers (or any, in a cluster of one
   * shard) move the leader followed for calls naming no key; another shard's
   * answer makes the node that answered that leader only while none is known.
   */
  answeredFor(endpoint: string, hint: LeaderHint | undefined, shard: ShardHint | undefined): void {
    const answering = this.learnShards(shard);
    if (answering === undefined) return this.answered(endpoint, hint);
    const index = this.endpoints.indexOf(endpoint);
    const leader = hint ? this.shardLeader(hint) : index >= 0 ? { index } : undefined;
    if (leader) this.shards.set(answering, leader);
    if (this.followsMeta(answering)) this.answered(endpoint, hint);
    else if (this.leaderIndex === undefined && index >= 0) this.leaderIndex = index;
  }

  /** `endpoint` failed; a leader it named (other than itself) is asked next. */
  failed(endpoint: string, hint: LeaderHint | undefined): void {
    const failed = this.endpoints.indexOf(endpoint);
    const named = hint && this.resolve(hint);
    if (named !== undefined && named !== failed) {
      this.leaderIndex = named;
      return;
    }
    if (this.leaderIndex !== undefined && this.leaderIndex === failed) this.leaderIndex = undefined;
    this.cursor = (failed >= 0 ? failed + 1 : this.cursor + 1) % this.endpoints.length;
  }

  /**
   * `failed` for a call about `key` (if it named one), whose answer carried
   * shard headers (`shard`) if it got one. The failing shard (the one that
   * answered, else the key's) takes the leader `hint` names, unless that is
   * the failed node; otherwise it forgets a leader that is the failed node. A
   * node that gave no answer at all is forgotten as every shard's leader. The
   * leader followed for calls naming no key takes `hint` only from the meta shard.
   */
  failedFor(endpoint: string, key: string | undefined, hint: LeaderHint | undefined, shard: ShardHint | undefined): void {
    const answering = this.learnShards(shard);
    const failing = answering ?? (key === undefined ? undefined : this.shards.shardOf(key));
    const failed = this.endpoints.indexOf(endpoint);
    const isFailed = (leader: ShardLeader) => failed >= 0 && this.indexOf(leader) === failed;
    if (failing !== undefined) {
      const named = hint && this.shardLeader(hint);
      if (named && !isFailed(named)) this.shards.set(failing, named);
      else {
        const known = this.shards.leader(failing);
        if (known && isFailed(known)) this.shards.forget(failing);
      }
    }
    if (shard === undefined && hint === undefined && failed >= 0) this.shards.forgetWhere(isFailed);
    const meta = failing === undefined || this.followsMeta(failing);
    this.failed(endpoint, meta ? hint : undefined);
  }

  /** Learns the count from `shard`, and returns the shard that answered when it is one of that count. */
  private learnShards(shard: ShardHint | undefined): number | undefined {
    if (!shard) return undefined;
    this.shards.learnCount(shard.shards);
    const answering = shard.shard;
    if (answering === undefined || shard.shards !== this.shards.count() || answering >= shard.shards) return undefined;
    return answering;
  }

  /** Whether answers of `shard` name the leader followed for calls naming no key. */
  private followsMeta(shard: number): boolean {
    return shard === META_SHARD || this.shards.count() === 1;
  }

  /** The shard leader a hint names: a URL becomes an endpoint (added if there is room), an id is kept and flagged when unknown. */
  private shardLeader(hint: LeaderHint): ShardLeader | undefined {
    if ("nodeId" in hint) {
      if (!this.nodeIds.includes(hint.nodeId)) this.unmappedShardLeader = true;
      return { nodeId: hint.nodeId };
    }
    const index = this.resolve(hint);
    return index === undefined ? undefined : { index };
  }

  /** The endpoint a shard leader is, if known. */
  private indexOf(leader: ShardLeader): number | undefined {
    if ("index" in leader) return leader.index;
    const found = this.nodeIds.indexOf(leader.nodeId);
    return found < 0 ? undefined : found;
  }

  private resolve(hint: LeaderHint): number | undefined {
    if ("nodeId" in hint) {
      const found = this.nodeIds.indexOf(hint.nodeId);
      this.unmappedLeader = found < 0 ? hint.nodeId : undefined;
      return found < 0 ? undefined : found;
    }
    const known = this.endpoints.indexOf(hint.url);
    if (known >= 0) return known;
    if (this.endpoints.length >= MAX_ENDPOINTS) return undefined;
    this.endpoints.push(hint.url);
    this.nodeIds.push(undefined);
    return this.endpoints.length - 1;
  }
}
