import type { KV, NatsConnection } from "nats";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { assertBuckets } from "../runtime/assert.ts";
import { writeBucket } from "../runtime/buckets.ts";
import { RevisionConflict } from "../runtime/errors.ts";
import { createLogger } from "../runtime/log.ts";
import { publisherOf } from "../runtime/publisher.ts";
import type { TestBus } from "../runtime/testing.ts";
import type { WriteBucket } from "../runtime/types.ts";
import { testBus } from "./helpers.ts";

// The write handle of a bucket publishes its compare-and-set writes through one subscription of
// the connection's inbox (runtime/publisher.ts): it must end each as nats.js's requests do.

let bus: TestBus;
let seat: NatsConnection;
let kv: KV;
let failing: WriteBucket;
let noStream: unknown;

beforeAll(async () => {
  // The seat with its derived permissions: it receives on its own inbox prefix only.
  bus = await testBus();
  seat = await bus.connect();
  // Before the buckets are made, no stream captures their subjects.
  noStream = await publisherOf(seat)("$KV.mesh-provisioner_failing.keycloak.alder.grafana", "{}").catch((err: unknown) => err);
  await assertBuckets(seat, bus.config, createLogger({ LOG_LEVEL: "silent" }));
  kv = await bus.kv("failing");
  failing = writeBucket(kv, seat.jetstream(), "mesh-provisioner_failing", seat);
});
afterAll(() => bus.stop());

describe("a bucket's compare-and-set writes, through the connection's publisher", () => {
  it("write at the revision they name, and lose with a RevisionConflict at any other", async () => {
    const first = await failing.update("keycloak.alder.grafana", '{"a":1}', 0);
    const second = await failing.update("keycloak.alder.grafana", '{"a":2}', first);
    expect(second).toBeGreaterThan(first);
    expect((await kv.get("keycloak.alder.grafana"))?.string()).toBe('{"a":2}');
    await expect(failing.update("keycloak.alder.grafana", '{"a":3}', first)).rejects.toBeInstanceOf(RevisionConflict);
    const gone = await failing.delete("keycloak.alder.grafana", { revision: second, value: '{"recovered":"x"}' });
    expect(await failing.last("keycloak.alder.grafana")).toMatchObject({ revision: gone, deleted: true });
    await expect(failing.delete("keycloak.alder.grafana", { revision: second })).rejects.toBeInstanceOf(RevisionConflict);
  });

  it("answer each of many writes at once with its own revision", async () => {
    const revisions = await Promise.all(Array.from({ length: 200 }, (_, i) => failing.update(`keycloak.m${i}.grafana`, `${i}`, 0)));
    expect(new Set(revisions).size).toBe(200);
    for (const i of [0, 99, 199]) expect((await kv.get(`keycloak.m${i}.grafana`))?.revision).toBe(revisions[i]);
  });

  it("refuse a key nats.js's KV refuses, and a subject no stream captures with no responders", async () => {
    await expect(failing.update("keycloak.alder.gra fana", "{}", 0)).rejects.toThrow(/invalid key/);
    expect(noStream).toMatchObject({ code: "503" });
  });

  it("end the writes in hand when the connection closes", async () => {
    const other = await bus.connect();
    const publish = publisherOf(other);
    await publish("$KV.mesh-provisioner_failing.keycloak.closing.grafana", "{}");
    const late = publish("$KV.mesh-provisioner_failing.keycloak.closing.grafana", "{}");
    const closed = other.close();
    // Acknowledged before the connection went, or ended by its close: never left waiting.
    expect(["acknowledged", "CONNECTION_CLOSED"]).toContain(
      await late.then(
        () => "acknowledged",
        (err: { code?: string }) => err.code,
      ),
    );
    await closed;
    await expect(publish("$KV.mesh-provisioner_failing.keycloak.closing.grafana", "{}")).rejects.toMatchObject({
      code: "CONNECTION_CLOSED",
    });
  });
});
