/**
 * Running one function once, from its raw input: the payload parsed (empty is `{}`, not JSON a
 * 400), the input schema, the handler, its error said as a code (a `ServiceError` keeps its own,
 * NATS not answering a 503, anything else a 500), the log line at the refusal's level, the run's metrics, and the
 * runtime's records: a scheduled run's success, an event's refusal. No binding does any of this
 * itself (docs/runtime.md §6.2.1).
 */
import type { NatsConnection } from "nats";
import type { Logger } from "pino";
import { z } from "zod";
import type { Config } from "./config.ts";
import { contexts } from "./context.ts";
import type { AnyContext, LoadedFunction, TriggerInfo } from "./define.ts";
import { formatIssues, refusalMessage, ServiceError, thrownText } from "./errors.ts";
import { HtmlText, JsonText, jsonOf, WithStatus } from "./json.ts";
import { createMetrics, type Metrics } from "./metrics.ts";
import type { Delivered, Recorder } from "./records.ts";
import { openStorage } from "./storage.ts";
import { watchCapacity } from "./capacity.ts";
import { serverClock } from "./server-clock.ts";
import type { Clock, Outcome, RawInput, Refusal, StoreUse, StreamUse } from "./types.ts";

/** Runs the functions of a set on one connection, with their storage, metrics and records. */
export interface Runner {
  readonly nc: NatsConnection;
  readonly config: Config;
  readonly log: Logger;
  /** The runtime's records (docs/runtime.md §6.2.1): scheduled runs, refused events, claims. */
  readonly records: Recorder;
  /** The runtime's Prometheus metrics and the functions' own. */
  readonly metrics: Metrics;
  /** The clock functions read: the server's (docs/runtime.md §6.15) unless one was given. */
  readonly clock: Clock;
  /** The `ctx` a function gets for one run: only what it declared. */
  context(fn: LoadedFunction, trigger: TriggerInfo): AnyContext;
  /**
   * Runs `fn` once from `input` (payload bytes, or a value already read). An answer given as
   * `WithStatus` is its value with its `status` beside it. Never throws: bad
   * input is a 400, a `ServiceError` keeps its code, NATS not answering (no responders, a timeout) a 503, anything else is logged and a 500. A refused
   * event is counted (`events_refused_total`, the records); when it cannot be counted the outcome
   * is a 500, so it comes again. A scheduled run (`cron`, `start`) that succeeded is recorded.
   */
  run(fn: LoadedFunction, input: RawInput, trigger: TriggerInfo): Promise<Outcome>;
  /** Asserts the buckets again, creating what the server lost (docs/buckets.md §2.4). */
  reassert(): Promise<void>;
  /** Calls `listener` each time buckets were made again (found deleted behind the set, or lost by the server). */
  onMadeAgain(listener: () => void): void;
  /** Why the runner cannot serve as it should now: views loading their bucket again, JetStream refusing writes or not answering them. */
  notReady(): string[];
  /** The set is stopping: buckets found gone are no longer made again; requests in hand are still answered. */
  stopping(): void;
  /** Stops the live views. */
  close(): void;
}

export interface RunnerOptions {
  readonly nc: NatsConnection;
  readonly config: Config;
  readonly log: Logger;
  /** The clock functions read; the server's ({@link serverClock}, docs/runtime.md §6.15) when absent. */
  readonly clock?: Clock;
  /** The functions whose `access.views` are kept live and whose metrics are declared; none when absent. */
  readonly functions?: readonly LoadedFunction[];
  /** Why NATS cannot be reached now; the views' server reads refuse with a 503 meanwhile (context.ts). */
  readonly unreachable?: () => string | undefined;
  /** The config's streams the triggers use, as the server last said (the event kind's binding reads them). */
  readonly streams?: () => Readonly<Record<string, StreamUse>>;
}

const utf8 = new TextDecoder("utf-8", { fatal: true });

/** A payload's JSON value: empty means `{}`; anything not JSON is a 400. */
function parsePayload(input: RawInput): { ok: true; value: unknown } | { ok: false; error: Refusal } {
  if (!("data" in input)) return { ok: true, value: input.value };
  if (input.data.length === 0) return { ok: true, value: {} };
  try {
    return { ok: true, value: JSON.parse(utf8.decode(input.data)) };
  } catch (err) {
    return { ok: false, error: { code: 400, message: `payload is not JSON: ${(err as Error).message}` } };
  }
}

