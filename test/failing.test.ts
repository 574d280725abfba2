import fc from "fast-check";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { applyEvent, decide, failingOf, keptOf, keptWord, notAhead, providerOf } from "../functions/_lib/follower.ts";
import { failingEvent, MAX_WORD, recoveredEvent } from "../contract/events.ts";
import { compareTimes, rfc3339 } from "../contract/times.ts";
import { assertBuckets } from "../runtime/assert.ts";
import { writeBucket } from "../runtime/buckets.ts";
import type { WriteBucket } from "../runtime/types.ts";
import { createLogger } from "../runtime/log.ts";
import { ServiceError } from "../runtime/index.ts";
import type { TestBus } from "../runtime/testing.ts";
import { testBus } from "./helpers.ts";

const bytes = (value: unknown) => new TextEncoder().encode(JSON.stringify(value));

describe("event times", () => {
  it("orders RFC 3339 times by their instant, to the last digit of the fraction, whatever the offset", () => {
    expect(compareTimes("2026-11-29T12:00:00Z", "2026-11-29T13:00:00+01:00")).toBe(0);
    expect(compareTimes("2026-11-29T12:00:00.000000001Z", "2026-11-29T12:00:00Z")).toBe(1);
    expect(compareTimes("2026-11-29T12:00:00.0000000001Z", "2026-11-29T12:00:00.0000000009Z")).toBe(-1);
    expect(compareTimes("2026-11-29t12:00:00.5z", "2026-11-29T12:00:00.500Z")).toBe(0);
    expect(compareTimes("1969-12-31T23:59:59.9Z", "1970-01-01T00:00:00Z")).toBe(-1);
    expect(compareTimes("0000-01-01T00:00:00Z", "9999-12-31T23:59:59.999Z")).toBe(-1);
  });

  it("takes RFC 3339 with an offset and nothing else", () => {
    for (const good of ["2026-11-29T12:00:00Z", "2026-11-29T12:00:00.123+05:30", "2026-11-29t12:00:00z"]) {
      expect(rfc3339.safeParse(good).success).toBe(true);
    }
    // After 9999 and before 0000 once in UTC no RFC 3339 can say them; and no time needs 600 digits.
    for (const bad of [
      `2026-11-29T12:00:00.${"1".repeat(600)}Z`,
      "yesterday",
      "2026-11-29",
      "2026-11-29 12:00:00Z",
      "2026-11-29T12:00:00",
      "2026-02-30T12:00:00Z",
      1764417600000,
      "9999-12-31T23:59:59-12:00",
      "0000-01-01T00:00:00+01:00",
    ]) {
      expect(rfc3339.safeParse(bad).success).toBe(false);
    }
  });
});

describe("events", () => {
  it("need machine, consumer and at as tokens and a time, a failing its word; other fields are ignored", () => {
    const ok = { machine: "m", consumer: "c", at: "2026-11-29T12:00:00Z" };
    expect(failingEvent.parse({ ...ok, word: "w", detail: "more" })).toEqual({ ...ok, word: "w" });
    expect(recoveredEvent.parse({ ...ok, word: "ignored" })).toEqual(ok);
    expect(failingEvent.safeParse(ok).success).toBe(false);
    expect(failingEvent.safeParse({ ...ok, word: "w", machine: "a.b" }).success).toBe(false);
    expect(recoveredEvent.safeParse({ consumer: "c", at: ok.at }).success).toBe(false);
  });

  it("take the provider from the subject's first token, refusing one that is not a token", () => {
    expect(providerOf({ kind: "event", subject: "keycloak.provisioner.failing" })).toBe("keycloak");
    const refused = (subject: string) => {
      try {
        providerOf({ kind: "event", subject });
        return "taken";
      } catch (err) {
        expect(err).toBeInstanceOf(ServiceError);
        return (err as ServiceError).message;
      }
    };
    expect(refused("key:cloak.provisioner.failing")).toBe(
      'subject key:cloak.provisioner.failing: the provider "key:cloak" is not one token (A-Z a-z 0-9 - _ / =)',
    );
    expect(() => providerOf({ kind: "invoke" })).toThrow(/this run has none/);
  });

  it("keep a word of at most 1,024 characters, cutting a longer one", () => {
    expect(keptWord("short")).toBe("short");
    const cut = keptWord("😀".repeat(5000));
    expect([...cut]).toHaveLength(MAX_WORD);
    expect(cut.endsWith("😀…")).toBe(true);
    expect(cut.isWellFormed()).toBe(true);
  });
});

