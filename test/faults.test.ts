import type { NatsConnection } from "nats";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { STATUS } from "../functions/_lib/status.ts";
import { pino } from "pino";
import { loadFunctions, start, type Running } from "../runtime/index.ts";
import { seatPermissions } from "../runtime/permissions.ts";
import type { TestBus } from "../runtime/testing.ts";
import { projectConfig, request, startSet, testBus, until } from "./helpers.ts";

let bus: TestBus;
let seat: NatsConnection;
let keycloak: NatsConnection;
let set: Running;

beforeAll(async () => {
  bus = await testBus();
  seat = await bus.connect();
  keycloak = await bus.connect("keycloak");
  set = await startSet(bus);
});
afterAll(async () => {
  await set.stop();
  await bus.stop();
});

const readyz = async () => {
  const response = await fetch(`${set.httpUrl}/readyz`);
  return { status: response.status, body: (await response.json()) as { ready: boolean; reasons?: string[] } };
};

describe("faults the set recovers from by itself", () => {
  it("makes a deleted durable consumer again from where it was, not ready meanwhile, and follows again within 10 s", async () => {
    const failing = (consumer: string) =>
      keycloak
        .jetstream()
        .publish(
          "keycloak.provisioner.failing",
          JSON.stringify({ machine: "alder", consumer, word: "before", at: new Date().toISOString() }),
        );
    await failing("before-delete");
    await until(async () => (await request(seat, STATUS, { consumer: "before-delete" })).body.failing.length === 1, 10_000, "followed");
    const jsm = await seat.jetstreamManager();
    const floor = (await jsm.consumers.info("mesh-provisioner_events", "provider-failing")).ack_floor.stream_seq;

    // As `nats consumer rm` would.
    await jsm.consumers.delete("mesh-provisioner_events", "provider-failing");
    const reasons: string[] = [];
    const deletedAt = Date.now();
    await until(
      async () => {
        const { status, body } = await readyz();
        if (status === 503) reasons.push(...(body.reasons ?? []));
        return (await jsm.consumers.info("mesh-provisioner_events", "provider-failing").catch(() => undefined)) !== undefined;
      },
      10_000,
      "the durable made again",
    );
    await failing("after-delete");
    await until(
      async () => (await request(seat, STATUS, { consumer: "after-delete" })).body.failing.length === 1,
      10_000,
      "followed again",
    );
    expect(Date.now() - deletedAt).toBeLessThan(10_000);
    // Made again from where it was: nothing acknowledged before is delivered again.
    const info = await jsm.consumers.info("mesh-provisioner_events", "provider-failing");
    expect(info.config.opt_start_seq).toBe(floor + 1);
    expect((await readyz()).status).toBe(200);
    if (reasons.length > 0) expect(reasons[0]).toMatch(/^durable consumer provider-failing of stream mesh-provisioner_events is gone/);
  });
});

describe("refusals only the server sees", () => {
  it("are logged with their subject, and a refused subscription makes the set not ready, naming it", async () => {
    const config = await projectConfig();
    const derived = seatPermissions(config, await loadFunctions(config));
    // Permissions printed before the status function existed: its verb is missing.
    const narrowed = await testBus({
      seatPermissions: { ...derived, subscribe: { allow: derived.subscribe.allow.filter((s) => s !== "mesh-provisioner.status") } },
    });
    const lines: { msg: string; operation?: string; subject?: string }[] = [];
    const log = pino({ level: "error" }, { write: (line: string) => void lines.push(JSON.parse(line)) });
    const started = await start({ config: narrowed.config, log });
    try {
      await until(async () => (await fetch(`${started.httpUrl}/readyz`)).status === 503, 10_000, "not ready");
      const body = (await (await fetch(`${started.httpUrl}/readyz`)).json()) as { reasons: string[] };
      expect(body.reasons).toEqual([
        "the server refuses the seat the subscription to mesh-provisioner.status: grant what `mesh-provisioner permissions` prints",
      ]);
      expect(lines).toContainEqual(
        expect.objectContaining({
          msg: "the server refused a permission of the seat",
          operation: "subscription",
          subject: "mesh-provisioner.status",
        }),
      );
    } finally {
      await started.stop();
      await narrowed.stop();
    }
  });
});

describe("a bucket deleted and made again behind the set", () => {
  it("is loaded again by the view: within 10 s the verb lists what the new bucket holds, and none of the old keys", async () => {
    // The seat may do anything here: the test deletes and makes the bucket's stream itself.
    const wide = await testBus({ seatPermissions: { publish: { allow: [">"] }, subscribe: { allow: [">"] } } });
    const running = await startSet(wide);
    try {
      const alder = await wide.kv("needs", "alder");
      for (let i = 0; i < 30; i++) await alder.put(`alder.old.config.k${i}`, '"old"');
      const asker = await wide.connect("birch");
      const keys = async () =>
        ((await request(asker, "mesh-provisioner.provisioning", { what: "needs", node: "alder" })).body.entries as { key: string }[]).map(
          (e) => e.key,
        );
      expect(await keys()).toHaveLength(30);

      const jsm = await (await wide.connect()).jetstreamManager();
      const { config } = await jsm.streams.info("KV_mesh-provisioner_needs");
      await jsm.streams.delete("KV_mesh-provisioner_needs");
      await jsm.streams.add(config);
      const recreated = Date.now();
      const again = await wide.kv("needs", "alder");
      for (let i = 0; i < 5; i++) await again.put(`alder.new.config.k${i}`, '"new"');
      const fresh = ["alder.new.config.k0", "alder.new.config.k1", "alder.new.config.k2", "alder.new.config.k3", "alder.new.config.k4"];
      await until(async () => JSON.stringify(await keys()) === JSON.stringify(fresh), 10_000, "the verb lists the new bucket");
      expect(Date.now() - recreated).toBeLessThan(10_000);
    } finally {
      await running.stop();
      await wide.stop();
    }
  });
});

