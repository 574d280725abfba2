import type { NatsConnection } from "nats";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { STATUS } from "../functions/_lib/status.ts";
import type { Running } from "../runtime/index.ts";
import type { TestBus } from "../runtime/testing.ts";
import { request, startSet, testBus, until } from "./helpers.ts";

let bus: TestBus;
let seat: NatsConnection;
let set: Running | undefined;
const providers: Record<string, NatsConnection> = {};

beforeAll(async () => {
  // max_payload above 2 MiB, so a 2 MiB word reaches the follower.
  bus = await testBus({ maxPayload: 4 * 1024 * 1024 });
  seat = await bus.connect();
  for (const provider of ["keycloak", "postgres", "mesh-vault"]) providers[provider] = await bus.connect(provider);
  set = await startSet(bus);
});
afterAll(async () => {
  await set?.stop();
  await bus.stop();
});

/** Publishes a provider's event through JetStream, as the provider's own user; resolves once the stream holds it. */
async function emit(provider: string, kind: "failing" | "recovered", event: Record<string, unknown> | string) {
  const data = typeof event === "string" ? event : JSON.stringify(event);
  await providers[provider]!.jetstream().publish(`${provider}.provisioner.${kind}`, data);
}

/** Waits until the follower's durable consumers have handled everything in the stream. */
async function settled() {
  const jsm = await seat.jetstreamManager();
  await until(async () => {
    for (const durable of ["mesh-provisioner-events"]) {
      const info = await jsm.consumers.info("mesh-provisioner_events", durable).catch(() => undefined);
      if (info === undefined || info.num_pending > 0 || info.num_ack_pending > 0) return false;
    }
    return true;
  });
}

const status = async (narrowing: Record<string, string> = {}) => {
  const reply = await request(seat, STATUS, narrowing);
  expect(reply.errorCode).toBeUndefined();
  return reply.body;
};

const at = (minute: number) => new Date(Date.UTC(2026, 10, 29, 12, minute)).toISOString();

