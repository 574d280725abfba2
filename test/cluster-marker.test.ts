import { setTimeout as sleep } from "node:timers/promises";
import type { NatsConnection } from "nats";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { endMarker, MARKER_KEY, MARKER_LEASE_WAIT_MS } from "../runtime/views/probes.ts";
import { OPERATOR, startTestCluster, type TestCluster } from "../runtime/testing.ts";
import { projectConfig, until } from "./helpers.ts";

// The marker a view short of a replicated stream writes (docs/verb.md §4.6), on three real
// servers: written only once the stream's leader heard from a quorum within 0.3 s, which an idle
// leader does only about one time in three when asked once (it hears from its followers once a
// second, up to 2 s after a write).

const BUCKET = "marker-lease";
const STREAM = `KV_${BUCKET}`;
let tc: TestCluster;
let paused: number[] = [];

/** What one asking for a marker did: `written`, or the refusal's words. */
const outcome = (marking: Promise<string>) =>
  marking.then(
    () => "written",
    (err: Error) => err.message,
  );
/** The number (1 to 3) of the server named `name`. */
const numberOf = (name: string) => tc.cluster.servers.findIndex((s) => s.name === name) + 1;

async function leaderOf(nc: NatsConnection): Promise<string> {
  const info = await (await nc.jetstreamManager()).streams.info(STREAM);
  return info.cluster!.leader!;
}

/** Asks for a marker `times` times, 300 to 1,000 ms apart (the stream idle between), and says what each did. */
async function markers(nc: NatsConnection, times: number): Promise<string[]> {
  const mark = endMarker(nc, BUCKET, 3);
  const done: string[] = [];
  for (let i = 0; i < times; i++) {
    await sleep(300 + Math.random() * 700);
    done.push(await outcome(mark()));
  }
  return done;
}

beforeAll(async () => {
  tc = await startTestCluster(await projectConfig());
  await tc.cluster.ready();
  const nc = await tc.connect(OPERATOR, 1);
  const kv = await nc.jetstream().views.kv(BUCKET, { replicas: 3 });
  await kv.put("a", "1");
}, 120_000);

afterAll(async () => {
  for (const pid of paused) process.kill(pid, "SIGCONT");
  await tc?.stop();
}, 60_000);

describe("a view's marker on a stream with replicas 3 (docs/verb.md §4.6)", () => {
  it("is written whenever asked on an idle stream: the leader is asked again until it heard from a follower lately", async () => {
    const nc = await tc.connect(OPERATOR, 1);
    expect(await markers(nc, 8)).toEqual(Array(8).fill("written"));
    // Each the key's one message, the last of the stream.
    const last = await (await nc.jetstreamManager()).streams.getMessage(STREAM, { last_by_subj: `$KV.${BUCKET}.${MARKER_KEY}` });
    expect(last.header.get("KV-Operation")).toBe("DEL");
  }, 60_000);

  it("is written whenever asked with one follower killed: the other is a quorum with the leader", async () => {
    const nc = await tc.connect(OPERATOR, 1);
    const leader = await leaderOf(nc);
    // A follower, not the server this connection is on when another is a follower too.
    const follower = tc.cluster.servers.find((s) => s.name !== leader && s !== tc.cluster.servers[0]) ?? tc.cluster.servers[1]!;
    await follower.kill();
    try {
      expect(await markers(nc, 8)).toEqual(Array(8).fill("written"));
    } finally {
      await follower.start();
      await tc.cluster.ready();
    }
  }, 90_000);

  it("is not written through a leader that heard from neither follower (both paused): refused after asking for 2 s, the stream unchanged", async () => {
    // Connected to the leader's own server, the one left running.
    let nc = await tc.connect(OPERATOR, 1);
    const leader = await leaderOf(nc);
    nc = await tc.connect(OPERATOR, numberOf(leader));
    const jsm = await nc.jetstreamManager();
    const before = (await jsm.streams.info(STREAM)).state;
    const followers = tc.cluster.servers.filter((s) => s.name !== leader);
    paused = followers.map((s) => s.pid!);
    for (const pid of paused) process.kill(pid, "SIGSTOP");
    try {
      // Until the leader has not heard from either for more than 0.3 s.
      await sleep(500);
      const began = performance.now();
      const refused = await outcome(endMarker(nc, BUCKET, 3)());
      expect(refused).toBe(
        `the leader of stream ${STREAM}, ${leader}, heard from no quorum of its servers within 0.3 s: it may be cut off (asked every 0.1 s for 2 s)`,
      );
      expect(performance.now() - began).toBeGreaterThanOrEqual(MARKER_LEASE_WAIT_MS - 150);
    } finally {
      for (const pid of paused) process.kill(pid, "SIGCONT");
      paused = [];
    }
    await tc.cluster.ready();
    await until(async () => (await jsm.streams.info(STREAM).catch(() => undefined))?.cluster?.leader !== undefined, 30_000, "a leader");
    const after = (await jsm.streams.info(STREAM)).state;
    expect([after.messages, after.last_seq]).toEqual([before.messages, before.last_seq]);
  }, 90_000);
});
