import fc from "fast-check";
import { pino } from "pino";
import type { KV, NatsConnection } from "nats";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { nanosOfTime, readBucket, scan, writeBucket } from "../runtime/buckets.ts";
import type { ReadBucket, WriteBucket } from "../runtime/types.ts";
import { createLogger } from "../runtime/log.ts";
import type { TestBus } from "../runtime/testing.ts";
import { MARKER_KEY, MARKER_VALUE_BYTES, openView, type LiveView } from "../runtime/views/index.ts";
import type { CatchUp } from "../runtime/views/freshness.ts";
import { appliedAt, startGeneration } from "../runtime/views/generation.ts";
import { coalesced } from "../runtime/serial.ts";
import { messageFromProbe, type LastSequence } from "../runtime/views/probes.ts";
import { catchUpOf, testBus, until } from "./helpers.ts";

// A live view answers the reads of a ReadBucket from memory: whatever was written, it must
// answer exactly what the server answers.

let bus: TestBus;
let seat: NatsConnection;
let kv: KV;
let server: ReadBucket;
let writer: WriteBucket;
let view: LiveView;
const BUCKET = "mesh-provisioner_views-probe";

beforeAll(async () => {
  // The probe bucket is none of the config's: the seat may use any subject here.
  bus = await testBus({ seatPermissions: { publish: { allow: [">"] }, subscribe: { allow: [">"] } } });
  seat = await bus.connect();
  kv = await seat.jetstream().views.kv(BUCKET, { history: 1, allow_direct: true });
  server = readBucket(kv, BUCKET);
  writer = writeBucket(kv, seat.jetstream(), BUCKET);
  await writer.put("before.the.view", "1");
  view = await openView(seat, BUCKET, server, createLogger({ LOG_LEVEL: "silent" }));
  await view.loaded;
});
afterAll(async () => {
  view.stop();
  await bus.stop();
});

const tokenOf = fc.constantFrom("a", "b", "ab", "b-c", "a_", "z");
const keyOf = fc.array(tokenOf, { minLength: 1, maxLength: 4 }).map((t) => t.join("."));
const filterOf = fc
  .tuple(fc.array(fc.oneof(tokenOf, fc.constant("*")), { minLength: 0, maxLength: 3 }), fc.boolean())
  .filter(([tokens, more]) => tokens.length > 0 || more)
  .map(([tokens, more]) => [...tokens, ...(more ? [">"] : [])].join("."));
const operation = fc.oneof(fc.record({ put: keyOf, value: fc.string() }), fc.record({ del: keyOf, value: fc.string() }));

describe("a live view", () => {
  it("answers get, last, list and records as the server does, after any writes and deletes", async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.array(operation, { maxLength: 25 }),
        fc.array(filterOf, { minLength: 1, maxLength: 3 }),
        fc.option(keyOf, { nil: undefined }),
        fc.option(fc.integer({ min: 1, max: 8 }), { nil: undefined }),
        keyOf,
        async (operations, filters, after, limit, probe) => {
          for (const op of operations) {
            if ("put" in op) await writer.put(op.put, op.value);
            else await writer.delete(op.del, { value: op.value });
          }
          const options = { after, limit };
          expect(await view.list(filters, options)).toEqual(await server.list(filters, options));
          expect(await view.records(filters, options)).toEqual(await server.records(filters, options));
          // A single key's read comes by direct get; nats.js turns a watch's time stamp into a
          // float of nanoseconds first, which can put it 1 ms away from the direct get's.
          const same = (a: { created: Date; createdNanos: number } | null, b: { created: Date; createdNanos: number } | null) => {
            expect(a === null ? null : { ...a, created: 0, createdNanos: 0 }).toEqual(
              b === null ? null : { ...b, created: 0, createdNanos: 0 },
            );
            if (a !== null && b !== null) expect(Math.abs(a.created.getTime() - b.created.getTime())).toBeLessThanOrEqual(1);
            if (a !== null && b !== null) expect(Math.abs(a.createdNanos - b.createdNanos)).toBeLessThan(2000);
          };
          same(await view.get(probe), await server.get(probe));
          same(await view.last(probe), await server.last(probe));
        },
      ),
      { numRuns: 60 },
    );
    expect((await view.get("before.the.view"))?.revision).toBe(1);
  });

  it("has every acknowledged write the moment the write returns", async () => {
    for (let i = 0; i < 200; i++) {
      const revision = await writer.put(`fresh.${i}`, String(i));
      expect((await view.get(`fresh.${i}`))?.revision).toBe(revision);
      expect(view.sequence()).toBeGreaterThanOrEqual(revision);
    }
  });

  it("reads from the server once stopped", async () => {
    const stopped = await openView(seat, BUCKET, server, createLogger({ LOG_LEVEL: "silent" }));
    await stopped.loaded;
    stopped.stop();
    await new Promise((r) => setTimeout(r, 50));
    const revision = await writer.put("after.stop", "late");
    expect((await stopped.get("after.stop"))?.revision).toBe(revision);
    expect((await stopped.list("after.>")).map((e) => e.key)).toEqual(["after.stop"]);
  });
});

