/**
 * The `ctx` a function gets: built once per function from its declarations (the buckets it reads
 * and writes, the views, the subjects it publishes, its metrics and config) and once per run for
 * its trigger. Whatever it did not declare is refused with an `AccessError` naming it, before
 * anything reaches the server (docs/runtime.md §6.4).
 */
import type { NatsConnection } from "nats";
import type { Logger } from "pino";
import type { Config } from "./config.ts";
import type { AnyContext, LoadedFunction, TriggerInfo } from "./define.ts";
import { AccessError, ServiceError } from "./errors.ts";
import { declareMetric, type Metrics } from "./metrics.ts";
import type { Storage } from "./storage.ts";
import { readStream, type ReadStream } from "./streams.ts";
import { subjectMatches } from "./subjects.ts";
import type { Clock, MetricDeclaration, ReadBucket, RuntimeRecords, Snapshot, StoreUse, ViewBucket, WriteBucket } from "./types.ts";

/**
 * `log.child(bindings)`, made only when a line is written at a level `log` writes: a run's
 * `ctx.log.debug(…)` at level `info` costs no child logger (making one serializes its bindings).
 */
function runLogger(log: Logger, bindings: Record<string, unknown>): Logger {
  let child: Logger | undefined;
  return new Proxy(log, {
    get(target, key) {
      // Until the child is made, a level `log` does not write is its no-op.
      if (child === undefined && typeof key === "string" && key in target.levels.values && !target.isLevelEnabled(key)) {
        return Reflect.get(target, key);
      }
      child ??= target.child(bindings);
      const value: unknown = Reflect.get(child, key);
      return typeof value === "function" ? value.bind(child) : value;
    },
    set(target, key, value) {
      child ??= target.child(bindings);
      return Reflect.set(child, key, value);
    },
  });
}

/** The writes of bucket `bucket` refused to function `fn`, each naming both. */
function refusals(fn: string, bucket: string) {
  const refuse = (op: string) => () => {
    throw new AccessError(`function ${fn} cannot ${op} in bucket ${bucket}: it declares the bucket in access.reads, not access.writes`);
  };
  return { create: refuse("create"), update: refuse("update"), put: refuse("put"), delete: refuse("delete") };
}

/** A read handle that refuses, naming the function and bucket, any write tried through it (`refused`: {@link refusals} of both). */
function readOnly(fn: string, handle: ReadBucket, refused = refusals(fn, handle.bucket)): ReadBucket {
  return Object.freeze({ ...handle, ...refused });
}

/** `ctx.buckets` or `ctx.views`: asking for a bucket of the config the function did not declare throws, naming both. */
function guarded<T extends object>(fn: string, buckets: T, known: readonly string[], side: "buckets" | "views" | "streams"): T {
  return new Proxy(buckets, {
    get(target, key, receiver) {
      if (typeof key === "string" && !(key in target) && known.includes(key)) {
        throw new AccessError(
          side === "buckets"
            ? `function ${fn} uses bucket ${key}, which its access does not declare`
            : side === "views"
              ? `function ${fn} uses a view of bucket ${key}, which its access.views does not declare`
              : `function ${fn} reads stream ${key}, which its access.streams does not declare`,
        );
      }
      return Reflect.get(target, key, receiver);
    },
  });
}

export interface ContextOptions {
  readonly nc: NatsConnection;
  readonly config: Config;
  readonly log: Logger;
  readonly clock: Clock;
  readonly storage: Storage;
  /** Where the functions' declared metrics are registered. */
  readonly metrics: Metrics;
  /**
   * Why NATS cannot be reached now (away, or not answering); none while it can. A view's reads
   * that would ask the server, and a stream's reads, refuse at once with a 503 saying so; a view's
   * `local` reads still answer.
   */
  readonly unreachable?: () => string | undefined;
  /** What JetStream stores for the set now (`ctx.runtime.store()`). */
  readonly store: () => StoreUse;
}

/** The contexts of a function set. */
export interface Contexts {
  /**
   * The `ctx` of one run of `fn`, sharing what does not change between its runs (handles,
   * metrics, the parsed config). `ctx.log` names the function and the trigger; its child logger
   * is made only when a run logs.
   */
  of(fn: LoadedFunction, trigger: TriggerInfo): AnyContext;
  /**
   * Makes what `fn`'s runs share now, its metrics declared among them (on `GET /metrics` before
   * a first run); done at the first run otherwise. Throws when a metric's name is taken.
   */
  prepare(fn: LoadedFunction): void;
}

