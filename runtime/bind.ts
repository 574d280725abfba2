import { Cron } from "croner";
import { Hono, type Context as HonoContext } from "hono";
import { z } from "zod";
import type { Service, ServiceMsg } from "nats";
import type { Trigger } from "./define.ts";
import { errorBody, refusalMessage } from "./errors.ts";
import type { Host, Outcome } from "./host.ts";
import { jsonOf } from "./json.ts";
import type { LoadedFunction } from "./loader.ts";

/** How long stopping waits for the requests in hand to be answered, in milliseconds. */
export const STOP_GRACE_MS = 10_000;

/** A bound trigger set; `stop` unbinds it. */
export interface Binding {
  stop(): Promise<void>;
}

type Of<K extends string> = Extract<Trigger, Record<K, unknown>>;

/** Each function paired with each of its triggers of one kind (`i`: among that kind), in load order. */
export function triggersOf<K extends "subject" | "event" | "cron" | "http">(functions: readonly LoadedFunction[], kind: K) {
  return functions.flatMap((fn) =>
    fn.definition.triggers
      .filter((t): t is Of<K> => kind in t)
      .map((trigger, i) => ({ fn, trigger, i })),
  );
}

const utf8 = new TextDecoder("utf-8", { fatal: true });
const encoder = new TextEncoder();

/** Parses a request payload: empty means `{}`; anything not JSON is a 400 outcome. */
export function parsePayload(data: Uint8Array): Outcome {
  if (data.length === 0) return { ok: true, value: {} };
  try {
    return { ok: true, value: JSON.parse(utf8.decode(data)) };
  } catch (err) {
    return { ok: false, error: { code: 400, message: `payload is not JSON: ${(err as Error).message}` } };
  }
}

/** What a run adds to its endpoint's `$SRV.STATS`. */
interface EndpointStats {
  /** A run took `ms` (the whole handler, awaits included); `error` when it was refused or failed. */
  ran(ms: number, error?: string): void;
}

/**
 * The `$SRV.STATS` of endpoint `name`, completed with what nats.js cannot see: it times only the
 * synchronous part of a handler and counts only errors thrown there, while ours answer later and
 * refuse by replying. Reaches into the counters of nats.js 2.x's service (`handlers[].stats`);
 * `undefined` when they are not there.
 */
function endpointStats(service: Service, name: string): EndpointStats | undefined {
  const handlers = (service as unknown as { handlers?: { name: string; stats?: Record<string, unknown> }[] }).handlers;
  const counters = handlers?.find((h) => h.name === name)?.stats as
    | { processing_time: number; average_processing_time: number; num_requests: number; num_errors: number; last_error?: string }
    | undefined;
  if (counters === undefined || typeof counters.processing_time !== "number" || typeof counters.num_errors !== "number") return undefined;
  return {
    ran(ms, error) {
      counters.processing_time += Math.round(ms * 1e6);
      counters.average_processing_time = Math.round(counters.processing_time / Math.max(1, counters.num_requests));
      if (error !== undefined) {
        counters.num_errors++;
        counters.last_error = error;
      }
    },
  };
}

/** A schema as JSON Schema text (what it accepts, or what it gives); what JSON Schema cannot say is left open. */
function jsonSchemaOf(schema: z.ZodType, io: "input" | "output"): string | undefined {
  try {
    return JSON.stringify(z.toJSONSchema(schema, { io, unrepresentable: "any" }));
  } catch {
    return undefined;
  }
}

/**
 * A request/reply function's metadata in the NATS service's description ($SRV.INFO): its
 * description, and the JSON Schema of its request and, when it declares `output`, of its answer.
 */
export function endpointMetadata(fn: LoadedFunction): Record<string, string> {
  const request = jsonSchemaOf(fn.input, "input");
  const response = fn.definition.output === undefined ? undefined : jsonSchemaOf(fn.definition.output, "output");
  return {
    description: fn.definition.description,
    ...(request === undefined ? {} : { request_schema: request }),
    ...(response === undefined ? {} : { response_schema: response }),
  };
}

function refuse(msg: ServiceMsg, code: number, message: string): void {
  msg.respondError(code, refusalMessage(message), encoder.encode(errorBody(code, message)));
}

/**
 * Binds every `{ subject }` trigger as an endpoint of one NATS service named after the seat,
 * in the queue group of the seat, so replicas share requests. Answers are the handler's value
 * as JSON; refusals carry `Nats-Service-Error-Code`/`Nats-Service-Error` and a JSON body.
 * Stopping takes no new request and answers those in hand, for at most `graceMs` (default
 * {@link STOP_GRACE_MS}).
 */