describe("a provider's clock", () => {
  it("may run up to 5 minutes ahead of the server's time of the event; further ahead, its event is refused", () => {
    const storedAt = new Date("2026-11-29T12:00:00Z");
    expect(() => notAhead("2026-11-29T12:05:00Z", storedAt)).not.toThrow();
    expect(() => notAhead("2026-11-29T14:00:00+02:00", storedAt)).not.toThrow();
    expect(() => notAhead("2026-11-29T14:00:00Z", storedAt)).toThrow(
      "at: 2026-11-29T14:00:00Z is 120 minutes ahead of the server's time of the event; is the provider's clock right?",
    );
  });
});

describe("the failing bucket's records", () => {
  const record = (value: unknown, deleted: boolean) => ({
    key: "p.m.c",
    value: bytes(value),
    revision: 7,
    created: new Date(),
    createdNanos: 0,
    deleted,
  });
  it("read as failing, recovered or none", () => {
    expect(keptOf(null)).toEqual({ state: "none", revision: 0 });
    expect(keptOf(record({ word: "w", since: "2026-11-29T12:00:00Z", at: "2026-11-29T12:01:00Z" }, false))).toEqual({
      state: "failing",
      revision: 7,
      word: "w",
      since: "2026-11-29T12:00:00Z",
      at: "2026-11-29T12:01:00Z",
    });
    expect(keptOf(record({ recovered: "2026-11-29T12:02:00Z" }, true))).toEqual({
      state: "recovered",
      revision: 7,
      at: "2026-11-29T12:02:00Z",
    });
    expect(keptOf({ ...record(null, true), value: new Uint8Array() })).toEqual({ state: "none", revision: 7 });
  });

  it("list as failing triples sorted by provider, machine, consumer; other keys are said out of shape", () => {
    const value = { word: "w", since: "2026-11-29T12:00:00Z", at: "2026-11-29T12:00:00Z" };
    const { failing, outOfShape } = failingOf([
      { key: "b.m.c", value: bytes(value) },
      { key: "a-b.m.c", value: bytes(value) },
      { key: "a.z.c", value: bytes(value) },
      { key: "a.m", value: bytes(value) },
      { key: "a.m.x", value: bytes({ word: 1 }) },
    ]);
    expect(failing.map((f) => [f.provider, f.machine, f.consumer])).toEqual([
      ["a", "z", "c"],
      ["a-b", "m", "c"],
      ["b", "m", "c"],
    ]);
    expect(outOfShape).toEqual([
      { key: "a.m", reason: "failing keys have 3 tokens, this has 2" },
      {
        key: "a.m.x",
        reason:
          "value is not { word, since, at }: word: Invalid input: expected string, received number; since: Invalid input: expected string, received undefined; at: Invalid input: expected string, received undefined",
      },
    ]);
  });
});

