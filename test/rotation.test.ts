import type { KV, Msg, NatsConnection } from "nats";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { RotationState } from "../functions/_lib/rotation.ts";
import type { Status } from "../functions/_lib/status.ts";
import type { ModuleState } from "../functions/_lib/state.ts";
import { start, type Config, type Running } from "../runtime/index.ts";
import type { TestBus } from "../runtime/testing.ts";
import { request, startSet, testBus, until } from "./helpers.ts";

const VERB = "mesh-provisioner.provisioning";
const ROTATION = { rotation: { graceSeconds: 2, renoticeMinutes: 60, renoticeEverySeconds: 2 } } as Partial<Config>;
let bus: TestBus;
let set: Running;
let seat: NatsConnection;
let keycloak: NatsConnection;
const needs: Record<string, KV> = {};
const applied: Record<string, KV> = {};
/** What each node and provider received, by subject. */
const received = new Map<string, unknown[]>();

const listen = async (user: string, subject: string) => {
  const nc = await bus.connect(user);
  received.set(subject, []);
  nc.subscribe(subject, { callback: (_err, msg: Msg) => received.get(subject)!.push(msg.json()) });
  await nc.flush();
};

beforeAll(async () => {
  bus = await testBus({ nodes: ["alder", "birch", "cedar"] });
  set = await startSet(bus, ROTATION);
  seat = await bus.connect();
  keycloak = await bus.connect("keycloak");
  for (const node of ["alder", "birch", "cedar"]) {
    needs[node] = await bus.kv("needs", node);
    applied[node] = await bus.kv("applied", node);
    await listen(node, `mesh-provisioner.refresh.${node}`);
  }
  await listen("keycloak", "mesh-provisioner.released.keycloak");
});
afterAll(async () => {
  await set.stop();
  await bus.stop();
});

const ask = async (body: Record<string, unknown>) => (await request(seat, VERB, body)).body as { entries: any[]; outOfShape: unknown[] };
const rotate = (event: Record<string, unknown>) =>
  keycloak.jetstream().publish("keycloak.provisioner.rotated", JSON.stringify({ at: new Date().toISOString(), ...event }));
const notices = (node: string) =>
  received.get(`mesh-provisioner.refresh.${node}`)! as { provision: string; revision: string; modules: string[] }[];
const releases = () => received.get("mesh-provisioner.released.keycloak")! as { provision: string; revision: string; holders: number }[];
const rotation = async (key: string) =>
  (await ask({ what: "rotations" })).entries.find((r: RotationState) => r.key === key) as RotationState;

