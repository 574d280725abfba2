/**
 * Module hooks (node:module `register`) of a bundled start (docs/scale.md §11.2): a project
 * source that a file loaded through tsx imports (`../runtime/index.ts`, `./_lib/…`) resolves to
 * its built module, so the set holds one runtime and one copy of each shared module. Registered
 * by runtime/modules.ts after tsx's own, so it runs first and asks tsx to resolve.
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
  return to === undefined ? resolved : { url: to, format: "module", shortCircuit: true };
};
