/**
 * What the benches share: one embedded nats-server with the embedded default's users plus a
 * `bench` user that may use any subject, the function set and the echo responder as processes of
 * their own, the bench data's keys, and the timing helpers. See test/bench/README.md.
 */
import { execFileSync, type ChildProcess } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { connect, type KV, type NatsConnection } from "nats";
import { Bench } from "tinybench";
import { CONFIG_FILE, loadConfig, loadFunctions } from "../../runtime/index.ts";
import { startEmbedded, type EmbeddedServer } from "../../runtime/embedded.ts";
import { authorization } from "../../runtime/permissions.ts";
import { collectKey, needKey } from "../../client/index.ts";
import { VERB } from "../../functions/_lib/provisioning.ts";
import { child, children, freePort, ROOT, stopChild } from "./processes.ts";

export { freePort, ROOT };

export const MODULES = 10;
export const PER_MODULE = 10;
const LATENCY_MS = 2000;
/** How often a fill of a bucket says how far it is, in milliseconds. */
const FILL_SAY_MS = 3000;

export const line = (text: string) => process.stdout.write(`${text}\n`);
export const ms = (n: number) => `${n < 10 ? n.toFixed(3) : n.toFixed(1)} ms`;
export const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
export const count = (n: number) => n.toLocaleString("en-US");
export const sleep = (n: number) => new Promise((r) => setTimeout(r, n));
const encoder = new TextEncoder();
const decoder = new TextDecoder();

/** Bytes of resident memory of a process, from /proc. */
export const rssOf = (pid: number) => Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${pid}/status`, "utf8"))![1]) * 1024;

/** Every key of `kv` read with one unfiltered (or filtered) watch, each value parsed as a client would. */
export async function watchRead(kv: KV, key = ">"): Promise<number> {
  let n = 0;
  let done = false;
  const iterator = await kv.watch({ key, initializedFn: () => (done = true) });
  if (done) iterator.stop();
  for await (const entry of iterator) {
    if (entry.operation === "PUT") JSON.parse(entry.string());
    n++;
    if (entry.delta === 0) iterator.stop();
  }
  return n;
}

/** p50 and mean of each task in milliseconds, with tinybench (2 s each after 0.3 s of warm-up). */
export async function latency(
  tasks: Record<string, () => Promise<unknown>>,
): Promise<Record<string, { p50: number; mean: number; samples: number }>> {
  const bench = new Bench({ time: LATENCY_MS, warmupTime: 300 });
  for (const [name, fn] of Object.entries(tasks)) bench.add(name, fn);
  await bench.run();
  return Object.fromEntries(
    bench.tasks.map((t) => {
      const r = t.result as unknown as { latency: { p50: number; mean: number; samplesCount: number } };
      return [t.name, { p50: r.latency.p50, mean: r.latency.mean, samples: r.latency.samplesCount }];
    }),
  );
}

/** Writes `keys` to `bucket` 1,000 puts at a time, a line every few seconds: keys written and the rate. */
export async function fill(bucket: KV, keys: Iterable<[string, string]>): Promise<void> {
  // nats.js's KV keeps its bucket's name, untyped.
  const { bucket: name } = bucket as unknown as { bucket: string };
  const began = performance.now();
  let written = 0;
  let said = began;
  let batch: Promise<unknown>[] = [];
  for (const [key, value] of keys) {
    batch.push(bucket.put(key, value));
    if (batch.length === 1000) {
      await Promise.all(batch);
      written += batch.length;
      batch = [];
      const now = performance.now();
      if (now - said >= FILL_SAY_MS) {
        said = now;
        line(`  filling ${name}: ${count(written)} keys written, ${count(Math.round(written / ((now - began) / 1000)))} keys/s`);
      }
    }
  }
  await Promise.all(batch);
}

/** The needs of nodes `n<from>` to `n<to - 1>`: 10 modules of 10 needs each, values of about 110 bytes. */
export function* needsOf(from: number, to: number): Generator<[string, string]> {
  for (let n = from; n < to; n++)
    for (let m = 0; m < MODULES; m++)
      for (let j = 0; j < PER_MODULE; j++)
        yield [
          needKey(`n${n}`, `m${m}`, `\${config:v${j}}`),
          JSON.stringify({ value: `postgres://db-${n}.mesh:5432/m${m}_${j}`, by: `n${n}`, note: "x".repeat(40) }),
        ];
}

