/**
 * Module hooks (node:module `register`) of a start through tsx (docs/scale.md §11.2): a project
 * source that a file loaded through tsx imports (`../runtime/index.ts`, `./_lib/…`) resolves to
 * its built module, so the set holds one runtime and one copy of each shared module; and a
 * TypeScript file outside node_modules is an ES module wherever it sits (a config file in
 * `/etc/mesh-provisioner/`, where no package says `"type": "module"`, would be read as
 * CommonJS). Registered by runtime/modules.ts (a build's) and bin/mesh-provisioner.mjs (no
 * build: none resolved) after tsx's own, so it runs first and asks tsx to resolve.
 */
import { realpathSync } from "node:fs";
import type { InitializeHook, ResolveHook } from "node:module";
import { fileURLToPath, pathToFileURL } from "node:url";
import type { BuiltSources } from "./modules.ts";

let built: Readonly<Record<string, string>> = {};

export const initialize: InitializeHook<BuiltSources> = (data) => {
  built = data.built;
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
  // A config or function file outside any package of `"type": "module"` (`/etc/mesh-provisioner/config.ts`)
  // is an ES module all the same: its format is not left to the folder it sits in.
  if (resolved.format !== "module" && /\.tsx?$/.test(new URL(resolved.url).pathname) && !resolved.url.includes("/node_modules/"))
    return { ...resolved, format: "module" };
  return resolved;
};