export async function bindSubjects(
  host: Host,
  functions: readonly LoadedFunction[],
  version: string,
  graceMs = STOP_GRACE_MS,
): Promise<Binding> {
  const endpoints = triggersOf(functions, "subject");
  if (endpoints.length === 0) return { stop: async () => {} };
  const service: Service = await host.nc.services.add({
    name: host.config.seat,
    version,
    queue: host.config.seat,
  });
  const inFlight = new Set<Promise<void>>();
  for (const { fn, trigger, i } of endpoints) {
    const name = i === 0 ? fn.name : `${fn.name}-${i + 1}`;
    let stats: EndpointStats | undefined;
    const answer = async (msg: ServiceMsg) => {
      const began = performance.now();
      const payload = parsePayload(msg.data);
      const trigger = { kind: "subject", subject: msg.subject } as const;
      const outcome = payload.ok ? await host.run(fn, payload.value, trigger) : host.refuse(fn, trigger, payload.error);
      stats?.ran(performance.now() - began, outcome.ok ? undefined : outcome.error.message);
      if (!outcome.ok) return refuse(msg, outcome.error.code, outcome.error.message);
      const body = encoder.encode(jsonOf(outcome.value));
      try {
        msg.respond(body);
      } catch (err) {
        host.log.error({ function: fn.name, subject: msg.subject, err }, "answer not sent");
        refuse(msg, 500, `the answer (${body.length} bytes) could not be sent: ${(err as Error).message}`);
      }
    };
    service.addEndpoint(name, {
      subject: trigger.subject,
      metadata: endpointMetadata(fn),
      handler: (err, msg) => {
        if (err) return host.log.error({ function: fn.name, err }, "endpoint stopped");
        // An answer goes to an inbox only: a reply subject such as `$KV.<bucket>.<key>` would
        // have the seat write, with its own rights, what the requester may not.
        if (!msg.reply?.startsWith("_INBOX.")) {
          return host.log.warn({ function: fn.name, subject: msg.subject, reply: msg.reply?.slice(0, 200) }, "request not answered: its reply subject is not an inbox");
        }
        const answering: Promise<void> = answer(msg)
          .catch((e: unknown) => host.log.error({ function: fn.name, err: e }, "request not answered"))
          .finally(() => inFlight.delete(answering));
        inFlight.add(answering);
      },
    });
    stats = endpointStats(service, name);
    if (stats === undefined) host.log.warn({ endpoint: name }, "$SRV.STATS will count only what nats.js sees of this endpoint");
  }
  return {
    // No new requests; those in hand are answered, for at most graceMs.
    stop: async () => {
      await service.stop();
      let timer: NodeJS.Timeout | undefined;
      const grace = new Promise((resolve) => (timer = setTimeout(resolve, graceMs)));
      await Promise.race([Promise.allSettled(inFlight), grace]);
      clearTimeout(timer);
      if (inFlight.size > 0) host.log.warn({ unanswered: inFlight.size }, "stopped with requests still in hand");
    },
  };
}

/**
 * Runs every `{ cron, onStart: true }` function once now (in order, awaited), then schedules
 * every `{ cron }` trigger with croner. Each scheduled time runs once across all replicas: the
 * replica that claims it first (the runtime's claims bucket) runs it; a claim that cannot be
 * made skips the run. A run still going when the next is due skips that one. A successful run
 * is recorded (`ctx.runtime.lastRun`). Returns the functions whose run at start failed.
 */
export async function bindCron(host: Host, functions: readonly LoadedFunction[]): Promise<Binding & { failedAtStart: string[] }> {
  const triggers = triggersOf(functions, "cron");
  const failedAtStart: string[] = [];
  for (const { fn, trigger } of triggers) {
    if (!trigger.onStart) continue;
    const outcome = await host.run(fn, {}, { kind: "start" });
    if (!outcome.ok) failedAtStart.push(fn.name);
    await report(host, fn, "start", outcome);
  }
  const jobs = triggers.map(
    ({ fn, trigger }) =>
      new Cron(trigger.cron, { protect: true }, async () => {
        // Schedules are whole seconds: the nearest one names this run the same on every replica.
        const scheduledAt = new Date(Math.round(Date.now() / 1000) * 1000);
        const claimed = await host.records.claim(fn.name, scheduledAt).catch((err: unknown) => {
          host.log.warn({ function: fn.name, scheduledAt, err }, "scheduled run not claimed; skipped");
          return false;
        });
        if (!claimed) return;
        const outcome = await host.run(fn, {}, { kind: "cron", cron: trigger.cron, scheduledAt });
        // A function that failed at start and has now run is no longer a reason to be not ready.
        if (outcome.ok && failedAtStart.includes(fn.name)) failedAtStart.splice(failedAtStart.indexOf(fn.name), 1);
        await report(host, fn, "cron", outcome);
      }),
  );
  return { failedAtStart, stop: async () => jobs.forEach((job) => job.stop()) };
}

