/**
 * `npm run bench:start [-- <node binary>…]`: what a start and one command line call cost, on the
 * machine's Node and on each Node binary given (docs/scale.md §11.2.3). For each: Node's bare
 * start; the empty set's spawn to ready and its own `ready in` (medians of 3, the compile cache
 * filled by a first start), their ratio against the set's own start plus Node's; and the wall
 * time of `mesh-provisioner status` and `mesh-provisioner ask needs --node n5` from spawn to
 * exit (medians of 5). Figures, not tests: nothing fails on a figure.
 */
import { execFileSync, spawnSync } from "node:child_process";
import { join } from "node:path";
import { emptyFigures, line, median, ms, openBench, ROOT } from "./harness.ts";

const others = process.argv.slice(2);
if (others.length > 0) {
  // Each binary runs this same bench, alone.
  for (const node of [process.execPath, ...others]) {
    execFileSync(node, ["--import", "tsx", import.meta.filename], { cwd: ROOT, stdio: "inherit" });
  }
  process.exit(0);
}

const bench = await openBench();
try {
  line(`start bench: node ${process.version} (${process.execPath})`);
  // A first start fills the compile cache where Node has one (22.1 and later).
  await bench.stopChild((await bench.startSet()).process);
  const { figures, set } = await emptyFigures(bench, 0);
  const ratio = figures.processSpawnToReadyMs / (figures.readyMs + figures.bareNodeStartMs);
  line(
    `  bare start ${ms(figures.bareNodeStartMs)} · set spawn to ready ${ms(figures.processSpawnToReadyMs)} · its own start ${ms(figures.readyMs)} · ratio ${ratio.toFixed(2)} (target ≤ 1.2)`,
  );
  const env = { ...process.env, NATS_URL: bench.server.url, NATS_USER: bench.benchUser.user, NATS_PASSWORD: bench.benchUser.pass };
  const wall = (args: string[]) => {
    const runs: number[] = [];
    for (let i = 0; i < 5; i++) {
      const t = performance.now();
      const run = spawnSync(process.execPath, [join(ROOT, "bin", "mesh-provisioner.mjs"), ...args], { cwd: ROOT, env, encoding: "utf8" });
      runs.push(performance.now() - t);
      if (run.error !== undefined || (run.status !== 0 && run.status !== 1)) throw new Error(`${args.join(" ")}: ${run.stderr}`);
    }
    return median(runs);
  };
  line(
    `  command line, spawn to exit: status ${ms(wall(["status"]))} · ask needs --node n5 ${ms(wall(["ask", "needs", "--node", "n5"]))} (target ≤ 500 ms)`,
  );
  await bench.stopChild(set.process);
} finally {
  await bench.stop();
}