describe("holders and a rotation", () => {
  it("lists the holders of a provision across nodes, in key order, each with its revision in use", async () => {
    await needs.alder!.put("alder.grafana.bound.keycloak/client-secret", "{}");
    await needs.birch!.put("birch.gitea.bound.keycloak/issuer", "{}");
    await needs.cedar!.put("cedar.motd.config.keycloak-free", "{}");
    await applied.alder!.put("alder.grafana", JSON.stringify({ revisions: { keycloak: "r1" } }));
    const holders = (await ask({ what: "holders", provision: "keycloak" })).entries;
    expect(holders.map((h) => [h.key, h.revision, h.stale])).toEqual([
      ["alder.grafana.bound.keycloak/client-secret", "r1", false],
      ["birch.gitea.bound.keycloak/issuer", null, false],
    ]);
    expect((await ask({ what: "holders", provision: "keycloak", node: "birch" })).entries).toHaveLength(1);
    // Read stale: from the views as held, with since when they are known current, asking the server nothing (docs/verb.md §4.6.1).
    process.kill(bus.server.pid, "SIGSTOP");
    try {
      for (const path of ["/provisioning?what=holders&provision=keycloak&stale=true", "/provisioning?what=rotations&stale=true"]) {
        const response = await fetch(`${set.httpUrl}${path}`, { signal: AbortSignal.timeout(10_000) });
        const body = (await response.json()) as { entries: { key: string }[]; confirmedAt?: string | null };
        expect([path, response.status, typeof body.confirmedAt]).toEqual([path, 200, "string"]);
        if (path.includes("holders")) expect(body.entries.map((h) => h.key)).toEqual(holders.map((h) => h.key));
      }
    } finally {
      process.kill(bus.server.pid, "SIGCONT");
    }
    const refused = await request(seat, VERB, { what: "holders" });
    expect([refused.errorCode, refused.errorText]).toEqual([
      400,
      "provision: is required with what=holders: the provision whose holders to list",
    ]);
  });

  it("makes exactly its holders stale, notices exactly their nodes, and releases once, when the last holder caught up", async () => {
    await rotate({ provision: "keycloak", revision: "r2" });
    await until(() => notices("alder").length === 1 && notices("birch").length === 1, 5000, "alder and birch noticed");
    expect(notices("alder")[0]).toMatchObject({ provider: "keycloak", provision: "keycloak", revision: "r2", modules: ["grafana"] });
    expect(notices("birch")[0]).toMatchObject({ revision: "r2", modules: ["gitea"] });
    expect(notices("cedar")).toEqual([]);
    expect((await ask({ what: "holders", provision: "keycloak" })).entries.map((h) => h.stale)).toEqual([true, true]);

    // One holder catching up is no release.
    await applied.alder!.put("alder.grafana", JSON.stringify({ revisions: { keycloak: "r2" } }));
    await until(async () => (await rotation("keycloak.keycloak")).caughtUp === 1, 5000, "alder caught up");
    await new Promise((r) => setTimeout(r, 1500));
    expect(releases()).toEqual([]);
    // The last one, without revisions: judged by the server's time of its applied record.
    await applied.birch!.put("birch.gitea", "{}");
    await until(() => releases().length === 1, 5000, "released");
    expect(releases()[0]).toMatchObject({ provision: "keycloak", revision: "r2", holders: 2 });
    await new Promise((r) => setTimeout(r, 2500));
    expect(releases()).toHaveLength(1);
    expect(await rotation("keycloak.keycloak")).toMatchObject({ holders: 2, caughtUp: 2, stale: 0, releasedAt: expect.any(String) });
  }, 30_000);

  it("reaches one holder with a rotation naming its machine and consumer, and renotices it while it is stale", async () => {
    const before = { alder: notices("alder").length, birch: notices("birch").length };
    await rotate({ provision: "keycloak", revision: "c3", machine: "alder", consumer: "grafana" });
    await until(() => notices("alder").length >= before.alder + 2, 8000, "noticed, then noticed again");
    expect(notices("birch")).toHaveLength(before.birch);
    expect(notices("alder").at(-1)).toMatchObject({ revision: "c3", modules: ["grafana"] });
    const holders = (await ask({ what: "holders", provision: "keycloak" })).entries;
    expect(holders.map((h) => h.stale)).toEqual([true, false]);
  }, 20_000);

  it("says a holder stale past the grace in status and as its module's Stale condition, until it catches up", async () => {
    await (await bus.kv("assignments", "mesh-controller")).put("alder.grafana", "{}");
    await until(
      async () => ((await request(seat, "mesh-provisioner.status", {})).body as Status).stale.length === 1,
      8000,
      "stale in status",
    );
    const status = (await request(seat, "mesh-provisioner.status", {})).body as Status;
    expect(status.well).toBe(false);
    expect(status.stale[0]).toMatchObject({
      provider: "keycloak",
      provision: "keycloak",
      node: "alder",
      module: "grafana",
      revision: "c3",
      heldRevision: "r2",
    });
    expect(await (await fetch(`${set.httpUrl}/metrics`)).text()).toMatch(/\nstale_holders 1\n/);
    const grafana = (await ask({ what: "state", node: "alder", module: "grafana" })).entries[0] as ModuleState;
    expect(grafana.conditions.map((c) => c.type)).toEqual(["Stale"]);
    expect(grafana.conditions[0]!.message).toBe("keycloak rotated keycloak to c3; it holds r2 (need bound.keycloak/client-secret)");
    await applied.alder!.put("alder.grafana", JSON.stringify({ revisions: { keycloak: "c3" } }));
    await until(async () => ((await request(seat, "mesh-provisioner.status", {})).body as Status).stale.length === 0, 5000, "caught up");
    await until(() => releases().some((r) => r.revision === "c3"), 5000, "the holder's rotation released");
  }, 30_000);

  it("keeps the newest rotation: a late older one changes nothing", async () => {
    const kept = await rotation("keycloak.keycloak");
    await rotate({ provision: "keycloak", revision: "r0", at: "2026-01-01T00:00:00Z" });
    await new Promise((r) => setTimeout(r, 1000));
    expect(await rotation("keycloak.keycloak")).toEqual(kept);
  });

  it("releases a rotation no one holds at once, with 0 holders", async () => {
    await rotate({ provision: "nobody", revision: "n1" });
    await until(() => releases().some((r) => r.provision === "nobody"), 5000, "released");
    expect(releases().find((r) => r.provision === "nobody")).toMatchObject({ revision: "n1", holders: 0 });
  });

  it("refuses and counts malformed rotated events", async () => {
    const count = async () => ((await request(seat, "mesh-provisioner.status", {})).body as Status).rejectedEvents;
    const before = await count();
    await keycloak.jetstream().publish("keycloak.provisioner.rotated", "not json");
    await rotate({ provision: "a.b", revision: "x" });
    await rotate({ provision: "p", revision: "x", machine: "alder" });
    await rotate({ provision: "keycloak/client-secret", revision: "x" });
    await until(async () => (await count()) === before + 4, 5000, "four refused");
  });
});

