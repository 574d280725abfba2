import { DiscardPolicy, nanos, RetentionPolicy, StorageType, type KV, type NatsConnection } from "nats";
import type { Logger } from "pino";
import { readBucket, writeBucket, type ReadBucket, type WriteBucket } from "./buckets.ts";
import type { BucketConfig, Config } from "./config.ts";
import type { Clock, Context, MetricDeclaration, TriggerInfo } from "./define.ts";
import { AccessError, formatIssues, refusalMessage, ServiceError } from "./errors.ts";
import { JsonText } from "./json.ts";
import type { LoadedFunction } from "./loader.ts";
import { CLAIM_DAYS, claimsBucket, recordsBucket, recorder, type Recorder } from "./records.ts";
import { subjectMatches } from "./subjects.ts";
import { openView, type LiveView, type ViewBucket } from "./views/index.ts";
import { createMetrics, declareMetric, type Metrics } from "./metrics.ts";

/** How one run ended: the handler's answer, or a refusal with its SPEC §4 code. */
export type Outcome =
  | { readonly ok: true; readonly value: unknown }
  | { readonly ok: false; readonly error: { readonly code: number; readonly message: string } };

/** The context of a function seen from the runtime, whatever buckets and config it declared. */
export type AnyContext = Context<string, string, unknown, string, Record<string, "counter" | "gauge">>;

/** What every binding shares: the connection, the opened buckets, and how a function runs. */
export interface Host {
  readonly nc: NatsConnection;
  readonly config: Config;
  readonly log: Logger;
  /** The runtime's records (SPEC §6): scheduled runs and refused events. */
  readonly records: Recorder;
  /** The runtime's Prometheus metrics: runs, errors and durations by function and trigger. */
  readonly metrics: Metrics;
  /** The `ctx` a function gets for one run: only the buckets it declared. */
  context(fn: LoadedFunction, trigger: TriggerInfo): AnyContext;
  /**
   * Validates `raw` with the function's input schema and runs its handler. Never throws:
   * bad input is a 400, a {@link ServiceError} keeps its code, anything else is logged and a 500.
   */
  run(fn: LoadedFunction, raw: unknown, trigger: TriggerInfo): Promise<Outcome>;
  /**
   * Counts and logs, as one run refused with `error`, a trigger whose input could not even be
   * read (a payload that is not JSON); returns that refusal.
   */
  refuse(fn: LoadedFunction, trigger: TriggerInfo, error: { readonly code: number; readonly message: string }): Outcome;
  /** Stops the live views. */
  close(): void;
}

export interface HostOptions {
  readonly nc: NatsConnection;
  readonly config: Config;
  readonly log: Logger;
  readonly clock?: Clock;
  /** The functions whose `access.views` the host keeps live; none when absent. */
  readonly functions?: readonly LoadedFunction[];
}

/** A read handle that refuses, naming the function and bucket, any write tried through it. */
function readOnly(fn: string, handle: ReadBucket): ReadBucket {
  const refuse = (op: string) => () => {
    throw new AccessError(`function ${fn} cannot ${op} in bucket ${handle.bucket}: it declares the bucket in access.reads, not access.writes`);
  };
  return Object.freeze({ ...handle, create: refuse("create"), update: refuse("update"), put: refuse("put"), delete: refuse("delete") });
}

/** `ctx.buckets` or `ctx.views`: asking for a bucket of the config the function did not declare throws, naming both. */
function guarded<T extends object>(fn: string, buckets: T, known: readonly string[], side: "buckets" | "views"): T {
  return new Proxy(buckets, {
    get(target, key, receiver) {
      if (typeof key === "string" && !(key in target) && known.includes(key)) {
        throw new AccessError(
          side === "buckets"
            ? `function ${fn} uses bucket ${key}, which its access does not declare`
            : `function ${fn} uses a view of bucket ${key}, which its access.views does not declare`,
        );
      }
      return Reflect.get(target, key, receiver);
    },
  });
}

/** The runtime's own bucket among the opened ones; no config name can be this. */
const RECORDS = "<runtime>";
const CLAIMS = "<claims>";

/** The settings of a bucket's stream that the config decides, as JetStream says them. */
interface BucketSettings {
  readonly num_replicas: number;
  readonly max_msgs_per_subject: number;
  readonly max_age: number;
  readonly max_bytes: number;
}