/** Where a refused event came from, for the records to count it once: with a stream only. */
const deliveredOf = (trigger: Extract<TriggerInfo, { kind: "event" }>): Delivered | undefined =>
  trigger.stream === undefined || trigger.sequence === undefined
    ? undefined
    : { stream: trigger.stream, created: trigger.streamCreated ?? "", sequence: trigger.sequence, ackFloor: trigger.ackFloor ?? 0 };

/** A refused request was answered; a refused event is kept nowhere but in the records. */
const refusalLevel = (trigger: TriggerInfo) => (trigger.kind === "event" ? "warn" : "info");

/** The kinds of run whose answer someone receives: a reply, an HTTP body, `invoke`'s value. */
const ANSWERED: ReadonlySet<TriggerInfo["kind"]> = new Set(["subject", "http", "invoke"]);

/**
 * Opens the runner: asserts the buckets and loads the live views the functions declare
 * (docs/buckets.md §2.4), declares every function's metrics (so they are on `GET /metrics`
 * before a first run), then runs functions. Throws when a bucket or view cannot be opened.
 */
export async function openRunner({
  nc,
  config,
  log,
  clock: given,
  functions = [],
  unreachable = () => undefined,
  streams = () => ({}),
}: RunnerOptions): Promise<Runner> {
  const storage = await openStorage(
    nc,
    config,
    log,
    functions.flatMap((fn) => fn.definition.access?.views ?? []),
    functions.filter((fn) => fn.triggers.some((t) => "event" in t)).map((fn) => fn.name),
  );
  const { records } = storage;
  const serverTime = given === undefined ? serverClock(storage.clockSample, log) : undefined;
  await serverTime?.measure();
  const clock = given ?? serverTime!;
  const capacity = watchCapacity(nc, config, log, () => unreachable() !== undefined);
  const store = (): StoreUse => ({ ...capacity.state(), streams: streams() });
  const metrics = createMetrics(store);
  const { of: context, prepare } = contexts({
    nc,
    config,
    log,
    clock,
    storage,
    metrics,
    store,
    // JetStream that does not answer a write is not waited for either.
    unreachable: () => unreachable() ?? capacity.unanswered(),
  });
  for (const fn of functions) {
    prepare(fn);
    // Counted from 0, so the series is on `GET /metrics` before any refusal.
    if (fn.triggers.some((t) => "event" in t)) metrics.refused.inc({ function: fn.name }, 0);
  }

  const handled = async (fn: LoadedFunction, input: RawInput, ctx: AnyContext): Promise<Outcome> => {
    const level = refusalLevel(ctx.trigger);
    const refused = (error: Refusal, said = "refused bad input"): Outcome => {
      const message = refusalMessage(error.message);
      ctx.log[level]({ code: error.code, refused: message }, said);
      return { ok: false, error: { code: error.code, message } };
    };
    const payload = parsePayload(input);
    if (!payload.ok) return refused(payload.error);
    const parsed = z.safeParse(fn.input, payload.value);
    if (!parsed.success) return refused({ code: 400, message: formatIssues(parsed.error.issues) });
    let value: unknown;
    try {
      const handler = fn.definition.handler as (input: unknown, ctx: AnyContext) => unknown;
      value = await handler(parsed.data, ctx);
    } catch (err) {
      if (err instanceof ServiceError) return refused(err, "refused");
      // No responders (503) or no answer: the bus is electing a leader or away; no stack to read.
      const code = err !== null && typeof err === "object" ? (err as { code?: unknown }).code : undefined;
      if (code === "503" || code === "TIMEOUT") {
        ctx.log.warn({ err: (err as Error).message }, "handler failed: NATS did not answer");
        const why = code === "TIMEOUT" ? "no answer in time" : "no responders: JetStream off, or a leader being elected";
        return { ok: false, error: { code: 503, message: refusalMessage(`${fn.name}: NATS did not answer (${why}); ask again`) } };
      }
      ctx.log.error({ err }, "handler failed");
      return { ok: false, error: { code: 500, message: refusalMessage(`${fn.name} failed: ${thrownText(err)}`) } };
    }
    const { answer, status } = value instanceof WithStatus ? { answer: value.value, status: value.status } : { answer: value };
    // What a requester receives is written as JSON here, once: an answer that is no JSON value is
    // the run's fault, said to it. A text the handler wrote is sent as it is.
    if (!ANSWERED.has(ctx.trigger.kind) || answer instanceof JsonText || answer instanceof HtmlText)
      return { ok: true, value: answer, status };
    let text: string;
    try {
      text = jsonOf(answer);
    } catch (err) {
      ctx.log.error({ err }, "answer is no JSON value");
      return {
        ok: false,
        error: { code: 500, message: refusalMessage(`${fn.name} failed: its answer is no JSON value: ${thrownText(err)}`) },
      };
    }
    return { ok: true, value: answer, status, text };
  };

  /** What the records keep of a run: a scheduled run that succeeded, an event refused. */
  const recorded = async (fn: LoadedFunction, trigger: TriggerInfo, outcome: Outcome): Promise<Outcome> => {
    if (outcome.ok && (trigger.kind === "cron" || trigger.kind === "start")) {
      log.debug({ function: fn.name, trigger: { kind: trigger.kind }, result: outcome.value }, "scheduled run done");
      await records
        .ran(fn.name, { at: clock.now(), trigger: trigger.kind })
        .catch((err: unknown) => log.warn({ function: fn.name, err }, "scheduled run not recorded"));
    }
    if (!outcome.ok && outcome.error.code < 500 && trigger.kind === "event") {
      metrics.refused.inc({ function: fn.name });
      try {
        const forgotten = await records.refused(
          fn.name,
          { subject: trigger.subject, reason: outcome.error.message, at: clock.now().toISOString() },
          deliveredOf(trigger),
        );
        if (forgotten > 0)
          log.warn(
            { function: fn.name, stream: trigger.stream, forgotten },
            "the refused events' record is full: its oldest counted sequences are forgotten, and counted again if delivered again",
          );
      } catch (err) {
        log.error({ function: fn.name, err }, "refused event not counted; it will be delivered again");
        return { ok: false, error: { code: 500, message: refusalMessage(`the refusal could not be counted: ${(err as Error).message}`) } };
      }
    }
    return outcome;
  };

  const run = async (fn: LoadedFunction, input: RawInput, trigger: TriggerInfo): Promise<Outcome> => {
    const labels = { function: fn.name, trigger: trigger.kind };
    const done = metrics.seconds.startTimer(labels);
    metrics.runs.inc(labels);
    const outcome = await handled(fn, input, context(fn, trigger));
    done();
    if (!outcome.ok) metrics.errors.inc({ ...labels, code: String(outcome.error.code) });
    return recorded(fn, trigger, outcome);
  };

  return {
    nc,
    config,
    log,
    records,
    metrics,
    clock,
    context,
    run,
    reassert: async () => {
      await storage.reassert();
      await capacity.probe();
    },
    onMadeAgain: (listener) => storage.onMadeAgain(listener),
    notReady: () => [...storage.notReady(), ...capacity.notReady()],
    stopping: () => storage.stopping(),
    close: () => {
      serverTime?.stop();
      capacity.stop();
      storage.close();
    },
  };
}

/**
 * Runs one function once with the context the runtime builds (trigger `invoke`), for tests and
 * the CLI. Returns the handler's answer (a {@link JsonText} parsed, an {@link HtmlText} as its text); throws a `ServiceError`
 * with the refusal's code.
 */
export async function invoke(runner: Runner, fn: LoadedFunction, input: unknown = {}): Promise<unknown> {
  const outcome = await runner.run(fn, { value: input }, { kind: "invoke" });
  if (!outcome.ok) throw new ServiceError(outcome.error.code, outcome.error.message);
  if (outcome.value instanceof HtmlText) return outcome.value.text;
  return outcome.value instanceof JsonText ? JSON.parse(outcome.value.text) : outcome.value;
}