describe("deciding what an event does", () => {
  const t = (m: number) => `2026-11-29T12:${String(m).padStart(2, "0")}:00Z`;
  const failing = (m: number, word = `w${m}`) => ({ kind: "failing" as const, event: { machine: "m", consumer: "c", word, at: t(m) } });
  const recovered = (m: number) => ({ kind: "recovered" as const, event: { machine: "m", consumer: "c", at: t(m) } });
  const kept = (since: number, at: number) => ({ state: "failing" as const, revision: 3, word: "kept", since: t(since), at: t(at) });
  const remembered = (at: number) => ({ state: "recovered" as const, revision: 3, at: t(at), since: t(0) });
  const none = { state: "none" as const, revision: 0 };

  it("raises, updates, recovers and remembers newer events", () => {
    expect(decide(none, failing(5))).toEqual({ change: "raised", write: { put: { word: "w5", since: t(5), at: t(5) } } });
    expect(decide(kept(1, 5), failing(6))).toEqual({ change: "updated", write: { put: { word: "w6", since: t(1), at: t(6) } } });
    expect(decide(kept(1, 5), recovered(6))).toEqual({ change: "recovered", write: { recover: { recovered: t(6), since: t(1) } } });
    expect(decide(none, recovered(6))).toEqual({ change: "remembered", write: { recover: { recovered: t(6) } } });
    expect(decide(remembered(6), recovered(7))).toEqual({ change: "remembered", write: { recover: { recovered: t(7), since: t(0) } } });
    expect(decide(remembered(6), failing(7))).toEqual({ change: "raised", write: { put: { word: "w7", since: t(7), at: t(7) } } });
  });

  it("changes nothing for older or same events, a failing winning a tie", () => {
    expect(decide(kept(1, 5), failing(5))).toEqual({ change: "older" });
    expect(decide(kept(1, 5), failing(4))).toEqual({ change: "older" });
    expect(decide(kept(1, 5), recovered(1))).toEqual({ change: "older" });
    expect(decide(remembered(6), failing(5))).toEqual({ change: "older" });
    expect(decide(remembered(6), recovered(6))).toEqual({ change: "older" });
    expect(decide(remembered(6), failing(6)).change).toBe("raised");
  });

  it("starts the streak at a tie's instant, whichever of the failing and the recovered of that instant arrives first", () => {
    // F(1), F(5), R(5) and F(1), R(5), F(5): failing since 5 both ways.
    expect(decide(kept(1, 5), recovered(5))).toEqual({ change: "restarted", write: { put: { word: "kept", since: t(5), at: t(5) } } });
    expect(decide(remembered(5), failing(5))).toEqual({ change: "raised", write: { put: { word: "w5", since: t(5), at: t(5) } } });
    // A lone failing and a recovered of one instant: failing since it, both ways.
    expect(decide(kept(5, 5), recovered(5))).toEqual({ change: "older" });
  });

  it("restarts the streak at the kept failing when a recovery between since and at arrives late", () => {
    // Published F(1), R(3), F(5); R applied last: the streak began at 5, not 1.
    expect(decide(kept(1, 5), recovered(3))).toEqual({ change: "restarted", write: { put: { word: "kept", since: t(5), at: t(5) } } });
  });
});

