import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { AckPolicy, DeliverPolicy, type NatsConnection } from "nats";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { loadFunctions, start, type Config } from "../runtime/index.ts";
import { startTestBus } from "../runtime/testing.ts";
import { backoff } from "../runtime/consume.ts";
import type { TestBus } from "../runtime/testing.ts";
import { projectConfig, ROOT, until, withoutFunctionFields } from "./helpers.ts";

const RUNTIME = join(ROOT, "runtime", "index.ts");
const TMP = join(ROOT, ".tmp");

let bus: TestBus;
let seat: NatsConnection;
/** A provider allowed to publish the probe's subjects. */
let prober: NatsConnection;
let dir: string;
let otherDir: string;

interface Seen {
  n: number;
  subject: string;
  deliveries?: number;
}
const seen = (): Seen[] => ((globalThis as any).__probeSeen ??= []);

beforeAll(async () => {
  mkdirSync(TMP, { recursive: true });
  dir = mkdtempSync(join(TMP, "functions-"));
  writeFileSync(
    join(dir, "probe-events.ts"),
    `import { z } from "zod";
import { defineFunction } from ${JSON.stringify(RUNTIME)};
export default defineFunction({
  description: "Notes each event; fails the first deliveries of one that asks for it.",
  triggers: [{ event: "probe.ev.*", stream: "probe" }, { event: "probe.plain" }],
  input: z.strictObject({ n: z.number(), failTimes: z.number().optional() }),
  handler: async ({ n, failTimes }, ctx) => {
    if (ctx.trigger.kind !== "event") throw new Error("not an event");
    const deliveries = ctx.trigger.deliveries;
    if (failTimes !== undefined && (deliveries ?? 0) <= failTimes) throw new Error("not yet");
    ((globalThis as any).__probeSeen ??= []).push({ n, subject: ctx.trigger.subject, deliveries });
  },
});
`,
  );
  // Another replica's function set: only a function taking probe.other.> on the same stream.
  otherDir = mkdtempSync(join(TMP, "functions-"));
  writeFileSync(
    join(otherDir, "other-events.ts"),
    `import { defineFunction } from ${JSON.stringify(RUNTIME)};
export default defineFunction({
  description: "Takes only probe.other.>.",
  triggers: [{ event: "probe.other.>", stream: "probe" }],
  handler: () => ((globalThis as any).__otherSeen = ((globalThis as any).__otherSeen ?? 0) + 1),
});
`,
  );
  // The bus grants the seat what both probe function sets need, derived from them.
  const config = withoutFunctionFields(await projectConfig());
  const probe = { ...config, functions: dir, streams: PROBE_STREAMS, providers: { publish: ["probe.ev.*", "probe.plain"], receive: [] } };
  const both = [...(await loadFunctions(probe)), ...(await loadFunctions({ ...probe, functions: otherDir }))];
  bus = await startTestBus(probe, { functions: both, providers: ["prober"] });
  seat = await bus.connect();
  prober = await bus.connect("prober");
});
afterAll(async () => {
  await bus.stop();
  rmSync(dir, { recursive: true, force: true });
  rmSync(otherDir, { recursive: true, force: true });
});

const PROBE_STREAMS = { probe: { stream: "probe_events", maxAgeSeconds: 3600, maxBytes: 1 << 20, ackWaitSeconds: 30 } };

/** The test bus's config with only the probe function and its stream. */
function probeConfig(): Config {
  const config = withoutFunctionFields(bus.config);
  return { ...config, functions: dir, streams: PROBE_STREAMS };
}

const publish = (subject: string, payload: unknown) =>
  prober.jetstream().publish(subject, typeof payload === "string" ? payload : JSON.stringify(payload));