describe("the follower and status", () => {
  it("names a failing provider with its word until a newer recovered, keeping since", async () => {
    await emit("keycloak", "failing", { machine: "dogwood", consumer: "grafana", word: "invalid_client", at: at(1) });
    await settled();
    expect(await status({ provider: "keycloak" })).toMatchObject({
      well: false,
      failing: [{ provider: "keycloak", machine: "dogwood", consumer: "grafana", word: "invalid_client", since: at(1), at: at(1) }],
    });

    await emit("keycloak", "failing", { machine: "dogwood", consumer: "grafana", word: "realm unreachable", at: at(2) });
    await settled();
    expect((await status({ provider: "keycloak" })).failing).toEqual([
      { provider: "keycloak", machine: "dogwood", consumer: "grafana", word: "realm unreachable", since: at(1), at: at(2) },
    ]);

    await emit("keycloak", "recovered", { machine: "dogwood", consumer: "grafana", at: at(3) });
    await settled();
    const well = await status();
    expect([well.well, well.failing]).toEqual([true, []]);
    expect(well.registry.kinds).toHaveLength(13);
    expect(well.registry.compiledAt).toMatch(/^\d{4}-\d\d-\d\dT/);
  });

  it("keeps the newest event per triple whatever the order they arrive in", async () => {
    // A recovered at t2, then a failing at t1 < t2: it stays recovered.
    await emit("postgres", "recovered", { machine: "birch", consumer: "gitea", at: at(20) });
    await settled();
    await emit("postgres", "failing", { machine: "birch", consumer: "gitea", word: "too late", at: at(10) });
    // A failing at t2, then one at t1 < t2: the t2 word stays.
    await emit("postgres", "failing", { machine: "cedar", consumer: "keycloak", word: "newest", at: at(20) });
    await settled();
    await emit("postgres", "failing", { machine: "cedar", consumer: "keycloak", word: "older", at: at(10) });
    await settled();
    expect((await status({ provider: "postgres" })).failing).toEqual([
      { provider: "postgres", machine: "cedar", consumer: "keycloak", word: "newest", since: at(20), at: at(20) },
    ]);
    await emit("postgres", "recovered", { machine: "cedar", consumer: "keycloak", at: at(21) });
    await settled();
    expect((await status()).well).toBe(true);
  });

  it("narrows status by provider, machine and consumer, refusing what is not one token", async () => {
    await emit("mesh-vault", "failing", { machine: "alder", consumer: "gitea", word: "sealed", at: at(30) });
    await emit("mesh-vault", "failing", { machine: "birch", consumer: "gitea", word: "sealed", at: at(30) });
    await emit("keycloak", "failing", { machine: "birch", consumer: "caddy", word: "no issuer", at: at(30) });
    await settled();
    const triples = (s: { failing: { provider: string; machine: string; consumer: string }[] }) =>
      s.failing.map((f) => `${f.provider}.${f.machine}.${f.consumer}`);
    expect(triples(await status())).toEqual(["keycloak.birch.caddy", "mesh-vault.alder.gitea", "mesh-vault.birch.gitea"]);
    expect(triples(await status({ machine: "birch" }))).toEqual(["keycloak.birch.caddy", "mesh-vault.birch.gitea"]);
    expect(triples(await status({ consumer: "gitea", machine: "alder" }))).toEqual(["mesh-vault.alder.gitea"]);
    expect(await status({ provider: "postgres" })).toMatchObject({ well: true, failing: [] });
    for (const [field, value] of [
      ["provider", "a.b"],
      ["machine", "*"],
      ["consumer", ">"],
      ["provider", ""],
    ]) {
      const refused = await request(seat, STATUS, { [field!]: value });
      expect(refused.errorCode).toBe(400);
      expect(refused.errorText).toMatch(new RegExp(`^${field}: must be one token`));
    }
    expect((await request(seat, STATUS, { node: "alder" })).errorText).toBe("node: unknown field");

    const http = await fetch(`${set!.httpUrl}/status?machine=birch`);
    expect(await http.json()).toEqual(await status({ machine: "birch" }));

    for (const [provider, machine, consumer] of [
      ["mesh-vault", "alder", "gitea"],
      ["mesh-vault", "birch", "gitea"],
      ["keycloak", "birch", "caddy"],
    ]) {
      await emit(provider!, "recovered", { machine, consumer, at: at(31) });
    }
    await settled();
    expect((await status()).well).toBe(true);
  });

  it("refuses and counts bad events, and goes on with the next good one", async () => {
    const before = (await status()).rejectedEvents as number;
    await emit("keycloak", "failing", "not json");
    await emit("keycloak", "failing", { consumer: "grafana", word: "x", at: at(40) });
    await emit("keycloak", "failing", { machine: "a.b", consumer: "grafana", word: "x", at: at(40) });
    await emit("keycloak", "failing", { machine: "dogwood", consumer: "grafana", word: "x", at: "yesterday" });
    await emit("keycloak", "recovered", { machine: "dogwood", consumer: "grafana", at: "2026-11-29 12:00" });
    await emit("keycloak", "failing", { machine: "dogwood", consumer: "grafana", word: "w".repeat(2 * 1024 * 1024), at: at(41) });
    await emit("keycloak", "failing", { machine: "cedar", consumer: "grafana", word: "good", at: at(42) });
    await settled();
    const after = await status({ provider: "keycloak" });
    expect(after.rejectedEvents).toBe(before + 5);
    expect(after.failing.map((f: { machine: string; word: string }) => [f.machine, f.word.length])).toEqual([
      ["cedar", 4],
      ["dogwood", 1024], // the 2 MiB word, cut
    ]);
    expect(after.failing[1].word.endsWith("…")).toBe(true);
    for (const machine of ["cedar", "dogwood"]) await emit("keycloak", "recovered", { machine, consumer: "grafana", at: at(43) });
    await settled();
    expect((await status()).well).toBe(true);
  });

  it("ends in the newest-wins state after 1,000 shuffled events over 100 triples", async () => {
    const triples = Array.from({ length: 100 }, (_, i) => ({
      provider: ["keycloak", "postgres", "mesh-vault"][i % 3]!,
      machine: `m${Math.floor(i / 3) % 10}`,
      consumer: `c${Math.floor(i / 30)}-${i}`,
    }));
    // Distinct times, so "newest" is never a tie.
    const times = Array.from({ length: 1000 }, (_, i) => new Date(Date.UTC(2026, 10, 28, 0, 0, 0, i * 7)).toISOString());
    const events = times.map((time, i) => {
      const triple = triples[i % 100]!;
      const failing = (i * 7919) % 3 !== 0;
      return { ...triple, kind: failing ? ("failing" as const) : ("recovered" as const), word: `w${i}`, at: time };
    });
    for (let i = events.length - 1; i > 0; i--) {
      const j = Math.floor(Math.random() * (i + 1));
      [events[i], events[j]] = [events[j]!, events[i]!];
    }
    await Promise.all(
      events.map(({ provider, kind, machine, consumer, word, at }) =>
        emit(provider, kind, kind === "failing" ? { machine, consumer, word, at } : { machine, consumer, at }),
      ),
    );
    await settled();

    const model = new Map<string, (typeof events)[number]>();
    for (const e of events) {
      const key = `${e.provider}.${e.machine}.${e.consumer}`;
      if ((model.get(key)?.at ?? "") < e.at) model.set(key, e);
    }
    const expected = [...model.entries()]
      .filter(([, e]) => e.kind === "failing")
      .map(([key, e]) => [key, e.word, e.at])
      .sort();
    const failing = (await status()).failing as {
      provider: string;
      machine: string;
      consumer: string;
      word: string;
      since: string;
      at: string;
    }[];
    expect(
      failing
        .filter((f) => f.machine.startsWith("m"))
        .map((f) => [`${f.provider}.${f.machine}.${f.consumer}`, f.word, f.at])
        .sort(),
    ).toEqual(expected);
    for (const f of failing) {
      // `since` is the time of one of the triple's failing events, no later than `at`.
      const own = events.filter(
        (e) => e.kind === "failing" && e.provider === f.provider && e.machine === f.machine && e.consumer === f.consumer,
      );
      expect(own.map((e) => e.at)).toContain(f.since);
      expect(f.since <= f.at).toBe(true);
    }
  });
});

