/**
 * The runtime's Prometheus metrics (runs, errors and durations by function and trigger, refused
 * events, the NATS connection) and the metrics functions declare, in one registry served on
 * `GET /metrics` (docs/runtime.md §6.3.5).
 */
import { createRequire } from "node:module";
import type { Counter, Gauge, Histogram, Registry } from "prom-client";
import type { Logger } from "pino";
import type { CounterMetric, GaugeMetric, Labels, MetricDeclaration, StoreUse } from "./types.ts";
import { thrownText } from "./errors.ts";

/**
 * prom-client, loaded when the first registry is made: a command line call that makes none
 * never loads it (docs/scale.md §11.2.3). A CommonJS package: the same module as an import of it.
 */
let promClient: typeof import("prom-client") | undefined;
const prom = () => (promClient ??= createRequire(import.meta.url)("prom-client") as typeof import("prom-client"));

/** The runtime's Prometheus metrics, in a registry of their own (served on `GET /metrics`). */
export interface Metrics {
  readonly registry: Registry;
  /** `function_runs_total{function, trigger}`: runs, whatever their outcome. */
  readonly runs: Counter<"function" | "trigger">;
  /** `function_run_errors_total{function, trigger, code}`: refusals (4xx) and faults (5xx). */
  readonly errors: Counter<"function" | "trigger" | "code">;
  /** `function_run_seconds{function, trigger}`: how long runs took, refused ones included. */
  readonly seconds: Histogram<"function" | "trigger">;
  /** `events_refused_total{function}`: events refused and acknowledged (not JSON, or refused by the function). */
  readonly refused: Counter<"function">;
  /** `nats_connected`: 1 while the connection is up, 0 while it reconnects. */
  readonly connected: Gauge;
  /** `nats_reconnects_total`: reconnections since start. */
  readonly reconnects: Counter;
}

/** The names of the runtime's own metrics; a function's metric may not take one, nor extend one with `_`. */
export const RUNTIME_METRICS = [
  "function_runs_total",
  "function_run_errors_total",
  "function_run_seconds",
  "events_refused_total",
  "nats_connected",
  "nats_reconnects_total",
  "jetstream_storing",
  "jetstream_account_storage_bytes",
  "jetstream_account_max_storage_bytes",
  "stream_bytes",
  "stream_max_bytes",
  "stream_messages",
  "consumer_pending_messages",
  "consumer_unacknowledged_messages",
] as const;

/** Whether a function's metric name is, or would be read as, one of {@link RUNTIME_METRICS}. */
export function isRuntimeMetric(name: string): boolean {
  return RUNTIME_METRICS.some((own) => name === own || name.startsWith(`${own}_`));
}

/** Milliseconds a gauge's `collect` may take at a scrape; after that the gauge keeps its value. */
export const COLLECT_MS = 2000;

/**
 * Registers one metric a function declared in `registry` and returns its handle. A gauge's
 * `collect` runs at each scrape; when it throws, returns no finite number or takes longer than
 * {@link COLLECT_MS}, the gauge keeps its value and `log` gets a warning naming the metric.
 * Throws when the name is taken; the handles throw on a value that is not a finite number (or a
 * negative one, for a counter).
 */
export function declareMetric(
  registry: Registry,
  name: string,
  declaration: MetricDeclaration<unknown>,
  collect: (() => Promise<unknown>) | undefined,
  log: Logger,
): CounterMetric | GaugeMetric {
  const { Counter, Gauge } = prom();
  const common = { name, help: declaration.help, labelNames: [...(declaration.labels ?? [])], registers: [registry] };
  const finite = (op: string, value: number, min = -Infinity) => {
    if (typeof value !== "number" || !Number.isFinite(value) || value < min) {
      throw new Error(`metric ${name}: ${op} takes a finite number${min === 0 ? " ≥ 0" : ""}, not ${String(value)}`);
    }
    return value;
  };
  if (declaration.type === "counter") {
    const counter = new Counter(common);
    return { inc: (value = 1, labels = {}) => counter.inc(labels as never, finite("inc", value, 0)) };
  }
  const gauge: Gauge = new Gauge({
    ...common,
    ...(collect === undefined
      ? {}
      : {
          collect: async () => {
            let timer: NodeJS.Timeout | undefined;
            try {
              const late = new Promise<never>((_, reject) => {
                timer = setTimeout(() => reject(new Error(`collect gave no value within ${COLLECT_MS} ms`)), COLLECT_MS);
              });
              const value = await Promise.race([collect(), late]);
              if (Array.isArray(value)) {
                // Samples by labels: the gauge is exactly these.
                const samples = value as { labels?: unknown; value?: unknown }[];
                const bad = samples.find((s) => typeof s?.value !== "number" || !Number.isFinite(s.value) || typeof s.labels !== "object");
                if (bad !== undefined) throw new Error(`collect returned a sample that is not { labels, value }: ${JSON.stringify(bad)}`);
                gauge.reset();
                for (const sample of samples) gauge.set(sample.labels as never, sample.value as number);
                return;
              }
              if (typeof value !== "number" || !Number.isFinite(value)) throw new Error(`collect returned ${String(value)}, not a number`);
              gauge.set(value);
            } catch (err) {
              log.warn({ metric: name, err: thrownText(err) }, "metric not collected; it keeps its last value");
            } finally {
              clearTimeout(timer);
            }
          },
        }),
  });
  const labelled = (labels: Labels | undefined) => (labels ?? {}) as never;
  return {
    set: (value, labels) => gauge.set(labelled(labels), finite("set", value)),
    inc: (value = 1, labels) => gauge.inc(labelled(labels), finite("inc", value)),
    dec: (value = 1, labels) => gauge.dec(labelled(labels), finite("dec", value)),
  };
}

