import { AckPolicy, DeliverPolicy, nanos, type NatsConnection } from "nats";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { STATUS } from "../functions/_lib/status.ts";
import { loadFunctions } from "../runtime/index.ts";
import { seatPermissions } from "../runtime/permissions.ts";
import type { TestBus } from "../runtime/testing.ts";
import { projectConfig, request, startSet, testBus, until } from "./helpers.ts";

const EVENTS = "mesh-provisioner_events";
/** The durables an earlier version made, one per follower function. */
const EARLIER = ["provider-failing", "provider-recovered", "provider-rotated"];

let bus: TestBus;
let seat: NatsConnection;
let keycloak: NatsConnection;

beforeAll(async () => {
  const config = await projectConfig();
  const derived = seatPermissions(config, await loadFunctions(config));
  // The seat as derived, and what the earlier version's durables needed besides: making them,
  // pulling and acknowledging. Reading their floors and deleting them is the derived grants' part.
  const earlier = EARLIER.flatMap((d) => [
    `$JS.API.CONSUMER.CREATE.${EVENTS}.${d}`,
    `$JS.API.CONSUMER.MSG.NEXT.${EVENTS}.${d}`,
    `$JS.ACK.${EVENTS}.${d}.>`,
  ]);
  bus = await testBus({ seatPermissions: { ...derived, publish: { ...derived.publish, allow: [...derived.publish.allow, ...earlier] } } });
  seat = await bus.connect();
  keycloak = await bus.connect("keycloak");
});
afterAll(async () => {
  await bus.stop();
});

const at = (minute: number) => new Date(Date.UTC(2026, 10, 29, 12, minute)).toISOString();

/** A sample of the set's `/metrics`. */
async function sample(httpUrl: string, name: string, labels: string): Promise<number> {
  const text = await (await fetch(`${httpUrl}/metrics`)).text();
  return Number(new RegExp(`^${name}\\{${labels}\\} (\\S+)$`, "m").exec(text)?.[1] ?? 0);
}

describe("the durables of an earlier version, one per function", () => {
  it("are replaced by one durable of the stream from their lowest acknowledgement floor, then deleted", async () => {
    // The set asserts the stream, then stops; its durable is deleted, as if it had never run.
    const first = await startSet(bus);
    await first.stop();
    const jsm = await seat.jetstreamManager();
    await jsm.consumers.delete(EVENTS, "mesh-provisioner-events");

    // The earlier version's durables: unfiltered, each taking every event of the stream.
    for (const durable of EARLIER) {
      await jsm.consumers.add(EVENTS, {
        durable_name: durable,
        ack_policy: AckPolicy.Explicit,
        deliver_policy: DeliverPolicy.All,
        ack_wait: nanos(30_000),
        max_deliver: -1,
        max_ack_pending: 1000,
      });
    }
    const publish = (kind: "failing" | "recovered", n: number, minute: number) =>
      keycloak
        .jetstream()
        .publish(
          `keycloak.provisioner.${kind}`,
          JSON.stringify({ machine: `m${n}`, consumer: `c${n}`, at: at(minute), ...(kind === "failing" ? { word: "down" } : {}) }),
        );
    await publish("failing", 1, 1); // 1
    await publish("failing", 2, 2); // 2
    await publish("recovered", 1, 3); // 3
    await publish("failing", 3, 4); // 4
    await publish("recovered", 2, 5); // 5
    await publish("failing", 4, 6); // 6
    // How far each had come: provider-failing acknowledged 1 to 4, provider-recovered 1 and 2,
    // provider-rotated all 6 (the lowest floor: 2).
    const js = seat.jetstream();
    for (const [durable, acked] of [
      ["provider-failing", 4],
      ["provider-recovered", 2],
      ["provider-rotated", 6],
    ] as const) {
      const consumer = await js.consumers.get(EVENTS, durable);
      for (let i = 0; i < acked; i++) await (await consumer.next({ expires: 5000 }))!.ackAck();
    }
    expect((await Promise.all(EARLIER.map((d) => jsm.consumers.info(EVENTS, d)))).map((c) => c.ack_floor.stream_seq)).toEqual([4, 2, 6]);

    const set = await startSet(bus);
    try {
      await until(async () => {
        const info = await jsm.consumers.info(EVENTS, "mesh-provisioner-events");
        return info.num_pending === 0 && info.num_ack_pending === 0;
      });
      const info = await jsm.consumers.info(EVENTS, "mesh-provisioner-events");
      expect([info.config.deliver_policy, info.config.opt_start_seq, info.config.filter_subject ?? ""]).toEqual([
        DeliverPolicy.StartSequence,
        3,
        "",
      ]);
      // Every event from 3 on handed to its function once: 4 and 6 to provider-failing (4 it had
      // applied already, and applying it again changes nothing), 3 and 5 to provider-recovered.
      const runs = async (fn: string) => sample(set.httpUrl!, "function_runs_total", `function="${fn}",trigger="event"`);
      expect([await runs("provider-failing"), await runs("provider-recovered"), await runs("provider-rotated")]).toEqual([2, 2, 0]);
      const { body } = await request(seat, STATUS, { provider: "keycloak" });
      expect(body.failing.map((f: { consumer: string }) => f.consumer)).toEqual(["c3", "c4"]);
      // The earlier durables are gone.
      const earlier = await Promise.all(
        EARLIER.map((d) =>
          jsm.consumers.info(EVENTS, d).then(
            () => "there",
            (e: Error) => e.message,
          ),
        ),
      );
      expect(earlier).toEqual(["consumer not found", "consumer not found", "consumer not found"]);
    } finally {
      await set.stop();
    }
  });
});