describe("rotations that overlap", () => {
  it("release none while a holder holds neither its revision nor a newer one's", async () => {
    await needs.alder!.put("alder.grafana.bound.ov/secret", "{}");
    await needs.birch!.put("birch.gitea.bound.ov/secret", "{}");
    await rotate({ provision: "ov", revision: "w1" });
    await new Promise((r) => setTimeout(r, 50));
    // A newer rotation of alder's credential alone.
    await rotate({ provision: "ov", revision: "c2", machine: "alder", consumer: "grafana" });
    await until(async () => (await rotation("keycloak.ov.alder.grafana")) !== undefined, 5000, "kept");
    await applied.birch!.put("birch.gitea", JSON.stringify({ revisions: { ov: "w1" } }));
    await new Promise((r) => setTimeout(r, 2500));
    // alder still holds the old secret: w1 is not released.
    expect(releases().filter((r) => r.provision === "ov")).toEqual([]);
    expect(await rotation("keycloak.ov")).toMatchObject({ holders: 2, caughtUp: 1, stale: 1, releasedAt: null });
    await applied.alder!.put("alder.grafana", JSON.stringify({ revisions: { ov: "c2", keycloak: "c3" } }));
    await until(() => releases().filter((r) => r.provision === "ov").length === 2, 5000, "both released");
    expect(
      releases()
        .filter((r) => r.provision === "ov")
        .map((r) => r.revision)
        .sort(),
    ).toEqual(["c2", "w1"]);
  }, 20_000);
});

describe("the notice and release subjects", () => {
  const refusedSubscription = async (user: string, subject: string) => {
    const nc = await bus.connect(user);
    const said = (async () => {
      for await (const s of nc.status()) {
        const refused = (s as { permissionContext?: { operation: string; subject: string } }).permissionContext;
        if (s.type === "error" && refused?.operation === "subscription") return refused.subject;
      }
    })();
    nc.subscribe(subject);
    return Promise.race([said, new Promise((r) => setTimeout(r, 3000, "not refused"))]);
  };

  it("are each node's and each provider's own: another's is refused by the server", async () => {
    expect(await refusedSubscription("alder", "mesh-provisioner.refresh.birch")).toBe("mesh-provisioner.refresh.birch");
    expect(await refusedSubscription("alder", "mesh-provisioner.refresh.*")).toBe("mesh-provisioner.refresh.*");
    expect(await refusedSubscription("keycloak", "mesh-provisioner.released.postgres")).toBe("mesh-provisioner.released.postgres");
    expect(await refusedSubscription("keycloak", "mesh-provisioner.refresh.alder")).toBe("mesh-provisioner.refresh.alder");
  });
});

