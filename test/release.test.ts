import type { KV, NatsConnection } from "nats";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { connectProvider, type ProviderClient, type ReleasedNotice } from "../client/index.ts";
import type { RotationState } from "../functions/_lib/rotation.ts";
import type { ModuleState } from "../functions/_lib/state.ts";
import { nanosOfTime, type Config, type Running } from "../runtime/index.ts";
import type { TestBus } from "../runtime/testing.ts";
import { request, startSet, testBus, until } from "./helpers.ts";

// docs/rotation.md §8.3, §8.6: a release goes out only when no holder can still use what came
// before, once per provision and revision, and reaches a provider that was away.
const VERB = "mesh-provisioner.provisioning";
const ROTATION = {
  rotation: { graceSeconds: 60, renoticeMinutes: 60, renoticeEverySeconds: 60, releaseEverySeconds: 1 },
} as Partial<Config>;
const EVENTS = "mesh-provisioner_events";
let bus: TestBus;
let set: Running;
let seat: NatsConnection;
let keycloak: NatsConnection;
let needs: KV;
let applied: KV;
/** Every message on `mesh-provisioner.released.keycloak` and `mesh-provisioner.refresh.alder`, as received. */
const releases: ReleasedNotice[] = [];
const notices: { provision: string; revision: string; modules: string[] }[] = [];

beforeAll(async () => {
  bus = await testBus({ nodes: ["alder"] });
  set = await startSet(bus, ROTATION);
  seat = await bus.connect();
  keycloak = await bus.connect("keycloak");
  keycloak.subscribe("mesh-provisioner.released.keycloak", { callback: (_e, m) => releases.push(m.json()) });
  const alder = await bus.connect("alder");
  alder.subscribe("mesh-provisioner.refresh.alder", { callback: (_e, m) => notices.push(m.json()) });
  await Promise.all([keycloak.flush(), alder.flush()]);
  needs = await bus.kv("needs", "alder");
  applied = await bus.kv("applied", "alder");
});
afterAll(async () => {
  await set.stop();
  await bus.stop();
});

const ask = async (body: Record<string, unknown>) => (await request(seat, VERB, body)).body as { entries: any[] };
const rotation = async (key: string) =>
  (await ask({ what: "rotations" })).entries.find((r: RotationState) => r.key === key) as RotationState;
/** Publishes `<provider>.provisioner.rotated` through JetStream; resolves with the stream's sequence. */
const rotate = async (provision: string, revision: string, provider = keycloak, name = "keycloak") =>
  (await provider.jetstream().publish(`${name}.provisioner.rotated`, JSON.stringify({ provision, revision, at: new Date().toISOString() })))
    .seq;
const releasesOf = (provision: string) => releases.filter((r) => r.provision === provision);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
/** A client of the provider keycloak through the client library. */
const connect = () =>
  connectProvider({ servers: bus.url, provider: "keycloak", credentials: { password: bus.server.users.keycloak!.password } });

describe("a holder whose revisions the set cannot read", () => {
  it.each([
    ["a number", { pg1: 2 }],
    ["null", null],
    ["an array", ["r2"]],
  ])(
    "stays stale, with OutOfShape, and holds the release back: revisions %s",
    async (_name, revisions) => {
      const provision = `pg${Math.random().toString(36).slice(2, 8)}`;
      const module = `m${provision}`;
      await needs.put(`alder.${module}.bound.${provision}/password`, "{}");
      await applied.put(`alder.${module}`, JSON.stringify({ revisions: { [provision]: "r1" } }));
      await rotate(provision, "r2");
      await until(async () => (await rotation(`keycloak.${provision}`))?.stale === 1, 5000, "stale");
      // The node writes what a client in another language might after it applied r2.
      await applied.put(`alder.${module}`, JSON.stringify({ revisions: { [provision]: revisions } }));
      await sleep(2500);
      expect(releasesOf(provision)).toEqual([]);
      expect(await rotation(`keycloak.${provision}`)).toMatchObject({ holders: 1, caughtUp: 0, stale: 1, releasedAt: null });
      const holder = (await ask({ what: "holders", provision })).entries[0];
      expect(holder).toMatchObject({ revision: null, stale: true });
      const state = (await ask({ what: "state", node: "alder", module })).entries[0] as ModuleState;
      expect(state.conditions.map((c) => c.type)).toContain("OutOfShape");
      // Read as it should be, it is caught up and the rotation released.
      await applied.put(`alder.${module}`, JSON.stringify({ revisions: { [provision]: "r2" } }));
      await until(() => releasesOf(provision).length === 1, 5000, "released once readable");
    },
    20_000,
  );
});

