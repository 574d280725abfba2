#!/usr/bin/env node
// Runs the command line from the build in dist/ when it is current (`npm run build`, run by
// `npm start`), else its TypeScript through tsx, so `npx mesh-provisioner` needs no build step
// and a source changed since the build never runs old code (docs/scale.md §11.2).
import { join, resolve } from "node:path";
import { pathToFileURL } from "node:url";
import { currentBuild, DIST } from "./dist.mjs";

const root = resolve(import.meta.dirname, "..");
// `--version` alone: the package's, said before anything is loaded.
if (process.argv.length === 3 && (process.argv[2] === "--version" || process.argv[2] === "-V")) {
  const { readFileSync } = await import("node:fs");
  console.log(JSON.parse(readFileSync(join(root, "package.json"), "utf8")).version);
  process.exit(0);
}
// Node 22.1 and later keep what they compiled of the modules below, for the next start
// (docs/scale.md §11.2.2): under the default state folder, or NODE_COMPILE_CACHE when set.
const { default: module } = await import("node:module");
module.enableCompileCache?.(process.env.NODE_COMPILE_CACHE ?? join(root, ".state", "compile-cache"));
const build = currentBuild(root);
if (build !== undefined) {
  await import(pathToFileURL(join(root, DIST, build.entries["cli/main.ts"])).href);
} else {
  const { register } = await import("tsx/esm/api");
  register();
  // A config or function file is an ES module wherever it sits (runtime/built-sources.ts; no build here).
  const loaders = [new URL("../runtime/modules.ts", import.meta.url).href];
  module.register("../runtime/built-sources.ts", import.meta.url, { data: { built: {}, loaders } });
  await import("../cli/main.ts");
}
