/** The queue: pure accounting (`state.ts`), the store interface (`store.ts`), the loop (`queue.ts`). */
export * from "./queue.js";
export * from "./state.js";
export * from "./store.js";
