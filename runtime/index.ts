/**
 * The runtime of the function set: define functions and the config, load, start, invoke, and
 * what the command line needs (sessions, users and permissions, the local cluster). Generic: it
 * knows buckets, subjects, cron and routes, nothing of what the functions do. Function files and
 * the command line import the runtime from here only (docs/runtime.md §6).
 */
export {
  defineFunction,
  type AnyContext,
  type Context,
  type FunctionDefinition,
  type LoadedFunction,
  type Trigger,
  type TriggerInfo,
} from "./define.ts";
export type {
  Clock,
  Entry,
  KeyRecord,
  ListOptions,
  Outcome,
  ReadBucket,
  RefusedEvents,
  Run,
  RuntimeRecords,
  Snapshot,
  StoreUse,
  StreamUse,
  ViewBucket,
  WriteBucket,
} from "./types.ts";
export type { ReadStream, StreamMessage } from "./streams.ts";
export { nanosOfTime } from "./buckets.ts";
export { defineConfig, loadConfig, resolveConfig, configPath, ConfigError, CONFIG_FILE, type Config, type ConfigInput } from "./config.ts";
export { ServiceError, RevisionConflict, badInput, formatIssues, thrownText } from "./errors.ts";
export { HtmlText, JsonText, WithStatus } from "./json.ts";
export { keyedSerial } from "./serial.ts";
export { createLogger } from "./log.ts";
export { loadFunction, loadFunctions, checkFunctions, LoadError } from "./loader.ts";
export { openRunner, invoke, type Runner } from "./runner.ts";
export { openSession, type Session } from "./session.ts";
export { authorization } from "./permissions.ts";
export { passwordsIn, serverConf, toConf, userName, type AuthorizedUser } from "./users.ts";
export { startCluster } from "./cluster.ts";
export { start, describe, STOP_GRACE_MS, type Running } from "./start.ts";
export { NatsServerMissing } from "./nats-server.ts";