describe("a revision-less applied record and a rotation stored in the same millisecond", () => {
  it("is stale while it was stored before the rotation: no release before the holder applied it (many trials)", async () => {
    const TRIALS = 120;
    const trials: { provision: string; appliedSeq: number; rotationSeq: number }[] = [];
    for (let i = 0; i < TRIALS; i++) {
      const provision = `tie${i}`;
      await needs.put(`alder.tie${i}.bound.${provision}/x`, "{}");
      // Sent back to back, the record first: most land in one millisecond, the record a few µs before.
      const [appliedSeq, rotationSeq] = await Promise.all([applied.put(`alder.tie${i}`, "{}"), rotate(provision, "r1")]);
      trials.push({ provision, appliedSeq, rotationSeq });
    }
    await sleep(3000);
    // The order each pair was stored in, on the server's nanosecond times.
    const jsm = await bus.connect().then((nc) => nc.jetstreamManager());
    let before = 0;
    let sameMs = 0;
    for (const t of trials) {
      const record = await jsm.streams.getMessage("KV_mesh-provisioner_applied", { seq: t.appliedSeq });
      const event = await jsm.streams.getMessage(EVENTS, { seq: t.rotationSeq });
      const [recordNanos, eventNanos] = [nanosOfTime(record.timestamp), nanosOfTime(event.timestamp)];
      if (recordNanos >= eventNanos) continue;
      before++;
      if (Math.floor(recordNanos / 1e6) === Math.floor(eventNanos / 1e6)) sameMs++;
      // Stored before the rotation arrived: the holder has not applied it, so no release.
      expect({ provision: t.provision, released: releasesOf(t.provision).length }).toEqual({ provision: t.provision, released: 0 });
    }
    // The test proves something only when many pairs fell in one millisecond.
    expect(before).toBeGreaterThan(TRIALS / 2);
    expect(sameMs).toBeGreaterThan(20);
  }, 60_000);
});

describe("a holder that comes back after the release", () => {
  it("is noticed like any stale holder", async () => {
    await needs.put("alder.solo.bound.solo/password", "{}");
    await applied.put("alder.solo", JSON.stringify({ revisions: { solo: "r1" } }));
    await rotate("solo", "r2");
    await until(() => notices.some((n) => n.provision === "solo"), 5000, "noticed");
    // Its need deleted: no holder left, released.
    await needs.delete("alder.solo.bound.solo/password");
    await until(() => releasesOf("solo").length >= 1, 5000, "released");
    await sleep(1000);
    const before = notices.filter((n) => n.provision === "solo").length;
    // Written again, still on r1: stale again, and told so.
    await needs.put("alder.solo.bound.solo/password", "{}");
    await until(() => notices.filter((n) => n.provision === "solo").length > before, 5000, "noticed again");
    expect(notices.at(-1)).toMatchObject({ provision: "solo", revision: "r2", modules: ["solo"] });
    expect((await ask({ what: "holders", provision: "solo" })).entries[0]).toMatchObject({ revision: "r1", stale: true });
    // Another module of the same node, appearing stale: noticed too, though its node was.
    const count = () => notices.filter((n) => n.provision === "solo").length;
    let seen = count();
    await needs.put("alder.solo2.bound.solo/password", "{}");
    await until(() => count() > seen, 5000, "the node's other module noticed");
    expect(notices.at(-1)).toMatchObject({ provision: "solo", modules: ["solo", "solo2"] });
    // The first one gone and back again: noticed again.
    await needs.delete("alder.solo.bound.solo/password");
    // Its leaving seen by the fan-out (the record keeps what is noticed and still stale).
    const rotations = await seat.jetstream().views.kv("mesh-provisioner_rotations", { bindOnly: true });
    const noticedModules = async () => ((await rotations.get("keycloak.solo"))!.json() as { noticedModules: string[] }).noticedModules;
    await until(async () => !(await noticedModules()).includes("alder.solo"), 5000, "its leaving seen");
    seen = count();
    await needs.put("alder.solo.bound.solo/password", "{}");
    await until(() => count() > seen, 5000, "noticed once more");
  }, 30_000);
});