/** One applied record for each module of nodes `n<from>` to `n<to - 1>`. */
export function* appliedOf(from: number, to: number): Generator<[string, string]> {
  for (let n = from; n < to; n++)
    for (let m = 0; m < MODULES; m++) yield [`n${n}.m${m}`, JSON.stringify({ applied: `rev-${n}-${m}`, at: "2026-11-29T18:00:00Z" })];
}

/** Ten collect keys for each of nodes `n<from>` to `n<to - 1>`. */
export function* collectsOf(from: number, to: number): Generator<[string, string]> {
  for (let n = from; n < to; n++)
    for (let c = 0; c < 10; c++)
      yield [collectKey(`n${n}`, "shell:zsh:normal", `c${c}`), JSON.stringify({ lines: [`alias c${c}='true'`] })];
}

/** The verb asked with `request`, its answer parsed; throws when the verb refuses. */
export const askVerb = (conn: NatsConnection, request: unknown) =>
  conn.request(VERB, encoder.encode(JSON.stringify(request)), { timeout: 30_000 }).then((m) => {
    if (m.headers?.get("Nats-Service-Error-Code")) throw new Error(`verb refused: ${m.headers.get("Nats-Service-Error")}`);
    return JSON.parse(decoder.decode(m.data)) as { entries: unknown[]; next?: string };
  });

/** One round trip to the echo responder, with a body the size of the narrowed verb's request. */
export const askEcho = (conn: NatsConnection) =>
  conn.request("bench.echo", encoder.encode('{"what":"needs","node":"n5","module":"m3"}'), { timeout: 30_000 });

export type Started = { process: ChildProcess; line: string };

/** The bench's server, its own connection, and the processes it starts. */
export interface BenchBus {
  readonly server: EmbeddedServer;
  readonly nc: NatsConnection;
  readonly natsVersion: string;
  readonly benchUser: { user: string; pass: string };
  readonly config: Awaited<ReturnType<typeof loadConfig>>;
  readonly functions: Awaited<ReturnType<typeof loadFunctions>>;
  /** The buckets some function views (`access.views`), by the config's names. */
  readonly viewed: string[];
  /** The port the set's HTTP listens on. */
  readonly httpPort: number;
  /** Starts `mesh-provisioner start` as the seat; resolves at its `ready in N ms` line. */
  startSet(): Promise<Started>;
  /** Starts the echo responder; resolves once it answers. */
  startEcho(): Promise<Started>;
  /** The KV handle of the config's bucket `name`, bound, direct gets allowed. */
  kv(name: string): Promise<KV>;
  /** Spawns a process of this project; resolves once a line of its stdout or stderr matches `ready`. */
  child(args: string[], env: NodeJS.ProcessEnv, ready: RegExp): Promise<Started>;
  stopChild(proc: ChildProcess): Promise<void>;
  /** Stops every process, the server, and removes its store. */
  stop(): Promise<void>;
}

