/**
 * `FileStore` against power cuts: a writer process (this file again, with
 * `FILE_STORE_WRITER` set) writes steps through a `FileStore` on a `powerfs`
 * mount, which drops every write not fsynced and every create or rename whose
 * directory was not fsynced when the power is cut. The writer's working
 * directory is the mount and its path relative (`queue.json`), as a runner's
 * often is.
 *
 * Each step `n` puts `n`, `step/{n}` and a padding record and deletes
 * `step/{n-1}`. After a random number of resolved writes the test SIGKILLs
 * the writer, cuts the power (every other cut tears the newest unsynced
 * write), and reads the file back: `n` must be at least the last resolved
 * step (else an acknowledged write was **lost**), and the file must hold that
 * one step whole (`step/{n}` and no other `step/` record).
 *
 * `FILE_STORE_POWER_LOSS_CUTS` (default 50) sets the cuts,
 * `FILE_STORE_POWER_LOSS_SEED` replays a run. The mount is made by the
 * `powerfs` binary built beside `permitd` (`cargo build --workspace --bins`);
 * it needs root and `/dev/fuse`, and without them the test is skipped.
 */

import assert from "node:assert/strict";
import { spawn, type ChildProcess } from "node:child_process";
import { closeSync, existsSync, mkdirSync, mkdtempSync, openSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { createInterface } from "node:readline";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

import { FileStore } from "../src/node/index.js";
import { permitdBin } from "./harness.js";

const WRITER_ENV = "FILE_STORE_WRITER";
const FILE = "queue.json";
/** Longest wait for a line from the writer or powerfs. */
const LINE_TIMEOUT_MS = 30_000;
/** Per step, so that a write spans several FUSE requests (a torn one tears). */
const PADDING = "x".repeat(200_000);

const writerPath = process.env[WRITER_ENV];
if (writerPath) {
  void runWriter(writerPath);
} else {
  test("FileStore loses no resolved write to power cuts", async (t) => {
    const skip = whyNotRunnable();
    if (skip) {
      t.skip(skip);
      return;
    }
    await powerLossRun();
  });
}

/** The writer: steps from what the file holds, one line per resolved write. */
async function runWriter(path: string): Promise<void> {
  const store = new FileStore(path);
  let n = ((await store.load()).get("n") as number | undefined) ?? 0;
  for (;;) {
    n += 1;
    const puts = new Map<string, unknown>([
      ["n", n],
      [`step/${n}`, n],
      ["padding", PADDING],
    ]);
    await store.write(puts, [`step/${n - 1}`]);
    // Synchronous on a pipe on Linux: the line is out when this returns.
    process.stdout.write(`wrote ${n}\n`);
  }
}

function powerfsBin(): string {
  return join(dirname(permitdBin()), "powerfs");
}

/** Why this machine cannot run the test, or undefined. */
function whyNotRunnable(): string | undefined {
  try {
    closeSync(openSync("/dev/fuse", "r+"));
  } catch (error) {
    return `cannot open /dev/fuse (${(error as Error).message}): powerfs needs FUSE and root`;
  }
  if (!existsSync(powerfsBin())) return `no powerfs binary at ${powerfsBin()}: run cargo build --workspace --bins`;
  return undefined;
}

/** A child's stdout, line by line, awaited with a timeout. */
class Lines {
  private readonly lines: string[] = [];
  private waiter: (() => void) | undefined;
  private ended = false;

  constructor(child: ChildProcess) {
    const reader = createInterface({ input: child.stdout! });
    reader.on("line", (line) => {
      this.lines.push(line);
      this.waiter?.();
    });
    reader.on("close", () => {
      this.ended = true;
      this.waiter?.();
    });
  }

  /** The next line; undefined once the stream ended. */
  async next(what: string): Promise<string | undefined> {
    const deadline = Date.now() + LINE_TIMEOUT_MS;
    while (this.lines.length === 0 && !this.ended) {
      const left = deadline - Date.now();
      if (left <= 0) throw new Error(`no line from ${what} in ${LINE_TIMEOUT_MS} ms`);
      await new Promise<void>((done) => {
        const timer = setTimeout(done, left);
        this.waiter = () => {
          clearTimeout(timer);
          done();
        };
      });
      this.waiter = undefined;
    }
    return this.lines.shift();
  }
}

/** xorshift64: the whole run follows from the seed. */
function random(seed: bigint): () => number {
  let state = seed === 0n ? 1n : seed;
  const mask = (1n << 64n) - 1n;
  return () => {
    state ^= (state << 13n) & mask;
    state ^= state >> 7n;
    state ^= (state << 17n) & mask;
    return Number(state % 1_000_000n) / 1_000_000;
  };
}

function exited(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return new Promise((done) => child.once("exit", () => done()));
}

/**
 * Runs the writer until it resolved `writes` steps, SIGKILLs it `delayMs`
 * later (so that cuts land at every point of a step: the line comes out
 * between two steps); returns the last step it resolved.
 */
async function writeThenKill(mountpoint: string, writes: number, delayMs: number): Promise<number> {
  const writer = spawn(process.execPath, [fileURLToPath(import.meta.url)], {
    cwd: mountpoint,
    env: { ...process.env, [WRITER_ENV]: FILE },
    stdio: ["ignore", "pipe", "inherit"],
  });
  const lines = new Lines(writer);
  let last = 0;
  for (let seen = 0; seen < writes; ) {
    const line = await lines.next("the writer");
    if (line === undefined) throw new Error("the writer ended before it was killed");
    const step = /^wrote (\d+)$/.exec(line);
    if (step) {
      last = Number(step[1]);
      seen += 1;
    }
  }
  await new Promise((done) => setTimeout(done, delayMs));
  writer.kill("SIGKILL");
  await exited(writer);
  // Lines written before it died were acknowledged too.
  for (let line = await lines.next("the writer"); line !== undefined; line = await lines.next("the writer")) {
    const step = /^wrote (\d+)$/.exec(line);
    if (step) last = Number(step[1]);
  }
  return last;
}

async function powerLossRun(): Promise<void> {
  const cuts = Number(process.env.FILE_STORE_POWER_LOSS_CUTS ?? 50);
  const seed = BigInt(process.env.FILE_STORE_POWER_LOSS_SEED ?? Date.now());
  console.log(`FILE_STORE_POWER_LOSS_SEED=${seed} FILE_STORE_POWER_LOSS_CUTS=${cuts}`);
  const next = random(seed);
  const root = mkdtempSync(join(tmpdir(), "file-store-power-"));
  mkdirSync(join(root, "backing"));
  mkdirSync(join(root, "disk"));
  const powerfs = spawn(powerfsBin(), [join(root, "backing"), join(root, "disk")], {
    stdio: ["pipe", "pipe", "inherit"],
  });
  const answers = new Lines(powerfs);
  try {
    const mounted = await answers.next("powerfs");
    assert.match(mounted ?? "", /^mounted /);
    const mountpoint = join(root, "disk");
    let lost = 0;
    let writesDropped = 0;
    let torn = 0;
    for (let cut = 0; cut < cuts; cut++) {
      const acknowledged = await writeThenKill(mountpoint, 1 + Math.floor(next() * 8), Math.floor(next() * 6));
      const tear = next() < 0.5;
      powerfs.stdin!.write(tear ? `power-loss-torn ${cut}\n` : "power-loss\n");
      const report = (await answers.next("powerfs")) ?? "";
      assert.match(report, /^power loss: /, `powerfs cut the power: ${report}`);
      writesDropped += Number(/(\d+) unsynced writes dropped/.exec(report)?.[1] ?? 0);
      torn += report.includes(", torn: ") ? 1 : 0;
      if (process.env.FILE_STORE_POWER_LOSS_VERBOSE) console.log(report);
      const records = await new FileStore(join(mountpoint, FILE)).load();
      const n = (records.get("n") as number | undefined) ?? 0;
      const steps = [...records.keys()].filter((name) => name.startsWith("step/"));
      if (n < acknowledged) {
        lost += 1;
        console.log(`LOST: cut ${cut} acknowledged step ${acknowledged}, the file holds ${n}`);
      }
      assert.deepEqual(steps, n === 0 ? [] : [`step/${n}`], `cut ${cut}: the file holds one whole step`);
    }
    console.log(
      `FileStore power loss: ${cuts} cuts, ${writesDropped} unsynced writes dropped, ${torn} torn; lost: ${lost}`,
    );
    assert.equal(lost, 0, `resolved writes lost (seed ${seed})`);
  } finally {
    powerfs.stdin!.end("quit\n");
    await exited(powerfs);
    rmSync(root, { recursive: true, force: true });
  }
}
