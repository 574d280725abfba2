/**
 * The set on a cluster under faults, as an operator runs it (docs/runtime.md §6.14): two replicas
 * of the set started at the same moment, each on its own host and given its local server's URL;
 * node writers, a provider's events and readers of the verb (over NATS through every server, and
 * over HTTP to each replica), and each replica's `/readyz`, all recorded with the test machine's
 * clock, so that checks.ts can hold every answer against every acknowledged write.
 */
import { randomBytes } from "node:crypto";
import { createWriteStream, mkdirSync, mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import type { ChildProcess } from "node:child_process";
import type { JetStreamClient, KV, NatsConnection } from "nats";
import type { Host, HostCluster, HostServer } from "../hosts.ts";
import { ROOT, SHIPPED_DIR } from "../helpers.ts";

const BIN = join(ROOT, "bin", "mesh-provisioner.mjs");
export const NEEDS = "mesh-provisioner_needs";
export const EVENTS = "mesh-provisioner_events";
const VERB = "mesh-provisioner.provisioning";
/** The module every writer's keys belong to: `<node>.faults.config.k<i>`. */
export const MODULE = "faults";
/** The machine of the provider's failing events: `keycloak.faults.c<i>`. */
export const MACHINE = "faults";
const HTTP_PORT = 8787;

/** A replica of the set, a process on a host. */
export interface Replica {
  /** `A`, `B`, … */
  readonly name: string;
  readonly host: Host;
  /** The server it was given (its host's). */
  readonly server: HostServer;
  readonly httpUrl: string;
  readonly child: ChildProcess;
  /** Its log (stdout and stderr). */
  readonly logFile: string;
  /** Resolves with its exit code or signal. */
  readonly exited: Promise<number | string | null>;
}

/** A replica's command line: `mesh-provisioner start`, the project's config with the shipped functions. */
function configFile(dir: string): string {
  const file = join(dir, "wrangler-free.config.ts");
  writeFileSync(
    file,
    `import base from ${JSON.stringify(join(ROOT, "wrangler-free.config.ts"))};\n` +
      `export default { ...base, functions: ${JSON.stringify(SHIPPED_DIR)}, state: ${JSON.stringify(join(dir, "state"))} };\n`,
  );
  return file;
}

/**
 * Starts one replica of the set on each of `on` (server n on host n), all at the same moment:
 * `node bin/mesh-provisioner.mjs start` inside the host, with `NATS_URL` its server's alone,
 * the seat's user, replicas 3, HTTP on the host's address with `token`. Resolves once each has
 * printed its banner; rejects with a replica's log when one exits first or is not started
 * within `timeoutMs`.
 */
export async function startReplicas(
  cluster: HostCluster,
  on: readonly HostServer[],
  { seat: seatUser, token, timeoutMs = 60_000 }: { seat: string; token: string; timeoutMs?: number },
): Promise<Replica[]> {
  mkdirSync(join(ROOT, ".tmp"), { recursive: true });
  const dir = mkdtempSync(join(ROOT, ".tmp", "faults-"));
  const config = configFile(dir);
  const seat = cluster.credentials(seatUser);
  return Promise.all(
    on.map((server, i) => {
      const name = String.fromCharCode(65 + i);
      const logFile = join(dir, `replica-${name}.log`);
      const log = createWriteStream(logFile);
      const child = server.host.spawn("node", [BIN, "-c", config, "start"], {
        cwd: ROOT,
        env: {
          ...process.env,
          NATS_URL: server.url,
          NATS_USER: seat.user,
          NATS_PASSWORD: seat.password,
          NATS_REPLICAS: "3",
          HTTP_HOST: server.host.ip,
          HTTP_PORT: String(HTTP_PORT),
          HTTP_TOKEN: token,
          LOG_LEVEL: process.env.FAULTS_LOG_LEVEL ?? "info",
        },
        stdio: ["ignore", "pipe", "pipe"],
      });
      child.stdout!.pipe(log, { end: false });
      let banner = "";
      const exited = new Promise<number | string | null>((resolve) => child.once("exit", (code, signal) => resolve(code ?? signal)));
      return new Promise<Replica>((resolve, reject) => {
        const timer = setTimeout(
          () => reject(new Error(`replica ${name} not started within ${timeoutMs} ms:\n${tail(logFile)}`)),
          timeoutMs,
        );
        child.stderr!.on("data", (d: Buffer) => {
          log.write(d);
          banner += d.toString();
          if (/\n {2}status .*\n/.test(banner)) {
            clearTimeout(timer);
            resolve({ name, host: server.host, server, httpUrl: `http://${server.host.ip}:${HTTP_PORT}`, child, logFile, exited });
          }
        });
        void exited.then((code) => {
          clearTimeout(timer);
          reject(new Error(`replica ${name} exited (${code}) before it started:\n${tail(logFile)}`));
        });
      });
    }),
  );
}

/** The last lines of a log file. */
export function tail(file: string, lines = 40): string {
  try {
    return readFileSync(file, "utf8").trimEnd().split("\n").slice(-lines).join("\n");
  } catch {
    return "(no log)";
  }
}

/**
 * A write a writer's server acknowledged: its key, its writer's count `n` (the value written is
 * `{"n": n}`, growing with every write of the writer), the revision (stream sequence) the
 * acknowledgement said, and when it came.
 */
export interface Write {
  readonly key: string;
  readonly n: number;
  readonly revision: number;
  readonly ackedAt: number;
}

/** One fresh read of a node's keys: over NATS through a server, or over HTTP to one replica. */
export type Answer = {
  readonly via: string;
  readonly node: string;
  /** When the request was sent (ms since the epoch, this machine's clock). */
  readonly sentAt: number;
  readonly doneAt: number;
} & (
  | { readonly ok: true; readonly counts: ReadonlyMap<string, number> }
  | { readonly ok: false; readonly code: number | "timeout"; readonly message: string }
);

/** One `/readyz` of a replica. */
export interface Poll {
  readonly replica: string;
  readonly at: number;
  /** `undefined`: it did not answer within 1 s. */
  readonly ready: boolean | undefined;
  readonly reasons: readonly string[];
}

/** A failing the provider published and the stream acknowledged. */
export interface Event {
  readonly consumer: string;
  readonly at: string;
  readonly ackedAt: number;
}

/** A moment of the run: a fault made or undone, said with the time. */
export interface Mark {
  readonly at: number;
  readonly what: string;
}

/** Everything a run recorded. */
export interface Recording {
  readonly writes: Write[];
  /** Writes not acknowledged (timed out, refused): their outcome is unknown. */
  unacknowledged: number;
  readonly answers: Answer[];
  readonly polls: Poll[];
  readonly events: Event[];
  readonly marks: Mark[];
  /** The nodes written, each with its keys. */
  readonly keys: ReadonlyMap<string, readonly string[]>;
}

export interface WorkloadOptions {
  /** The node users that write, one per server in turn (`nodes[i]` through `servers[i % n]`). */
  readonly nodes: readonly string[];
  /** Keys per node. */
  readonly keysPerNode?: number;
  /** Milliseconds between a writer's writes. */
  readonly writeEveryMs?: number;
  /** Milliseconds between a reader's reads. */
  readonly readEveryMs?: number;
  /** The provider publishing failing events. */
  readonly provider?: string;
  readonly eventEveryMs?: number;
  readonly token: string;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Loops `step` every `everyMs` (from the start of one to the next, never two at once) until stopped. */
function loop(step: () => Promise<void>, everyMs: number, running: () => boolean): Promise<void> {
  return (async () => {
    while (running()) {
      const began = Date.now();
      await step().catch(() => {});
      await sleep(Math.max(0, everyMs - (Date.now() - began)));
    }
  })();
}

/** A running workload: what it recorded so far, and how to stop it. */
export interface Workload {
  readonly recording: Recording;
  mark(what: string): void;
  /**
   * Moves the writers to `through` (writer i to `through[i % n]`), from their next write: no
   * node writes through a server about to be cut off or paused while it leads the needs stream
   * (nats-server 2.9 keeps what such a leader took, unacknowledged, in place of acknowledged
   * writes, docs/runtime.md §6.14).
   */
  writeThrough(through: readonly HostServer[]): Promise<void>;
  stop(): Promise<void>;
}

/**
 * Starts the workload on `cluster` with the set's `replicas`: each of `options.nodes` writes
 * its keys in turn through its own server (a KV put, 2 s to be acknowledged); a reader on every
 * server asks the verb for each node's keys (`what: needs`, fresh, 3 s); an HTTP reader asks
 * each replica the same; each replica's `/readyz` is polled every 200 ms; the provider publishes
 * one failing a time to the events stream through server 1 (as its client library does, again
 * until acknowledged). Everything is recorded with `Date.now()` of this process.
 */
export async function startWorkload(cluster: HostCluster, replicas: readonly Replica[], options: WorkloadOptions): Promise<Workload> {
  const { nodes, keysPerNode = 12, writeEveryMs = 25, readEveryMs = 40, provider = "keycloak", eventEveryMs = 400 } = options;
  const recording: Recording = {
    writes: [],
    unacknowledged: 0,
    answers: [],
    polls: [],
    events: [],
    marks: [],
    keys: new Map(nodes.map((node) => [node, Array.from({ length: keysPerNode }, (_, i) => `${node}.${MODULE}.config.k${i}`)])),
  };
  let running = true;
  const loops: Promise<void>[] = [];
  const { servers } = cluster;

  // Writers: one per node, through its own server (moved by `writeThrough`).
  const writers: { node: string; kv: KV; nc: NatsConnection }[] = [];
  for (const [i, node] of nodes.entries()) {
    const nc = await cluster.connect(node, servers[i % servers.length]!);
    const writer = { node, nc, kv: await nc.jetstream({ timeout: 2000 }).views.kv(NEEDS, { bindOnly: true }) };
    writers.push(writer);
    const keys = recording.keys.get(node)!;
    let n = 0;
    loops.push(
      loop(
        async () => {
          const key = keys[n % keys.length]!;
          const count = n++;
          try {
            const revision = await writer.kv.put(key, JSON.stringify({ n: count }));
            recording.writes.push({ key, n: count, revision, ackedAt: Date.now() });
          } catch {
            recording.unacknowledged++;
          }
        },
        writeEveryMs,
        () => running,
      ),
    );
  }

  /** A reader: asks for each node's keys in turn through `ask`, every `readEveryMs`, recording each answer under `via`. */
  type Asked = { ok: true; counts: Map<string, number> } | { ok: false; code: number | "timeout"; message: string };
  const reader = (via: string, ask: (node: string) => Promise<Asked>) => {
    let n = 0;
    loops.push(
      loop(
        async () => {
          const node = nodes[n++ % nodes.length]!;
          const sentAt = Date.now();
          const answer = await ask(node).catch((err: Error) => ({ ok: false as const, code: "timeout" as const, message: err.message }));
          recording.answers.push({ via, node, sentAt, doneAt: Date.now(), ...answer });
        },
        readEveryMs,
        () => running,
      ),
    );
  };

  // Readers over NATS: one per server, as a node of the mesh would ask.
  for (const server of servers) {
    const nc: NatsConnection = await cluster.connect(nodes[0]!, server);
    reader(server.name, async (node) => {
      const msg = await nc.request(VERB, JSON.stringify({ what: "needs", node, module: MODULE }), { timeout: 3000 });
      return answerOf(msg.headers?.get("Nats-Service-Error-Code") || undefined, msg.string());
    });
  }

  // Readers over HTTP: one per replica, and its `/readyz`.
  for (const replica of replicas) {
    reader(replica.name, async (node) => {
      const response = await fetch(`${replica.httpUrl}/provisioning?what=needs&node=${node}&module=${MODULE}`, {
        headers: { authorization: `Bearer ${options.token}` },
        signal: AbortSignal.timeout(3000),
      });
      return answerOf(response.status === 200 ? undefined : String(response.status), await response.text());
    });
    loops.push(
      loop(
        async () => {
          const at = Date.now();
          const poll = await fetch(`${replica.httpUrl}/readyz`, { signal: AbortSignal.timeout(1000) }).then(
            async (response) => {
              const body = (await response.json()) as { ready?: boolean; reasons?: string[] };
              return { ready: response.status === 200 && body.ready === true, reasons: body.reasons ?? [] };
            },
            () => ({ ready: undefined, reasons: [] }),
          );
          recording.polls.push({ replica: replica.name, at, ...poll });
        },
        200,
        () => running,
      ),
    );
  }

  // The provider's failing events, each published again with its id until acknowledged.
  const js: JetStreamClient = (await cluster.connect(provider, servers[0]!)).jetstream({ timeout: 2000 });
  let e = 0;
  loops.push(
    loop(
      async () => {
        const consumer = `c${e++}`;
        const at = new Date().toISOString();
        for (;;) {
          try {
            await js.publish(`${provider}.provisioner.failing`, JSON.stringify({ machine: MACHINE, consumer, word: "down", at }), {
              msgID: `faults-${consumer}`,
            });
            recording.events.push({ consumer, at, ackedAt: Date.now() });
            return;
          } catch {
            if (!running) return;
            await sleep(200);
          }
        }
      },
      eventEveryMs,
      () => running,
    ),
  );

  return {
    recording,
    mark: (what) => recording.marks.push({ at: Date.now(), what }),
    writeThrough: async (through) => {
      for (const [i, writer] of writers.entries()) {
        const nc = await cluster.connect(writer.node, through[i % through.length]!);
        const kv = await nc.jetstream({ timeout: 2000 }).views.kv(NEEDS, { bindOnly: true });
        const was = writer.nc;
        Object.assign(writer, { nc, kv });
        await was.close().catch(() => {});
      }
    },
    stop: async () => {
      running = false;
      await Promise.all(loops);
    },
  };
}

/** A verb answer's body as the checker keeps it: each key's revision, or the refusal. */
function answerOf(
  errorCode: string | undefined,
  body: string,
): { ok: true; counts: Map<string, number> } | { ok: false; code: number; message: string } {
  if (errorCode !== undefined) {
    let message = body;
    try {
      message = (JSON.parse(body) as { error?: { message?: string } }).error?.message ?? body;
    } catch {
      // not JSON: said as it is
    }
    return { ok: false, code: Number(errorCode), message };
  }
  const parsed = JSON.parse(body) as { entries: { key: string; value: { n: number } }[] };
  return { ok: true, counts: new Map(parsed.entries.map((e) => [e.key, e.value.n])) };
}

/** A token for the replicas' HTTP (a bearer token of 32 hex digits). */
export const newToken = (): string => randomBytes(16).toString("hex");
