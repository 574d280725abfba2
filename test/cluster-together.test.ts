import { spawn, type ChildProcess } from "node:child_process";
import { join } from "node:path";
import { afterEach, describe, it } from "vitest";
import { startTestCluster, type TestCluster } from "../runtime/testing.ts";
import { bannerUrl, killGroups, projectConfig, ROOT, SHIPPED_CONFIG } from "./helpers.ts";

const BIN = join(ROOT, "bin", "mesh-provisioner.mjs");
const ROUNDS = 10;
/** How long a replica may say it is not ready after its banner, in milliseconds. */
const READY_MS = 15_000;

/** Every replica spawned and still to be killed, and the cluster of the round. */
const spawned: ChildProcess[] = [];
let tc: TestCluster | undefined;

afterEach(async () => {
  killGroups(spawned);
  await tc?.stop();
  tc = undefined;
});

/**
 * Starts a replica as an operator does, `mesh-provisioner start` on server `n` only, in a process
 * group of its own; resolves with its HTTP URL once it prints its banner, rejects with its
 * stderr when it exits first. Each round takes about 5 s: the cluster 0.5 s, the two processes'
 * start 3 s (Node and the sources' transpiling on the machine's cores), 5 s more when a request
 * to the new cluster goes unanswered (nats.js's request timeout) and is asked again.
 */
function startReplica(cluster: TestCluster, n: number, round: number): Promise<string> {
  const child = spawn("node", [BIN, "-c", SHIPPED_CONFIG, "start"], {
    cwd: ROOT,
    detached: true,
    env: {
      ...process.env,
      NATS_URL: cluster.cluster.urls[n - 1],
      NATS_USER: cluster.cluster.seat.user,
      NATS_PASSWORD: cluster.cluster.seat.password,
      NATS_REPLICAS: "3",
      HTTP_PORT: "0",
      LOG_LEVEL: "warn",
    },
  });
  spawned.push(child);
  // Its log lines are read and dropped: a pipe nobody reads would hold the replica's writes.
  child.stdout!.resume();
  return bannerUrl(child, `round ${round}: the replica on server ${n}`);
}

/** Waits until `GET /readyz` answers 200, for at most {@link READY_MS}; throws with the reasons it last gave. */
async function ready(url: string, round: number): Promise<void> {
  const deadline = Date.now() + READY_MS;
  for (;;) {
    const readyz = await fetch(`${url}/readyz`);
    if (readyz.status === 200) return;
    const { reasons } = (await readyz.json()) as { reasons?: string[] };
    if (Date.now() > deadline) throw new Error(`round ${round}: ${url} not ready within ${READY_MS} ms: ${reasons?.join("; ")}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

describe("two replicas started together on a fresh 3-server cluster with replicas 3", () => {
  it(`both become ready, ${ROUNDS} times in a row`, async () => {
    const config = await projectConfig();
    for (let round = 1; round <= ROUNDS; round++) {
      tc = await startTestCluster(config);
      const urls = await Promise.all([startReplica(tc, 1, round), startReplica(tc, 2, round)]);
      // Ready once the streams' leaders, just elected, answer: within seconds of the banner.
      await Promise.all(urls.map((url) => ready(url, round)));
      killGroups(spawned);
      await tc.stop();
      tc = undefined;
    }
  }, 170_000);
});
