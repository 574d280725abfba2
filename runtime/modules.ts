/**
 * How the runtime imports a function file or the config file (docs/runtime.md §6.1,
 * docs/scale.md §11.2). Run from its TypeScript (vitest, tsx): the file itself. Run from the
 * build in `dist/` (`npm run build`): the file's built module when the build has one, else the
 * file through tsx, registered at the first such file (a set without one never loads tsx).
 */
import { existsSync, readFileSync, realpathSync } from "node:fs";
import { register } from "node:module";
import { dirname, join, relative, resolve } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

/**
 * The data of the hooks of runtime/built-sources.ts: `{ <source file URL>: <built module URL> }`,
 * sources by their real path; and the URLs of the modules that import config and function files
 * ({@link importModule}'s).
 */
export interface BuiltSources {
  readonly built: Readonly<Record<string, string>>;
  readonly loaders: readonly string[];
}

/** What bin/build.mjs records of a build: the sources it was built from, and each entry's module (relative to `dist/`). */
interface BuildRecord {
  readonly inputs: Readonly<Record<string, string>>;
  readonly entries: Readonly<Record<string, string>>;
}

/** The build this module is part of: its record, and the project's and `dist/`'s folders. */
interface Build {
  readonly root: string;
  readonly dist: string;
  readonly record: BuildRecord;
}

/** The build's folder is the first above this module holding `build.json`; none when run from TypeScript. */
function ownBuild(): Build | undefined {
  const here = fileURLToPath(import.meta.url);
  if (/\.tsx?$/.test(here)) return undefined;
  for (let dir = dirname(here), up = 0; up < 4; dir = dirname(dir), up++) {
    const file = join(dir, "build.json");
    if (existsSync(file)) {
      const dist = dirname(dir);
      return { root: dirname(dist), dist, record: JSON.parse(readFileSync(file, "utf8")) as BuildRecord };
    }
  }
  return undefined;
}

const build = ownBuild();
let tsx: Promise<void> | undefined;

/** tsx's loader, then the hooks resolving the project's built sources to their modules (runtime/built-sources.ts). */
async function registerTsx(b: Build): Promise<void> {
  const api = await import("tsx/esm/api");
  api.register();
  const built: Record<string, string> = {};
  for (const [source, output] of Object.entries(b.record.entries)) {
    built[pathToFileURL(join(b.root, source)).href] = pathToFileURL(join(b.dist, output)).href;
  }
  const hooks = b.record.entries["runtime/built-sources.ts"];
  if (hooks === undefined) throw new Error("the build has no runtime/built-sources.ts: build again (npm run build)");
  register<BuiltSources>(pathToFileURL(join(b.dist, hooks)).href, { data: { built, loaders: [import.meta.url] } });
}

/**
 * Imports `file` (an absolute path), resolving its links: the built module of a source the build
 * was made from, or the file itself. Throws what the import throws.
 */
export async function importModule(file: string): Promise<unknown> {
  if (build === undefined) return import(pathToFileURL(file).href);
  const real = realpathSync(resolve(file));
  const output = build.record.entries[relative(build.root, real)];
  if (output !== undefined) return import(pathToFileURL(join(build.dist, output)).href);
  if (/\.(c|m)?tsx?$/.test(real)) await (tsx ??= registerTsx(build));
  return import(pathToFileURL(real).href);
}