/**
 * Gauges of what JetStream stores for the set (docs/runtime.md §6.11), read from `store()` at
 * each scrape: whether it stores, the account's storage and limit, each stream's bytes, limit and
 * messages, each durable's pending and unacknowledged messages.
 */
function storeGauges(registry: Registry, store: () => StoreUse): void {
  const { Gauge } = prom();
  const registers = [registry];
  const each = (name: string, help: string, labelNames: string[], values: (use: StoreUse) => [Labels, number][]) =>
    new Gauge({
      name,
      help,
      labelNames,
      registers,
      collect() {
        this.reset();
        for (const [labels, value] of values(store())) this.set(labels as never, value);
      },
    });
  // Gauges without labels always have a sample: each says what stands for "not known".
  each("jetstream_storing", "1 while JetStream stores the set's writes, 0 while it refuses them or does not answer", [], (use) => [
    [{}, use.refusing === null ? 1 : 0],
  ]);
  each("jetstream_account_storage_bytes", "Bytes of JetStream file storage the seat's account uses (-1 before it is known)", [], (use) => [
    [{}, use.account?.bytes ?? -1],
  ]);
  each(
    "jetstream_account_max_storage_bytes",
    "The seat's account's own JetStream file storage limit (-1: none, the server's applies)",
    [],
    (use) => [[{}, use.account?.maxBytes ?? -1]],
  );
  const streams = (use: StoreUse) => Object.values(use.streams);
  each("stream_bytes", "Bytes a stream the triggers use holds", ["stream"], (use) =>
    streams(use).map((s) => [{ stream: s.stream }, s.bytes]),
  );
  each("stream_max_bytes", "A stream's limit in bytes (the oldest messages go beyond it)", ["stream"], (use) =>
    streams(use).flatMap((s) => (s.maxBytes === null ? [] : [[{ stream: s.stream }, s.maxBytes] as [Labels, number]])),
  );
  each("stream_messages", "Messages a stream the triggers use holds", ["stream"], (use) =>
    streams(use).map((s) => [{ stream: s.stream }, s.messages]),
  );
  const durables = (use: StoreUse, pick: (c: StoreUse["streams"][string]["consumers"][number]) => number): [Labels, number][] =>
    streams(use).flatMap((s) => s.consumers.map((c) => [{ stream: s.stream, durable: c.durable }, pick(c)] as [Labels, number]));
  each("consumer_pending_messages", "Messages of a stream not delivered yet to its durable consumer", ["stream", "durable"], (use) =>
    durables(use, (c) => c.pending),
  );
  each(
    "consumer_unacknowledged_messages",
    "Messages delivered to a replica and not acknowledged yet (a replica that stopped holds them for the ack wait)",
    ["stream", "durable"],
    (use) => durables(use, (c) => c.unacknowledged),
  );
}

/** A new set of the runtime's metrics; with `store`, the gauges of what JetStream stores. */
export function createMetrics(store?: () => StoreUse): Metrics {
  const { Counter, Gauge, Histogram, Registry } = prom();
  const registry = new Registry();
  const registers = [registry];
  if (store !== undefined) storeGauges(registry, store);
  const fnLabels = ["function", "trigger"] as const;
  return {
    registry,
    runs: new Counter({ name: "function_runs_total", help: "Runs of a function, by trigger", labelNames: fnLabels, registers }),
    errors: new Counter({
      name: "function_run_errors_total",
      help: "Runs of a function that refused (4xx) or failed (5xx), by trigger and code",
      labelNames: [...fnLabels, "code"] as const,
      registers,
    }),
    seconds: new Histogram({ name: "function_run_seconds", help: "How long runs of a function took", labelNames: fnLabels, registers }),
    refused: new Counter({
      name: "events_refused_total",
      help: "Events refused and acknowledged, by function",
      labelNames: ["function"] as const,
      registers,
    }),
    connected: new Gauge({ name: "nats_connected", help: "1 while the NATS connection is up", registers }),
    reconnects: new Counter({ name: "nats_reconnects_total", help: "NATS reconnections since start", registers }),
  };
}
