#!/usr/bin/env node
// `npm run build` (run by `prestart`): the command line, the runtime, the shipped function files
// and the config bundled by esbuild into dist/, so that a start needs no tsx (docs/scale.md §11.2).
import { mkdirSync, readdirSync, readFileSync, renameSync, rmSync, statSync, writeFileSync } from "node:fs";
import { join, relative, resolve } from "node:path";
import { BUILD_FILE, DIST, currentBuild, hashOf } from "./dist.mjs";

const ROOT = resolve(import.meta.dirname, "..");

/** The function files the project ships (functions/_shipped.json, as the tests read it); a file a user drops in loads through tsx. */
export const SHIPPED_FUNCTIONS = JSON.parse(readFileSync(join(ROOT, "functions", "_shipped.json"), "utf8"));

/** The sources bundled as modules of their own: what the bin, the loader and a dropped-in function file import. */
function entryPoints() {
  const lib = ["functions/_lib", "contract"].flatMap((dir) =>
    readdirSync(join(ROOT, dir))
      .filter((f) => /\.tsx?$/.test(f) && !f.endsWith(".d.ts"))
      .map((f) => `${dir}/${f}`),
  );
  return [
    "cli/main.ts",
    "runtime/index.ts",
    "runtime/built-sources.ts",
    "wrangler-free.config.ts",
    ...SHIPPED_FUNCTIONS.map((f) => `functions/${f}.ts`),
    ...lib,
  ];
}

/**
 * Bundles the sources into `dist/<id>/` (`id` a hash of every input's content), one copy of each
 * module shared through chunks, libraries imported from node_modules as they are (one zod for the
 * bundle and for a function file loaded through tsx). Then points `dist/build.json` at it: the
 * inputs' hashes and each entry's output. Does nothing when `dist/build.json` is current.
 * Returns the build's record (bin/dist.mjs).
 */
export async function buildDist() {
  const now = currentBuild(ROOT);
  if (now !== undefined) return now;
  const dist = join(ROOT, DIST);
  mkdirSync(dist, { recursive: true });
  // Built beside, then moved in whole: a start reading dist/ meanwhile never sees half a build.
  const making = join(dist, `.making-${process.pid}`);
  rmSync(making, { recursive: true, force: true });
  const { build } = await import("esbuild");
  const result = await build({
    absWorkingDir: ROOT,
    entryPoints: entryPoints(),
    outbase: ".",
    outdir: making,
    entryNames: "[dir]/[name]",
    chunkNames: "chunks/[name]-[hash]",
    bundle: true,
    splitting: true,
    format: "esm",
    platform: "node",
    target: "node20",
    packages: "external",
    sourcemap: "linked",
    metafile: true,
    logLevel: "warning",
  });
  // This file and the list of shipped functions among the inputs: a build of other options or
  // other entries is another build.
  const inputs = Object.fromEntries(
    [...Object.keys(result.metafile.inputs).filter((file) => !file.startsWith("node_modules/")), "bin/build.mjs", "functions/_shipped.json"]
      .sort()
      .map((file) => [file, hashOf(join(ROOT, file))]),
  );
  const id = hashOf(JSON.stringify(inputs), "text").slice(0, 16);
  const entries = Object.fromEntries(
    Object.entries(result.metafile.outputs)
      .filter(([, output]) => output.entryPoint !== undefined)
      .map(([file, output]) => [output.entryPoint, `${id}/${relative(making, join(ROOT, file))}`]),
  );
  const record = { id, inputs, entries };
  // A copy in the build's own folder: what a process running this build reads, whichever build is current later.
  writeFileSync(join(making, BUILD_FILE), `${JSON.stringify(record, null, 2)}\n`);
  const target = join(dist, id);
  try {
    renameSync(making, target);
  } catch {
    rmSync(making, { recursive: true, force: true }); // the same build, made meanwhile by another start
  }
  const file = join(dist, `${BUILD_FILE}.${process.pid}`);
  writeFileSync(file, `${JSON.stringify(record, null, 2)}\n`);
  renameSync(file, join(dist, BUILD_FILE));
  // Older builds go, but for the newest few: a process started on one may still import from it.
  const builds = readdirSync(dist, { withFileTypes: true })
    .filter((d) => d.isDirectory() && !d.name.startsWith(".") && d.name !== id)
    .map((d) => ({ name: d.name, at: statSync(join(dist, d.name)).mtimeMs }))
    .sort((a, b) => b.at - a.at);
  for (const old of builds.slice(2)) rmSync(join(dist, old.name), { recursive: true, force: true });
  return record;
}

if (process.argv[1] !== undefined && resolve(process.argv[1]) === import.meta.filename) await buildDist();
