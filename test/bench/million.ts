/**
 * `npm run bench:million`: the function set on a mesh ten times the bench's, 10,000 nodes × 10
 * modules × 10 needs (1,000,000 needs keys), 100,000 applied and 100,000 collect keys, against
 * the same floors as `npm run bench`: its RSS at a tenth of that and at the whole (the slope a
 * key), its start against one unfiltered read of every viewed bucket, the narrowed verb against
 * echo, every needs key through the pages against one unfiltered watch. Prints a table and
 * writes `test/bench/results-million.json`. Figures, not tests: nothing fails on a figure.
 */
import { writeFileSync } from "node:fs";
import { cpus, totalmem } from "node:os";
import { join } from "node:path";
import {
  appliedOf,
  askEcho,
  askVerb,
  collectsOf,
  count,
  fill,
  latency,
  line,
  median,
  MODULES,
  ms,
  needsOf,
  openBench,
  PER_MODULE,
  rssOf,
  sleep,
  watchRead,
  type BenchBus,
} from "./harness.ts";

const RESULTS = join(import.meta.dirname, "results-million.json");
const NODES = Number(process.env.BENCH_MILLION_NODES ?? 10_000);
/** The first size measured, a tenth of the whole. */
const FIRST = NODES / 10;
/** How long the set is left idle before each RSS figure, in milliseconds. */
const IDLE_MS = 10_000;
/** The keys of every viewed bucket with `nodes` nodes: needs, applied records and collect keys. */
const keysOf = (nodes: number) => nodes * MODULES * PER_MODULE + nodes * MODULES + nodes * 10;