/** The config's words and the nats CLI's flag for each of {@link BucketSettings}. */
const SETTINGS: Record<keyof BucketSettings, { readonly said: string; readonly flag: (value: number) => string }> = {
  num_replicas: { said: "replicas", flag: (v) => `--replicas ${v}` },
  max_msgs_per_subject: { said: "history", flag: (v) => `--max-msgs-per-subject ${v}` },
  max_age: { said: "maxAgeSeconds", flag: (v) => `--max-age ${v === 0 ? "0" : `${v / 1e9}s`}` },
  max_bytes: { said: "maxBytes", flag: (v) => `--max-bytes ${v}` },
};

/**
 * What differs between a stream's settings and those wanted, said in the config's words with
 * the nats CLI command that would make them equal; `undefined` when nothing differs.
 */
export function settingsDiffer(stream: string, have: BucketSettings, want: BucketSettings): string | undefined {
  const keys = (Object.keys(SETTINGS) as (keyof BucketSettings)[]).filter((k) => have[k] !== want[k]);
  if (keys.length === 0) return undefined;
  const shown = (k: keyof BucketSettings, v: number) =>
    k === "max_age" ? (v === 0 ? "none" : `${v / 1e9}`) : k === "max_bytes" && v === -1 ? "none" : String(v);
  const said = keys.map((k) => `${SETTINGS[k].said} ${shown(k, have[k])} (the config says ${shown(k, want[k])})`);
  return `${said.join(", ")}; it is left as it is: edit it (nats stream edit ${stream} ${keys.map((k) => SETTINGS[k].flag(want[k])).join(" ")}) or make the config say what it has`;
}

/** Whether a server version (`2.9.10`) is older than `[major, minor, patch]`. */
function olderThan(version: string, than: readonly [number, number, number]): boolean {
  const parts = version.split(/[.-]/).slice(0, 3).map(Number);
  for (let i = 0; i < 3; i++) {
    const part = parts[i] ?? 0;
    if (part !== than[i]) return part < than[i]!;
  }
  return false;
}

/**
 * Asserts every bucket of `config.buckets`, and the runtime's own `<seat>_runtime` and
 * `<seat>_claims` (whose keys go after {@link CLAIM_DAYS} days), on the connection (SPEC §2): a
 * missing one is created as a JetStream key-value bucket with the config's `history`,
 * `replicas` (the bucket's, else the config's), `maxAgeSeconds` and `maxBytes`, refusing rollup
 * headers (so no writer can erase keys it was not granted); an existing one is never emptied nor
 * changed: when those settings differ, this throws saying each difference of every bucket, having
 * created none; a node-written one
 * that still takes rollups gets a warning. Returns the opened buckets by config name (reads go
 * to the stream's leader when it has replicas: a follower may lag); throws naming the bucket
 * when the server refuses.
 */
export async function assertBuckets(nc: NatsConnection, config: Config, log: Logger): Promise<Map<string, KV>> {
  const jsm = await nc.jetstreamManager();
  const js = nc.jetstream();
  const all: [string, BucketConfig][] = [
    ...Object.entries(config.buckets),
    [RECORDS, { bucket: recordsBucket(config.seat), writtenBy: "seat", readBy: [], history: 1 }],
    [CLAIMS, { bucket: claimsBucket(config.seat), writtenBy: "seat", readBy: [], history: 1, maxAgeSeconds: CLAIM_DAYS * 86_400 }],
  ];
  const wanted = ({ history, replicas, maxAgeSeconds, maxBytes }: BucketConfig): BucketSettings => ({
    num_replicas: replicas ?? config.replicas,
    max_msgs_per_subject: history,
    max_age: maxAgeSeconds === undefined ? 0 : nanos(maxAgeSeconds * 1000),
    max_bytes: maxBytes ?? -1,
  });
  // First every bucket as it is: nothing is created while one of them differs from the config.
  const found = await Promise.all(
    all.map(async ([, { bucket }]) =>
      jsm.streams.info(`KV_${bucket}`).catch((err: Error) => {
        if (err.message === "stream not found") return undefined;
        throw new Error(`cannot assert bucket ${bucket}: ${err.message}`);
      }),
    ),
  );
  const differ = all.flatMap(([, settings], i) => {
    const info = found[i];
    const said = info && settingsDiffer(`KV_${settings.bucket}`, info.config, wanted(settings));
    return said ? [`bucket ${settings.bucket} exists with other settings than the config: ${said}`] : [];
  });
  if (differ.length > 0) throw new Error(differ.join("\n"));

  const replicated = all.some(([, settings], i) => (found[i]?.config.num_replicas ?? wanted(settings).num_replicas) > 1);
  if (replicated && olderThan(nc.info?.version ?? "0.0.0", [2, 9, 21])) {
    log.warn(
      { server: nc.info?.version },
      "nats-server before 2.9.21 does not check a replicated bucket's expected revision atomically (nats-server#4320): " +
        "compare-and-set writes of several replicas of the set may race; run 2.9.21 or later, or one replica of the set",
    );
  }
  const opened = new Map<string, KV>();
  await Promise.all(
    all.map(async ([name, settings], i) => {
      const { bucket, writtenBy } = settings;
      let info = found[i];
      try {
        info ??= await jsm.streams.add({
          name: `KV_${bucket}`,
          subjects: [`$KV.${bucket}.>`],
          retention: RetentionPolicy.Limits,
          storage: StorageType.File,
          discard: DiscardPolicy.New,
          allow_direct: true,
          deny_delete: true,
          allow_rollup_hdrs: false,
          ...wanted(settings),
        });
      } catch (err) {
        throw new Error(`cannot assert bucket ${bucket}: ${(err as Error).message}`);
      }
      if (writtenBy === "nodes" && info.config.allow_rollup_hdrs) {
        log.warn({ bucket }, "bucket takes rollup headers: a node could erase other nodes' keys");
      }
      const direct = info.config.allow_direct === true && info.config.num_replicas === 1;
      opened.set(name, await js.views.kv(bucket, { bindOnly: true, allow_direct: direct }));
    }),
  );
  return opened;
}

