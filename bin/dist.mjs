// The build in dist/ and whether it is current: what bin/build.mjs writes, what the bin checks
// before it runs the bundle (docs/scale.md §11.2).
import { createHash } from "node:crypto";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";

/** The build's folder, under the project's. */
export const DIST = "dist";
/** The record of the current build in {@link DIST}: `{ id, inputs: { <source>: <sha256> }, entries: { <source>: <output> } }`, paths relative to the project and to `dist/`. */
export const BUILD_FILE = "build.json";

/** The SHA-256 of a file's content (or of `text`), hex. */
export function hashOf(fileOrText, as = "file") {
  return createHash("sha256")
    .update(as === "file" ? readFileSync(fileOrText) : fileOrText)
    .digest("hex");
}

/**
 * The record of the build in `<root>/dist/` when it is current: every source it was built from
 * has the content it had then, and every entry's output is there. `undefined` when there is no
 * build, or a source changed since (a stale build never runs).
 */
export function currentBuild(root) {
  let record;
  try {
    record = JSON.parse(readFileSync(join(root, DIST, BUILD_FILE), "utf8"));
  } catch {
    return undefined;
  }
  for (const [source, hash] of Object.entries(record.inputs ?? {})) {
    if (!existsSync(join(root, source)) || hashOf(join(root, source)) !== hash) return undefined;
  }
  for (const output of Object.values(record.entries ?? {})) {
    if (!existsSync(join(root, DIST, output))) return undefined;
  }
  return record;
}