describe("two replicas of the set", () => {
  it("publish each notice and each release once, a holder appearing later noticed at once", async () => {
    const two = await testBus({ nodes: ["alder", "birch"] });
    const quiet = { rotation: { graceSeconds: 300, renoticeMinutes: 60, renoticeEverySeconds: 600 } } as Partial<Config>;
    const first = await startSet(two, quiet);
    const second = await start({ config: { ...two.config, ...quiet } });
    try {
      const got = { notices: [] as unknown[], releases: [] as unknown[] };
      (await two.connect("alder")).subscribe("mesh-provisioner.refresh.alder", { callback: (_e, m) => got.notices.push(m.json()) });
      (await two.connect("keycloak")).subscribe("mesh-provisioner.released.keycloak", { callback: (_e, m) => got.releases.push(m.json()) });
      const alderNeeds = await two.kv("needs", "alder");
      await alderNeeds.put("alder.grafana.bound.sso/secret", "{}");
      const provider = (await two.connect("keycloak")).jetstream();
      await provider.publish(
        "keycloak.provisioner.rotated",
        JSON.stringify({ provision: "sso", revision: "v2", at: new Date().toISOString() }),
      );
      await until(() => got.notices.length >= 1, 5000, "noticed");
      // A holder that appears after the notice is noticed at once, not at the next renotice (600 s here).
      const birchNotices: unknown[] = [];
      (await two.connect("birch")).subscribe("mesh-provisioner.refresh.birch", { callback: (_e, m) => birchNotices.push(m.json()) });
      await (await two.kv("needs", "birch")).put("birch.gitea.bound.sso/secret", "{}");
      await until(() => birchNotices.length === 1, 5000, "the new holder noticed");
      await (await two.kv("applied", "birch")).put("birch.gitea", JSON.stringify({ revisions: { sso: "v2" } }));
      await (await two.kv("applied", "alder")).put("alder.grafana", JSON.stringify({ revisions: { sso: "v2" } }));
      await until(() => got.releases.length >= 1, 5000, "released");
      await new Promise((r) => setTimeout(r, 3000));
      expect([got.notices.length, birchNotices.length, got.releases.length]).toEqual([1, 1, 1]);
    } finally {
      await second.stop();
      await first.stop();
      await two.stop();
    }
  }, 30_000);
});

describe("the rotation's config", () => {
  it("is refused once, naming every function that reads it", async () => {
    const failure = await startSet(bus, { rotation: { graceSeconds: -1 } } as Partial<Config>).catch((e: unknown) => e);
    const problems = (failure as { problems: string[] }).problems;
    expect(problems).toHaveLength(1);
    expect(problems[0]).toMatch(/^wrangler-free\.config\.ts: rotation\.graceSeconds: .* \(read by .*rotation-fanout\.ts/);
  });
});

describe("a rotation whose record outgrows one message", () => {
  it("keeps its nodes noticed, notices them once, and leaves the other rotations going", { timeout: 60_000 }, async () => {
    const small = await testBus({ maxPayload: 65536, nodes: ["alder"] });
    const running = await startSet(small, {
      rotation: { graceSeconds: 2, renoticeMinutes: 60, renoticeEverySeconds: 60 },
    } as Partial<Config>);
    try {
      const got: { provision: string; modules: string[] }[] = [];
      const released: { provision: string }[] = [];
      const alder = await small.connect("alder");
      alder.subscribe("mesh-provisioner.refresh.alder", { callback: (_err, msg) => got.push(msg.json()) });
      await alder.flush();
      const provider = await small.connect("keycloak");
      provider.subscribe("mesh-provisioner.released.keycloak", { callback: (_err, msg) => released.push(msg.json()) });
      await provider.flush();
      // 400 holders of 200-character module names: about 82 KB of modules noticed, more than a message holds.
      const modules = Array.from({ length: 400 }, (_, i) => `m${String(i).padStart(3, "0")}${"x".repeat(196)}`);
      const alderNeeds = await small.kv("needs", "alder");
      for (const m of modules) await alderNeeds.put(`alder.${m}.bound.big/x`, "{}");
      const rotated = (provision: string, revision: string) =>
        provider.jetstream().publish("keycloak.provisioner.rotated", JSON.stringify({ provision, revision, at: new Date().toISOString() }));
      await rotated("big", "b1");
      await until(() => new Set(got.flatMap((n) => n.modules)).size === 400, 20_000, "every holder noticed");
      // Noticed in two messages (each within max_payload), and not again: the record kept that alder was noticed.
      expect(got.length).toBe(2);
      const records = await small.kv("rotations");
      await until(async () => (await records.get("keycloak.big"))?.json<{ noticedAt: string | null }>().noticedAt != null);
      expect((await records.get("keycloak.big"))!.json()).toMatchObject({ noticedNodes: ["alder"], noticedModules: null, notices: 1 });
      await rotated("nobody", "n1");
      await until(() => released.some((r) => r.provision === "nobody"), 10_000, "the other rotation released");
      await new Promise((r) => setTimeout(r, 3000));
      expect(got.length).toBe(2);
    } finally {
      await running.stop();
      await small.stop();
    }
  });
});
