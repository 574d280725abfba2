/**
 * `npm run faults`: every fault of scenario.ts on a cluster of its own (three hosts in network
 * namespaces, nats-server 2.9.10, the set's replicas started at the same moment, the workload
 * throughout), judged as the cluster fault test judges them; prints the table that
 * docs/runtime.md §6.14 keeps, and writes it with its figures to test/faults/results.json. Needs
 * root and iproute2. `npm run faults -- <key> …` runs only those faults.
 */
import { writeFileSync } from "node:fs";
import { cpus } from "node:os";
import { join } from "node:path";
import { execFileSync } from "node:child_process";
import { findNatsServer } from "../../runtime/nats-server.ts";
import { ROOT } from "../helpers.ts";
import { FAULTS, judge, losses, RECOVERED_WITHIN_MS, startScene, type Fault, type Judgement, type Losses } from "./scenario.ts";

const asked = process.argv.slice(2);
const unknown = asked.filter((key) => !(key in FAULTS));
if (unknown.length > 0) {
  console.error(`no fault ${unknown.join(", ")}; the faults are: ${Object.keys(FAULTS).join(", ")}`);
  process.exit(2);
}
const keys = (asked.length > 0 ? asked : Object.keys(FAULTS)) as (keyof typeof FAULTS)[];

interface Row {
  readonly key: string;
  readonly judged?: Judgement;
  readonly lost?: Losses;
  readonly error?: string;
}

const seconds = (ms: number) => `${(ms / 1000).toFixed(1)} s`;

/** One fault on a scene of its own; a run that fails says why in its row. */
async function runOne(key: string, fault: Fault): Promise<Row> {
  const scene = await startScene({ count: fault.replicas ?? 2 });
  try {
    const made = await fault.make(scene);
    const judged = await judge(scene, fault.name, made);
    const lost = await losses(scene);
    return { key, judged, lost };
  } catch (err) {
    return { key, error: `${(err as Error).message}\n${scene.logs()}` };
  } finally {
    await scene.stop();
  }
}

const rows: Row[] = [];
for (const key of keys) {
  const fault: Fault = FAULTS[key];
  console.error(`${key}: ${fault.name}`);
  const row = await runOne(key, fault).catch((err: Error) => ({ key, error: err.message }));
  rows.push(row);
  console.error(row.error ? `  failed: ${row.error.split("\n")[0]}` : "  done");
}

const table = [
  "| fault | acknowledged writes / events lost | fresh answers missing acknowledged writes (writes missed) | fresh answers / refused | `/readyz` ready while a replica could not answer fresh | servers back after the fault was undone | refused " +
    `${RECOVERED_WITHIN_MS / 1000} s after the servers were back | longest without a fresh answer (per reader) | the needs stream's replicas at the end |`,
  "|---|---|---|---|---|---|---|---|---|",
  ...rows.map(({ key, judged, lost, error }) => {
    const name = FAULTS[key as keyof typeof FAULTS].name;
    if (judged === undefined || lost === undefined) return `| ${name} | the run failed: ${error?.split("\n")[0]} | | | | | | | |`;
    const gaps = Object.entries(judged.longestGapMs)
      .map(([via, ms]) => `${via} ${seconds(ms)}`)
      .join(", ");
    const same = new Set(lost.replicas).size === 1 ? "equal" : `differ: ${lost.replicas.join(" / ")}`;
    return (
      `| ${name} | ${lost.writes.length} / ${lost.events.length} | ${judged.missed.answers} (${judged.missed.writes}) | ` +
      `${judged.answered} / ${judged.refused} | ${judged.readyWhileFailing} | ${seconds(judged.serversBackMs)} | ` +
      `${judged.refusedAfterRecovery.length} | ${gaps} | ${same} |`
    );
  }),
];
console.log(table.join("\n"));

const server = execFileSync(findNatsServer(), ["--version"], { encoding: "utf8" }).trim();
writeFileSync(
  join(ROOT, "test", "faults", "results.json"),
  `${JSON.stringify({ at: new Date().toISOString(), node: process.version, server, cores: cpus().length, rows, table }, null, 2)}\n`,
);
process.exit(rows.some((r) => r.error !== undefined) ? 1 : 0);
