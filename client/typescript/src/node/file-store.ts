/**
 * `FileStore`: a queue store in one JSON file, for Node.
 *
 * Each `write` rewrites the whole file through a temporary file that is
 * fsynced and then renamed over the old one, and then fsyncs the directory, so
 * the file always holds one complete step, old or new, and a resolved `write`
 * survives a power cut: the file's fsync makes its bytes durable, the
 * directory's makes the rename durable (without it a cut can bring back the
 * old file, or none at all after the first write). The cost is a
 * write of every record per step: fine for thousands of items; a runner with
 * far more should plug in a store with real batches (sqlite, a Durable Object).
 */

import { open, readFile, rename } from "node:fs/promises";
import { dirname } from "node:path";

import type { QueueStore } from "../queue/store.js";

export class FileStore implements QueueStore {
  private records: Map<string, unknown> | undefined;
  /** Writes run one at a time, in order. */
  private writing: Promise<void> = Promise.resolve();

  constructor(readonly path: string) {}

  async load(): Promise<Map<string, unknown>> {
    if (!this.records) {
      let text: string | undefined;
      try {
        text = await readFile(this.path, "utf8");
      } catch (error) {
        if ((error as NodeJS.ErrnoException).code !== "ENOENT") throw error;
      }
      this.records = new Map(Object.entries(text ? (JSON.parse(text) as Record<string, unknown>) : {}));
    }
    return new Map(this.records);
  }

  write(puts: Map<string, unknown>, deletes: string[]): Promise<void> {
    const step = this.writing.then(async () => {
      const records = this.records ?? (await this.load(), this.records!);
      for (const name of deletes) records.delete(name);
      for (const [name, value] of puts) records.set(name, value);
      const temporary = `${this.path}.tmp`;
      const file = await open(temporary, "w");
      try {
        await file.writeFile(JSON.stringify(Object.fromEntries(records)));
        await file.sync();
      } finally {
        await file.close();
      }
      await rename(temporary, this.path);
      await syncDirectory(dirname(this.path));
    });
    this.writing = step.catch(() => undefined);
    return step;
  }
}

/**
 * Fsyncs a directory, so that the entries renamed into it are durable.
 * Windows cannot open a directory for fsync (NTFS journals its metadata
 * itself), so there it does nothing.
 */
async function syncDirectory(path: string): Promise<void> {
  if (process.platform === "win32") return;
  const directory = await open(path, "r");
  try {
    await directory.sync();
  } finally {
    await directory.close();
  }
}