describe("event triggers", () => {
  it("backs off 0.5 s doubling per delivery, up to 30 s", () => {
    expect([1, 2, 3, 4, 7, 20].map(backoff)).toEqual([500, 1000, 2000, 4000, 30_000, 30_000]);
  });

  it("acknowledges after the handler, redelivers a fault with backoff, acknowledges and counts a refusal", async () => {
    const set = await start({ config: probeConfig() });
    try {
      await publish("probe.ev.a", { n: 1 });
      await publish("probe.ev.b", "not json");
      await publish("probe.ev.c", { n: "two" });
      await publish("probe.ev.d", { n: 3, failTimes: 2 });
      await publish("probe.ev.e", { n: 4 });
      await until(() => seen().some((s) => s.n === 3));
      // A message waiting for its redelivery does not hold the next ones up.
      expect(seen()).toEqual([
        { n: 1, subject: "probe.ev.a", deliveries: 1 },
        { n: 4, subject: "probe.ev.e", deliveries: 1 },
        { n: 3, subject: "probe.ev.d", deliveries: 3 },
      ]);
      const refused = await set.runner.records.refusedEvents();
      expect(refused.count).toBe(2);
      expect(refused.byFunction["probe-events"]).toMatchObject({
        count: 2,
        last: { subject: "probe.ev.c", reason: "n: Invalid input: expected number, received string" },
      });
      const info = await (await seat.jetstreamManager()).consumers.info("probe_events", "mesh-provisioner-probe");
      expect([info.num_pending, info.num_ack_pending]).toEqual([0, 0]);
      // A refused event delivered again (its acknowledgement lost) is counted once.
      const again = { subject: "probe.ev.c", reason: "again", at: new Date().toISOString() };
      await set.runner.records.refused("probe-events", again, 3);
      await set.runner.records.refused("probe-events", again, 3);
      expect((await set.runner.records.refusedEvents()).count).toBe(2);
      await set.runner.records.refused("probe-events", again, 99);
      expect((await set.runner.records.refusedEvents()).count).toBe(3);
      await sleep(1500); // nothing refused comes back
      expect(seen()).toHaveLength(3);
    } finally {
      await set.stop();
    }
  });

  it("handles what was published while the set was down once it starts again, and plain subjects live", async () => {
    seen().length = 0;
    await publish("probe.ev.f", { n: 5 });
    await publish("probe.ev.g", { n: 6 });
    const set = await start({ config: probeConfig() });
    try {
      await until(() => seen().length === 2);
      expect(seen().map((s) => s.n)).toEqual([5, 6]);
      prober.publish("probe.plain", JSON.stringify({ n: 7 }));
      await until(() => seen().length === 3);
      expect(seen()[2]).toEqual({ n: 7, subject: "probe.plain" });
      const stream = await (await seat.jetstreamManager()).streams.info("probe_events");
      expect(stream.config.subjects).toEqual(["probe.ev.*"]);
      expect(stream.config.max_age).toBe(3600 * 1e9);
    } finally {
      await set.stop();
    }
  });

  it("hands every event to its function, whatever functions another replica has", async () => {
    // Replica `other` (another version of the set, as in a rolling upgrade) has only a function
    // taking probe.other.>; the probe.ev.* events must all reach `set`'s function, once each.
    seen().length = 0;
    const other = await start({ config: { ...probeConfig(), functions: otherDir, http: { host: "127.0.0.1", port: 0 } } });
    const set = await start({ config: probeConfig() });
    try {
      for (let i = 0; i < 20; i++) await publish(`probe.ev.r${i}`, { n: 100 + i });
      await until(() => seen().length >= 20, 30_000, "every event handled by the replica that has its function");
      await sleep(500);
      expect(
        seen()
          .map((s) => s.n)
          .sort((a, b) => a - b),
      ).toEqual(Array.from({ length: 20 }, (_, i) => 100 + i));
      expect((globalThis as any).__otherSeen).toBeUndefined();
    } finally {
      await set.stop();
      await other.stop();
    }
  });

  it("makes a filtered durable of an earlier set unfiltered, going on from what it acknowledged", async () => {
    const jsm = await seat.jetstreamManager();
    await jsm.consumers.delete("probe_events", "mesh-provisioner-probe");
    await jsm.consumers.add("probe_events", {
      durable_name: "mesh-provisioner-probe",
      filter_subject: "probe.ev.*",
      ack_policy: AckPolicy.Explicit,
      deliver_policy: DeliverPolicy.New,
    });
    for (let i = 0; i < 3; i++) await publish(`probe.ev.m${i}`, { n: 200 + i });
    const old = await seat.jetstream().consumers.get("probe_events", "mesh-provisioner-probe");
    const first = await old.next();
    first!.ack();
    await seat.flush();
    await until(async () => (await jsm.consumers.info("probe_events", "mesh-provisioner-probe")).num_ack_pending === 0);
    seen().length = 0;
    const set = await start({ config: probeConfig() });
    try {
      await until(() => seen().length >= 2);
      await sleep(300);
      expect(seen().map((s) => s.n)).toEqual([201, 202]);
      const info = await jsm.consumers.info("probe_events", "mesh-provisioner-probe");
      expect(info.config.filter_subject ?? "").toBe("");
      expect([info.num_pending, info.num_ack_pending]).toEqual([0, 0]);
    } finally {
      await set.stop();
    }
  });

  it("refuses a trigger naming a stream the config lacks", async () => {
    const failure = await start({ config: { ...probeConfig(), streams: {} } }).catch((e: unknown) => e);
    expect((failure as Error).message).toMatch(
      /probe-events\.ts: triggers\.0\.stream: no stream "probe" in the config \(it has no streams\)$/,
    );
  });

  it("refuses to start with other limits than its stream has, dropping nothing", async () => {
    const smaller = { ...probeConfig(), streams: { probe: { ...PROBE_STREAMS.probe, maxBytes: 4096 } } };
    const failure = await start({ config: smaller }).catch((e: unknown) => e);
    expect((failure as Error).message).toBe(
      "cannot assert stream probe_events (for probe.ev.*): it exists with other settings than the config: maxBytes 1048576 (the config says 4096); " +
        "it is left as it is: edit it (nats stream edit probe_events --max-bytes 4096) or make the config say what it has",
    );
    expect((await (await seat.jetstreamManager()).streams.info("probe_events")).config.max_bytes).toBe(1 << 20);
  });
});
