/** `@permitd/client/node`: what only Node can offer, kept apart so Workers never import `node:fs`. */
export { FileStore } from "./file-store.js";
