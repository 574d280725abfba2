/**
 * The process's logger (pino): JSON lines, readable lines on a terminal, the level from
 * `LOG_LEVEL`, and every field named like a credential written `***` at any depth. A leaf.
 */
import { createRequire } from "node:module";
import { pino, type Logger, type LoggerOptions } from "pino";
import type { PrettyStream } from "pino-pretty";

/** pino-pretty, loaded only for a terminal: a stream of this thread, not a transport's worker thread (docs/scale.md §11.2). */
const prettyStream = (options: { translateTime: string; destination: number; sync: boolean }): PrettyStream =>
  (createRequire(import.meta.url)("pino-pretty") as typeof import("pino-pretty")).build(options);

/** Field names whose values are credentials, in any case: written `***` at any depth. */
const SECRET_FIELD = /^(pass|passwd|password|token|auth_token|creds|credentials|seed|nkey|authorization|secret)$/i;
/** How deep a logged object is searched for credentials; deeper parts are written `[deep]`. */
const MAX_DEPTH = 12;

/**
 * `value` with every field named like a credential ({@link SECRET_FIELD}) replaced by `***`,
 * at any depth: plain objects, arrays and errors are copied, other values kept as they are.
 */
export function redacted(value: unknown, depth = 0, seen = new WeakSet<object>()): unknown {
  if (value === null || typeof value !== "object") return value;
  if (seen.has(value)) return "[circular]";
  if (depth > MAX_DEPTH) return "[deep]";
  if (value instanceof Error) return redacted(pino.stdSerializers.err(value), depth, seen);
  if (ArrayBuffer.isView(value) || value instanceof Date || typeof (value as { toJSON?: unknown }).toJSON === "function") return value;
  seen.add(value);
  const copy = Array.isArray(value)
    ? value.map((item) => redacted(item, depth + 1, seen))
    : Object.fromEntries(
        Object.entries(value).map(([key, item]) => [key, SECRET_FIELD.test(key) ? "***" : redacted(item, depth + 1, seen)]),
      );
  seen.delete(value);
  return copy;
}

const LEVELS = [...Object.keys(pino.levels.values), "silent"];

const OPTIONS: LoggerOptions = {
  // Serializers run after `formatters.log`: errors are serialized, then searched.
  serializers: { err: (err: unknown) => redacted(err) },
  formatters: { log: (object) => redacted(object) as Record<string, unknown> },
};

/**
 * The process's logger: JSON lines on stdout (or `to` stderr, for commands whose stdout is their
 * answer), readable lines on a terminal.
 * `LOG_LEVEL` sets the level (default `info`; `silent` turns logs off); throws naming the levels
 * when it is none of them. A field named like a credential (`password`, `token`, `creds`,
 * `seed`, `authorization`… in any case, at any depth) is written `***`.
 */
export function createLogger(env: NodeJS.ProcessEnv = process.env, { to = "stdout" }: { to?: "stdout" | "stderr" } = {}): Logger {
  const level = env.LOG_LEVEL ?? "info";
  if (!LEVELS.includes(level)) throw new Error(`LOG_LEVEL: ${JSON.stringify(level)} is not a level (${LEVELS.join(", ")})`);
  const fd = to === "stdout" ? 1 : 2;
  if ((to === "stdout" ? process.stdout : process.stderr).isTTY) {
    return pino({ ...OPTIONS, level }, prettyStream({ translateTime: "SYS:HH:MM:ss", destination: fd, sync: true }));
  }
  return pino({ ...OPTIONS, level }, pino.destination({ fd, sync: true }));
}
