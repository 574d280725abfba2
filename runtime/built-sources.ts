/**
 * Module hooks (node:module `register`) of a start through tsx (docs/scale.md §11.2): a project
 * source that a file loaded through tsx imports (`../runtime/index.ts`, `./_lib/…`) resolves to
 * its built module, so the set holds one runtime and one copy of each shared module; and a
 * config or function file the runtime imports (from a module of `loaders`: runtime/modules.ts,
 * built or not) is an ES module wherever it sits, and so is another TypeScript file outside
 * node_modules unless its package says `"type": "commonjs"` (a config file in
 * `/etc/mesh-provisioner/`, where no package says anything, would be read as CommonJS).
 * Registered by runtime/modules.ts (a build's) and bin/mesh-provisioner.mjs (no build: none
 * resolved) after tsx's own, so it runs first and asks tsx to resolve.
 */
import { readFileSync, realpathSync } from "node:fs";
import { dirname, join, sep } from "node:path";
import type { InitializeHook, ResolveHook } from "node:module";
import { fileURLToPath, pathToFileURL } from "node:url";
import type { BuiltSources } from "./modules.ts";

let built: Readonly<Record<string, string>> = {};
let loaders: ReadonlySet<string> = new Set();

export const initialize: InitializeHook<BuiltSources> = (data) => {
  built = data.built;
  loaders = new Set(data.loaders);
};

const real = (url: string) => {
  try {
    return pathToFileURL(realpathSync(fileURLToPath(url))).href;
  } catch {
    return url;
  }
};

export const resolve: ResolveHook = async (specifier, context, next) => {
  const resolved = await next(specifier, context);
  const to = resolved.url.startsWith("file:") ? built[real(resolved.url)] : undefined;
  if (to !== undefined) return { url: to, format: "module", shortCircuit: true };
  if (resolved.format === "module" || !resolved.url.startsWith("file:") || !/\.tsx?$/.test(new URL(resolved.url).pathname)) return resolved;
  // A config or function file the runtime imports is an ES module wherever it sits; another
  // TypeScript file outside node_modules is one unless its package says `"type": "commonjs"`
  // (`/etc/mesh-provisioner/`, where no package says anything): not left to Node's default.
  const path = fileURLToPath(resolved.url);
  const loaded = context.parentURL !== undefined && loaders.has(context.parentURL);
  if (loaded || (!path.includes(`${sep}node_modules${sep}`) && packageType(dirname(path)) !== "commonjs"))
    return { ...resolved, format: "module" };
  return resolved;
};

/** By folder: the `type` of the nearest package.json at or above it, `undefined` when it says none or there is none. */
const types = new Map<string, string | undefined>();

/** The `type` the nearest package.json at or above `dir` says (`module`, `commonjs`), as Node reads a package's scope. */
function packageType(dir: string): string | undefined {
  if (types.has(dir)) return types.get(dir);
  let type: string | undefined;
  try {
    const { type: said } = JSON.parse(readFileSync(join(dir, "package.json"), "utf8")) as { type?: unknown };
    type = typeof said === "string" ? said : undefined;
  } catch (err) {
    const parent = dirname(dir);
    // No package.json here (or one Node cannot read either): the scope is the folder above's.
    type = (err as { code?: string }).code === "ENOENT" && parent !== dir ? packageType(parent) : undefined;
  }
  types.set(dir, type);
  return type;
}
