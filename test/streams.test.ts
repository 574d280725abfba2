import type { NatsConnection } from "nats";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { readStream } from "../runtime/streams.ts";
import type { TestBus } from "../runtime/testing.ts";
import { testBus } from "./helpers.ts";

// A stream's messages newest first, narrowed to a subject (runtime/streams.ts), on a real stream:
// dense runs, sparse ones and long stretches of other subjects, every `before` against the truth.
const STREAM = "probe_newest";
const COUNT = 1000;
/** The sequences (1-based) whose subject is one the walk asks for. */
const MATCHING = new Set([...Array.from({ length: 100 }, (_, i) => i + 1), 300, 301, 777, 778, 779, 802]);

let bus: TestBus;
let nc: NatsConnection;

beforeAll(async () => {
  // The seat may make any stream here.
  bus = await testBus({ seatPermissions: { publish: { allow: [">"] }, subscribe: { allow: [">"] } } });
  nc = await bus.connect();
  await (await nc.jetstreamManager()).streams.add({ name: STREAM, subjects: ["probe.>"] });
  const js = nc.jetstream();
  for (let seq = 1; seq <= COUNT; seq++) await js.publish(MATCHING.has(seq) ? `probe.p.wanted` : `probe.checked.n${seq}`, String(seq));
});
afterAll(async () => {
  await nc?.close();
  await bus?.stop();
});

describe("a stream read newest first, narrowed to a subject", () => {
  it("gives every message of the subject below each `before`, newest first, and nothing else", async () => {
    const stream = readStream(nc, STREAM);
    for (let before = COUNT + 1; before >= 1; before -= 37) {
      const got: number[] = [];
      for await (const message of stream.newest({ before, subject: "probe.*.wanted" })) got.push(message.seq);
      const truth = [...MATCHING].filter((seq) => seq < before).sort((a, b) => b - a);
      expect([before, got]).toEqual([before, truth]);
    }
  });

  it("gives every message below `before` without a subject", async () => {
    const got: number[] = [];
    for await (const message of readStream(nc, STREAM).newest({ before: 130 })) got.push(message.seq);
    expect(got).toEqual(Array.from({ length: 129 }, (_, i) => 129 - i));
  });
});
