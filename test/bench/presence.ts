/**
 * `npm run bench:presence`: what presence and checks cost (docs/presence.md §16.4). On one
 * embedded nats-server with 100,000 needs (1,000 nodes of 10 modules), the function set as
 * `npm start` runs it: its CPU share and RSS while 10,000 nodes write presence every 15 s
 * (about 670 writes a second), against the same with none, status asked once a second in
 * both; `what=nodes` narrowed to one node and the state of one node with checks, each p50 against
 * one echo round trip, in three rounds once the set is quiet (the median ratio the figure;
 * `BENCH_PRESENCE_ROUNDS=<n>` for more); and
 * how long 1,000 checks failing at once take to show in status.
 * Figures, not tests: nothing fails on a figure.
 */
import { readFileSync } from "node:fs";
import { cpus } from "node:os";
import { STATUS } from "../../functions/_lib/status.ts";
import { STATE_VIEWS } from "../../functions/_lib/state.ts";
import { requesterOf } from "../../runtime/publisher.ts";
import { askEcho, askVerb, count, fill, latency, line, median, ms, needsOf, openBench, rssOf, sleep } from "./harness.ts";

const NODES_WITH_NEEDS = 1000;
const PRESENT_NODES = 10_000;
const EVERY_SECONDS = 15;
const MEASURE_MS = 20_000;
const CHECKS = 1000;
/** How many rounds of p50s the latency figures are the median of. */
const ROUNDS = Number(process.env.BENCH_PRESENCE_ROUNDS ?? 3);

/** The CPU time of `pid` so far (user and system), in seconds. */
const cpuOf = (pid: number) => {
  const fields = readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1]!.split(" ");
  return (Number(fields[11]) + Number(fields[12])) / 100;
};