describe("a live view and what the key-value layer does not say", () => {
  const silent = createLogger({ LOG_LEVEL: "silent" });

  it("keeps a long delete-marker value out of memory and still reads it back", async () => {
    const long = "r".repeat(MARKER_VALUE_BYTES + 1);
    const revision = await writer.delete("marker.long", { value: long });
    await writer.delete("marker.short", { value: "short" });
    const last = await view.last("marker.long");
    expect([last?.revision, last?.deleted, new TextDecoder().decode(last?.value)]).toEqual([revision, true, long]);
    const records = await view.records("marker.>");
    expect(records.map((r) => [r.key, new TextDecoder().decode(r.value).length])).toEqual([
      ["marker.long", MARKER_VALUE_BYTES + 1],
      ["marker.short", 5],
    ]);
  });

  it("drops the keys of a stream purge within its resync period", async () => {
    const name = "mesh-provisioner_views-purge";
    const purged = await seat.jetstream().views.kv(name, { history: 1, allow_direct: true });
    const reader = readBucket(purged, name);
    for (const key of ["p.a", "p.b", "q.c"]) await purged.put(key, "1");
    const watched = await openView(seat, name, reader, silent, { resyncMs: 200 });
    await watched.loaded;
    try {
      expect((await watched.list(">")).map((e) => e.key)).toEqual(["p.a", "p.b", "q.c"]);
      await (await seat.jetstreamManager()).streams.purge(`KV_${name}`, { filter: `$KV.${name}.p.>` });
      await until(async () => (await watched.list(">")).length === 1, 5000, "the purge seen");
      expect((await watched.list(">")).map((e) => e.key)).toEqual(["q.c"]);
      await purged.put("p.a", "2");
      expect((await watched.list(">")).map((e) => e.key)).toEqual(["p.a", "q.c"]);
    } finally {
      watched.stop();
    }
  });

  it("drops a purged key even after the stream's last message was purged", async () => {
    const name = "mesh-provisioner_views-lastpurge";
    const bucket = await seat.jetstream().views.kv(name, { history: 1, allow_direct: true });
    const jsm = await seat.jetstreamManager();
    await bucket.put("a", "1");
    await bucket.put("b", "2");
    const watched = await openView(seat, name, readBucket(bucket, name), silent, { resyncMs: 100 });
    await watched.loaded;
    try {
      await jsm.streams.purge(`KV_${name}`, { filter: `$KV.${name}.b` });
      await until(async () => (await watched.list(">")).length === 1, 5000, "b dropped");
      await jsm.streams.purge(`KV_${name}`, { filter: `$KV.${name}.a` });
      await until(async () => (await watched.list(">")).length === 0, 5000, "a dropped");
      expect(await watched.get("a")).toBeNull();
    } finally {
      watched.stop();
    }
  });

  it("holds a bucket made again behind it against the config (no deletion heard): other settings are said and never read", async () => {
    const name = "mesh-provisioner_views-replaced";
    const stream = `KV_${name}`;
    const bucket = await seat.jetstream().views.kv(name, { history: 1, allow_direct: true });
    const jsm = await seat.jetstreamManager();
    await bucket.put("old.key", "1");
    // As the set asserts it: the config says a history of 1.
    const assert = async () => {
      const history = (await jsm.streams.info(stream)).config.max_msgs_per_subject;
      if (history !== 1)
        throw new Error(`bucket ${name} exists with other settings than the config: history ${history} (the config says 1)`);
    };
    // Compared with its stream every 2 s: most often not while the stream is missing below.
    const watched = await openView(seat, name, readBucket(bucket, name), silent, { resyncMs: 2000, assert, remake: assert });
    await watched.loaded;
    try {
      const { config } = await jsm.streams.info(stream);
      await jsm.streams.delete(stream);
      // nats-server 2.9 removes the deleted stream's folder after it answered: a stream made before then loses its files.
      await new Promise((resolve) => setTimeout(resolve, 300));
      await jsm.streams.add({ ...config, max_msgs_per_subject: 5 });
      await until(() => watched.trouble()?.includes("history 5") === true, 5000, "said");
      expect(watched.trouble()).toBe(
        `bucket ${name} was deleted behind the set and cannot be made again: bucket ${name} exists with other settings than the config: history 5 (the config says 1)`,
      );
      await expect(watched.list(">")).rejects.toMatchObject({ code: 503, message: expect.stringContaining("cannot be made again") });
      // Edited to what the config says: loaded, and read.
      await jsm.streams.update(stream, { ...config, max_msgs_per_subject: 1 });
      await bucket.put("new.key", "2");
      await until(
        async () => watched.trouble() === undefined && (await watched.list(">").catch(() => [])).length === 1,
        10_000,
        "read again",
      );
      expect((await watched.list(">")).map((e) => e.key)).toEqual(["new.key"]);
    } finally {
      watched.stop();
    }
  });

  it("answers from memory on a stream that does not allow direct gets", async () => {
    const name = "mesh-provisioner_views-nodirect";
    const plain = await seat.jetstream().views.kv(name, { history: 1, allow_direct: false });
    const warnings: string[] = [];
    const log = pino({ level: "warn" }, { write: (line: string) => void warnings.push(line) });
    const watched = await openView(seat, name, readBucket(plain, name), log);
    await watched.loaded;
    try {
      for (let i = 0; i < 20; i++) {
        const revision = await plain.put(`k.${i}`, String(i));
        expect((await watched.get(`k.${i}`))?.revision).toBe(revision);
      }
      // Never a fallback to the server: every read knew the view was current.
      expect(warnings).toEqual([]);
    } finally {
      watched.stop();
    }
  });
});

