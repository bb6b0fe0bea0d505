/**
 * Which node to ask next: the remembered leader first, then the others in turn.
 *
 * Any node accepts any call (a follower forwards to the leader), so the leader
 * is an optimisation that saves a hop. permitd names the leader's node id in
 * the `x-permitd-leader` header of every v1 answer (and of a `not_leader` 503);
 * a URL there is accepted too. An id maps to an endpoint once the endpoints'
 * ids are known: the client asks each node's `/cluster/status` when an unknown
 * id shows up. A node that failed is skipped until the others were tried.
 * Same rules as the Rust client's `leader.rs`.
 */

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
  private leaderIndex: number | undefined;
  private unmappedLeader: number | undefined;
  private cursor = 0;

  constructor(endpoints: readonly string[]) {
    if (endpoints.length === 0) throw new TypeError("no endpoints configured");
    this.endpoints = [...new Set(endpoints)].slice(0, MAX_ENDPOINTS);
    this.nodeIds = this.endpoints.map(() => undefined);
  }

  /** The node asked first, if one is remembered. */
  leader(): string | undefined {
    return this.leaderIndex === undefined ? undefined : this.endpoints[this.leaderIndex];
  }

  /** A leader id was named that no endpoint is known to have. */
  wantsNodeIds(): boolean {
    return this.unmappedLeader !== undefined;
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
  }

  /** The node to ask next: the leader if known, else the next in turn. */
  pick(): string {
    const index = this.leaderIndex ?? this.cursor % this.endpoints.length;
    return this.endpoints[index]!;
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
