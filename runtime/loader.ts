/**
 * Discovery as data: scanning the functions folder, loading each file and checking its default
 * export and each trigger's kind, then checking the set against itself and the config, so that
 * start refuses with every problem named, file by file (docs/runtime.md §6.1).
 */
import { existsSync, readdirSync, statSync } from "node:fs";
import { basename, join, relative } from "node:path";
import { z } from "zod";
import { configPath, configSchema, RESOLVED_FIELDS, type Config } from "./config.ts";
import { definitionSchema, type FunctionDefinition, type LoadedFunction } from "./define.ts";
import { formatIssues, thrownText } from "./errors.ts";
import { isRuntimeMetric } from "./metrics.ts";
import { importModule } from "./modules.ts";
import { kindOf } from "./triggers/index.ts";
import type { Problem } from "./triggers/kind.ts";

/** Start cannot go on: `problems` holds one sentence per file or field at fault. */
export class LoadError extends Error {
  override readonly name = "LoadError";
  constructor(
    readonly problems: readonly string[],
    options?: ErrorOptions,
  ) {
    super(problems.join("\n"), options);
  }
}

const shown = (file: string) => relative(process.cwd(), file) || file;
const NAME = /^[A-Za-z0-9_-]+$/;

/**
 * The function files of `dir`: every `*.ts` whose name does not start with `_` (nor ends in
 * `.d.ts` or `.test.ts`), as absolute paths sorted by name. Throws {@link LoadError} when `dir`
 * is not a folder.
 */
export function scanFunctions(dir: string): string[] {
  if (!existsSync(dir) || !statSync(dir).isDirectory()) {
    throw new LoadError([`${shown(dir)}: the functions folder does not exist or is not a folder`]);
  }
  return readdirSync(dir)
    .filter((f) => f.endsWith(".ts") && !f.startsWith("_") && !f.endsWith(".d.ts") && !f.endsWith(".test.ts"))
    .sort()
    .map((f) => join(dir, f));
}

/** Imports one function file (runtime/modules.ts: built or through tsx) and checks its default export. Throws {@link LoadError}. */
export async function loadFunction(file: string): Promise<LoadedFunction> {
  const name = basename(file, ".ts");
  if (!NAME.test(name)) {
    throw new LoadError([`${shown(file)}: a function's file name must be letters, digits, - or _`]);
  }
  let module: { default?: unknown };
  try {
    module = (await importModule(file)) as { default?: unknown };
  } catch (err) {
    throw new LoadError([`${shown(file)}: cannot be loaded: ${thrownText(err)}`], { cause: err });
  }
  if (module.default === undefined) {
    throw new LoadError([`${shown(file)}: has no default export; export default defineFunction({...})`]);
  }
  const parsed = definitionSchema.safeParse(module.default);
  if (!parsed.success) {
    throw new LoadError([`${shown(file)}: not a valid function: ${formatIssues(parsed.error.issues)}`]);
  }
  const definition = module.default as FunctionDefinition;
  const input = definition.input ?? z.strictObject({});
  const problems = definition.triggers.flatMap((trigger, i) => said(file, i, kindOf(trigger)!.checkFile?.(trigger, { input }) ?? []));
  if (problems.length > 0) throw new LoadError(problems);
  return { name, file, definition, description: definition.description, output: definition.output, triggers: definition.triggers, input };
}

/** A trigger's problems as the loader says them: `<file>: triggers.<i>[.<field>]: <message>`. */
const said = (file: string, i: number, problems: readonly Problem[]) =>
  problems.map(({ at, message }) => `${shown(file)}: triggers.${i}${at === undefined ? "" : `.${at}`}: ${message}`);

/**
 * Checks a loaded function set against itself and the config: no subject, route or metric
 * taken twice (both files named), no metric named as the runtime's, streams of event triggers and of `access.streams` exist in `config.streams`, buckets in
 * `access` exist in `config.buckets`, each function's
 * `config` schema accepts the config, and every config field is read by the runtime or a
 * function. Returns the problems, one sentence each; none means the set can start.
 */
