import { pino } from "pino";
import type { NatsConnection } from "nats";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { readBucket, writeBucket } from "../runtime/buckets.ts";
import { OPERATOR, startTestCluster, type TestCluster } from "../runtime/testing.ts";
import { openView, type LiveView } from "../runtime/views/index.ts";
import { projectConfig } from "./helpers.ts";

// A view's watch reads from any server of its stream, and nats-server may store a committed
// message on a follower before its leader's own store does: a view there then holds more than the
// leader says it stored. That is a view ahead, not a stream gone back (docs/verb.md §4.6).
//
// How often that happens is the machine's: on a 2-core VM a view was ahead 0 to 20 times in 20 s
// of writes, and once not in 40 s. So the test gives it time, prints how often it came, and asserts
// what must hold whether it came or not. That a view ahead is told from a stream gone back, every
// time, is asserted in test/views.test.ts, where the leader's answers are the test's.

const BUCKET = "mesh-provisioner_ahead";
/** How long the writers and readers run at least, in milliseconds; then on until a view was ahead of its leader, {@link MAX_RUN_MS} at most. */
const RUN_MS = 10_000;
const MAX_RUN_MS = 40_000;

let tc: TestCluster;
const connections: NatsConnection[] = [];
const views: LiveView[] = [];
/** What the views logged of a view ahead of its leader, and of a stream gone back. */
const said = { ahead: 0, wentBack: [] as string[] };

beforeAll(async () => {
  tc = await startTestCluster(await projectConfig());
  const operator = await tc.connect(OPERATOR, 1);
  await operator.jetstream().views.kv(BUCKET, { history: 1, replicas: 3 });
  const log = pino(
    { level: "debug" },
    {
      write: (line: string) => {
        if (line.includes("had not stored yet")) said.ahead++;
        if (line.includes("went back")) said.wentBack.push(line);
      },
    },
  );
  // A view on each server: the watch's consumer of each is on one of the stream's three servers.
  for (const n of [1, 2, 3]) {
    const nc = await tc.connect(OPERATOR, n);
    connections.push(nc);
    const view = await openView(nc, BUCKET, readBucket(await nc.jetstream().views.kv(BUCKET, { bindOnly: true }), BUCKET), log);
    await view.loaded;
    views.push(view);
  }
}, 60_000);

afterAll(async () => {
  for (const view of views) view.stop();
  await tc?.stop();
});

describe.sequential("views of a stream with 3 replicas, one on each server, under writes", () => {
  it("call no stream gone back, ahead of their leader or not, and miss no write acknowledged before a read", async () => {
    /** The newest value of each writer's key acknowledged so far. */
    const acked = [0, 0, 0];
    const refused: string[] = [];
    const missed: string[] = [];
    let reads = 0;
    const began = Date.now();
    const running = () => Date.now() - began < RUN_MS || (said.ahead === 0 && Date.now() - began < MAX_RUN_MS);
    const writers = connections.map(async (nc, i) => {
      const bucket = writeBucket(await nc.jetstream().views.kv(BUCKET, { bindOnly: true }), nc.jetstream(), BUCKET);
      for (let n = 1; running(); n++) {
        await bucket.put(`writer.${i}`, String(n));
        acked[i] = n;
      }
    });
    const readers = views.flatMap((view) =>
      [0, 1].map(async () => {
        for (let i = 0; running(); i = (i + 1) % 3) {
          const before = acked[i]!;
          try {
            const entry = await view.get(`writer.${i}`);
            reads++;
            const value = entry === null ? 0 : Number(Buffer.from(entry.value).toString());
            if (value < before) missed.push(`writer.${i}: ${value}, acknowledged ${before} before the read`);
          } catch (err) {
            refused.push((err as Error).message);
            await new Promise((resolve) => setTimeout(resolve, 10));
          }
        }
      }),
    );
    await Promise.all([...writers, ...readers]);
    // As many writes as the servers take. A view behind may be refused under such a load (its watch
    // lags): that is the truth, and not what is asserted here.
    const figures = `${reads} reads, ${refused.length} refused, ${acked.join("+")} writes, ${said.ahead} times a view was ahead of its leader`;
    console.info(`views of a stream with 3 replicas: ${figures}`);
    expect(reads, figures).toBeGreaterThan(1000);
    expect(missed.slice(0, 5), figures).toEqual([]);
    expect(refused.filter((why) => why.includes("went back")).slice(0, 5), figures).toEqual([]);
    expect(said.wentBack.slice(0, 5), figures).toEqual([]);
  }, 90_000);
});
