/**
 * A refused event is counted once however often it is delivered (docs/failing.md §5.3): the
 * record of `refused.<function>` remembers the counted stream sequences above the durable's
 * acknowledgement floor, not a window of the last ones. Replicas of the set share the events
 * stream's durable; two are killed with kill -9 in the middle of a burst of refused events, so
 * the refusals they counted and had not acknowledged come again to the one left after the ack
 * wait, by when hundreds more were counted.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { createWriteStream, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import type { KV, NatsConnection } from "nats";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { STATUS } from "../functions/_lib/status.ts";
import { writeBucket } from "../runtime/buckets.ts";
import { MAX_COUNTED_RANGES, recorder, type Delivered } from "../runtime/records.ts";
import type { TestBus } from "../runtime/testing.ts";
import { killGroups, request, ROOT, SHIPPED_DIR, testBus, until } from "./helpers.ts";

const BIN = join(ROOT, "bin", "mesh-provisioner.mjs");
const STREAM = "mesh-provisioner_events";
const DURABLE = "mesh-provisioner-events";
const RUNTIME_BUCKET = "mesh-provisioner_runtime";
/** Seconds a delivered message may go unacknowledged before it comes again: short, so a killed replica's come back soon. */
const ACK_WAIT_SECONDS = 2;

let bus: TestBus;
let seat: NatsConnection;
let keycloak: NatsConnection;
let records: KV;
let dir: string;
/** The replicas running, oldest first. */
const replicas: ChildProcess[] = [];
/** Every replica's log (stdout, and stderr after its banner). */
const logs: string[] = [];
const groups: ChildProcess[] = [];

/**
 * Starts a replica of the shipped set as an operator would (`mesh-provisioner start` on the
 * test's server, the seat's user), with the events stream's `ackWaitSeconds` of the config set
 * to {@link ACK_WAIT_SECONDS} and a state folder of its own; resolves once it printed its banner.
 */
async function startReplica(): Promise<void> {
  const own = mkdtempSync(join(dir, "replica-"));
  const config = join(own, "wrangler-free.config.ts");
  writeFileSync(
    config,
    `import base from ${JSON.stringify(join(ROOT, "wrangler-free.config.ts"))};\n` +
      `export default { ...base, functions: ${JSON.stringify(SHIPPED_DIR)}, state: ${JSON.stringify(join(own, "state"))},\n` +
      `  streams: { events: { ...base.streams.events, ackWaitSeconds: ${ACK_WAIT_SECONDS} } } };\n`,
  );
  const log = join(own, "replica.log");
  logs.push(log);
  const child = spawn(process.execPath, [BIN, "-c", config, "start"], {
    cwd: ROOT,
    env: {
      ...process.env,
      NATS_URL: bus.url,
      NATS_USER: bus.config.nats.user,
      NATS_PASSWORD: bus.config.nats.password,
      HTTP_PORT: "0",
      LOG_LEVEL: "error",
    },
    detached: true,
    stdio: ["ignore", "pipe", "pipe"],
  });
  groups.push(child);
  const out = createWriteStream(log);
  child.stdout!.pipe(out);
  let banner = "";
  await new Promise<void>((resolve, reject) => {
    child.stderr!.on("data", (d: Buffer) => {
      // After its banner, what it says on stderr (a crash) goes to its log too.
      if (/\n {2}status .*\n/.test(banner)) return void out.write(d);
      banner += d.toString();
      if (/\n {2}status .*\n/.test(banner)) resolve();
    });
    child.once("exit", (code, signal) => reject(new Error(`a replica exited (${code ?? signal}) before it started:\n${banner}`)));
  });
  replicas.push(child);
}

/** Kills the oldest replica with SIGKILL, as kill -9 does, and waits for it to be gone. */
async function killOldest(): Promise<void> {
  const child = replicas.shift()!;
  const exited = new Promise((resolve) => child.once("exit", resolve));
  child.kill("SIGKILL");
  await exited;
}

/** `refused.provider-failing` as the replicas wrote it. */
async function refusedRecord(): Promise<{ count: number; counted?: Record<string, { floor: number; ranges: [number, number][] }> }> {
  const entry = await records.get("refused.provider-failing");
  return entry === null || entry.value.length === 0 ? { count: 0 } : entry.json();
}

