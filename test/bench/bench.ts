/**
 * `npm run bench`: the function set against its physical floor and against a client reading
 * the buckets itself, in one run on one embedded nats-server. Prints a table of figures and
 * their ratios to the targets, and writes them to `test/bench/results.json`. Figures, not
 * tests: nothing here fails on a figure. See test/bench/README.md.
 *
 * Processes: this one (the server's owner, the data writer, every client), the function set
 * (`mesh-provisioner start`, as it runs in production) and the `echo` responder, each its own.
 */
import { writeFileSync } from "node:fs";
import { cpus, totalmem } from "node:os";
import { join } from "node:path";
import { connect, type NatsConnection } from "nats";
import { invoke, openRunner } from "../../runtime/index.ts";
import { createLogger } from "../../runtime/log.ts";
import { needKey } from "../../client/index.ts";
import { VERB } from "../../functions/_lib/provisioning.ts";
import { STATUS } from "../../functions/_lib/status.ts";
import { demoPageFigures, OWN_BYTES, pageFigures } from "./page.ts";
import { followerFigures } from "./follower.ts";
import {
  appliedOf,
  pagesFigures,
  startFigures,
  askEcho,
  askVerb,
  collectsOf,
  emptyFigures,
  fill,
  latency,
  line,
  median,
  MODULES,
  ms,
  needsOf,
  openBench,
  pageThrough,
  printTables,
  PER_MODULE,
  rssOf,
  watchRead,
  type BenchBus,
} from "./harness.ts";

const RESULTS = join(import.meta.dirname, "results.json");
const NODES = 1000;
const CONCURRENT = 32;
const CONCURRENT_MS = 5000;
/** How long the set is left idle before each RSS figure of the state, in milliseconds. */
const IDLE_MS = 10_000;

/** p50 of `ask` in milliseconds, each of `runs` asked right after `write(i)` was acknowledged (the write not timed). */
async function afterWrites(write: (i: number) => Promise<unknown>, ask: () => Promise<unknown>, runs = 300): Promise<number> {
  const times: number[] = [];
  for (let i = 0; i < runs; i++) {
    await write(i);
    const t = performance.now();
    await ask();
    times.push(performance.now() - t);
  }
  return median(times);
}

/** Requests per second of `CONCURRENT` requesters, each on its own connection, for `CONCURRENT_MS`. */
async function throughput(connections: NatsConnection[], ask: (nc: NatsConnection) => Promise<unknown>): Promise<number> {
  let done = 0;
  const until = performance.now() + CONCURRENT_MS;
  const began = performance.now();
  await Promise.all(
    connections.map(async (nc) => {
      while (performance.now() < until) {
        await ask(nc);
        done++;
      }
    }),
  );
  return done / ((performance.now() - began) / 1000);
}

const encoder = new TextEncoder();

