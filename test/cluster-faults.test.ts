import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { FAULTS, judge, losses, startScene, type Fault, type Scene } from "./faults/scenario.ts";
import { canMakeHosts } from "./hosts.ts";

// Three nats-servers 2.9.10 in network namespaces, every bucket and the events stream with 3
// replicas, two replicas of the set started at the same moment on hosts 1 and 2, node writers,
// a provider's events and readers throughout; faults made for real, one after the other
// (docs/runtime.md §6.14 says what the set does under each; `npm run faults` runs more kinds).

let scene: Scene | undefined;

/**
 * Makes `fault`, then holds the set to its rules over the fault's run: no fresh answer missing
 * an acknowledged write, `/readyz` never ready while a replica could not answer fresh, every
 * fresh read answering again from 10 s after the servers recovered, by every reader.
 */
async function survives(fault: Fault): Promise<void> {
  const made = await fault.make(scene!);
  const judged = await judge(scene!, fault.name, made);
  const logs = scene!.logs();
  expect(judged.missed.first, logs).toEqual([]);
  expect(judged.readyWhileFailing, logs).toBe(0);
  expect(judged.refusedAfterRecovery.slice(0, 5), logs).toEqual([]);
  // Every reader, over NATS through each server and over HTTP to each replica, answered meanwhile.
  expect(judged.answeringAfterRecovery).toEqual(["A", "B", "hosts-1", "hosts-2", "hosts-3"]);
}

describe.skipIf(!canMakeHosts)("two replicas of the set on three servers in network namespaces, under faults (as root)", () => {
  beforeAll(async () => {
    scene = await startScene({ count: 2 });
  }, 120_000);

  afterAll(async () => {
    await scene?.stop();
  }, 60_000);

  it("both became ready, started at the same moment, and answer fresh", () => {
    const { recording } = scene!.workload;
    expect(recording.answers.filter((a) => a.ok).length).toBeGreaterThan(50);
    expect(recording.writes.length).toBeGreaterThan(50);
  });

  it("partition of the needs stream's leader, the server of replica A, for 20 s", () => survives(FAULTS.partitionLeader), 240_000);

  it("SIGSTOP of the needs stream's leader, the server of replica B, for 15 s", () => survives(FAULTS.pauseLeader), 240_000);

  it("partition of a minority server, with no replica of the set on it, for 20 s", () => survives(FAULTS.partitionMinority), 240_000);

  it("lost no acknowledged write and no acknowledged event", async () => {
    const lost = await losses(scene!);
    expect(lost.writes, `${JSON.stringify(lost.replicas)}\n${scene!.logs()}`).toEqual([]);
    expect(lost.events.slice(0, 10), scene!.logs()).toEqual([]);
  }, 120_000);
});
