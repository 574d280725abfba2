import type { KV, NatsConnection } from "nats";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { connectNode, connectProvider, type NodeClient } from "../client/index.ts";
import type { Check } from "../functions/_lib/checks.ts";
import type { Status } from "../functions/_lib/status.ts";
import type { ModuleState } from "../functions/_lib/state.ts";
import type { Running } from "../runtime/index.ts";
import type { TestBus } from "../runtime/testing.ts";
import { request, startSet, testBus, until } from "./helpers.ts";

// docs/presence.md §16.5: checks from where the consumer runs.
let bus: TestBus;
let set: Running;
let seat: NatsConnection;
let alder: NodeClient;
let controller: KV;

beforeAll(async () => {
  bus = await testBus();
  set = await startSet(bus);
  seat = await bus.connect();
  controller = await bus.kv("assignments", "mesh-controller");
  alder = await connectNode({ servers: bus.url, node: "alder", credentials: { password: bus.server.users.alder!.password } });
});
afterAll(async () => {
  await alder?.close();
  await set.stop();
  await bus.stop();
});

type Answer<E> = { entries: E[]; outOfShape: { key: string; reason: string }[] };
const verb = async <E>(body: Record<string, unknown>) => (await request(seat, "mesh-provisioner.provisioning", body)).body as Answer<E>;
const checksOf = async (narrowing: Record<string, unknown> = {}) =>
  (await verb<Check & { confirmed: boolean }>({ what: "checks", ...narrowing })).entries;
const stateOf = async (node: string, module: string) => (await verb<ModuleState>({ what: "state", node, module })).entries[0]!;
const status = async (narrowing: Record<string, unknown> = {}) =>
  (await request(seat, "mesh-provisioner.status", narrowing)).body as Status;
/** Publishes a check as `node`'s user, as it is on the wire. */
const publishAs = async (node: string, body: unknown, subject = `mesh-provisioner.checked.${node}`) =>
  (await bus.connect(node)).jetstream().publish(subject, typeof body === "string" ? body : JSON.stringify(body));
const wellModule = async (node: string, module: string, need: string, applied: Record<string, unknown> = {}) => {
  await controller.put(`${node}.${module}`, JSON.stringify({ plan: { module } }));
  await (await bus.kv("needs", node)).put(`${node}.${module}.${need}`, JSON.stringify({}));
  await (await bus.kv("applied", node)).put(`${node}.${module}`, JSON.stringify(applied));
};