/** Builds the set (it runs from its build, as `npm start` runs it: docs/scale.md §11.2.1), starts the bench's embedded nats-server and connects to it as `bench`. */
export async function openBench(): Promise<BenchBus> {
  execFileSync(process.execPath, [join(ROOT, "bin", "build.mjs")], { cwd: ROOT, stdio: "inherit" });
  const config = await loadConfig(resolve(ROOT, CONFIG_FILE), {});
  const functions = await loadFunctions(config);
  const dir = mkdtempSync(join(tmpdir(), "mesh-provisioner-bench-"));
  const users = authorization(config, functions, { nodes: config.embedded.nodes, providers: config.embedded.providers });
  // The bench's own client writes every node's keys and answers echo: any subject.
  const wide = { publish: { allow: [">"] }, subscribe: { allow: [">"] } };
  const server = await startEmbedded({ stateDir: dir, users: [...users, { role: "seat", user: "bench", permissions: wide }] });
  const benchUser = { user: "bench", pass: server.users.bench!.password };
  const nc = await connect({ servers: server.url, ...benchUser, name: "bench" });
  const js = nc.jetstream();

  const httpPort = await freePort();
  const seatEnv = {
    NATS_URL: server.url,
    NATS_USER: server.seat.user,
    NATS_PASSWORD: server.seat.password,
    // A known port: the page's figures are asked over HTTP (docs/page.md §10.5).
    HTTP_PORT: String(httpPort),
    LOG_LEVEL: process.env.LOG_LEVEL ?? "info",
  };
  // Node's flags as `npm start` gives them (package.json), so the set runs as it does there.
  const { scripts } = JSON.parse(readFileSync(join(ROOT, "package.json"), "utf8")) as { scripts: Record<string, string> };
  const startFlags = /\bnode ((?:--\S+ )*)bin\//.exec(scripts.start!)?.[1]?.trim().split(" ").filter(Boolean) ?? [];
  // BENCH_PROFILE=<folder>: each run of the set writes a V8 CPU profile there when it stops.
  const profile = process.env.BENCH_PROFILE ? ["--cpu-prof", `--cpu-prof-dir=${resolve(process.env.BENCH_PROFILE)}`] : [];
  return {
    server,
    nc,
    natsVersion: nc.info?.version ?? "?",
    benchUser,
    config,
    functions,
    viewed: [...new Set(functions.flatMap((fn) => fn.definition.access?.views ?? []))],
    httpPort,
    startSet: () => child([...startFlags, ...profile, join(ROOT, "bin", "mesh-provisioner.mjs"), "start"], seatEnv, /^ready in \d+ ms/),
    startEcho: () =>
      child(
        ["--import", "tsx", join(import.meta.dirname, "echo.ts")],
        { NATS_URL: server.url, NATS_USER: "bench", NATS_PASSWORD: benchUser.pass },
        /^ready$/,
      ),
    kv: (name) => js.views.kv(config.buckets[name]!.bucket, { bindOnly: true, allow_direct: true }),
    child,
    stopChild,
    async stop() {
      for (const proc of children) await stopChild(proc).catch(() => {});
      await nc.close().catch(() => {});
      await server.stop();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** Start-to-ready against one read of every viewed bucket, each a median of 3 runs, in milliseconds. */
export interface StartFigures {
  readonly readyMs: number;
  readonly readyRuns: number[];
  readonly processSpawnToReadyMs: number;
  readonly spawnRuns: number[];
  readonly unfilteredReadOfViewedBucketsMs: number;
  readonly readAllRuns: number[];
}

/**
 * Starts the set `runs` times (the one before stopped each time): each start's `ready in` and
 * the time from spawn to that line, in milliseconds. Resolves with them and the set left running.
 */
async function starts(bench: BenchBus, runs = 3): Promise<{ readyRuns: number[]; spawnRuns: number[]; set: Started }> {
  const readyRuns: number[] = [];
  const spawnRuns: number[] = [];
  let set: Started | undefined;
  for (let i = 0; i < runs; i++) {
    if (set !== undefined) await bench.stopChild(set.process);
    const spawned = performance.now();
    set = await bench.startSet();
    spawnRuns.push(performance.now() - spawned);
    readyRuns.push(Number(/ready in (\d+) ms/.exec(set.line)![1]));
  }
  return { readyRuns, spawnRuns, set: set! };
}

/** Node's bare start: from spawning `node -e 'console.log("ready")'` to that line, 5 times; each in milliseconds. */
async function bareStarts(bench: BenchBus): Promise<number[]> {
  const runs: number[] = [];
  for (let i = 0; i < 5; i++) {
    const spawned = performance.now();
    const bare = await bench.child(["-e", 'console.log("ready")'], {}, /^ready$/);
    runs.push(performance.now() - spawned);
    await bench.stopChild(bare.process);
  }
  return runs;
}

/** The set started on empty buckets, against Node's bare start (docs/scale.md §11.2), in milliseconds and bytes. */
export interface EmptyFigures {
  readonly readyMs: number;
  readonly readyRuns: number[];
  readonly processSpawnToReadyMs: number;
  readonly spawnRuns: number[];
  readonly bareNodeStartMs: number;
  readonly bareRuns: number[];
  /** The set's RSS after `idleMs` idle, its last start. */
  readonly rssBytes: number;
  readonly idleMs: number;
}

/**
 * With the set stopped and its buckets asserted but empty: Node's bare start 5 times, then the
 * set started 3 times (stopped between), then its RSS after `idleMs` idle. Medians; resolves
 * with the figures and the set left running.
 */
export async function emptyFigures(bench: BenchBus, idleMs: number): Promise<{ figures: EmptyFigures; set: Started }> {
  const bareRuns = await bareStarts(bench);
  const { readyRuns, spawnRuns, set } = await starts(bench);
  await new Promise((r) => setTimeout(r, idleMs));
  const figures = {
    readyMs: median(readyRuns),
    readyRuns,
    processSpawnToReadyMs: median(spawnRuns),
    spawnRuns,
    bareNodeStartMs: median(bareRuns),
    bareRuns,
    rssBytes: rssOf(set.process.pid!),
    idleMs,
  };
  return { figures, set };
}

/**
 * With the set stopped, one unfiltered `kv.watch` read of each bucket it views, one after another,
 * 3 times; then the set started 3 times (stopped between): its `ready in` and the time from spawn
 * to that line. Resolves with the figures and the set left running.
 */
export async function startFigures(bench: BenchBus): Promise<{ figures: StartFigures; set: Started }> {
  const readAllRuns: number[] = [];
  for (let i = 0; i < 3; i++) {
    const t = performance.now();
    for (const name of bench.viewed) await watchRead(await bench.kv(name));
    readAllRuns.push(performance.now() - t);
  }
  const { readyRuns, spawnRuns, set } = await starts(bench);
  return {
    set,
    figures: {
      readyMs: median(readyRuns),
      readyRuns,
      processSpawnToReadyMs: median(spawnRuns),
      spawnRuns,
      unfilteredReadOfViewedBucketsMs: median(readAllRuns),
      readAllRuns,
    },
  };
}

/** Every entry of `what` through the verb's pages (`limit` 10,000) until no `next`: how many entries, in how many pages. */
export async function pageThrough(nc: NatsConnection, what: string): Promise<{ entries: number; pages: number }> {
  let entries = 0;
  let pages = 0;
  let cursor: string | undefined;
  do {
    const page = await askVerb(nc, { what, limit: 10_000, ...(cursor ? { cursor } : {}) });
    entries += page.entries.length;
    cursor = page.next;
    pages++;
  } while (cursor !== undefined);
  return { entries, pages };
}

/**
 * Every key of needs through the verb's pages (`limit` 10,000) until no `next`, against one
 * unfiltered watch of the bucket, 3 times each; medians in milliseconds. Throws when either read
 * another number of keys than `keys`.
 */
export async function pagesFigures(
  nc: NatsConnection,
  needs: KV,
  keys: number,
): Promise<{ pagedMs: number; pagedRuns: number[]; pages: number; watchedMs: number; watchRuns: number[] }> {
  const pagedRuns: number[] = [];
  const watchRuns: number[] = [];
  let pages = 0;
  for (let i = 0; i < 3; i++) {
    let t = performance.now();
    let n: number;
    ({ entries: n, pages } = await pageThrough(nc, "needs"));
    pagedRuns.push(performance.now() - t);
    if (n !== keys) throw new Error(`the pages held ${n} keys, not ${keys}`);
    t = performance.now();
    const watched = await watchRead(needs);
    watchRuns.push(performance.now() - t);
    if (watched !== keys) throw new Error(`the watch read ${watched} keys, not ${keys}`);
  }
  return { pagedMs: median(pagedRuns), pagedRuns, pages, watchedMs: median(watchRuns), watchRuns };
}

/** A target: what is judged, the figure, what is wanted (`-`: shown, not judged), whether it is met. */
export type Target = readonly [string, number, string, boolean];

/** Prints the figures' table and the targets' (`head` the targets' figure column), as Markdown. */
export function printTables(rows: readonly (readonly [string, string])[], targets: readonly Target[], head = "ratio"): void {
  const width = Math.max(...rows.map(([k]) => k.length), ...targets.map(([k]) => k.length));
  line("");
  line("| figure | value |");
  line("|---|---|");
  for (const [k, v] of rows) line(`| ${k.padEnd(width)} | ${v} |`);
  line("");
  line(`| target | ${head} | wanted | met |`);
  line("|---|---|---|---|");
  for (const [k, figure, wanted, met] of targets)
    line(`| ${k.padEnd(width)} | ${figure.toFixed(3)} | ${wanted} | ${wanted === "-" ? "-" : met ? "yes" : "NO"} |`);
}
