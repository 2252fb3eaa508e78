// The npm packages the suite uses, taken from tests/node (installed by `npm ci --prefix
// tests/node`, as scripts/test.sh does), so the suite adds no dependency of its own.

import { createRequire } from "node:module";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

/** The repository's root. */
export const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../../..");
/** tests/node, where the real clients live. */
export const NODE_DIR = path.join(ROOT, "tests/node");

const require = createRequire(path.join(NODE_DIR, "package.json"));

let resolved;
try {
  resolved = require.resolve("eventsource");
} catch {
  throw new Error("the eventsource package is missing: run `npm ci --prefix tests/node`");
}

/** The WHATWG EventSource of the npm `eventsource` package (4.x). */
export const { EventSource } = await import(pathToFileURL(resolved).href);
