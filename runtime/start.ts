/**
 * Starting the whole set: load and check the function files, open the bus (with the derived
 * users when it is the embedded server), open the runner, bind every trigger kind in the order
 * of the list of kinds, and say readiness and health from then on; stopping undoes it all within
 * the grace (docs/runtime.md §6).
 */
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import type { Logger } from "pino";
import { ConfigError, type Config } from "./config.ts";
import { thrownText } from "./errors.ts";
import type { LoadedFunction } from "./define.ts";
import { loadFunctions } from "./loader.ts";
import { createLogger } from "./log.ts";
import type { Metrics } from "./metrics.ts";
import { authorization } from "./permissions.ts";
import { openRunner, type Runner } from "./runner.ts";
import { openSession, withoutPassword, type Session } from "./session.ts";
import { KINDS, kindOf } from "./triggers/index.ts";
import { targetsOf, type BindEnv, type Binding } from "./triggers/kind.ts";
import type { Clock } from "./types.ts";

/** How long a round trip to the server may take before the set says NATS does not answer, in milliseconds. */
const ROUND_TRIP_MS = 2000;

/** How long stopping waits for the requests in hand to be answered, in milliseconds. */
export const STOP_GRACE_MS = 10_000;

export interface StartOptions {
  readonly config: Config;
  readonly log?: Logger;
  readonly clock?: Clock;
  /** The embedded server's `max_payload` in bytes, when one is started. */
  readonly maxPayload?: number;
  /** How long stop waits for requests in hand (NATS and HTTP), in milliseconds; {@link STOP_GRACE_MS} by default. */
  readonly stopGraceMs?: number;
}

/** A running function set. */
export interface Running {
  readonly natsUrl: string;
  readonly httpUrl: string;
  /** True when this process started the embedded nats-server. */
  readonly embedded: boolean;
  readonly functions: readonly LoadedFunction[];
  readonly runner: Runner;
  /** Milliseconds from the call of {@link start} until every trigger was bound and the views loaded. */
  readonly readyMs: number;
  /** Unbinds every trigger, closes HTTP, drains the connection and stops the embedded server. */
  stop(): Promise<void>;
}

/**
 * The NATS service's version and description (docs/runtime.md §6.3.1): those of the
 * `package.json` beside the config; `0.0.0`, and a sentence naming the seat, when it has none.
 */
function serviceOf(config: Config): { readonly version: string; readonly description: string } {
  const file = join(config.root, "package.json");
  const pkg = existsSync(file) ? (JSON.parse(readFileSync(file, "utf8")) as { version?: string; description?: string }) : {};
  return { version: pkg.version ?? "0.0.0", description: pkg.description || `The function set of the seat ${config.seat}.` };
}

/**
 * Starts the function set of `config` (docs/runtime.md §6): refuses, with a `ConfigError` and
 * before opening anything, what a trigger kind's `checkStart` refuses (HTTP on a host that is
 * not loopback without a token); loads and checks every function file, opens the bus (the
 * configured servers, or the embedded server with the users
 * {@link authorization} derives for the config's embedded nodes and providers), asserts the
 * buckets and streams, binds every trigger kind and runs what each does once all are bound (the
 * `onStart` functions). Throws, having released what it opened, when any step fails; the error
 * says which.
 */
