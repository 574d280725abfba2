/**
 * Finding and spawning a `nats-server` process with a conf of our own (the embedded server, the
 * local cluster, the test buses), on a free loopback port, and stopping it. A leaf.
 */
import { spawn, type ChildProcess, type SpawnOptions as ProcessOptions } from "node:child_process";
import { accessSync, constants, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { delimiter, join } from "node:path";

/** `nats-server` could not be found; the message says how to get one or do without. */
export class NatsServerMissing extends Error {
  override readonly name = "NatsServerMissing";
  constructor() {
    super(
      "nats-server is not installed. Install it (apt-get install nats-server), " +
        "set NATS_SERVER_BIN to its path, or set NATS_URL to use a running server instead of the embedded one.",
    );
  }
}

const SBIN = ["/usr/sbin", "/usr/local/sbin"];

/**
 * Finds the `nats-server` binary: `NATS_SERVER_BIN`, then the `PATH`, then `sbin` (the folders
 * Debian installs it in, often missing from a user's `PATH`). Throws {@link NatsServerMissing}.
 */
export function findNatsServer(env: NodeJS.ProcessEnv = process.env, sbin: readonly string[] = SBIN): string {
  const candidates = env.NATS_SERVER_BIN
    ? [env.NATS_SERVER_BIN]
    : [...(env.PATH ?? "").split(delimiter), ...sbin].filter((dir) => dir !== "").map((dir) => join(dir, "nats-server"));
  for (const file of candidates) {
    try {
      accessSync(file, constants.X_OK);
      return file;
    } catch {
      // not here
    }
  }
  throw new NatsServerMissing();
}

/** A loopback port nothing listens on right now. */
export function freePort(): Promise<number> {
  return portFree(0);
}

/** `n` distinct loopback ports nothing listens on right now: all held at once while they are picked. */
export async function freePorts(n: number): Promise<number[]> {
  const probes = Array.from({ length: n }, () => createServer());
  try {
    return await Promise.all(
      probes.map(
        (probe) =>
          new Promise<number>((resolve, reject) => {
            probe.on("error", reject);
            probe.listen(0, "127.0.0.1", () => resolve((probe.address() as { port: number }).port));
          }),
      ),
    );
  } finally {
    await Promise.all(probes.map((probe) => new Promise((resolve) => probe.close(resolve))));
  }
}

/** `port` on 127.0.0.1 when nothing listens there now (0: any free one); rejects when it is taken. */
function portFree(port: number): Promise<number> {
  return new Promise((resolve, reject) => {
    const probe = createServer();
    probe.unref();
    probe.on("error", reject);
    probe.listen(port, "127.0.0.1", () => {
      const { port } = probe.address() as { port: number };
      probe.close(() => resolve(port));
    });
  });
}

/** `preferred` when it is free on 127.0.0.1, else a free port. */
export async function freePortPreferring(preferred: number | undefined): Promise<number> {
  if (preferred !== undefined && preferred > 0) {
    const kept = await portFree(preferred).catch(() => undefined);
    if (kept !== undefined) return kept;
  }
  return freePort();
}

/** A `nats-server` child of this process. */
export interface RunningNatsServer {
  readonly url: string;
  readonly port: number;
  readonly pid: number;
  /** Stops the server (SIGTERM, then SIGKILL after 5 s) and waits for it to exit. */
  stop(): Promise<void>;
}

/**
 * How a server's process is started: node's `spawn` by default. Another function may start it
 * elsewhere, e.g. inside a network namespace (`ip netns exec <ns> <command> …`, which execs, so
 * the child's pid stays the server's), given the same command, arguments and options.
 */
export type SpawnProcess = (command: string, args: readonly string[], options: ProcessOptions) => ChildProcess;

/** Where a server listens and how its process is started; both optional. */
export interface ServerPlace {
  /** The address the client port listens on: 127.0.0.1 by default. */
  readonly host?: string;
  /** Starts the process: node's `spawn` by default. */
  readonly spawn?: SpawnProcess;
}

export interface SpawnOptions extends ServerPlace {
  /**
   * The server's configuration: an object, written as JSON (which nats-server's configuration
   * format accepts), or configuration text. `host` and `port` are added to either.
   */
  readonly conf: Record<string, unknown> | string;
  /** Where the configuration file is written. */
  readonly confFile: string;
  /** Port to listen on; a free loopback one when absent. */
  readonly port?: number;
  /** The server's environment (variables a text configuration refers to as `$NAME`). */
  readonly env?: NodeJS.ProcessEnv;
}

const READY = /Server is ready/;

function stopChild(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return new Promise((resolve) => {
    const kill = setTimeout(() => child.kill("SIGKILL"), 5000);
    child.once("exit", () => {
      clearTimeout(kill);
      resolve();
    });
    child.kill("SIGTERM");
  });
}

/**
 * Starts `nats-server -c confFile` on 127.0.0.1 (or `host`) and resolves once it logs that it is ready.
 * The child is killed if this process exits first. Rejects with the server's last log lines
 * when it exits or is not ready within 20 s; throws {@link NatsServerMissing}.
 */
export async function spawnNatsServer(options: SpawnOptions): Promise<RunningNatsServer> {
  const port = options.port ?? (await freePort());
  const host = options.host ?? "127.0.0.1";
  const text =
    typeof options.conf === "string"
      ? `${options.conf}\nhost: ${JSON.stringify(host)}\nport: ${port}\n`
      : JSON.stringify({ ...options.conf, host, port }, null, 2);
  writeFileSync(options.confFile, text, { mode: 0o600 });
  return startNatsServer(options.confFile, port, options.env, options);
}

/**
 * Starts `nats-server -c confFile` on a configuration file as it is written, which listens on
 * 127.0.0.1:`port` (or `place.host`), and resolves once it logs that it is ready; as {@link spawnNatsServer} does.
 */
export async function startNatsServer(
  confFile: string,
  port: number,
  env?: NodeJS.ProcessEnv,
  place: ServerPlace = {},
): Promise<RunningNatsServer> {
  const bin = findNatsServer(env);
  // Its own process group: a terminal's Ctrl-C reaches this process, which stops the child in order.
  const child = (place.spawn ?? spawn)(bin, ["-c", confFile], {
    stdio: ["ignore", "ignore", "pipe"],
    detached: true,
    env: env ?? process.env,
  });
  const killOnExit = () => child.kill("SIGKILL");
  process.on("exit", killOnExit);
  child.once("exit", () => process.off("exit", killOnExit));

  const log: string[] = [];
  await new Promise<void>((resolve, reject) => {
    const fail = (why: string) => {
      clearTimeout(timer);
      void stopChild(child);
      reject(new Error(`nats-server ${why}:\n${log.slice(-15).join("\n")}`));
    };
    const timer = setTimeout(() => fail("was not ready within 20 s"), 20_000);
    child.once("error", (err) => fail(`could not be started (${err.message})`));
    child.once("exit", (code, signal) => fail(`exited before it was ready (${signal ?? `code ${code}`})`));
    child.stderr!.setEncoding("utf8").on("data", (chunk: string) => {
      log.push(...chunk.split("\n").filter((line) => line !== ""));
      if (log.length > 200) log.splice(0, log.length - 200);
      if (READY.test(chunk)) {
        clearTimeout(timer);
        child.removeAllListeners("exit");
        child.once("exit", () => process.off("exit", killOnExit));
        resolve();
      }
    });
  });
  return {
    url: `nats://${place.host ?? "127.0.0.1"}:${port}`,
    port,
    pid: child.pid!,
    stop: () => stopChild(child),
  };
}
