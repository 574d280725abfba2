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
  MODULES,
  ms,
  needsOf,
  openBench,
  printTables,
  pagesFigures,
  PER_MODULE,
  rssOf,
  sleep,
  startFigures,
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
  const started = await startFigures(bench);
  set = started.set;
  const rss = await rssStarted();

  // The narrowed verb against echo.
  const narrowedAt = await latency({ echo: () => askEcho(nc), verb: () => askVerb(nc, narrowed) });
  const check = await askVerb(nc, narrowed);
  if (check.entries.length !== PER_MODULE) throw new Error(`the narrowed verb answered ${check.entries.length} entries, not ${PER_MODULE}`);

  // Every needs key through the pages, against one unfiltered watch of the bucket.
  const paging = await pagesFigures(nc, needs, NODES * MODULES * PER_MODULE);
  await sleep(IDLE_MS);
  const rssAfterRequests = rssOf(set.process.pid!);
  await stopChild(echo.process);

  const { readyMs, unfilteredReadOfViewedBucketsMs: readAllMs } = started.figures;
  const { pages, pagedMs: paged, watchedMs: watched } = paging;
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
      `${readyMs} ms · ${Math.round(started.figures.processSpawnToReadyMs)} ms · ${Math.round(readAllMs)} ms`,
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
  printTables(rows, targets, "figure");
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
    startToReady: started.figures,
    narrowed: narrowedAt,
    pagedAllNeeds: { ms: paged, pages, runs: paging.pagedRuns },
    unfilteredWatchNeeds: { ms: watched, runs: paging.watchRuns },
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