const bench = await openBench();
try {
  const { nc } = bench;
  const js = nc.jetstream();
  line(`presence bench: ${cpus().length} × ${cpus()[0]?.model}, node ${process.version}, nats-server ${bench.natsVersion}`);
  let set = await bench.startSet();
  await fill(await bench.kv("needs"), needsOf(0, NODES_WITH_NEEDS));
  line(`filled needs: ${count(NODES_WITH_NEEDS * 100)} keys`);
  // Started again on what is there, as a set runs on a mesh that has it.
  await bench.stopChild(set.process);
  set = await bench.startSet();
  await bench.startEcho();
  const pid = set.process.pid!;
  const ask = (body: unknown) => askVerb(nc, body);
  const status = () => nc.request(STATUS, "{}", { timeout: 30_000 }).then((m) => m.json<{ checks: { failing: number } }>());

  /** The set's CPU share (of one core) and RSS over {@link MEASURE_MS}, status asked every second, `load` running meanwhile. */
  const measure = async (load: (until: number) => Promise<void>) => {
    await status();
    const cpu0 = cpuOf(pid);
    const t0 = performance.now();
    const until = t0 + MEASURE_MS;
    const asking = (async () => {
      while (performance.now() < until) {
        await status();
        await sleep(1000);
      }
    })();
    await Promise.all([load(until), asking]);
    return { cpu: (cpuOf(pid) - cpu0) / ((performance.now() - t0) / 1000), rss: rssOf(pid) };
  };
  const quiet = await measure(async () => {});
  line(`without presence: CPU ${(quiet.cpu * 100).toFixed(1)} % of a core, RSS ${(quiet.rss / 2 ** 20).toFixed(0)} MiB`);

  // Every node once, then each again every 15 s: PRESENT_NODES / EVERY_SECONDS writes a second, spread evenly.
  const value = JSON.stringify({ everySeconds: EVERY_SECONDS, client: "bench" });
  const writePresence = async (from: number, to: number) => {
    for (let i = from; i < to; i++) nc.publish(`$KV.mesh-provisioner_presence.n${i % PRESENT_NODES}`, value);
    await nc.flush();
  };
  await writePresence(0, PRESENT_NODES);
  let written = PRESENT_NODES;
  const presenceLoad = async (until: number) => {
    const perTick = Math.ceil(PRESENT_NODES / EVERY_SECONDS / 10);
    while (performance.now() < until) {
      await writePresence(written, written + perTick);
      written += perTick;
      await sleep(100);
    }
  };
  await measure(presenceLoad); // warm: the view and the kept presence take the first round
  const loaded = await measure(presenceLoad);
  line(
    `with ${count(PRESENT_NODES)} nodes every ${EVERY_SECONDS} s: CPU ${(loaded.cpu * 100).toFixed(1)} % of a core, RSS ${(loaded.rss / 2 ** 20).toFixed(0)} MiB`,
  );

  // One node's checks: each of its 10 modules checked a provision.
  await Promise.all(
    Array.from({ length: 10 }, (_, m) =>
      js.publish(
        "mesh-provisioner.checked.n5",
        JSON.stringify({ module: `m${m}`, provision: "postgres", ok: m !== 3, at: new Date().toISOString() }),
      ),
    ),
  );
  // Once the set is quiet (what the presence writes left it to do done: under 5 % of a core for a
  // second, 30 s at most), ROUNDS rounds of p50s; the median ratio of each is the figure.
  for (let waited = 0; waited < 30; waited++) {
    const cpu0 = cpuOf(pid);
    await sleep(1000);
    if (cpuOf(pid) - cpu0 < 0.05) break;
  }
  // The parts of the state's floor (docs/scale.md §11.6): the freshness probes of its eight views
  // asked together from the bench as the set asks them (direct gets of nothing after a sequence,
  // on the connection's one requester), and the state answered from what the set holds.
  const probe = requesterOf(nc);
  const probeBody = `{"seq":${Number.MAX_SAFE_INTEGER},"next_by_subj":"$KV.none.>"}`;
  const probes = STATE_VIEWS.map((view) => `$JS.API.DIRECT.GET.KV_${bench.config.buckets[view]!.bucket}`);
  const rounds: { echo: number; nodes: number; state: number; probes: number; stale: number }[] = [];
  for (let round = 0; round < ROUNDS; round++) {
    const lat = await latency({
      echo: () => askEcho(nc),
      "nodes, one node": () => ask({ what: "nodes", node: "n5" }),
      "state of one node with checks": () => ask({ what: "state", node: "n5" }),
      "eight probes": () => Promise.all(probes.map((subject) => probe(subject, probeBody))),
      "state, stale": () => ask({ what: "state", node: "n5", stale: true }),
    });
    const r = {
      echo: lat.echo!.p50,
      nodes: lat["nodes, one node"]!.p50,
      state: lat["state of one node with checks"]!.p50,
      probes: lat["eight probes"]!.p50,
      stale: lat["state, stale"]!.p50,
    };
    rounds.push(r);
    line(
      `round ${round + 1}: echo p50 ${ms(r.echo)} · what=nodes narrowed ${ms(r.nodes)} (${(r.nodes / r.echo).toFixed(2)} ×) · state of one node with checks ${ms(r.state)} (${(r.state / r.echo).toFixed(2)} ×)`,
    );
    line(
      `  its floor: the state stale ${ms(r.stale)} + eight probes ${ms(r.probes)} = ${ms(r.stale + r.probes)} (${((r.stale + r.probes) / r.echo).toFixed(2)} ×)`,
    );
  }
  const medianRatio = (of: (r: (typeof rounds)[number]) => number) => median(rounds.map((r) => of(r) / r.echo)).toFixed(2);
  line(`what=nodes narrowed p50 / echo, median of ${ROUNDS} rounds: ${medianRatio((r) => r.nodes)} × (target ≤ 3)`);
  line(`state of one node with checks p50 / echo, median of ${ROUNDS} rounds: ${medianRatio((r) => r.state)} × (target ≤ 3)`);
  line(`  its floor (stale + eight probes) / echo, median of ${ROUNDS} rounds: ${medianRatio((r) => r.stale + r.probes)} ×`);

  // A mesh-wide transition: 1,000 checks failing at once, one a node.
  const before = (await status()).checks.failing;
  const at = new Date().toISOString();
  const t = performance.now();
  await Promise.all(
    Array.from({ length: CHECKS }, (_, n) =>
      js.publish(
        `mesh-provisioner.checked.n${n}`,
        JSON.stringify({ module: "m0", provision: "vault", ok: false, reason: "AuthFailed", at }),
      ),
    ),
  );
  const published = performance.now() - t;
  while ((await status()).checks.failing < before + CHECKS) await sleep(20);
  const shown = performance.now() - t;
  line(
    `${count(CHECKS)} checks failing at once: published in ${ms(published)}, in status after ${(shown / 1000).toFixed(2)} s (target ≤ 2 s)`,
  );
} finally {
  await bench.stop();
}