describe("checks (docs/presence.md §16.5)", () => {
  it("keeps a failing check, makes it CheckFailing with its reason, not well; ok again ends it", async () => {
    await wellModule("alder", "gitea", "bound.postgres/gitea");
    expect(
      await alder.check("gitea", "postgres", { ok: false, reason: "Unreachable", message: "connect ECONNREFUSED 10.0.0.5:5432" }),
    ).toBe(true);
    await until(async () => (await checksOf({ node: "alder" })).length === 1);
    const [kept] = await checksOf({ node: "alder" });
    expect(kept).toMatchObject({
      key: "alder.gitea.postgres",
      node: "alder",
      module: "gitea",
      provision: "postgres",
      ok: false,
      reason: "Unreachable",
      message: "connect ECONNREFUSED 10.0.0.5:5432",
      revision: null,
      // The client writes alder's presence: its node confirms it.
      confirmed: true,
    });
    expect(kept!.since).toBe(kept!.at);
    const state = await stateOf("alder", "gitea");
    expect(state.checks).toEqual({ ok: 0, failing: 1, unconfirmed: 0 });
    expect(state.conditions).toEqual([
      {
        type: "CheckFailing",
        reason: "Unreachable",
        message: "check of postgres fails: Unreachable: connect ECONNREFUSED 10.0.0.5:5432",
        since: kept!.since,
      },
    ]);
    const s = await status();
    expect(s.well).toBe(false);
    expect(s.checks.failing).toBe(1);
    expect((await status({ machine: "alder", consumer: "gitea" })).checks.failing).toBe(1);
    // Said by what=checks, not by the providers' history (docs/failing.md §5.8).
    const history = await verb<{ key: string }>({ what: "history" });
    expect([...history.entries, ...history.outOfShape].filter((e) => JSON.stringify(e).includes("checked"))).toEqual([]);
    // The same result again is not published again.
    expect(await alder.check("gitea", "postgres", { ok: false, reason: "Unreachable", message: "again" })).toBe(false);
    expect(await alder.check("gitea", "postgres", { ok: true })).toBe(true);
    await until(async () => (await checksOf({ node: "alder", ok: true })).length === 1);
    expect((await stateOf("alder", "gitea")).conditions).toEqual([]);
    expect((await status({ machine: "alder", consumer: "gitea" })).well).toBe(true);
    const metrics = await (await fetch(`${set.httpUrl}/metrics`)).text();
    expect(metrics).toMatch(/\nchecks\{result="failing"\} 0\n/);
    expect(metrics).toMatch(/\nchecks\{result="ok"\} 1\n/);
  });

  it("keeps the newest by `at` whatever the order of arrival, a failing result winning a tie", async () => {
    const at = (s: number) => new Date(Date.UTC(2026, 11, 2, 6, 0, s)).toISOString();
    const events = [
      { module: "zot", provision: "vault", ok: true, at: at(1) },
      { module: "zot", provision: "vault", ok: false, reason: "AuthFailed", at: at(2) },
      { module: "zot", provision: "vault", ok: false, reason: "AuthFailed", message: "newest", at: at(4) },
      { module: "zot", provision: "vault", ok: true, at: at(4) },
      { module: "zot", provision: "vault", ok: false, reason: "Timeout", at: at(3) },
    ];
    // Newest first, so each older one arrives after it.
    for (const e of [events[2], events[4], events[0], events[3], events[1]]) await publishAs("birch", e);
    await until(async () => (await checksOf({ node: "birch", module: "zot" })).length === 1);
    await until(async () => (await status({ machine: "birch" })).events.pending === 0 && (await status()).events.unacknowledged === 0);
    const [kept] = await checksOf({ node: "birch", module: "zot" });
    // birch writes no presence: its checks are unconfirmed.
    expect(kept).toMatchObject({ ok: false, reason: "AuthFailed", message: "newest", at: at(4), confirmed: false });
    await wellModule("birch", "zot", "secret.vault/token");
    const state = await stateOf("birch", "zot");
    expect(state.checks).toEqual({ ok: 0, failing: 1, unconfirmed: 1 });
    expect(state.conditions.map((c) => [c.type, c.reason])).toEqual([["CheckFailing", "AuthFailed"]]);
    // The older ok of second 1 cut nothing after the streak's start; the streak is of second 4's result alone.
    expect(kept!.since).toBe(at(4));
  });

  it("counts a failing check of a module the state does not list in status (not well) and the metrics, as what=checks does", async () => {
    const metric = async (result: string) =>
      Number(new RegExp(`\\nchecks\\{result="${result}"\\} (\\d+)\\n`).exec(await (await fetch(`${set.httpUrl}/metrics`)).text())![1]);
    const failing = await metric("failing");
    const unconfirmed = await metric("unconfirmed");
    await publishAs("cedar", { module: "ghost", provision: "vault", ok: false, reason: "AuthFailed", at: new Date().toISOString() });
    await until(async () => (await checksOf({ node: "cedar", module: "ghost" })).length === 1);
    // No assignment, need or applied record: no state, and no CheckFailing.
    expect((await verb({ what: "state", node: "cedar", module: "ghost" })).entries).toEqual([]);
    await until(async () => (await status({ machine: "cedar" })).checks.failing === 1);
    expect((await status({ machine: "cedar" })).well).toBe(false);
    expect((await status({ consumer: "ghost" })).checks.failing).toBe(1);
    await until(async () => (await metric("failing")) === failing + 1);
    // cedar writes no presence: its check is unconfirmed.
    expect(await metric("unconfirmed")).toBe(unconfirmed + 1);
    await publishAs("cedar", { module: "ghost", provision: "vault", ok: true, at: new Date().toISOString() });
    await until(async () => (await status({ machine: "cedar" })).checks.failing === 0);
    expect((await status({ machine: "cedar" })).well).toBe(true);
    expect(await metric("failing")).toBe(failing);
  });

  it("refuses and counts a check out of shape, and a node publishing another node's check is refused by the server", async () => {
    const before = (await status()).rejectedEvents;
    await publishAs("cedar", "not json");
    await publishAs("cedar", { module: "m", provision: "p", ok: false, reason: "not camel case", at: new Date().toISOString() });
    await publishAs("cedar", { module: "m", provision: "p/x", ok: true, at: new Date().toISOString() });
    await until(async () => (await status()).rejectedEvents === before + 3);
    await expect(
      publishAs("cedar", { module: "m", provision: "p", ok: true, at: new Date().toISOString() }, "mesh-provisioner.checked.dogwood"),
    ).rejects.toThrow(/permission|timeout|no responders/i);
  });

  it("says AuthFailed on a holder caught up with the newest rotation: the provider does not accept it", async () => {
    await wellModule("dogwood", "grafana", "bound.keycloak/client-secret", { revisions: { keycloak: "r7" } });
    const keycloak = await connectProvider({
      servers: bus.url,
      provider: "keycloak",
      credentials: { password: bus.server.users.keycloak!.password },
    });
    try {
      await keycloak.rotated("keycloak", "r7");
    } finally {
      await keycloak.close();
    }
    await publishAs("dogwood", {
      module: "grafana",
      provision: "keycloak",
      ok: false,
      reason: "AuthFailed",
      revision: "r7",
      message: "401",
      at: new Date().toISOString(),
    });
    await until(async () => (await stateOf("dogwood", "grafana")).conditions.some((c) => c.type === "CheckFailing"));
    const condition = (await stateOf("dogwood", "grafana")).conditions.find((c) => c.type === "CheckFailing")!;
    expect(condition.message).toBe(
      "check of keycloak fails: AuthFailed: 401 (revision r7); it holds the newest revision: the provider does not accept it",
    );
  });
});

