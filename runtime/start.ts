import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { serve, type ServerType } from "@hono/node-server";
import type { Logger } from "pino";
import type { Server } from "node:http";
import { bindCron, bindSubjects, httpApp, STOP_GRACE_MS, type Binding } from "./bind.ts";
import type { Config } from "./config.ts";
import { bindEvents } from "./events.ts";
import type { Clock, Trigger } from "./define.ts";
import { openHost, type Host } from "./host.ts";
import type { Metrics } from "./metrics.ts";
import { loadFunctions, type LoadedFunction } from "./loader.ts";
import { createLogger } from "./log.ts";
import { openSession, withoutPassword, type Session } from "./session.ts";

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
  readonly host: Host;
  /** Milliseconds from the call of {@link start} until every trigger was bound and the views loaded. */
  readonly readyMs: number;
  /** Unbinds every trigger, closes HTTP, drains the connection and stops the embedded server. */
  stop(): Promise<void>;
}

/** The version in the `package.json` beside the config, for the NATS service; `0.0.0` if none. */
function versionOf(config: Config): string {
  const file = join(config.root, "package.json");
  if (!existsSync(file)) return "0.0.0";
  return (JSON.parse(readFileSync(file, "utf8")) as { version?: string }).version ?? "0.0.0";
}

/**
 * Closes the HTTP server: no new connection, idle ones closed now, those still busy after
 * `graceMs` closed too (a client that never finishes its request cannot hold stop).
 */
async function closeHttp(http: ServerType, graceMs: number): Promise<void> {
  const server = http as Server;
  const closed = new Promise((resolve) => server.close(resolve));
  server.closeIdleConnections();
  const timer = setTimeout(() => server.closeAllConnections(), graceMs);
  await closed;
  clearTimeout(timer);
}

function listen(app: ReturnType<typeof httpApp>, host: string, port: number): Promise<ServerType> {
  return new Promise((resolve, reject) => {
    const server = serve({ fetch: app.fetch, hostname: host, port }, () => resolve(server));
    server.once("error", (err: NodeJS.ErrnoException) =>
      reject(
        new Error(
          err.code === "EADDRINUSE"
            ? `HTTP port ${port} on ${host} is in use: set HTTP_PORT to another port (0 picks a free one)`
            : `HTTP server cannot listen on ${host}:${port}: ${err.message}`,
        ),
      ),
    );
  });
}

/**
 * Starts the function set of `config` (SPEC §6): loads and checks every function file, opens
 * the bus (the configured servers, or the embedded server), asserts the buckets and streams,
 * binds subjects, HTTP routes, events and cron, and runs the `onStart` functions. Throws, having released what it
 * opened, when any step fails; the error says which.
 */
export async function start(options: StartOptions): Promise<Running> {
  const began = performance.now();
  const { config, stopGraceMs: graceMs = STOP_GRACE_MS } = options;
  const log = options.log ?? createLogger();
  const functions = await loadFunctions(config);
  const session: Session = await openSession(config, { embedded: "start", maxPayload: options.maxPayload, functions });
  const bindings: Binding[] = [];
  let http: ServerType | undefined;
  let host: Host | undefined;
  let stopping: Promise<void> | undefined;
  const stop = () =>
    (stopping ??= (async () => {
      log.info("stopping");
      // Requests in hand, over NATS and HTTP, are answered for at most the grace.
      await Promise.all([
        (async () => {
          for (const binding of [...bindings].reverse()) await binding.stop();
        })(),
        http === undefined ? undefined : closeHttp(http, graceMs),
      ]);
      host?.close();
      await session.close();
      log.info("stopped");
    })());
  // What `GET /readyz` says is missing (empty: ready).
  let bound = false;
  // Why the connection is gone for good, when it closed without a stop (`GET /healthz` says it).
  let lost: string | undefined;
  let connected = true;
  let failedAtStart: string[] = [];
  const readiness = () => [
    ...(stopping ? ["stopping"] : bound ? [] : ["starting: not every trigger is bound yet"]),
    ...(lost !== undefined ? [lost] : connected ? [] : ["not connected to NATS: reconnecting"]),
    ...failedAtStart.map((name) => `${name}: its run at start failed`),
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
        }
      }
    })();
  };
  try {
    host = await openHost({ nc: session.nc, config, log, clock: options.clock, functions });
    watchConnection(host.metrics);
    bindings.push(await bindSubjects(host, functions, versionOf(config), graceMs));
    http = await listen(httpApp(host, functions, { live: () => (lost === undefined ? [] : [lost]), ready: readiness }), config.http.host, config.http.port);
    bindings.push(await bindEvents(host, functions));
    const cron = await bindCron(host, functions);
    bindings.push(cron);
    failedAtStart = cron.failedAtStart;
    // Ready means the server has every subscription: a request sent now finds its responder.
    await session.nc.flush();
    bound = true;
    const { port } = http.address() as { port: number };
    const running: Running = {
      natsUrl: session.url,
      httpUrl: `http://${config.http.host}:${port}`,
      embedded: session.embedded !== undefined,
      functions,
      host,
      readyMs: Math.round(performance.now() - began),
      stop,
    };
    log.info({ nats: running.natsUrl, http: running.httpUrl, readyMs: running.readyMs, functions: functions.map((fn) => fn.name) }, "started");
    return running;
  } catch (err) {
    await stop().catch(() => {});
    throw err;
  }
}

function describeTrigger(trigger: Trigger): string {
  if ("subject" in trigger) return `subject ${trigger.subject}`;
  if ("http" in trigger) return `http ${trigger.http}`;
  if ("event" in trigger) return `event ${trigger.event}${trigger.stream ? ` (stream ${trigger.stream})` : ""}`;
  return `cron ${trigger.cron}${trigger.onStart ? " (and at start)" : ""}`;
}

/** The lines printed at start: where NATS and HTTP are, and each function with its triggers. */
export function describe(running: Running): string[] {
  const width = Math.max(...running.functions.map((fn) => fn.name.length));
  return [
    `NATS  ${running.natsUrl}${running.embedded ? " (embedded nats-server)" : ""}`,
    `HTTP  ${running.httpUrl}`,
    `ready in ${running.readyMs} ms`,
    "functions:",
    ...running.functions.map(
      (fn) => `  ${fn.name.padEnd(width)}  ${fn.definition.triggers.map(describeTrigger).join(", ")}`,
    ),
  ];
}