async function report(host: Host, fn: LoadedFunction, trigger: "cron" | "start", outcome: Outcome): Promise<void> {
  if (!outcome.ok) return;
  host.log.debug({ function: fn.name, trigger: { kind: trigger }, result: outcome.value }, "scheduled run done");
  await host.records
    .ran(fn.name, { at: new Date(), trigger })
    .catch((err: unknown) => host.log.warn({ function: fn.name, err }, "scheduled run not recorded"));
}

/** Reads an HTTP request's input: the query of a GET or DELETE, the JSON body otherwise. */
async function httpInput(c: HonoContext): Promise<Outcome> {
  if (c.req.method === "GET" || c.req.method === "DELETE") {
    const queries = c.req.queries();
    return {
      ok: true,
      value: Object.fromEntries(Object.entries(queries).map(([k, v]) => [k, v.length === 1 ? v[0] : v])),
    };
  }
  return parsePayload(new Uint8Array(await c.req.arrayBuffer()));
}

/** What `GET /healthz` and `GET /readyz` say is wrong: nothing (an empty list) when all is well. */
export interface Probes {
  /** Why the process cannot go on serving, and should be restarted. */
  live(): string[];
  /** Why the set cannot serve yet, or for now. */
  ready(): string[];
}

/**
 * One Hono app with a route per `{ http: "METHOD /path" }` trigger. Answers are JSON; a refusal
 * has the status of its code and the body of SPEC §4; an unknown route is a JSON 404. Besides,
 * `GET /healthz` answers 200 `{ ok: true }`, or 503 `{ ok: false, reasons }` with what
 * `probes.live` says; `GET /readyz` 200 `{ ready: true }`, or 503 `{ ready: false, reasons }`
 * with what `probes.ready` says is missing; and `GET /metrics`
 * the runtime's metrics in Prometheus's text format.
 */
export function httpApp(host: Host, functions: readonly LoadedFunction[], probes: Probes = { live: () => [], ready: () => [] }): Hono {
  const app = new Hono();
  // The runtime's own: the process is up; the set is ready, or why not.
  app.get("/healthz", (c) => {
    const dead = probes.live();
    return dead.length === 0 ? c.json({ ok: true }) : c.json({ ok: false, reasons: dead }, 503);
  });
  app.get("/metrics", async (c) => c.body(await host.metrics.registry.metrics(), 200, { "content-type": host.metrics.registry.contentType }));
  app.get("/readyz", (c) => {
    const notReady = probes.ready();
    return notReady.length === 0 ? c.json({ ready: true }) : c.json({ ready: false, reasons: notReady }, 503);
  });
  for (const { fn, trigger } of triggersOf(functions, "http")) {
    const [method, path] = trigger.http.split(" ") as [string, string];
    app.on(method, path, async (c) => {
      const input = await httpInput(c);
      const trigger = { kind: "http", method, path } as const;
      const outcome = input.ok ? await host.run(fn, input.value, trigger) : host.refuse(fn, trigger, input.error);
      if (outcome.ok) return c.body(jsonOf(outcome.value), 200, { "content-type": "application/json" });
      return c.body(errorBody(outcome.error.code, outcome.error.message), outcome.error.code as 400, {
        "content-type": "application/json",
      });
    });
  }
  // What escapes a route (a client gone mid-request): a log line, not Hono's console output.
  app.onError((err, c) => {
    host.log.warn({ method: c.req.method, path: c.req.path, err: err.message }, "HTTP request not answered");
    return c.body(errorBody(500, `the request could not be read: ${err.message}`), 500, { "content-type": "application/json" });
  });
  app.notFound((c) =>
    c.body(errorBody(404, `no function at ${c.req.method} ${c.req.path}`), 404, { "content-type": "application/json" }),
  );
  return app;
}