describe("a server back with an empty store", () => {
  it("gets its buckets, stream and durables asserted again, is not ready until then, and serves again by itself", async () => {
    const lost = await testBus();
    const running = await startSet(lost);
    try {
      await (await lost.kv("needs", "alder")).put("alder.before.config.k", '"before"');
      await lost.restart({ emptyStore: true });
      const readiness: number[] = [];
      const back = Date.now();
      const birch = await lost.connect("birch");
      const keycloak = await lost.connect("keycloak");
      // Serving again: the verb answers from the new, empty bucket, and a provider's event is followed.
      await until(
        async () => {
          readiness.push((await fetch(`${running.httpUrl}/readyz`)).status);
          const answer = await request(birch, "mesh-provisioner.provisioning", { what: "needs", node: "alder" }).catch(() => undefined);
          return answer?.errorCode === undefined && answer?.body.entries.length === 0;
        },
        15_000,
        "the verb answers from the asserted bucket",
      );
      await until(
        async () => {
          const ack = await keycloak
            .jetstream()
            .publish(
              "keycloak.provisioner.failing",
              JSON.stringify({ machine: "alder", consumer: "after", word: "back", at: new Date().toISOString() }),
            )
            .catch(() => undefined);
          return ack !== undefined;
        },
        15_000,
        "the events stream takes events again",
      );
      await until(
        async () => (await request(birch, "mesh-provisioner.status", { consumer: "after" })).body.failing?.length === 1,
        15_000,
        "the follower follows again",
      );
      await until(async () => (await fetch(`${running.httpUrl}/readyz`)).status === 200, 10_000, "ready again");
      expect(Date.now() - back).toBeLessThan(30_000);
      expect(readiness).toContain(503);
      await (await lost.kv("needs", "alder")).put("alder.after.config.k", '"after"');
      const answer = await request(birch, "mesh-provisioner.provisioning", { what: "needs", node: "alder" });
      expect(answer.body.entries.map((e: { key: string }) => e.key)).toEqual(["alder.after.config.k"]);
    } finally {
      await running.stop();
      await lost.stop();
    }
  }, 90_000);
});

describe("a hung server (SIGSTOP)", () => {
  it("makes the set not ready within 10 s, HTTP answering 503 at once meanwhile, and ready again once it answers", async () => {
    const hung = await testBus();
    const running = await startSet(hung);
    try {
      await (await hung.kv("needs", "alder")).put("alder.zsh.shell.zsh/normal", '"held in memory"');
      const asked = await fetch(`${running.httpUrl}/provisioning?what=needs&node=alder`);
      expect(asked.status).toBe(200);
      const stoppedAt = Date.now();
      process.kill(hung.server.pid, "SIGSTOP");
      try {
        await until(async () => (await fetch(`${running.httpUrl}/readyz`)).status === 503, 10_000, "not ready");
        expect(Date.now() - stoppedAt).toBeLessThan(10_000);
        const body = (await (await fetch(`${running.httpUrl}/readyz`)).json()) as { reasons: string[] };
        expect(body.reasons.join("; ")).toMatch(/NATS does not answer|not connected to NATS/);
        const began = Date.now();
        const answer = await fetch(`${running.httpUrl}/provisioning?what=needs&node=alder`);
        expect(answer.status).toBe(503);
        expect(Date.now() - began).toBeLessThan(1000);
        // The reader's choice: what the view holds, and when it was last confirmed current.
        const stale = await fetch(`${running.httpUrl}/provisioning?what=needs&node=alder&stale=true`);
        expect(stale.status).toBe(200);
        const held = (await stale.json()) as { entries: { key: string }[]; confirmedAt: string };
        expect(held.entries.map((e) => e.key)).toEqual(["alder.zsh.shell.zsh/normal"]);
        expect(Date.parse(held.confirmedAt)).toBeGreaterThanOrEqual(stoppedAt - 60_000);
        expect(Date.parse(held.confirmedAt)).toBeLessThanOrEqual(stoppedAt);
      } finally {
        process.kill(hung.server.pid, "SIGCONT");
      }
      await until(async () => (await fetch(`${running.httpUrl}/readyz`)).status === 200, 30_000, "ready again");
      expect((await fetch(`${running.httpUrl}/provisioning?what=registry&kind=port`)).status).toBe(200);
    } finally {
      await running.stop();
      await hung.stop();
    }
  }, 60_000);
});
