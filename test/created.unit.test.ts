import type { KvEntry } from "nats";
import { describe, expect, it } from "vitest";
import { createdMsOf } from "../runtime/buckets.ts";

// A watch's entry as nats.js makes it: its time in nanoseconds the reply subject's tenth token.
const watched = (nanos: string, created: Date) =>
  ({ created, sm: { reply: `$JS.ACK._.hash.KV_b.consumer.1.42.42.${nanos}.0.random` } }) as unknown as KvEntry;

describe("when a watched entry was stored", () => {
  it("is the millisecond its nanoseconds fall in, as a direct get says, where a Number would round up", () => {
    const nanos = "1796201137808999999";
    // What nats.js makes of it: the Number is past 2^53, and lands on the next millisecond.
    expect(Math.floor(parseInt(nanos, 10) / 1_000_000)).toBe(1796201137809);
    expect(createdMsOf(watched(nanos, new Date(1796201137809)))).toBe(1796201137808);
    expect(new Date(createdMsOf(watched(nanos, new Date(0)))).toISOString()).toBe("2026-12-02T08:45:37.808Z");
  });

  it("is the entry's own time when it came from no watch (a get)", () => {
    const got = { created: new Date(1796201137808), sm: {} } as unknown as KvEntry;
    expect(createdMsOf(got)).toBe(1796201137808);
  });
});