export function checkFunctions(functions: readonly LoadedFunction[], config: Config): string[] {
  const problems: string[] = [];
  const bound = new Map<string, string[]>();
  for (const fn of functions) {
    for (const trigger of fn.definition.triggers) {
      const key = kindOf(trigger)!.exclusive?.(trigger);
      if (key !== undefined) bound.set(key, [...(bound.get(key) ?? []), shown(fn.file)]);
    }
  }
  for (const [key, files] of bound) {
    if (files.length > 1) problems.push(`${key} is bound more than once: by ${files.join(" and ")}`);
  }
  const all = functions.flatMap((fn) => fn.definition.triggers.map((trigger) => ({ trigger, file: shown(fn.file) })));
  all.forEach((a, i) => {
    for (const b of all.slice(i + 1)) {
      const kind = kindOf(a.trigger)!;
      const why = kind === kindOf(b.trigger) ? kind.conflict?.(a.trigger as never, b.trigger as never) : undefined;
      if (why !== undefined) problems.push(`${why}: by ${a.file === b.file ? a.file : `${a.file} and ${b.file}`}`);
    }
  });
  const declared = new Map<string, string[]>();
  for (const fn of functions) {
    for (const name of Object.keys(fn.definition.metrics ?? {})) {
      if (isRuntimeMetric(name)) problems.push(`${shown(fn.file)}: metrics.${name}: the runtime's own metric (or one of its samples)`);
      else declared.set(name, [...(declared.get(name) ?? []), shown(fn.file)]);
    }
  }
  for (const [name, files] of declared) {
    if (files.length > 1) problems.push(`metric ${name} is declared more than once: by ${files.join(" and ")}`);
  }

  for (const fn of functions) {
    fn.definition.triggers.forEach((trigger, i) =>
      problems.push(...said(fn.file, i, kindOf(trigger)!.checkConfig?.(trigger, config) ?? [])),
    );
  }

  const buckets = Object.keys(config.buckets);
  const claimed = new Set(Object.keys(configSchema.shape));
  // A config field several functions read and refuse is said once, naming them all.
  const refusedBy = new Map<string, string[]>();
  for (const fn of functions) {
    const { access, config: schema } = fn.definition;
    for (const side of ["reads", "writes", "views"] as const) {
      for (const bucket of access?.[side] ?? []) {
        if (!buckets.includes(bucket)) {
          problems.push(`${shown(fn.file)}: access.${side}: no bucket "${bucket}" in the config (it has ${buckets.join(", ")})`);
        } else if (side === "writes" && config.buckets[bucket]!.writtenBy !== "seat") {
          problems.push(
            `${shown(fn.file)}: access.writes: bucket "${bucket}" is written by nodes only (docs/buckets.md §2), never by the seat`,
          );
        }
      }
    }
    for (const stream of access?.streams ?? []) {
      if (config.streams[stream] === undefined) {
        const known = Object.keys(config.streams);
        problems.push(`${shown(fn.file)}: access.streams: no stream "${stream}" in the config (it has ${known.join(", ") || "none"})`);
      }
    }
    if (schema === undefined) continue;
    for (const field of Object.keys(schema.shape)) claimed.add(field);
    const parsed = schema.safeParse(config);
    if (!parsed.success) {
      const said = `${shown(config.file)}: ${formatIssues(parsed.error.issues)}`;
      refusedBy.set(said, [...(refusedBy.get(said) ?? []), shown(fn.file)]);
    }
  }
  for (const [said, files] of refusedBy) problems.push(`${said} (read by ${files.join(", ")})`);
  for (const field of Object.keys(config)) {
    if (!claimed.has(field) && !RESOLVED_FIELDS.includes(field)) {
      problems.push(`${shown(config.file)}: ${field}: unknown field (neither the runtime nor any function reads it)`);
    }
  }
  return problems;
}

/**
 * Scans the config's functions folder, loads every file and checks the set with
 * {@link checkFunctions}. Throws one {@link LoadError} listing every problem found.
 */
export async function loadFunctions(config: Config): Promise<LoadedFunction[]> {
  const files = scanFunctions(configPath(config, config.functions));
  const problems: string[] = [];
  const loaded: LoadedFunction[] = [];
  for (const file of files) {
    try {
      loaded.push(await loadFunction(file));
    } catch (err) {
      if (!(err instanceof LoadError)) throw err;
      problems.push(...err.problems);
    }
  }
  problems.push(...checkFunctions(loaded, config));
  if (problems.length > 0) throw new LoadError(problems);
  return loaded;
}