beforeAll(async () => {
  bus = await testBus();
  seat = await bus.connect();
  keycloak = await bus.connect("keycloak");
  mkdirSync(join(ROOT, ".tmp"), { recursive: true });
  dir = mkdtempSync(join(ROOT, ".tmp", "refused-once-"));
  // One first: it makes the buckets, the stream and the durable; the others bind them.
  await startReplica();
  records = await bus.kv(RUNTIME_BUCKET);
}, 60_000);
afterAll(async () => {
  // The replicas' last log lines (errors only): what a failure's reader wants.
  for (const log of logs) {
    const text = existsSync(log) ? readFileSync(log, "utf8").trim() : "";
    if (text.length > 0) console.error(`--- ${log}\n${text.split("\n").slice(-10).join("\n")}`);
  }
  killGroups(groups);
  await bus?.stop();
  if (dir !== undefined) rmSync(dir, { recursive: true, force: true });
});

describe("the counted ranges of a refused-events record", () => {
  const last = { subject: "keycloak.provisioner.failing", reason: "probe", at: new Date().toISOString() };
  const of =
    (stream: string, created: string) =>
    (sequence: number, ackFloor: number): Delivered => ({
      stream,
      created,
      sequence,
      ackFloor,
    });
  const counter = () => {
    const bucket = writeBucket(records, seat.jetstream(), RUNTIME_BUCKET, seat);
    return { bucket, recorded: recorder(bucket, bucket) };
  };
  const record = async (fn: string) => JSON.parse(new TextDecoder().decode((await records.get(`refused.${fn}`))!.value));

  it("counts a sequence once however late it comes again, and forgets only what is at or below the floor", async () => {
    const { recorded } = counter();
    const at = of("probe_stream", "2026-01-01T00:00:00.000000001Z");
    await recorded.refused("unit-late", last, at(5, 0));
    // Hundreds counted meanwhile (more than any window of the last ones), the floor held at 4.
    for (let seq = 6; seq <= 400; seq++) await recorded.refused("unit-late", last, at(seq, 4));
    await recorded.refused("unit-late", last, at(5, 4));
    expect((await record("unit-late")).count).toBe(396);
    // Contiguous sequences are one range; a gap (sequence 402 not refused) starts another.
    await recorded.refused("unit-late", last, at(403, 4));
    expect((await record("unit-late")).counted).toEqual({
      probe_stream: {
        created: "2026-01-01T00:00:00.000000001Z",
        floor: 4,
        ranges: [
          [5, 400],
          [403, 403],
        ],
      },
    });
    // The floor rises past 400: the ranges below it are forgotten, and what is at or below it is not counted again.
    await recorded.refused("unit-late", last, at(404, 400));
    expect((await record("unit-late")).counted.probe_stream).toEqual({
      created: "2026-01-01T00:00:00.000000001Z",
      floor: 400,
      ranges: [[403, 404]],
    });
    await recorded.refused("unit-late", last, at(5, 0)); // a replica's floor read long ago, lower: still counted once
    await recorded.refused("unit-late", last, at(399, 0));
    await recorded.refused("unit-late", last, at(404, 0));
    expect((await record("unit-late")).count).toBe(398);
    // What functions read is the count and the last refusal only.
    expect((await recorded.refusedEvents()).byFunction["unit-late"]).toEqual({ count: 398, last });
  });

  it("keeps streams apart, starts again on a stream made anew, and reads a record of before with `recent`", async () => {
    const { bucket, recorded } = counter();
    const first = of("probe_stream", "2026-01-01T00:00:00Z");
    const other = of("other_stream", "2026-01-01T00:00:00Z");
    await recorded.refused("unit-streams", last, first(7, 0));
    await recorded.refused("unit-streams", last, other(7, 0));
    // Made anew: its sequences start from 1 again, and 7 is another event.
    const anew = of("probe_stream", "2026-02-01T00:00:00Z");
    await recorded.refused("unit-streams", last, anew(7, 0));
    // A replica still on the stream before: counted (it cannot come again), the new one's remembered sequences kept.
    await recorded.refused("unit-streams", last, first(8, 0));
    await recorded.refused("unit-streams", last, anew(7, 0));
    expect(await record("unit-streams")).toMatchObject({
      count: 4,
      counted: {
        probe_stream: { created: "2026-02-01T00:00:00Z", floor: 0, ranges: [[7, 7]] },
        other_stream: { floor: 0, ranges: [[7, 7]] },
      },
    });

    await bucket.put("refused.unit-before", JSON.stringify({ count: 3, last, recent: [9, 7, 8] }));
    await recorded.refused("unit-before", last, first(8, 0));
    expect((await record("unit-before")).count).toBe(3);
    await recorded.refused("unit-before", last, first(10, 6));
    expect(await record("unit-before")).toEqual({
      count: 4,
      last,
      counted: { probe_stream: { created: "2026-01-01T00:00:00Z", floor: 6, ranges: [[7, 10]] } },
    });
  });

  it(`keeps at most ${MAX_COUNTED_RANGES} ranges a stream, the newest, saying how many it forgot`, async () => {
    const { bucket, recorded } = counter();
    const at = of("probe_stream", "2026-01-01T00:00:00Z");
    // Every other sequence refused above a floor held back: one range each.
    const ranges = Array.from({ length: MAX_COUNTED_RANGES }, (_, i): [number, number] => [2 * i + 1, 2 * i + 1]);
    const full = { count: MAX_COUNTED_RANGES, last, counted: { probe_stream: { created: "2026-01-01T00:00:00Z", floor: 0, ranges } } };
    await bucket.put("refused.unit-full", JSON.stringify(full));
    expect(await recorded.refused("unit-full", last, at(2 * MAX_COUNTED_RANGES + 1, 0))).toBe(1);
    const kept = (await record("unit-full")).counted.probe_stream.ranges as [number, number][];
    expect([kept.length, kept[0], kept.at(-1)]).toEqual([
      MAX_COUNTED_RANGES,
      [3, 3],
      [2 * MAX_COUNTED_RANGES + 1, 2 * MAX_COUNTED_RANGES + 1],
    ]);
    expect(await recorded.refused("unit-full", last, at(2, 0))).toBe(0);
  });
});