describe("a listing by the stream's gets, without a consumer", () => {
  it("gives the same last records as a watch, delete markers included, narrowed by a filter", async () => {
    const name = "mesh-provisioner_scan-probe";
    const plain = await seat.jetstream().views.kv(name, { history: 1 });
    const handle = writeBucket(plain, seat.jetstream(), name);
    await handle.put("a.x", "1");
    await handle.put("a.y", "2");
    await handle.put("a.x", "3");
    await handle.put("b.z", "4");
    await handle.delete("a.y");
    const shown = (records: { key: string; value: Uint8Array; deleted: boolean; revision: number }[]) =>
      records.map((r) => [r.key, new TextDecoder().decode(r.value), r.deleted, r.revision]).sort();
    const watched = await readBucket(plain, name).records(">");
    expect(shown(await scan(seat, name, ">", true))).toEqual(shown(watched));
    expect(shown(await scan(seat, name, "a.>", false))).toEqual([["a.x", "3", false, 3]]);
    expect(await scan(seat, name, "none.>", true)).toEqual([]);
  });
});

describe("a live view's freshness probe (docs/verb.md §4.6)", () => {
  it("stores nothing on one server: the stream keeps its messages and has no marker after 200 checks", async () => {
    const jsm = await seat.jetstreamManager();
    const before = (await jsm.streams.info(`KV_${BUCKET}`)).state;
    const checks = await Promise.all(Array.from({ length: 200 }, () => view.check()));
    expect(checks.every((c) => c.current)).toBe(true);
    const after = (await jsm.streams.info(`KV_${BUCKET}`)).state;
    expect([after.messages, after.last_seq]).toEqual([before.messages, before.last_seq]);
    expect(await server.last(MARKER_KEY)).toBeNull();
    expect(view.trouble()).toBeUndefined();
  });

  it("says when the view was proven current as the time the proving probe was sent, not when its answer came", async () => {
    let askedAt = 0;
    const answered: (() => void)[] = [];
    const fresh = catchUpOf({
      applied: () => 7,
      probe: coalesced(
        () =>
          new Promise<LastSequence>((resolve) => {
            const sent = (askedAt += 1000);
            answered.push(() => resolve({ sequence: 7, askedAt: sent, heldAtAsk: 7 }));
          }),
      ),
      tail: { nothingAfter: async () => false },
    });
    const first = fresh.caughtUp();
    const second = fresh.caughtUp();
    expect(fresh.confirmedAt()).toBeNull();
    answered[1]?.(); // not sent yet: the second waits for the first
    answered[0]!();
    expect(await first).toEqual({ current: true });
    expect(fresh.confirmedAt()?.getTime()).toBe(1000);
    await new Promise((r) => setTimeout(r, 0));
    answered[1]!();
    expect(await second).toEqual({ current: true });
    expect(fresh.confirmedAt()?.getTime()).toBe(2000);
    // A load of the same stream that holds less than was proven holds none of it.
    fresh.adopted(6, true);
    expect(fresh.confirmedAt()).toBeNull();
  });

  it("refuses to call a view current when the stream's last sequence went back below what it applied", async () => {
    const told: string[] = [];
    const fresh = catchUpOf({
      applied: () => 9,
      probe: async () => ({ sequence: 4, askedAt: 1, heldAtAsk: 9 }),
      wentBack: (why) => told.push(why),
    });
    expect(await fresh.caughtUp()).toEqual({
      current: false,
      why: "stream KV_b went back: its last sequence is 4, the view had applied 9",
    });
    expect(told).toHaveLength(1);
    expect(fresh.confirmedAt()).toBeNull();
  });

  it("holds a view current that holds a message its stream's leader has not stored yet, once the leader holds that very message", async () => {
    // A follower may store a committed message before its leader's own store does: the view, reading there, is ahead.
    const answers = [
      { sequence: 8, askedAt: 1000, heldAtAsk: 9 },
      { sequence: 9, askedAt: 2000, heldAtAsk: 9 },
    ];
    const asked: string[] = [];
    const held = ["none", "same"] as const;
    const told: string[] = [];
    const fresh = catchUpOf({
      applied: () => 9,
      probe: async () => answers.shift()!,
      tail: { nothingAfter: async () => false },
      sameAfter: async (after, upTo) => {
        asked.push(`after ${after} up to ${upTo}`);
        return held[asked.length - 1]!;
      },
      wentBack: (why) => told.push(why),
    });
    expect(await fresh.caughtUp()).toEqual({ current: true });
    expect(asked).toEqual(["after 8 up to 9", "after 8 up to 9"]);
    expect(told).toEqual([]);
    // Proven by the probe asked once the leader held it.
    expect(fresh.confirmedAt()?.getTime()).toBe(2000);
  });

  it("calls the stream gone back at once when its leader holds another message where the view applied one", async () => {
    let probes = 0;
    let asked = 0;
    const told: string[] = [];
    const fresh = catchUpOf({
      applied: () => 9,
      probe: async () => (probes++, { sequence: 8, askedAt: 1, heldAtAsk: 9 }),
      sameAfter: async () => (asked++, "other"),
      wentBack: (why) => told.push(why),
    });
    expect(await fresh.caughtUp()).toEqual({
      current: false,
      why: "stream KV_b went back: its last sequence is 8, the view had applied 9",
    });
    expect([probes, asked, told.length]).toEqual([1, 1, 1]);
  });

  it("says why, and calls no stream gone back, when the leader cannot be asked what it holds; reads ahead share one asking", async () => {
    let asked = 0;
    const told: string[] = [];
    const fresh = catchUpOf({
      applied: () => 9,
      probe: async () => ({ sequence: 8, askedAt: 1, heldAtAsk: 9 }),
      sameAfter: async () => {
        asked++;
        await new Promise((resolve) => setTimeout(resolve, 20));
        throw new Error("TIMEOUT");
      },
      wentBack: (why) => told.push(why),
    });
    const why = "the leader of stream KV_b could not be asked what it holds after sequence 8: TIMEOUT";
    expect(await Promise.all([fresh.caughtUp(), fresh.caughtUp()])).toEqual([
      { current: false, why },
      { current: false, why },
    ]);
    expect([asked, told.length]).toEqual([1, 0]);
  });

  it("calls the stream gone back when the leader still holds nothing that far after a while, or its next check is still below the view", async () => {
    const told: string[] = [];
    const waiting = catchUpOf({
      applied: () => 9,
      probe: async () => ({ sequence: 8, askedAt: 1, heldAtAsk: 9 }),
      wentBack: (why) => told.push(why),
    });
    expect(await waiting.caughtUp()).toEqual({
      current: false,
      why: "stream KV_b went back: its last sequence is 8, the view had applied 9",
    });
    const answers = [
      { sequence: 8, askedAt: 1, heldAtAsk: 9 },
      { sequence: 7, askedAt: 2, heldAtAsk: 9 },
    ];
    const below = catchUpOf({
      applied: () => 9,
      probe: async () => answers.shift()!,
      sameAfter: async () => "same",
      wentBack: (why) => told.push(why),
    });
    expect(await below.caughtUp()).toEqual({
      current: false,
      why: "stream KV_b went back: its last sequence is 7, the view had applied 9",
    });
    expect(told).toHaveLength(2);
  });

  it("gives up on a view ahead of its leader by the read's deadline, calling no stream gone back", async () => {
    const told: string[] = [];
    const fresh = catchUpOf({
      applied: () => 9,
      probe: async () => ({ sequence: 8, askedAt: 1, heldAtAsk: 9 }),
      sameAfter: () => new Promise(() => {}),
      wentBack: (why) => told.push(why),
    });
    expect(await fresh.caughtUp(performance.now() + 50)).toEqual({
      current: false,
      why: "the view of bucket b holds more than its stream's leader said it stored, and the leader did not come to hold it within 2500 ms",
    });
    expect(told).toEqual([]);
  });

  it("knows the messages it applied as the stream's leader holds them: their keys and times", async () => {
    const name = "mesh-provisioner_views-applied";
    const probeKv = await seat.jetstream().views.kv(name, { history: 1 });
    const w = writeBucket(probeKv, seat.jetstream(), name);
    const first = await w.put("a.one", "1");
    const second = await w.put("a.two", "2");
    const generation = await startGeneration(
      probeKv,
      name,
      createLogger({ LOG_LEVEL: "silent" }),
      { applied: () => {}, ended: () => {} },
      [5000],
    );
    await generation.loaded;
    await until(() => generation.applied >= second, 5000, "the generation applied both");
    const messageFrom = messageFromProbe(seat, name);
    const mine = appliedAt(generation, second)!;
    const theirs = (await messageFrom(second))!;
    expect([mine.key, theirs.sequence, theirs.subject]).toEqual(["a.two", second, `$KV.${name}.a.two`]);
    expect(Math.abs(nanosOfTime(theirs.time) - mine.nanos)).toBeLessThan(1000);
    // A key written again: its older message is gone from the stream (history 1), and the first
    // from its sequence on is the next one; the generation still knows both.
    const third = await w.put("a.one", "3");
    await until(() => generation.applied >= third, 5000, "the generation applied the rewrite");
    expect((await messageFrom(first))?.sequence).toBe(second);
    expect(appliedAt(generation, first)?.key).toBe("a.one");
    expect(appliedAt(generation, third)?.key).toBe("a.one");
    expect(appliedAt(generation, third + 1)).toBeUndefined();
    expect(await messageFrom(third + 1)).toBeNull();
    generation.watch.stop();
    await seat.jetstreamManager().then((jsm) => jsm.streams.delete(`KV_${name}`));
  });

  it("short of the stream's last sequence with replicas, holds the view current once it receives its own marker, and behind when it does not", async () => {
    let applied = 5;
    const stuck: string[] = [];
    let delivered = true;
    const fresh: CatchUp = catchUpOf({
      applied: () => applied,
      probe: async () => ({ sequence: 9, askedAt: 1000, heldAtAsk: 5 }),
      tail: {
        mark: async () => {
          // The marker comes through the view's watch at sequence 12, or not at all (a stuck watch).
          if (delivered) setTimeout(() => ((applied = 12), fresh.marked("m1", 12), fresh.reached(12)), 10);
          return "m1";
        },
      },
      stuck: (why) => stuck.push(why),
    });
    expect(await fresh.caughtUp()).toEqual({ current: true });
    expect(fresh.confirmedAt()?.getTime()).toBe(1000);
    applied = 5;
    delivered = false;
    const other = catchUpOf({
      applied: () => applied,
      probe: async () => ({ sequence: 9, askedAt: 2000, heldAtAsk: 5 }),
      tail: { mark: async () => "m2" },
      stuck: (why) => stuck.push(why),
    });
    expect(await other.caughtUp()).toEqual({
      current: false,
      why: "the view of bucket b is behind its stream: it applied sequence 5, the stream's leader has 9, and its marker did not come",
    });
    expect(stuck).toHaveLength(1);
    expect(other.confirmedAt()).toBeNull();
  });

  it("short of the stream's last sequence with replicas, holds the view current when its watch reached that sequence while the marker did not come", async () => {
    let applied = 5;
    const fresh = catchUpOf({
      applied: () => applied,
      probe: async () => ({ sequence: 9, askedAt: 3000, heldAtAsk: 5 }),
      tail: {
        mark: async () => {
          // The watch lags: it reaches sequence 9 past the catch-up's wait, and the marker after the read gave up.
          setTimeout(() => (applied = 9), 200);
          return "m3";
        },
      },
    });
    expect(await fresh.caughtUp()).toEqual({ current: true });
    expect(fresh.confirmedAt()?.getTime()).toBe(3000);
  });
});