/**
 * Opens a live view ({@link openView}) of every bucket some function names in `access.views`,
 * all at once, and waits until each has loaded its bucket.
 */
async function openViews(nc: NatsConnection, config: Config, kvs: Map<string, KV>, functions: readonly LoadedFunction[], log: Logger) {
  const names = [...new Set(functions.flatMap((fn) => fn.definition.access?.views ?? []))];
  const views = new Map<string, LiveView>();
  try {
    await Promise.all(
      names.map(async (name) => {
        const { bucket } = config.buckets[name]!;
        const view = await openView(nc, kvs.get(name)!, bucket, readBucket(kvs.get(name)!, bucket), log);
        views.set(name, view);
        await view.loaded;
      }),
    );
  } catch (err) {
    for (const view of views.values()) view.stop();
    throw err;
  }
  return views;
}

/**
 * Opens the host: asserts the buckets, loads the live views the functions declare, then hands
 * out contexts and runs functions.
 */
export async function openHost({ nc, config, log, clock = { now: () => new Date() }, functions = [] }: HostOptions): Promise<Host> {
  const kvs = await assertBuckets(nc, config, log);
  const views = await openViews(nc, config, kvs, functions, log);
  const js = nc.jetstream();
  const records = recorder(writeBucket(kvs.get(RECORDS)!, js, recordsBucket(config.seat)), writeBucket(kvs.get(CLAIMS)!, js, claimsBucket(config.seat)));
  const runtime = Object.freeze({ lastRun: records.lastRun, refusedEvents: records.refusedEvents });
  const limits = Object.freeze({ maxPayload: nc.info?.max_payload ?? 1024 * 1024 });
  type Shared = Omit<AnyContext, "trigger">;
  const perFunction = new Map<LoadedFunction, Shared>();
  const metrics = createMetrics();

  const prepared = (fn: LoadedFunction): Shared => {
    let shared = perFunction.get(fn);
    if (shared !== undefined) return shared;
    const { access, config: schema } = fn.definition;
    const buckets: Record<string, ReadBucket | WriteBucket> = {};
    for (const name of access?.reads ?? []) buckets[name] = readOnly(fn.name, readBucket(kvs.get(name)!, config.buckets[name]!.bucket));
    for (const name of access?.writes ?? []) buckets[name] = writeBucket(kvs.get(name)!, js, config.buckets[name]!.bucket);
    const live: Record<string, ViewBucket> = {};
    for (const name of access?.views ?? []) {
      // Without a view (a host opened for one function), the server answers both ways.
      const view: ViewBucket = views.get(name) ?? { ...readBucket(kvs.get(name)!, config.buckets[name]!.bucket), local: readBucket(kvs.get(name)!, config.buckets[name]!.bucket) };
      live[name] = { ...readOnly(fn.name, view), local: readOnly(fn.name, view.local) };
    }
    const publishes = access?.publishes ?? [];
    const fnLog = log.child({ function: fn.name });
    const declared: Record<string, ReturnType<typeof declareMetric>> = {};
    for (const [name, declaration] of Object.entries(fn.definition.metrics ?? {}) as [string, MetricDeclaration<AnyContext>][]) {
      const collect = declaration.type === "gauge" ? declaration.collect : undefined;
      declared[name] = declareMetric(metrics.registry, name, declaration as MetricDeclaration<unknown>, collect && (async () => collect(context(fn, { kind: "scrape" }))), fnLog);
    }
    shared = {
      function: fn.name,
      buckets: guarded(fn.name, Object.freeze(buckets), Object.keys(config.buckets), "buckets") as AnyContext["buckets"],
      views: guarded(fn.name, Object.freeze(live), Object.keys(config.buckets), "views"),
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

  // `ctx.log` names the trigger too; the child logger is made only when a run logs.
  const context = (fn: LoadedFunction, trigger: TriggerInfo): AnyContext => {
    const shared = prepared(fn);
    let runLog: Logger | undefined;
    return {
      ...shared,
      trigger,
      get log() {
        return (runLog ??= shared.log.child({ trigger }));
      },
    };
  };
  // Every function's metrics are on `GET /metrics` from the start, before its first run.
  for (const fn of functions) prepared(fn);

  const run = async (fn: LoadedFunction, raw: unknown, trigger: TriggerInfo): Promise<Outcome> => {
    const labels = { function: fn.name, trigger: trigger.kind };
    const done = metrics.seconds.startTimer(labels);
    metrics.runs.inc(labels);
    const outcome = await runOnce(fn, raw, trigger);
    done();
    if (!outcome.ok) metrics.errors.inc({ ...labels, code: String(outcome.error.code) });
    return outcome;
  };

  // A refused request was answered; a refused event is kept nowhere but in the records.
  const refusalLevel = (trigger: TriggerInfo) => (trigger.kind === "event" ? "warn" : "info");

  const refuse = (fn: LoadedFunction, trigger: TriggerInfo, error: { code: number; message: string }): Outcome => {
    const labels = { function: fn.name, trigger: trigger.kind };
    metrics.runs.inc(labels);
    metrics.seconds.observe(labels, 0);
    metrics.errors.inc({ ...labels, code: String(error.code) });
    const message = refusalMessage(error.message);
    context(fn, trigger).log[refusalLevel(trigger)]({ code: error.code, refused: message }, "refused bad input");
    return { ok: false, error: { code: error.code, message } };
  };

  const runOnce = async (fn: LoadedFunction, raw: unknown, trigger: TriggerInfo): Promise<Outcome> => {
    const ctx = context(fn, trigger);
    const input = fn.input.safeParse(raw);
    const level = refusalLevel(trigger);
    if (!input.success) {
      const message = refusalMessage(formatIssues(input.error.issues));
      ctx.log[level]({ code: 400, refused: message }, "refused bad input");
      return { ok: false, error: { code: 400, message } };
    }
    try {
      const handler = fn.definition.handler as (input: unknown, ctx: AnyContext) => unknown;
      return { ok: true, value: await handler(input.data, ctx) };
    } catch (err) {
      if (err instanceof ServiceError) {
        const message = refusalMessage(err.message);
        ctx.log[level]({ code: err.code, refused: message }, "refused");
        return { ok: false, error: { code: err.code, message } };
      }
      // No responders (503) or no answer: the bus is electing a leader or away; no stack to read.
      const code = (err as { code?: unknown }).code;
      if (code === "503" || code === "TIMEOUT") ctx.log.warn({ err: (err as Error).message }, "handler failed: NATS did not answer");
      else ctx.log.error({ err }, "handler failed");
      return { ok: false, error: { code: 500, message: refusalMessage(`${fn.name} failed: ${(err as Error).message}`) } };
    }
  };

  const close = () => {
    for (const view of views.values()) view.stop();
  };

  return { nc, config, log, records, metrics, context, run, refuse, close };
}

/**
 * Runs one function once with the context the runtime builds (trigger `invoke`), for tests and
 * the CLI. Returns the handler's answer (a {@link JsonText} parsed); throws a {@link ServiceError}
 * with the refusal's code.
 */
export async function invoke(host: Host, fn: LoadedFunction, input: unknown = {}): Promise<unknown> {
  const outcome = await host.run(fn, input, { kind: "invoke" });
  if (!outcome.ok) throw new ServiceError(outcome.error.code, outcome.error.message);
  return outcome.value instanceof JsonText ? JSON.parse(outcome.value.text) : outcome.value;
}