async function main(bench: BenchBus) {
  const { nc, kv, startSet, stopChild } = bench;
  line(`mesh-provisioner bench, ${count(NODES)} nodes: ${cpus().length} × ${cpus()[0]?.model}, ${Math.round(totalmem() / 2 ** 30)} GiB`);
  line(`node ${process.version}, nats-server ${bench.natsVersion}`);
  let set = await startSet();
  const echo = await bench.startEcho();
  const [needs, applied, collect] = await Promise.all([kv("needs"), kv("applied"), kv("collect")]);
  const narrowed = { what: "needs", node: "n5", module: "m3" };

  // A tenth of the data, the set started on it, idle, its RSS.
  const built = performance.now();
  await fill(needs, needsOf(0, FIRST));
  await fill(applied, appliedOf(0, FIRST));
  await fill(collect, collectsOf(0, FIRST));
  let buildMs = performance.now() - built;
  line(`filled ${count(keysOf(FIRST))} keys`);
  /** The RSS of the set just started, after one narrowed request and `IDLE_MS` idle. */
  const rssStarted = async () => {
    await askVerb(nc, narrowed);
    await sleep(IDLE_MS);
    return rssOf(set.process.pid!);
  };
  await stopChild(set.process);
  set = await startSet();
  const rssFirst = await rssStarted();

  // The rest of the data.
  const rest = performance.now();
  await fill(needs, needsOf(FIRST, NODES));
  await fill(applied, appliedOf(FIRST, NODES));
  await fill(collect, collectsOf(FIRST, NODES));
  buildMs += performance.now() - rest;
  line(`filled ${count(keysOf(NODES))} keys in ${(buildMs / 1000).toFixed(1)} s`);

  // Start-to-ready against one unfiltered read of every viewed bucket, medians of 3.
  await stopChild(set.process);
  const readAll: number[] = [];
  for (let i = 0; i < 3; i++) {
    const t = performance.now();
    for (const name of bench.viewed) await watchRead(await kv(name));
    readAll.push(performance.now() - t);
  }
  const readyRuns: number[] = [];
  const spawnRuns: number[] = [];
  for (let i = 0; i < 3; i++) {
    if (i > 0) await stopChild(set.process);
    const spawned = performance.now();
    set = await startSet();
    spawnRuns.push(performance.now() - spawned);
    readyRuns.push(Number(/ready in (\d+) ms/.exec(set.line)![1]));
  }
  const rss = await rssStarted();

  // The narrowed verb against echo.
  const narrowedAt = await latency({ echo: () => askEcho(nc), verb: () => askVerb(nc, narrowed) });
  const check = await askVerb(nc, narrowed);
  if (check.entries.length !== PER_MODULE) throw new Error(`the narrowed verb answered ${check.entries.length} entries, not ${PER_MODULE}`);

  // Every needs key through the pages, against one unfiltered watch of the bucket.
  const pagedRuns: number[] = [];
  const watchRuns: number[] = [];
  let pages = 0;
  for (let i = 0; i < 3; i++) {
    let t = performance.now();
    let n = 0;
    let cursor: string | undefined;
    pages = 0;
    do {
      const page = await askVerb(nc, { what: "needs", limit: 10_000, ...(cursor ? { cursor } : {}) });
      n += page.entries.length;
      cursor = page.next;
      pages++;
    } while (cursor !== undefined);
    pagedRuns.push(performance.now() - t);
    if (n !== NODES * MODULES * PER_MODULE) throw new Error(`the pages held ${n} keys`);
    t = performance.now();
    const watched = await watchRead(needs);
    watchRuns.push(performance.now() - t);
    if (watched !== NODES * MODULES * PER_MODULE) throw new Error(`the watch read ${watched} keys`);
  }
  await sleep(IDLE_MS);
  const rssAfterRequests = rssOf(set.process.pid!);
  await stopChild(echo.process);

  const readyMs = median(readyRuns);
  const readAllMs = median(readAll);
  const paged = median(pagedRuns);
  const watched = median(watchRuns);
  const slope = (rss - rssFirst) / (keysOf(NODES) - keysOf(FIRST));
  const echoP50 = narrowedAt.echo!.p50;
  const verbP50 = narrowedAt.verb!.p50;
  const needsKeys = count(NODES * MODULES * PER_MODULE);
  const rows: [string, string][] = [
    [
      `data: ${needsKeys} needs, ${count(NODES * MODULES)} applied, ${count(NODES * 10)} collect keys, built in`,
      `${(buildMs / 1000).toFixed(1)} s`,
    ],
    [
      `RSS of the set started, one request, 10 s idle: ${count(keysOf(FIRST))} keys · ${count(keysOf(NODES))} keys`,
      `${(rssFirst / 1e6).toFixed(0)} MB · ${(rss / 1e6).toFixed(0)} MB`,
    ],
    ["RSS a key, the slope between them", `${slope.toFixed(0)} B`],
    ["RSS of the set after the requests below and 10 s idle", `${(rssAfterRequests / 1e6).toFixed(0)} MB`],
    [
      "start-to-ready · process spawn-to-ready · read all viewed buckets (medians of 3)",
      `${readyMs} ms · ${Math.round(median(spawnRuns))} ms · ${Math.round(readAllMs)} ms`,
    ],
    ["narrowed verb p50 (10 keys) · echo p50", `${ms(verbP50)} · ${ms(echoP50)}`],
    [`all ${needsKeys} needs: verb pages (${pages}) · one unfiltered watch`, `${ms(paged)} · ${ms(watched)}`],
  ];
  const targets = [
    ["RSS of the set (MB)", rss / 1e6, "≤ 400", rss / 1e6 <= 400],
    ["RSS a key, slope (bytes)", slope, "≤ 250", slope <= 250],
    ["start-to-ready / one read of all viewed buckets", readyMs / readAllMs, "≤ 1.5", readyMs / readAllMs <= 1.5],
    ["narrowed verb p50 / echo p50", verbP50 / echoP50, "≤ 2.5", verbP50 / echoP50 <= 2.5],
    ["all needs: pages / one unfiltered watch", paged / watched, "≤ 1.2", paged / watched <= 1.2],
    ["data built (s)", buildMs / 1000, "< 120", buildMs < 120_000],
  ] as const;
  const width = Math.max(...rows.map(([k]) => k.length), ...targets.map(([k]) => k.length));
  line("");
  line("| figure | value |");
  line("|---|---|");
  for (const [k, v] of rows) line(`| ${k.padEnd(width)} | ${v} |`);
  line("");
  line("| target | figure | wanted | met |");
  line("|---|---|---|---|");
  for (const [k, figure, wanted, met] of targets) line(`| ${k.padEnd(width)} | ${figure.toFixed(3)} | ${wanted} | ${met ? "yes" : "NO"} |`);
  const figures = {
    machine: {
      cpus: cpus().length,
      model: cpus()[0]?.model,
      memoryGiB: Math.round(totalmem() / 2 ** 30),
      node: process.version,
      natsServer: bench.natsVersion,
    },
    at: new Date().toISOString(),
    nodes: NODES,
    keys: { first: keysOf(FIRST), whole: keysOf(NODES) },
    buildMs,
    rssBytes: { first: rssFirst, whole: rss, slopeBytesPerKey: slope, afterRequests: rssAfterRequests },
    startToReady: {
      readyMs,
      readyRuns,
      processSpawnToReadyMs: median(spawnRuns),
      spawnRuns,
      unfilteredReadOfViewedBucketsMs: readAllMs,
      readAllRuns: readAll,
    },
    narrowed: narrowedAt,
    pagedAllNeeds: { ms: paged, pages, runs: pagedRuns },
    unfilteredWatchNeeds: { ms: watched, runs: watchRuns },
    targets: targets.map(([target, figure, wanted, met]) => ({ target, figure, wanted, met })),
  };
  writeFileSync(RESULTS, `${JSON.stringify(figures, null, 2)}\n`);
  line(`\nwritten to ${RESULTS}`);
}

const bench = await openBench();
try {
  await main(bench);
} finally {
  await bench.stop();
}