describe("refused events and replicas killed with kill -9", () => {
  it("counts each refused event once: the count equals the events published, round after round", async () => {
    const jsm = await seat.jetstreamManager();
    const js = keycloak.jetstream();
    const BURST = 1500;
    const ROUNDS = 3;
    const before = (await refusedRecord()).count;
    let published = 0;
    for (let round = 1; round <= ROUNDS; round++) {
      // Three replicas share the durable; two are killed in the middle of the burst.
      while (replicas.length < 3) await Promise.all(Array.from({ length: 3 - replicas.length }, startReplica));
      const from = (await refusedRecord()).count;
      // Refused by provider-failing's input: no machine, consumer, word or at (docs/failing.md §5.3).
      let last = 0;
      for (let i = 0; i < BURST; i += 100) {
        const acks = await Promise.all(Array.from({ length: 100 }, () => js.publish("keycloak.provisioner.failing", "{}")));
        last = Math.max(last, ...acks.map((a) => a.seq));
      }
      published += BURST;
      // Each killed with refusals it may have counted and not acknowledged yet: they come again
      // to a replica left after the ack wait, once hundreds more were counted.
      for (const share of [1 / 4, 1 / 2]) {
        await until(async () => (await refusedRecord()).count >= from + BURST * share, 20_000, `${share} of the burst counted`);
        await killOldest();
      }
      await until(
        async () => {
          const info = await jsm.consumers.info(STREAM, DURABLE);
          return info.delivered.stream_seq >= last && info.num_pending === 0 && info.num_ack_pending === 0;
        },
        30_000,
        "every event acknowledged",
      );
      expect((await refusedRecord()).count - before, `counted by the end of round ${round}`).toBe(published);
    }
    // As status says it.
    const status = await request(seat, STATUS, {});
    expect(status.body.rejectedEvents).toBe(before + published);
    // What the record keeps is bounded by the floor: a few ranges, not thousands of sequences.
    const { counted } = await refusedRecord();
    expect(counted?.[STREAM]?.ranges.length ?? 0).toBeLessThan(10);
  }, 90_000);
});
