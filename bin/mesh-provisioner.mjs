#!/usr/bin/env node
// Runs the command line from the build in dist/ when it is current (`npm run build`, run by
// `npm start`), else its TypeScript through tsx, so `npx mesh-provisioner` needs no build step
// and a source changed since the build never runs old code (docs/scale.md §11.2).
import { join, resolve } from "node:path";
import { pathToFileURL } from "node:url";
import { currentBuild, DIST } from "./dist.mjs";

const root = resolve(import.meta.dirname, "..");
const build = currentBuild(root);
if (build !== undefined) {
  await import(pathToFileURL(join(root, DIST, build.entries["cli/main.ts"])).href);
} else {
  const { register } = await import("tsx/esm/api");
  register();
  await import("../cli/main.ts");
}
