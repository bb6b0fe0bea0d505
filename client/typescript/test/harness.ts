/**
 * Real `permitd` processes for the TypeScript tests, like `tests/src/lib.rs`'s
 * `Cluster`: a `cluster.toml` with free loopback ports, short Raft timings and
 * small round timings in a temporary directory, one `permitd serve --config …
 * --id N` per node, `POST /cluster/init`, and every process killed at `stop()`.
 *
 * The binary: `PERMITD_BIN`, else `$CARGO_TARGET_DIR/debug/permitd`, else the
 * repository's `target/debug/permitd` (`cargo build -p permitd` makes it).
 */

import { spawn, type ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, openSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const SECRET = "permitd-test-secret-0123456789";
/** The admin token every test cluster uses (auth is on, as in production). */
export const ADMIN_TOKEN = "permitd-test-admin-token-0123456789";
const START_TIMEOUT_MS = 30_000;
const POLL_MS = 50;
/** The package root (`client/typescript`), from `build/test/harness.js`. */
const PACKAGE_ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "../..");

export function permitdBin(): string {
  const candidates = [
    process.env.PERMITD_BIN,
    process.env.CARGO_TARGET_DIR && join(process.env.CARGO_TARGET_DIR, "debug", "permitd"),
    join(PACKAGE_ROOT, "../../target/debug/permitd"),
  ].filter((path): path is string => !!path);
  const found = candidates.find((path) => existsSync(path));
  if (!found) throw new Error(`no permitd binary in ${candidates.join(", ")}: run cargo build -p permitd or set PERMITD_BIN`);
  return found;
}

/** Ports handed out by this process, never twice. */
const handedOut = new Set<number>();

/** A free loopback port below the ephemeral range (see `free_port` in the Rust harness). */
export async function freePort(): Promise<number> {
  for (;;) {
    const port = 20_000 + Math.floor(Math.random() * 12_000);
    if (handedOut.has(port)) continue;
    handedOut.add(port);
    const free = await new Promise<boolean>((done) => {
      const server = createServer();
      server.once("error", () => done(false));
      server.listen(port, "127.0.0.1", () => server.close(() => done(true)));
    });
    if (free) return port;
  }
}

interface Node {
  id: number;
  url: string;
  child: ChildProcess | undefined;
}

export interface ClusterSettings {
  nodes?: number;
  /** The `[defaults]` table, in TOML. */
  defaults?: string;
  /** `[cluster] shards`: the number of shards (Raft groups); the node's default (1) when unset. */
  shards?: number;
}

export class Cluster {
  private constructor(
    readonly dir: string,
    readonly nodes: Node[],
    private readonly config: string,
  ) {}