describe("a provider's user", () => {
  it("publishes only its own events and reads the needs without writing them", async () => {
    const keycloak = providers.keycloak!;
    const forged = await keycloak
      .jetstream()
      .publish("postgres.provisioner.failing", JSON.stringify({ machine: "birch", consumer: "gitea", word: "forged", at: at(55) }), {
        timeout: 2000,
      })
      .catch((e: Error) => e);
    expect(forged).toBeInstanceOf(Error);
    await (await bus.kv("needs", "birch")).put("birch.gitea.config.app_name", "{}");
    const needs = await bus.kv("needs", "keycloak");
    expect((await needs.get("birch.gitea.config.app_name"))?.operation).toBe("PUT");
    expect(await needs.put("birch.gitea.config.app_name", "{}").catch((e: Error) => e.message)).toMatch(/permissions|timeout/i);
    await settled();
    expect((await status({ provider: "postgres", machine: "birch" })).failing).toEqual([]);
  });
});

describe("durability", () => {
  it("applies what was published while the function set was down, each event once", async () => {
    const jsm = await seat.jetstreamManager();
    const writes = async () => (await jsm.streams.info("KV_mesh-provisioner_failing")).state.last_seq;
    await set!.stop();
    set = undefined;
    const before = await writes();
    await emit("keycloak", "failing", { machine: "alder", consumer: "mesh-controller", word: "offline", at: at(50) });
    set = await startSet(bus);
    await settled();
    expect((await status({ machine: "alder" })).failing).toEqual([
      { provider: "keycloak", machine: "alder", consumer: "mesh-controller", word: "offline", since: at(50), at: at(50) },
    ]);

    await set.stop();
    set = undefined;
    await emit("keycloak", "recovered", { machine: "alder", consumer: "mesh-controller", at: at(51) });
    set = await startSet(bus);
    await settled();
    expect(await status({ machine: "alder" })).toMatchObject({ well: true, failing: [] });
    // Two writes to the failing bucket in all: the failing's put and the recovered's delete.
    expect((await writes()) - before).toBe(2);
  });
});
