/**
 * The runtime of the function set: define functions and the config, load, start, invoke.
 * Generic: it knows buckets, subjects, cron and routes, nothing of what the functions do.
 */
export { defineFunction, type Context, type FunctionDefinition, type Trigger, type TriggerInfo, type Clock, type RuntimeRecords, type Run, type Refused } from "./define.ts";
export { defineConfig, loadConfig, resolveConfig, ConfigError, CONFIG_FILE, type Config, type ConfigInput } from "./config.ts";
export { ServiceError, badInput, formatIssues } from "./errors.ts";
export { JsonText } from "./json.ts";
export { keyedSerial } from "./serial.ts";
export { RevisionConflict, type Entry, type KeyRecord, type ListOptions, type ReadBucket, type WriteBucket } from "./buckets.ts";
export type { ViewBucket } from "./views/index.ts";
export { loadFunction, loadFunctions, checkFunctions, LoadError, type LoadedFunction } from "./loader.ts";
export { openHost, invoke, type Host, type Outcome } from "./host.ts";
export { openSession, type Session } from "./session.ts";
export { start, describe, type Running } from "./start.ts";
export { NatsServerMissing } from "./nats-server.ts";
