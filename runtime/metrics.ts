import { Counter, Gauge, Histogram, Registry } from "prom-client";

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

/** A new set of the runtime's metrics. */
export function createMetrics(): Metrics {
  const registry = new Registry();
  const registers = [registry];
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
    refused: new Counter({ name: "events_refused_total", help: "Events refused and acknowledged, by function", labelNames: ["function"] as const, registers }),
    connected: new Gauge({ name: "nats_connected", help: "1 while the NATS connection is up", registers }),
    reconnects: new Counter({ name: "nats_reconnects_total", help: "NATS reconnections since start", registers }),
  };
}