  static async start(settings: ClusterSettings = {}): Promise<Cluster> {
    const dir = mkdtempSync(join(tmpdir(), "permitd-ts-"));
    const count = settings.nodes ?? 3;
    const defaults = settings.defaults ?? "limit = 100\nroundWaitMs = 20\nroundPeriodMs = 20\ngrantTimeoutMs = 60000\n";
    let text =
      `secret = "${SECRET}"\n\n[auth]\nadmin_token = "${ADMIN_TOKEN}"\n\n[raft]\nheartbeat_interval_ms = 50\nelection_timeout_min_ms = 300\n` +
      `election_timeout_max_ms = 600\nrpc_timeout_ms = 500\nsnapshot_every_logs = 500\n\n[defaults]\n${defaults}\n`;
    if (settings.shards !== undefined) text += `[cluster]\nshards = ${settings.shards}\n\n`;
    const nodes: Node[] = [];
    for (let id = 1; id <= count; id++) {
      const api = `127.0.0.1:${await freePort()}`;
      const raft = `127.0.0.1:${await freePort()}`;
      text += `[[node]]\nid = ${id}\napi_addr = "${api}"\nraft_addr = "${raft}"\ndata_dir = "data/node-${id}"\n\n`;
      nodes.push({ id, url: `http://${api}`, child: undefined });
    }
    const config = join(dir, "cluster.toml");
    writeFileSync(config, text);
    const cluster = new Cluster(dir, nodes, config);
    for (const node of nodes) cluster.spawn(node);
    await cluster.waitHealthy();
    const init = await fetch(`${nodes[0]!.url}/cluster/init`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${ADMIN_TOKEN}` },
      body: "{}",
    });
    if (init.status !== 200) throw new Error(`init failed: ${init.status} ${await init.text()}`);
    await cluster.waitForLeader();
    return cluster;
  }

  urls(): string[] {
    return this.nodes.map((node) => node.url);
  }

  private spawn(node: Node): void {
    const log = openSync(join(this.dir, `node-${node.id}.log`), "a");
    node.child = spawn(permitdBin(), ["serve", "--config", this.config, "--id", String(node.id)], {
      stdio: ["ignore", log, log],
      env: { ...process.env, RUST_LOG: process.env.RUST_LOG ?? "info,openraft=warn" },
    });
  }

  private async waitHealthy(): Promise<void> {
    for (const node of this.nodes) {
      await eventually(START_TIMEOUT_MS, async () => (await fetch(`${node.url}/healthz`).catch(() => undefined))?.ok ?? false, `node ${node.id} healthy`);
    }
  }

  /** Waits until every running node names the same running leader, and returns it. */
  async waitForLeader(): Promise<number> {
    let leader = 0;
    await eventually(
      START_TIMEOUT_MS,
      async () => {
        const running = this.nodes.filter((node) => node.child);
        const seen = await Promise.all(running.map((node) => this.status(node).then((status) => status?.leader ?? null)));
        const first = seen[0];
        leader = first ?? 0;
        return first != null && seen.every((id) => id === first) && running.some((node) => node.id === first);
      },
      "a leader agreed",
    );
    return leader;
  }

  private async status(node: Node): Promise<{ leader: number | null } | undefined> {
    try {
      const answer = await fetch(`${node.url}/cluster/status`, {
        headers: { authorization: `Bearer ${ADMIN_TOKEN}` },
        signal: AbortSignal.timeout(2_000),
      });
      return answer.ok ? ((await answer.json()) as { leader: number | null }) : undefined;
    } catch {
      return undefined;
    }
  }

  /** SIGKILLs node `id` and waits for it to be gone. */
  async kill(id: number): Promise<void> {
    const node = this.nodes.find((candidate) => candidate.id === id)!;
    const child = node.child;
    node.child = undefined;
    if (!child || child.exitCode !== null) return;
    await new Promise<void>((done) => {
      child.once("exit", () => done());
      child.kill("SIGKILL");
    });
  }

  /** A running node other than `id`. */
  other(id: number): Node {
    return this.nodes.find((node) => node.id !== id && node.child)!;
  }

  async stop(): Promise<void> {
    await Promise.all(this.nodes.map((node) => this.kill(node.id)));
    if (!process.env.PERMITD_KEEP_DIRS) rmSync(this.dir, { recursive: true, force: true });
  }
}

/** Polls `check` until it holds; throws after `timeoutMs`. */
export async function eventually(timeoutMs: number, check: () => Promise<boolean>, what: string): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (await check().catch(() => false)) return;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((done) => setTimeout(done, POLL_MS));
  }
}

/**
 * A TCP proxy in front of `target` (`http://host:port`) that lets the first
 * request through but cuts the connection as its answer starts coming back:
 * the server did the work, the client never hears of it. Later connections
 * pass through untouched.
 */
export async function answerDroppingProxy(target: string): Promise<{ url: string; dropped: () => number; close: () => void }> {
  const { createConnection } = await import("node:net");
  const { hostname, port } = new URL(target);
  let dropped = 0;
  const server = createServer((client) => {
    const upstream = createConnection({ host: hostname, port: Number(port) });
    const dropThis = dropped === 0;
    client.on("error", () => upstream.destroy());
    upstream.on("error", () => client.destroy());
    client.pipe(upstream);
    if (dropThis) {
      upstream.once("data", () => {
        dropped += 1;
        upstream.destroy();
        client.destroy();
      });
    } else {
      upstream.pipe(client);
    }
  });
  const proxyPort = await freePort();
  await new Promise<void>((done) => server.listen(proxyPort, "127.0.0.1", done));
  return { url: `http://127.0.0.1:${proxyPort}`, dropped: () => dropped, close: () => server.close() };
}