export async function start(options: StartOptions): Promise<Running> {
  const began = performance.now();
  const { config, stopGraceMs: graceMs = STOP_GRACE_MS } = options;
  const log = options.log ?? createLogger();
  // What no trigger may start with (HTTP open to the network without a token): before anything opens.
  const refused = KINDS.flatMap((kind) => kind.checkStart?.(config) ?? []);
  if (refused.length > 0) throw new ConfigError(refused.join("; "));
  const functions = await loadFunctions(config);
  const session: Session = await openSession(config, {
    embedded: "start",
    maxPayload: options.maxPayload,
    users: authorization(config, functions, config.embedded),
  });
  const bindings: Binding[] = [];
  let runner: Runner | undefined;
  let stopping: Promise<void> | undefined;
  const stop = () =>
    (stopping ??= (async () => {
      log.info("stopping");
      clearInterval(roundTrips);
      runner?.stopping();
      // Requests in hand, over NATS and HTTP, are answered for at most the grace.
      await Promise.all(bindings.map((binding) => binding.stop()));
      runner?.close();
      await session.close();
      log.info("stopped");
    })());
  // What `GET /readyz` says is missing (empty: ready).
  let bound = false;
  // Why the connection is gone for good, when it closed without a stop (`GET /healthz` says it).
  let lost: string | undefined;
  let connected = true;
  // After a reconnect: what the server may have lost (it came back with an empty store) is
  // asserted again, buckets, streams and durables, never emptying anything; until then not ready.
  let reasserting: Promise<void> | undefined;
  let reassertFailed: string | undefined;
  const reassert = () =>
    (reasserting ??= (async () => {
      for (;;) {
        if (stopping || runner === undefined) break;
        try {
          await runner.reassert();
          for (const binding of bindings) await binding.reconnected?.();
          reassertFailed = undefined;
          break;
        } catch (err) {
          // Said once at warn while it lasts; every 2 s at debug.
          const first = reassertFailed === undefined;
          reassertFailed = (err as Error).message;
          log[first ? "warn" : "debug"](
            { err: reassertFailed },
            "buckets and streams not asserted again after the reconnect; trying again in 2 s",
          );
          await new Promise((r) => setTimeout(r, 2000));
        }
      }
    })().finally(() => (reasserting = undefined)));
  // A server that holds the connection but answers nothing (hung, stopped): the round trip the set
  // depends on, timed every second.
  let unanswered: string | undefined;
  const roundTrips = setInterval(() => {
    if (stopping || !connected || lost !== undefined) return;
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<"late">((resolve) => (timer = setTimeout(resolve, ROUND_TRIP_MS, "late")));
    void Promise.race([session.nc.flush().then(() => "answered" as const), late])
      .then((result) => {
        if (result === "late") {
          if (unanswered === undefined) log.warn({ ms: ROUND_TRIP_MS }, "NATS does not answer a round trip");
          unanswered = `NATS does not answer: no round trip within ${ROUND_TRIP_MS / 1000} s`;
        } else if (unanswered !== undefined) {
          unanswered = undefined;
          log.info("NATS answers again");
        }
      })
      .catch(() => {})
      .finally(() => clearTimeout(timer));
  }, 1000);
  roundTrips.unref();
  /** Why NATS cannot be reached now: the connection closed, away, or not answering; none while it answers. */
  const unreachable = () => lost ?? (connected ? unanswered : "NATS is unreachable: the set is reconnecting");
  // Subscriptions the server refused: their triggers take nothing until the seat may subscribe.
  const refusedSubscriptions = new Set<string>();
  const readiness = () => [
    ...(stopping ? ["stopping"] : bound ? [] : ["starting: not every trigger is bound yet"]),
    ...(lost !== undefined ? [lost] : connected ? (unanswered === undefined ? [] : [unanswered]) : ["not connected to NATS: reconnecting"]),
    ...(reasserting === undefined
      ? []
      : [`reconnected: asserting the buckets and streams again${reassertFailed ? ` (${reassertFailed})` : ""}`]),
    ...(runner?.notReady() ?? []),
    ...bindings.flatMap((binding) => binding.notReady?.() ?? []),
    ...[...refusedSubscriptions].map(
      (subject) => `the server refuses the seat the subscription to ${subject}: grant what \`mesh-provisioner permissions\` prints`,
    ),
  ];
  const watchConnection = (metrics: Metrics) => {
    metrics.connected.set(1);
    void session.nc.closed().then((err) => {
      if (stopping) return;
      lost = `the NATS connection closed${err ? `: ${err.message}` : ""}; restart the process`;
      metrics.connected.set(0);
      log.error({ err }, "NATS connection closed for good");
    });
    void (async () => {
      for await (const status of session.nc.status()) {
        if (status.type === "disconnect") {
          connected = false;
          metrics.connected.set(0);
          log.warn({ server: withoutPassword(String(status.data)) }, "NATS disconnected; reconnecting");
        }
        if (status.type === "reconnect") {
          connected = true;
          metrics.connected.set(1);
          metrics.reconnects.inc();
          log.info({ server: withoutPassword(String(status.data)) }, "NATS reconnected");
          void reassert();
        }
        // A publish or subscription the server refuses shows nowhere else: say it, with its subject.
        const refused = (status as { permissionContext?: { operation: string; subject: string; queue?: string } }).permissionContext;
        if (status.type === "error" && refused !== undefined) {
          log.error({ operation: refused.operation, subject: refused.subject }, "the server refused a permission of the seat");
          if (refused.operation === "subscription") refusedSubscriptions.add(refused.subject);
        }
      }
    })();
  };
  try {
    const opened = await openRunner({
      nc: session.nc,
      config,
      log,
      clock: options.clock,
      functions,
      unreachable,
      // The event kind's binding reads its streams' use; bound after the runner is open.
      streams: () => Object.assign({}, ...bindings.map((binding) => binding.streams?.() ?? {})),
    });
    runner = opened;
    watchConnection(opened.metrics);
    const env: BindEnv<LoadedFunction> = {
      nc: session.nc,
      config,
      log,
      run: opened.run,
      claim: opened.records.claim,
      clock: opened.clock,
      service: serviceOf(config),
      graceMs,
      probes: {
        live: () => (lost === undefined ? [] : [lost]),
        ready: readiness,
      },
      metrics: async () => ({ text: await opened.metrics.registry.metrics(), contentType: opened.metrics.registry.contentType }),
    };
    for (const kind of KINDS) bindings.push(await kind.bind(targetsOf(functions, kind), env));
    for (const binding of bindings) await binding.afterBind?.();
    // Buckets made again (found deleted, or lost by the server): what is made at start, made again.
    opened.onMadeAgain(() => {
      if (stopping) return;
      void (async () => {
        for (const binding of bindings) await binding.madeAgain?.();
      })().catch((err: unknown) => log.warn({ err: thrownText(err) }, "runs at start not made again"));
    });
    // Ready means the server has every subscription: a request sent now finds its responder.
    await session.nc.flush();
    bound = true;
    const running: Running = {
      natsUrl: session.url,
      httpUrl: bindings.find((binding) => binding.url !== undefined)?.url ?? "",
      embedded: session.embedded !== undefined,
      functions,
      runner: opened,
      readyMs: Math.round(performance.now() - began),
      stop,
    };
    log.info(
      { nats: running.natsUrl, http: running.httpUrl, readyMs: running.readyMs, functions: functions.map((fn) => fn.name) },
      "started",
    );
    return running;
  } catch (err) {
    await stop().catch(() => {});
    throw err;
  }
}

/** The lines printed at start: where NATS and HTTP are, and each function with its triggers. */
export function describe(running: Running): string[] {
  const width = Math.max(...running.functions.map((fn) => fn.name.length));
  return [
    `NATS  ${running.natsUrl}${running.embedded ? " (embedded nats-server)" : ""}`,
    `HTTP  ${running.httpUrl}`,
    `ready in ${running.readyMs} ms`,
    "functions:",
    ...running.functions.map((fn) => `  ${fn.name.padEnd(width)}  ${fn.triggers.map((t) => kindOf(t)!.describe(t)).join(", ")}`),
  ];
}