/** The context maker of a function set, over its storage and metrics registry. */
export function contexts({ nc, config, log, clock, storage, metrics, store, unreachable = () => undefined }: ContextOptions): Contexts {
  type Shared = Omit<AnyContext, "trigger">;
  const perFunction = new Map<LoadedFunction, Shared>();
  const runtime: RuntimeRecords = Object.freeze({ lastRun: storage.records.lastRun, refusedEvents: storage.records.refusedEvents, store });
  // Read at each use: a server the connection moves to, or one restarted, may have another.
  const limits = Object.freeze({
    get maxPayload() {
      return nc.info?.max_payload ?? 1024 * 1024;
    },
  });

  /** `read()`, or a 503 saying why when NATS cannot be reached now ({@link ContextOptions.unreachable}). */
  const reachable = <T>(read: () => Promise<T>): Promise<T> => {
    const away = unreachable();
    return away === undefined ? read() : Promise.reject(new ServiceError(503, away));
  };

  const prepared = (fn: LoadedFunction): Shared => {
    let shared = perFunction.get(fn);
    if (shared !== undefined) return shared;
    const { access, config: schema } = fn.definition;
    const buckets: Record<string, ReadBucket | WriteBucket> = {};
    for (const name of access?.reads ?? []) buckets[name] = readOnly(fn.name, storage.read(name));
    for (const name of access?.writes ?? []) buckets[name] = storage.write(name);
    const live: Record<string, ViewBucket> = {};
    for (const name of access?.views ?? []) {
      const view = storage.view(name);
      const refused = refusals(fn.name, view.bucket);
      const checked = readOnly(fn.name, view, refused);
      // A snapshot's reads are the view's own while it holds them (the same every answer): wrapped once.
      const wrapped = new WeakMap<ReadBucket, ReadBucket>();
      const readsOf = (reads: ReadBucket) => {
        let guardedReads = wrapped.get(reads);
        if (guardedReads === undefined) wrapped.set(reads, (guardedReads = readOnly(fn.name, reads, refused)));
        return guardedReads;
      };
      const snapshotOf = (snapshot: Snapshot): Snapshot => ({
        stamp: snapshot.stamp,
        reads: readsOf(snapshot.reads),
        changedSince: snapshot.changedSince,
      });
      live[name] = {
        ...checked,
        get: (key) => reachable(() => checked.get(key)),
        last: (key) => reachable(() => checked.last(key)),
        list: (filters, options) => reachable(() => checked.list(filters, options)),
        records: (filters, options) => reachable(() => checked.records(filters, options)),
        local: readOnly(fn.name, view.local),
        confirmedAt: () => view.confirmedAt(),
        snapshot: () => reachable(() => view.snapshot().then(snapshotOf)),
        localSnapshot: () => snapshotOf(view.localSnapshot()),
      };
    }
    const streams: Record<string, ReadStream> = {};
    for (const name of access?.streams ?? []) streams[name] = readStream(nc, config.streams[name]!.stream, unreachable);
    const publishes = access?.publishes ?? [];
    const fnLog = log.child({ function: fn.name });
    const declared: Record<string, ReturnType<typeof declareMetric>> = {};
    for (const [name, declaration] of Object.entries(fn.definition.metrics ?? {}) as [string, MetricDeclaration<AnyContext>][]) {
      const collect = declaration.type === "gauge" ? declaration.collect : undefined;
      declared[name] = declareMetric(
        metrics.registry,
        name,
        declaration as MetricDeclaration<unknown>,
        collect && (async () => collect(of(fn, { kind: "scrape" }))),
        fnLog,
      );
    }
    shared = {
      function: fn.name,
      buckets: guarded(fn.name, Object.freeze(buckets), Object.keys(config.buckets), "buckets") as AnyContext["buckets"],
      views: guarded(fn.name, Object.freeze(live), Object.keys(config.buckets), "views"),
      streams: guarded(fn.name, Object.freeze(streams), Object.keys(config.streams), "streams"),
      metrics: Object.freeze(declared) as AnyContext["metrics"],
      log: fnLog,
      config: schema === undefined ? {} : schema.parse(config),
      clock,
      limits,
      runtime,
      publish: (subject, data) => {
        if (/[\s*>]/.test(subject) || !publishes.some((pattern) => subjectMatches(pattern, subject))) {
          throw new AccessError(
            `function ${fn.name} publishes ${subject}, which its access.publishes (${publishes.join(", ") || "none"}) does not name`,
          );
        }
        nc.publish(subject, data);
      },
    };
    perFunction.set(fn, shared);
    return shared;
  };

  const of = (fn: LoadedFunction, trigger: TriggerInfo): AnyContext => {
    const shared = prepared(fn);
    let runLog: Logger | undefined;
    // Each field named rather than spread: made on every run, a literal of one shape is cheap.
    return {
      function: shared.function,
      buckets: shared.buckets,
      views: shared.views,
      streams: shared.streams,
      metrics: shared.metrics,
      config: shared.config,
      clock: shared.clock,
      limits: shared.limits,
      runtime: shared.runtime,
      publish: shared.publish,
      trigger,
      get log() {
        return (runLog ??= runLogger(shared.log, { trigger }));
      },
    };
  };
  return { of, prepare: (fn) => void prepared(fn) };
}