async function main(bench: BenchBus) {
  const { server, nc, natsVersion, benchUser, config, functions, kv, startSet, stopChild } = bench;
  line(`mesh-provisioner bench: ${cpus().length} × ${cpus()[0]?.model}, ${Math.round(totalmem() / 2 ** 30)} GiB, node ${process.version}`);
  line(`nats-server ${natsVersion} at ${server.url}`);
  const js = nc.jetstream();
  const httpPort = bench.httpPort;

  // The set asserts the buckets and streams; the bench then fills them as node clients would.
  let set = await startSet();
  // 0. The set on its empty buckets: RSS and spawn-to-ready, against Node's bare start.
  await stopChild(set.process);
  const empty = await emptyFigures(bench, IDLE_MS);
  set = empty.set;
  const emptyStart = empty.figures.processSpawnToReadyMs / (empty.figures.readyMs + empty.figures.bareNodeStartMs);
  const echo = await bench.startEcho();
  const needs = await kv("needs");

  const narrowed = { what: "needs", node: "n5", module: "m3" };
  const narrowedTasks = (size: string) => ({
    [`echo`]: () => askEcho(nc),
    [`raw-filter ${size}`]: () => watchRead(needs, "n5.m3.>"),
    [`verb ${size}`]: () => askVerb(nc, narrowed),
  });

  // 1. Narrowed needs at 1,000 keys.
  await fill(needs, needsOf(0, (1000 / MODULES / PER_MODULE) | 0));
  line("filled needs: 1,000 keys");
  const at1k = await latency(narrowedTasks("1k"));
  const check = await askVerb(nc, narrowed);
  if (check.entries.length !== PER_MODULE) throw new Error(`the narrowed verb answered ${check.entries.length} entries, not ${PER_MODULE}`);

  // 2. Fill to 100,000 needs, 10,000 applied and 10,000 collect keys.
  await fill(needs, needsOf(10, NODES));
  const applied = await kv("applied");
  const collect = await kv("collect");
  await fill(applied, appliedOf(0, NODES));
  await fill(collect, collectsOf(0, NODES));
  line("filled needs: 100,000 keys; applied: 10,000; collect: 10,000");

  // 3. Start-to-ready with those buckets, against one unfiltered read of every bucket the set views.
  await stopChild(set.process);
  const started = await startFigures(bench);
  set = started.set;
  const { readyMs, processSpawnToReadyMs: processReady, unfilteredReadOfViewedBucketsMs: readAllMs } = started.figures;

  // 4. Narrowed needs at 100,000 keys.
  const at100k = await latency(narrowedTasks("100k"));

  // 5. Every needs key through the pages, against one unfiltered watch of the bucket.
  const paging = await pagesFigures(nc, needs, NODES * MODULES * PER_MODULE);
  const { pages, pagedMs: paged, watchedMs: watched } = paging;

  // 6. 32 concurrent requesters for 5 s each.
  const connections = await Promise.all(Array.from({ length: CONCURRENT }, () => connect({ servers: server.url, ...benchUser })));
  // Both answers taken as they come (the verb's checked for a refusal, not parsed): what is
  // measured is the responder. Alternated, three times each, to even out the machine's noise.
  const narrowedBody = encoder.encode(JSON.stringify(narrowed));
  const askVerbRaw = async (conn: NatsConnection) => {
    const m = await conn.request(VERB, narrowedBody, { timeout: 30_000 });
    if (m.headers?.get("Nats-Service-Error-Code")) throw new Error(`verb refused: ${m.headers.get("Nats-Service-Error")}`);
  };
  const echoRuns: number[] = [];
  const verbRuns: number[] = [];
  for (let i = 0; i < 3; i++) {
    echoRuns.push(await throughput(connections, askEcho));
    verbRuns.push(await throughput(connections, askVerbRaw));
  }
  const echoRps = median(echoRuns);
  const verbRps = median(verbRuns);
  await Promise.all(connections.map((c) => c.close()));
  // After every read above: the views and whatever the functions keep of them.
  const rss = rssOf(set.process.pid!);

  // 6b. Provisioning state (docs/state.md §7): every module of every node assigned, 10,000.
  await fill(
    await kv("assignments"),
    (function* () {
      for (let n = 0; n < NODES; n++) for (let m = 0; m < MODULES; m++) yield [`n${n}.m${m}`, '{"plan":{}}'] as [string, string];
    })(),
  );
  line("filled assignments: 10,000 modules");
  // Both RSS figures after the set was idle a while: what it holds, not the young generation V8
  // grew under the last requests' garbage (it shrinks it again once idle).
  await new Promise((r) => setTimeout(r, IDLE_MS));
  const rssWithoutState = rssOf(set.process.pid!);
  const askStatusOf = (conn: NatsConnection) =>
    conn.request(STATUS, encoder.encode("{}"), { timeout: 30_000 }).then((m) => {
      if (m.headers?.get("Nats-Service-Error-Code")) throw new Error(`status refused: ${m.headers.get("Nats-Service-Error")}`);
    });
  const firstState = performance.now();
  const nodeStates = await askVerb(nc, { what: "state", node: "n5" });
  const firstStateMs = performance.now() - firstState;
  if (nodeStates.entries.length !== MODULES) throw new Error(`state of n5 answered ${nodeStates.entries.length} modules, not ${MODULES}`);
  // What holding the state costs: the model made, the set idle again.
  await new Promise((r) => setTimeout(r, IDLE_MS));
  const rssWithState = rssOf(set.process.pid!);
  const states = await latency({
    echo: () => askEcho(nc),
    "state of one node": () => askVerb(nc, { what: "state", node: "n5" }),
    status: () => askStatusOf(nc),
  });
  // After each change: one need of another node written (and acknowledged) before each request,
  // so the model is brought up to date by each (docs/state.md §7.5).
  const changedStates = await afterWrites(
    (i) => needs.put(needKey("n7", "m1", `\${config:v${i % 10}}`), JSON.stringify({ v: i })),
    () => askVerb(nc, { what: "state", node: "n5" }),
  );
  const changedStatus = await afterWrites(
    (i) => needs.put(needKey("n7", "m1", `\${config:v${i % 10}}`), JSON.stringify({ v: i })),
    () => askStatusOf(nc),
  );
  const statePagedRuns: number[] = [];
  let statePages = 0;
  for (let i = 0; i < 3; i++) {
    const t = performance.now();
    let count: number;
    ({ entries: count, pages: statePages } = await pageThrough(nc, "state"));
    statePagedRuns.push(performance.now() - t);
    if (count !== NODES * MODULES) throw new Error(`the state pages held ${count} modules`);
  }
  await new Promise((r) => setTimeout(r, IDLE_MS));
  const rssAfterStateRequests = rssOf(set.process.pid!);
  // The page with every module of 1,000 nodes assigned (docs/page.md §10.5), after the state's figures.
  const page1k = await pageFigures(`http://127.0.0.1:${httpPort}`);

  // 6c. Holders and a rotation (docs/rotation.md §8): a provision of 10 holders among the 100,000
  // needs, and one held by 1,000 modules on 1,000 nodes.
  await fill(
    needs,
    (function* () {
      for (let n = 0; n < 10; n++) yield [needKey(`n${n}`, "m1", "${secret:few:key}"), "{}"] as [string, string];
      for (let n = 0; n < NODES; n++) yield [needKey(`n${n}`, "m2", "${bound:rot:secret}"), "{}"] as [string, string];
    })(),
  );
  const holdersOfFew = await askVerb(nc, { what: "holders", provision: "few" });
  if (holdersOfFew.entries.length !== 10) throw new Error(`holders of few: ${holdersOfFew.entries.length}, not 10`);
  const holders = await latency({
    echo: () => askEcho(nc),
    "holders of one provision": () => askVerb(nc, { what: "holders", provision: "few" }),
  });
  const changedHolders = await afterWrites(
    (i) => needs.put(needKey("n7", "m1", `\${config:v${i % 10}}`), JSON.stringify({ v: i })),
    () => askVerb(nc, { what: "holders", provision: "few" }),
  );
  const noticed = new Set<string>();
  let lastNotice = 0;
  let releasedAt = 0;
  const refresh = nc.subscribe("mesh-provisioner.refresh.>", {
    callback: (_err, m) => {
      noticed.add(m.subject);
      lastNotice = performance.now();
    },
  });
  const release = nc.subscribe("mesh-provisioner.released.bench", { callback: () => (releasedAt = performance.now()) });
  await nc.flush();
  await js.publish(
    "bench.provisioner.rotated",
    encoder.encode(JSON.stringify({ provision: "rot", revision: "v2", at: new Date().toISOString() })),
  );
  const rotatedAck = performance.now();
  while (noticed.size < NODES && performance.now() - rotatedAck < 30_000) await new Promise((r) => setTimeout(r, 5));
  if (noticed.size < NODES) throw new Error(`only ${noticed.size} nodes noticed`);
  const toLastNotice = lastNotice - rotatedAck;
  await fill(
    applied,
    (function* () {
      for (let n = 0; n < NODES; n++) yield [`n${n}.m2`, JSON.stringify({ revisions: { rot: "v2" } })] as [string, string];
    })(),
  );
  const lastApplied = performance.now();
  while (releasedAt === 0 && performance.now() - lastApplied < 30_000) await new Promise((r) => setTimeout(r, 5));
  if (releasedAt === 0) throw new Error("the rotation was not released");
  const toRelease = releasedAt - lastApplied;
  refresh.unsubscribe();
  release.unsubscribe();

  // 7. A steady registry compile: nothing changed, the registry read and compared.
  const seat = await connect({
    servers: server.url,
    user: server.seat.user,
    pass: server.seat.password,
    inboxPrefix: `_INBOX.${server.seat.user}`,
  });
  const runner = await openRunner({ nc: seat, config, log: createLogger({ LOG_LEVEL: "silent" }) });
  const compile = functions.find((fn) => fn.name === "registry-compile")!;
  const compiles = await latency({ "registry compile": () => invoke(runner, compile) });
  await seat.close();

  // 8. 10,000 failing/recovered events through the follower, against a bare durable-consumer ack loop.
  await stopChild(set.process);
  const follower = await followerFigures(nc, config, functions, async () => (await startSet()).process);
  const { followerEventsPerSecond: followerRate, ackLoopEventsPerSecond: loopRate, storeLoopEventsPerSecond: storeRate } = follower;

  await stopChild(echo.process);
  await nc.close();
  // The demo mesh's page, on a server of its own.
  const pageDemo = await demoPageFigures();

  // The table.
  const echo100k = at100k.echo!.p50;
  const verb100k = at100k["verb 100k"]!.p50;
  const raw100k = at100k["raw-filter 100k"]!.p50;
  const verb1k = at1k["verb 1k"]!.p50;
  const figures = {
    machine: {
      cpus: cpus().length,
      model: cpus()[0]?.model,
      memoryGiB: Math.round(totalmem() / 2 ** 30),
      node: process.version,
      natsServer: natsVersion,
    },
    at: new Date().toISOString(),
    narrowed1k: at1k,
    narrowed100k: at100k,
    pagedAllNeeds: { ms: paged, pages, runs: paging.pagedRuns },
    unfilteredWatchNeeds: { ms: watched, runs: paging.watchRuns },
    concurrent: { requesters: CONCURRENT, seconds: CONCURRENT_MS / 1000, echoRps, verbRps, echoRuns, verbRuns },
    registryCompile: compiles["registry compile"],
    follower,
    rssBytes: rss,
    page: { demo: pageDemo, nodes1k: page1k, ownBytes: OWN_BYTES },
    rotation: { holders, heldBy: NODES, toLastNoticeMs: toLastNotice, toReleaseMs: toRelease },
    state: {
      modules: NODES * MODULES,
      firstRequestMs: firstStateMs,
      latency: states,
      pagedAllMs: median(statePagedRuns),
      pages: statePages,
      runs: statePagedRuns,
      afterWriteP50Ms: { stateOfOneNode: changedStates, status: changedStatus, holders: changedHolders },
      rssWithoutStateBytes: rssWithoutState,
      rssWithStateBytes: rssWithState,
      rssAfterStateRequestsBytes: rssAfterStateRequests,
    },
    startToReady: { ...started.figures, buckets: bench.viewed },
    empty: empty.figures,
  };
  const targets = [
    ["empty set: RSS (MB)", empty.figures.rssBytes / 1e6, "≤ 75", empty.figures.rssBytes / 1e6 <= 75],
    ["empty set: spawn-to-ready / (start-to-ready + Node's bare start)", emptyStart, "≤ 1.2", emptyStart <= 1.2],
    ["narrowed 100k: verb p50 / echo p50", verb100k / echo100k, "≤ 3", verb100k / echo100k <= 3],
    ["narrowed 100k: verb p50 / raw-filter p50", verb100k / raw100k, "≤ 0.1", verb100k / raw100k <= 0.1],
    ["verb p50 100k / verb p50 1k", verb100k / verb1k, "≤ 1.5", verb100k / verb1k <= 1.5],
    ["all needs: pages / one unfiltered watch", paged / watched, "≤ 1.2", paged / watched <= 1.2],
    ["32 requesters: verb / echo requests/s", verbRps / echoRps, "≥ 0.5", verbRps / echoRps >= 0.5],
    ["events/s: follower / bare ack loop", followerRate / loopRate, "≥ 0.5", followerRate / loopRate >= 0.5],
    ["(events/s: put-then-ack loop / bare ack loop)", storeRate / loopRate, "-", true],
    ["events/s: follower / put-then-ack loop", followerRate / storeRate, "≥ 0.8", followerRate / storeRate >= 0.8],
    ["RSS of the running set (MB)", rss / 1e6, "≤ 300", rss / 1e6 <= 300],
    [
      "state of one node p50 / echo p50",
      states["state of one node"]!.p50 / states.echo!.p50,
      "≤ 3",
      states["state of one node"]!.p50 / states.echo!.p50 <= 3,
    ],
    ["status p50 / echo p50", states.status!.p50 / states.echo!.p50, "≤ 5", states.status!.p50 / states.echo!.p50 <= 5],
    ["(after a write: state of one node p50 / echo p50)", changedStates / states.echo!.p50, "-", true],
    ["(after a write: status p50 / echo p50)", changedStatus / states.echo!.p50, "-", true],
    ["(after a write: holders of one provision p50 / echo p50)", changedHolders / holders.echo!.p50, "-", true],
    [
      "every module's state: pages / one unfiltered watch of needs",
      median(statePagedRuns) / watched,
      "≤ 1.5",
      median(statePagedRuns) / watched <= 1.5,
    ],
    ["RSS with the state / without", rssWithState / rssWithoutState, "≤ 1.2", rssWithState / rssWithoutState <= 1.2],
    ["(RSS after the state's requests / without)", rssAfterStateRequests / rssWithoutState, "-", true],
    [
      "holders of one provision p50 / echo p50",
      holders["holders of one provision"]!.p50 / holders.echo!.p50,
      "≤ 3",
      holders["holders of one provision"]!.p50 / holders.echo!.p50 <= 3,
    ],
    ["rotation of 1,000 holders: acknowledged → last notice (s)", toLastNotice / 1000, "≤ 2", toLastNotice <= 2000],
    ["rotation of 1,000 holders: last applied record → release (s)", toRelease / 1000, "≤ 2", toRelease <= 2000],
    ["start-to-ready / one read of all viewed buckets", readyMs / readAllMs, "≤ 1.5", readyMs / readAllMs <= 1.5],
  ] as const;

  const rows: [string, string][] = [
    [
      "empty set: spawn-to-ready · start-to-ready · Node's bare start (medians) · RSS after 10 s idle",
      `${Math.round(empty.figures.processSpawnToReadyMs)} ms · ${empty.figures.readyMs} ms · ${Math.round(empty.figures.bareNodeStartMs)} ms · ${(empty.figures.rssBytes / 1e6).toFixed(0)} MB`,
    ],
    ["echo p50 (1k · 100k)", `${ms(at1k.echo!.p50)} · ${ms(echo100k)}`],
    ["raw-filter p50, 10 keys (1k · 100k)", `${ms(at1k["raw-filter 1k"]!.p50)} · ${ms(raw100k)}`],
    ["verb p50, 10 keys (1k · 100k)", `${ms(verb1k)} · ${ms(verb100k)}`],
    [`all 100,000 needs: verb pages (${pages}) · one unfiltered watch`, `${ms(paged)} · ${ms(watched)}`],
    [
      `${CONCURRENT} requesters, ${CONCURRENT_MS / 1000} s: echo · verb (medians of 3)`,
      `${Math.round(echoRps)} · ${Math.round(verbRps)} requests/s`,
    ],
    ["registry compile, steady (p50)", ms(compiles["registry compile"]!.p50)],
    [
      `${follower.events.toLocaleString("en-US")} events: follower · bare ack loop · put-then-ack loop (medians of 3 runs)`,
      `${Math.round(followerRate)} · ${Math.round(loopRate)} · ${Math.round(storeRate)} events/s`,
    ],
    ["RSS of the set: 100k needs, 10k applied, 10k collect", `${(rss / 1e6).toFixed(0)} MB`],
    [
      "state, 10,000 modules: first request · one node p50 · status p50 · echo p50",
      `${ms(firstStateMs)} · ${ms(states["state of one node"]!.p50)} · ${ms(states.status!.p50)} · ${ms(states.echo!.p50)}`,
    ],
    [
      "each right after one need written: state of one node · status · holders of one provision (p50 of 300)",
      `${ms(changedStates)} · ${ms(changedStatus)} · ${ms(changedHolders)}`,
    ],
    [`every module's state: pages (${statePages}) · one unfiltered watch of needs`, `${ms(median(statePagedRuns))} · ${ms(watched)}`],
    [
      "holders of one provision (10 of 100,000 needs) p50 · echo p50",
      `${ms(holders["holders of one provision"]!.p50)} · ${ms(holders.echo!.p50)}`,
    ],
    ["rotation held by 1,000 modules on 1,000 nodes: to the last notice · to the release", `${ms(toLastNotice)} · ${ms(toRelease)}`],
    [
      "RSS without · with the state · after its requests (10,000 assigned modules; each after 10 s idle)",
      `${(rssWithoutState / 1e6).toFixed(0)} MB · ${(rssWithState / 1e6).toFixed(0)} MB · ${(rssAfterStateRequests / 1e6).toFixed(0)} MB`,
    ],
    [
      "page GET /: render p50 · HTML · parts JSON (demo mesh)",
      `${ms(pageDemo.p50Ms)} · ${pageDemo.htmlBytes} B · ${pageDemo.partsBytes} B`,
    ],
    [
      "page GET /: render p50 · HTML · parts JSON (1,000 nodes, 10,000 modules)",
      `${ms(page1k.p50Ms)} · ${page1k.htmlBytes} B · ${page1k.partsBytes} B`,
    ],
    ["page's own style · script", `${OWN_BYTES.style} B · ${OWN_BYTES.script} B`],
    [
      "start-to-ready · process spawn-to-ready · read all viewed buckets (medians of 3)",
      `${readyMs} ms · ${Math.round(processReady)} ms · ${Math.round(readAllMs)} ms`,
    ],
  ];
  printTables(rows, targets);
  writeFileSync(
    RESULTS,
    `${JSON.stringify({ ...figures, targets: targets.filter(([, , wanted]) => wanted !== "-").map(([target, ratio, wanted, met]) => ({ target, ratio, wanted, met })) }, null, 2)}\n`,
  );
  line(`\nwritten to ${RESULTS}`);
}

const bench = await openBench();
try {
  await main(bench);
} finally {
  await bench.stop();
}