describe("RevisionMismatch (docs/presence.md §16.6)", () => {
  it("names a holder's revision of a shared credential its provider has not applied, and clears when they agree", async () => {
    // The provider module pgsql on cedar shares one login, provision pg, with its holders.
    await wellModule("cedar", "pgsql", "port.pg", { revisions: { pg: "r3" } });
    await controller.put("dogwood.app", JSON.stringify({ plan: { module: "app" } }));
    await (await bus.kv("needs", "dogwood")).put("dogwood.app.bound.pg/app", JSON.stringify({ provider: "pgsql" }));
    const applied = await bus.kv("applied", "dogwood");
    await applied.put("dogwood.app", JSON.stringify({ revisions: { pg: "r2" } }));
    const app = await stateOf("dogwood", "app");
    const later = [(await applied.get("dogwood.app"))!.created, (await (await bus.kv("applied", "cedar")).get("cedar.pgsql"))!.created]
      .map((d) => d.toISOString())
      .sort()[1];
    expect(app.conditions).toEqual([
      {
        type: "RevisionMismatch",
        reason: "ProviderHoldsOther",
        message: "app on dogwood holds pg r2 (need bound.pg/app); pgsql on cedar applied r3",
        since: later,
      },
    ]);
    // Before any check fails, and gone once the holder catches up.
    await applied.put("dogwood.app", JSON.stringify({ revisions: { pg: "r3" } }));
    expect((await stateOf("dogwood", "app")).conditions).toEqual([]);
    // And when the provider goes back to what the holder has: the other way round.
    await (await bus.kv("applied", "cedar")).put("cedar.pgsql", JSON.stringify({ revisions: { pg: "r4" } }));
    expect((await stateOf("dogwood", "app")).conditions.map((c) => c.type)).toEqual(["RevisionMismatch"]);
    await (await bus.kv("applied", "cedar")).put("cedar.pgsql", JSON.stringify({ revisions: { pg: "r3" } }));
    expect((await stateOf("dogwood", "app")).conditions).toEqual([]);
  });
});
