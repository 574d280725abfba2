#!/usr/bin/env node
// `npm run build:client` (run by `prepack`): the client library as a package's export
// `mesh-provisioner/client` (docs/client.md §9.4): `client/index.ts` and the wire contract it
// stands on bundled by esbuild into one ES module, `dist-client/index.js` (nats, zod and p-retry
// imported from node_modules), and its declarations by tsc into `dist-client/types/`.
import { execFileSync } from "node:child_process";
import { rmSync, statSync } from "node:fs";
import { createRequire } from "node:module";
import { join, resolve } from "node:path";
import { build } from "esbuild";

const ROOT = resolve(import.meta.dirname, "..");
const OUT = join(ROOT, "dist-client");

rmSync(OUT, { recursive: true, force: true });
await build({
  absWorkingDir: ROOT,
  entryPoints: ["client/index.ts"],
  outfile: join(OUT, "index.js"),
  bundle: true,
  format: "esm",
  platform: "node",
  target: "node20",
  packages: "external",
  sourcemap: "linked",
  logLevel: "warning",
});
const tsc = createRequire(import.meta.url).resolve("typescript/bin/tsc");
execFileSync(process.execPath, [tsc, "-p", join(ROOT, "tsconfig.client.json")], {
  cwd: ROOT,
  stdio: ["ignore", process.stderr, process.stderr],
});
console.error(`dist-client/index.js: ${statSync(join(OUT, "index.js")).size} bytes, declarations in dist-client/types/`);