describe("applying events, newest wins", () => {
  let bus: TestBus;
  let bucket: WriteBucket;
  beforeAll(async () => {
    bus = await testBus();
    const seat = await bus.connect();
    // The bucket is made as the function set makes it.
    await assertBuckets(seat, bus.config, createLogger({ LOG_LEVEL: "silent" }));
    bucket = writeBucket(await bus.kv("failing"), seat.jetstream(), "mesh-provisioner_failing");
  });
  afterAll(() => bus.stop());

  const t = (s: number) => new Date(Date.UTC(2026, 10, 29, 12, 0, s)).toISOString();

  it("says what each event did", async () => {
    const on = (kind: "failing" | "recovered", s: number, word = "w") =>
      applyEvent(
        bucket,
        "p",
        kind === "failing"
          ? { kind, event: { machine: "m", consumer: "c", word, at: t(s) } }
          : { kind, event: { machine: "m", consumer: "c", at: t(s) } },
      );
    expect(await on("recovered", 1)).toBe("remembered");
    expect(await on("failing", 0)).toBe("older");
    expect(await on("failing", 2, "a")).toBe("raised");
    expect(await on("failing", 2, "again")).toBe("older");
    expect(await on("failing", 3, "b")).toBe("updated");
    expect(keptOf(await bucket.last("p.m.c"))).toMatchObject({ state: "failing", word: "b", since: t(2), at: t(3) });
    expect(await on("recovered", 4)).toBe("recovered");
    expect(keptOf(await bucket.last("p.m.c"))).toMatchObject({ state: "recovered", at: t(4), since: t(2) });
    expect(await bucket.get("p.m.c")).toBeNull();
  });

  it("keeps the same since at ties, whatever order F(1), F(2) and R(2) arrive in", async () => {
    const events = [
      { kind: "failing", event: { machine: "m", consumer: "tie", word: "one", at: t(1) } },
      { kind: "failing", event: { machine: "m", consumer: "tie", word: "two", at: t(2) } },
      { kind: "recovered", event: { machine: "m", consumer: "tie", at: t(2) } },
    ] as const;
    const orders = [
      [0, 1, 2],
      [0, 2, 1],
      [1, 0, 2],
      [1, 2, 0],
      [2, 0, 1],
      [2, 1, 0],
    ];
    const ends = [];
    for (const [i, order] of orders.entries()) {
      for (const n of order) await applyEvent(bucket, `tie${i}`, events[n]!);
      const { revision: _, ...kept } = keptOf(await bucket.last(`tie${i}.m.tie`)) as { revision: number };
      ends.push(kept);
    }
    expect(ends).toEqual(Array(6).fill({ state: "failing", word: "two", since: t(2), at: t(2) }));
  });

  it("ends at the newest event of a triple, whatever order the events come in, even applied at once", async () => {
    let run = 0;
    await fc.assert(
      fc.asyncProperty(
        fc
          .uniqueArray(fc.integer({ min: 0, max: 3600 }), { minLength: 1, maxLength: 12 })
          .chain((seconds) =>
            fc.tuple(
              fc.constant(seconds),
              fc.array(fc.boolean(), { minLength: seconds.length, maxLength: seconds.length }),
              fc.boolean(),
              fc.boolean(),
            ),
          ),
        async ([seconds, failing, together, ordered]) => {
          const consumer = `c${run++}`;
          const events = seconds.map((s, i) =>
            failing[i]
              ? { kind: "failing" as const, event: { machine: "m", consumer, word: `w${s}`, at: t(s) } }
              : { kind: "recovered" as const, event: { machine: "m", consumer, at: t(s) } },
          );
          // In the order they happened, or in the order drawn, one by one or all at once.
          const order = ordered ? [...events].sort((a, b) => (a.event.at < b.event.at ? -1 : 1)) : events;
          if (together) await Promise.all(order.map((e) => applyEvent(bucket, "q", e)));
          else for (const e of order) await applyEvent(bucket, "q", e);
          const newest = events.reduce((a, b) => (b.event.at > a.event.at ? b : a));
          const kept = keptOf(await bucket.last(`q.m.${consumer}`));
          expect(kept.state).toBe(newest.kind);
          expect(kept.state !== "none" && kept.at).toBe(newest.event.at);
          if (kept.state !== "failing") return;
          expect(kept.word).toBe(`w${seconds[events.indexOf(newest)]}`);
          // The streak truly began at the first failing after the last recovery before the newest.
          const lastRecovery =
            events
              .filter((e) => e.kind === "recovered")
              .map((e) => e.event.at)
              .sort()
              .at(-1) ?? "";
          const start = events
            .filter((e) => e.kind === "failing" && e.event.at > lastRecovery)
            .map((e) => e.event.at)
            .sort()[0]!;
          if (!together && ordered) expect(kept.since).toBe(start);
          expect(kept.since >= start && kept.since <= kept.at).toBe(true);
        },
      ),
      { numRuns: 40 },
    );
  });
});