describe("a provider away when its rotation is released", () => {
  let client: ProviderClient | undefined;
  afterAll(async () => client?.close());

  it("receives it once through the client library when it is back, which acknowledges it", async () => {
    await needs.put("alder.away.bound.away/password", "{}");
    await rotate("away", "r2");
    await until(async () => (await rotation("keycloak.away"))?.stale === 1, 5000, "stale");
    // Released while no client of the provider listens.
    await applied.put("alder.away", JSON.stringify({ revisions: { away: "r2" } }));
    await until(async () => (await rotation("keycloak.away"))?.releasedAt !== null, 5000, "released");
    await sleep(3000);
    client = await connect();
    const got: ReleasedNotice[] = [];
    client.onReleased((r) => void got.push(r));
    await until(() => got.some((r) => r.provision === "away"), 5000, "received after coming back");
    await until(async () => (await rotation("keycloak.away")).acknowledgedAt !== null, 5000, "acknowledged");
    const published = (await rotation("keycloak.away")).releases;
    await sleep(3000);
    expect(got.filter((r) => r.provision === "away")).toEqual([{ provision: "away", revision: "r2", at: expect.any(String), holders: 1 }]);
    // Acknowledged, it is published no more.
    expect((await rotation("keycloak.away")).releases).toBe(published);
  }, 30_000);

  it("receives it on the raw subject, published again until it acknowledges", async () => {
    const postgres = await bus.connect("postgres");
    await rotate("raw", "v2", postgres, "postgres");
    await until(async () => (await rotation("postgres.raw"))?.releasedAt !== null, 5000, "released, no holder");
    await sleep(2000);
    const got: { provision: string; revision: string }[] = [];
    postgres.subscribe("mesh-provisioner.released.postgres", { callback: (_e, m) => got.push(m.json()) });
    await until(() => got.length >= 1, 5000, "published again to the provider back");
    expect(got[0]).toMatchObject({ provision: "raw", revision: "v2", holders: 0 });
    await postgres
      .jetstream()
      .publish("postgres.provisioner.acknowledged", JSON.stringify({ provision: "raw", revision: "v2", at: new Date().toISOString() }));
    await until(async () => (await rotation("postgres.raw")).acknowledgedAt !== null, 5000, "acknowledged");
    const heard = got.length;
    await sleep(3000);
    expect(got.length).toBe(heard);
  }, 30_000);
});

describe("a revision that comes back (A, B, A)", () => {
  it("is released, and handed to the client library's handler, each time", async () => {
    const client = await connect();
    const got: ReleasedNotice[] = [];
    client.onReleased((r) => void got.push(r));
    try {
      for (const revision of ["blue", "green", "blue"]) {
        const before = got.length;
        await rotate("slot", revision);
        await until(() => got.length > before, 5000, `${revision} released`);
      }
      await until(async () => (await rotation("keycloak.slot")).acknowledgedAt !== null, 5000, "acknowledged");
      expect(got.filter((r) => r.provision === "slot").map((r) => r.revision)).toEqual(["blue", "green", "blue"]);
    } finally {
      await client.close();
    }
  }, 20_000);
});

describe("a revision announced again", () => {
  it("is released once", async () => {
    const client = await connect();
    const got: ReleasedNotice[] = [];
    client.onReleased((r) => void got.push(r));
    try {
      await rotate("again", "r2");
      await until(() => releasesOf("again").length === 1, 5000, "released");
      const releasedAt = (await rotation("keycloak.again")).releasedAt;
      // A provider announcing its current revision at each boot.
      for (let i = 0; i < 3; i++) {
        await sleep(300);
        await rotate("again", "r2");
      }
      await sleep(3000);
      expect(releasesOf("again").length).toBe(1);
      expect(got.filter((r) => r.provision === "again").length).toBe(1);
      expect((await rotation("keycloak.again")).releasedAt).toBe(releasedAt);
    } finally {
      await client.close();
    }
  }, 20_000);
});
