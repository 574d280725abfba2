import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import type { NatsConnection } from "nats";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { loadFunctions, start, type Config } from "../runtime/index.ts";
import { startTestBus, type TestBus } from "../runtime/testing.ts";
import { projectConfig, ROOT, until, withoutFunctionFields } from "./helpers.ts";

const RUNTIME = join(ROOT, "runtime", "index.ts");
const TMP = join(ROOT, ".tmp");
const STREAMS = { probe: { stream: "dispatch_events", maxAgeSeconds: 3600, maxBytes: 1 << 20, ackWaitSeconds: 30 } };

let bus: TestBus;
let seat: NatsConnection;
let prober: NatsConnection;
let dir: string;
let config: Config;

/** Each function's runs, as `<function> <n> <deliveries>`. */
const runs = (): string[] => ((globalThis as any).__dispatchRuns ??= []);

const fn = (name: string, event: string, failing: boolean) => `import { z } from "zod";
import { defineFunction } from ${JSON.stringify(RUNTIME)};
export default defineFunction({
  description: "Notes each event${failing ? "; fails the first deliveries of one that asks for it" : ""}.",
  triggers: [{ event: ${JSON.stringify(event)}, stream: "probe" }],
  input: z.strictObject({ n: z.number(), failTimes: z.number().optional() }),
  handler: async ({ n, failTimes }, ctx) => {
    if (ctx.trigger.kind !== "event") throw new Error("not an event");
    const deliveries = ctx.trigger.deliveries ?? 0;
    ((globalThis as any).__dispatchRuns ??= []).push(\`${name} \${n} \${deliveries}\`);
    ${failing ? `if (failTimes !== undefined && deliveries <= failTimes) throw new Error("not yet");` : ""}
  },
});
`;

beforeAll(async () => {
  mkdirSync(TMP, { recursive: true });
  dir = mkdtempSync(join(TMP, "functions-"));
  // Two functions on one subject (a stream cannot capture overlapping ones), and one on another.
  writeFileSync(join(dir, "first.ts"), fn("first", "dispatch.ev.*", false));
  writeFileSync(join(dir, "second.ts"), fn("second", "dispatch.ev.*", true));
  writeFileSync(join(dir, "third.ts"), fn("third", "dispatch.other", false));
  const base = withoutFunctionFields(await projectConfig());
  const probe = { ...base, functions: dir, streams: STREAMS, providers: { publish: ["dispatch.ev.*", "dispatch.other"], receive: [] } };
  bus = await startTestBus(probe, { functions: await loadFunctions(probe), providers: ["prober"] });
  config = { ...withoutFunctionFields(bus.config), functions: dir, streams: STREAMS };
  seat = await bus.connect();
  prober = await bus.connect("prober");
});
afterAll(async () => {
  await bus.stop();
  rmSync(dir, { recursive: true, force: true });
});

describe("one durable consumer for the triggers of a stream", () => {
  it("hands a message to every trigger it matches, acknowledges it once all succeeded, and runs again only those that faulted", async () => {
    const set = await start({ config });
    try {
      const publish = (subject: string, payload: unknown) => prober.jetstream().publish(subject, JSON.stringify(payload));
      await publish("dispatch.ev.a", { n: 1 });
      await publish("dispatch.ev.b", { n: 2, failTimes: 2 });
      await publish("dispatch.other", { n: 3 });
      const jsm = await seat.jetstreamManager();
      await until(async () => {
        const info = await jsm.consumers.info("dispatch_events", "mesh-provisioner-probe");
        return info.delivered.stream_seq === 3 && info.num_pending === 0 && info.num_ack_pending === 0;
      });
      expect(runs().sort()).toEqual(["first 1 1", "first 2 1", "second 1 1", "second 2 1", "second 2 2", "second 2 3", "third 3 1"]);
      // One durable for the three triggers.
      expect((await jsm.streams.info("dispatch_events")).state.consumer_count).toBe(1);
    } finally {
      await set.stop();
    }
  });
});
