// One piece of work under a permit, from TypeScript or JavaScript:
//
//   permitd up --config cluster.toml &
//   cd client/typescript && npm ci && npm run build && node examples/with-permit.mjs
//
// (In an application: `import { SemaphoreClient } from "@permitd/client"`.)
import { SemaphoreClient } from "../dist/index.js";

const endpoints = process.env.PERMITD_ENDPOINTS ?? "http://127.0.0.1:7001,http://127.0.0.1:7002,http://127.0.0.1:7003";
// Configuring a key takes an admin: cluster.toml's token (PERMITD_TOKEN overrides it).
const token = process.env.PERMITD_TOKEN ?? "change-me-local-admin-token";
const client = new SemaphoreClient({ endpoints, token });
await client.setKeyConfig("acct-42", { limit: 2 });

// A guard: released by `release()` (or by `await using` at the end of a block).
const permit = await client.acquire("acct-42", "nightly-report", 1, { timeoutMs: 30_000 });
console.log(`holding ${permit.count} permit of acct-42, fence ${permit.fence}`);
console.log("usage while held:", await client.usage("acct-42"));
await permit.release();

// A callback: acquired before, released after, whether it resolves or throws.
const rows = await client.withPermit("acct-42", "nightly-report", 2, async (fence) => {
  console.log(`running under fence ${fence} with 2 permits`);
  return 1234;
});
console.log(`report done: ${rows} rows`);
console.log("usage after:", await client.usage("acct-42"));
