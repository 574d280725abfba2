import type { KV, NatsConnection } from "nats";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { connectNode } from "../client/index.ts";
import type { Status } from "../functions/_lib/status.ts";
import type { ModuleState, NodeEntry } from "../functions/_lib/state.ts";
import type { Config, Running } from "../runtime/index.ts";
import type { TestBus } from "../runtime/testing.ts";
import { request, startSet, testBus, until } from "./helpers.ts";

// docs/presence.md §16: a node unreachable once neither the TTL nor three of its own periods have
// passed since the server stored its last presence write.
const TTL_SECONDS = 3;
let bus: TestBus;
let set: Running;
let seat: NatsConnection;
let controller: KV;
const presence: Record<string, KV> = {};
const applied: Record<string, KV> = {};
const needs: Record<string, KV> = {};
const NODES = ["alder", "birch", "cedar", "dogwood", "elm"];

beforeAll(async () => {
  bus = await testBus({ nodes: NODES });
  set = await startSet(bus, { presence: { ttlSeconds: TTL_SECONDS } } as Partial<Config>);
  seat = await bus.connect();
  controller = await bus.kv("assignments", "mesh-controller");
  for (const node of NODES) {
    presence[node] = await bus.kv("presence", node);
    applied[node] = await bus.kv("applied", node);
    needs[node] = await bus.kv("needs", node);
  }
});
afterAll(async () => {
  await set.stop();
  await bus.stop();
});

const verb = async (body: Record<string, unknown>) => (await request(seat, "mesh-provisioner.provisioning", body)).body;
const nodesOf = async (narrowing: Record<string, unknown> = {}) =>
  ((await verb({ what: "nodes", ...narrowing })) as { entries: NodeEntry[] }).entries;
const nodeOf = async (node: string) => (await nodesOf({ node }))[0];
const stateOf = async (node: string, module: string) =>
  ((await verb({ what: "state", node, module })) as { entries: ModuleState[] }).entries[0]!;
const status = async (narrowing: Record<string, unknown> = {}) =>
  (await request(seat, "mesh-provisioner.status", narrowing)).body as Status;
/** A module assigned, declaring one need and applied: well. */
const wellModule = async (node: string, module: string, need: Record<string, unknown> = {}) => {
  await controller.put(`${node}.${module}`, JSON.stringify({ plan: { module } }));
  await needs[node]!.put(`${node}.${module}.config.x`, JSON.stringify(need));
  await applied[node]!.put(`${node}.${module}`, JSON.stringify({}));
};
const beHere = (node: string, everySeconds = 1, extra: Record<string, unknown> = {}) =>
  presence[node]!.put(node, JSON.stringify({ everySeconds, client: "test", ...extra }));

describe("presence from the server's times (docs/presence.md §16.1)", () => {
  it("a node that never wrote is silent, and nothing is inferred: its module stays applied and well", async () => {
    await wellModule("alder", "gitea");
    expect(await nodeOf("alder")).toEqual({
      key: "alder",
      node: "alder",
      presence: "silent",
      since: null,
      lastSeen: null,
      everySeconds: null,
      client: null,
      modules: 1,
    });
    const state = await stateOf("alder", "gitea");
    expect(state).toMatchObject({ state: "applied", presence: "silent", conditions: [] });
    expect((await status({ machine: "alder" })).well).toBe(true);
    // The module unchanged (its state kept as it was made), its node writing: the state says so.
    await beHere("alder", 60);
    expect(await stateOf("alder", "gitea")).toMatchObject({ state: "applied", presence: "reachable", conditions: [] });
  });

  it("is reachable from the server's time of the write, whatever time the node's value claims", async () => {
    await wellModule("birch", "caddy");
    // A node whose clock is a year behind: the value's own time is never read.
    await beHere("birch", 1, { at: "2025-01-01T00:00:00Z" });
    const stored = (await presence.birch!.get("birch"))!.created.toISOString();
    expect(await nodeOf("birch")).toEqual({
      key: "birch",
      node: "birch",
      presence: "reachable",
      since: null,
      lastSeen: stored,
      everySeconds: 1,
      client: "test",
      modules: 1,
    });
    expect(await stateOf("birch", "caddy")).toMatchObject({ presence: "reachable", conditions: [] });
  });

  it("becomes unreachable by time alone, with no write in between; Unconfirmed until it writes again", async () => {
    await wellModule("cedar", "motd");
    await beHere("cedar");
    const lastSeen = (await presence.cedar!.get("cedar"))!.created;
    expect((await nodeOf("cedar"))!.presence).toBe("reachable");
    // No write at all from here on: the TTL (3 s, three periods of 1 s) alone.
    await until(async () => (await nodeOf("cedar"))!.presence === "unreachable", 10_000);
    const since = new Date(lastSeen.getTime() + TTL_SECONDS * 1000).toISOString();
    expect(await nodeOf("cedar")).toMatchObject({ presence: "unreachable", since, lastSeen: lastSeen.toISOString() });
    const state = await stateOf("cedar", "motd");
    expect(state.presence).toBe("unreachable");
    expect(state.conditions).toEqual([
      {
        type: "Unconfirmed",
        reason: "NodeUnreachable",
        message: `node cedar is unreachable: no presence since ${lastSeen.toISOString()}, so nothing it recorded is confirmed`,
        since,
      },
    ]);
    const s = await status();
    expect(s.well).toBe(false);
    expect(s.nodes.unreachable).toContainEqual({ node: "cedar", since, lastSeen: lastSeen.toISOString() });
    expect(s.provisioning.notWell.map((m) => m.key)).toContain("cedar.motd");
    expect((await nodesOf({ presence: "unreachable" })).map((n) => n.node)).toContain("cedar");
    const counts = s.nodes.counts;
    const metrics = await (await fetch(`${set.httpUrl}/metrics`)).text();
    expect(metrics).toContain(`nodes_by_presence{presence="unreachable"} ${counts.unreachable}`);
    expect(metrics).toContain(`nodes_by_presence{presence="silent"} ${counts.silent}`);
    expect(counts.unreachable).toBeGreaterThanOrEqual(1);

    await beHere("cedar", 60);
    const back = await stateOf("cedar", "motd");
    expect(back).toMatchObject({ presence: "reachable", conditions: [] });
    expect((await status({ machine: "cedar" })).well).toBe(true);
    // Its own period of 60 s is longer than the TTL: three of them apply.
    const wrote = (await presence.cedar!.get("cedar"))!.created.getTime();
    expect((await nodeOf("cedar"))!.everySeconds).toBe(60);
    expect(new Date(wrote + 180_000).toISOString() > new Date().toISOString()).toBe(true);
  });

  it("says a value out of shape and still counts the write, in what=state and what=nodes", async () => {
    await presence.dogwood!.put("dogwood", "not json");
    expect((await nodeOf("dogwood"))!).toMatchObject({ presence: "reachable", everySeconds: null });
    const said = { key: "presence:dogwood", reason: expect.stringMatching(/^value is not JSON: /) };
    expect(((await verb({ what: "state" })) as { outOfShape: unknown[] }).outOfShape).toContainEqual(said);
    expect(((await verb({ what: "nodes" })) as { outOfShape: unknown[] }).outOfShape).toContainEqual(said);
    // Narrowed to the node: its own key, and no other's.
    expect(((await verb({ what: "nodes", node: "dogwood" })) as { outOfShape: unknown[] }).outOfShape).toEqual([said]);
    expect(((await verb({ what: "nodes", node: "cedar" })) as { outOfShape: unknown[] }).outOfShape).toEqual([]);
    // The key out of shape is an item of the page: `limit` 1 holds it and no entry, and the next page the entries.
    const first = (await verb({ what: "nodes", limit: 1 })) as { entries: unknown[]; outOfShape: unknown[]; next?: string };
    expect(first.entries.length + first.outOfShape.length).toBe(1);
    expect(first.outOfShape).toEqual([said]);
    expect(first.next).toBeDefined();
    const second = (await verb({ what: "nodes", limit: 1, cursor: first.next })) as { entries: { node: string }[]; outOfShape: unknown[] };
    expect(second.outOfShape).toEqual([]);
    expect(second.entries).toHaveLength(1);
    await presence.dogwood!.put("dogwood", JSON.stringify({ everySeconds: 0.001 }));
    expect(((await verb({ what: "nodes" })) as { outOfShape: unknown[] }).outOfShape).toContainEqual({
      key: "presence:dogwood",
      reason: "value is not { everySeconds, client? }: everySeconds must be at least 1 second",
    });
    await presence.dogwood!.put("dogwood", JSON.stringify({ everySeconds: 30 }));
    const mended = (await verb({ what: "state" })) as { outOfShape: { key: string }[] };
    expect(mended.outOfShape.filter((o) => o.key.startsWith("presence:"))).toEqual([]);
  });

  it("refuses a node writing another node's presence, a key under its own, or its bare name in another bucket (the server's permissions)", async () => {
    await expect(presence.alder!.put("birch", JSON.stringify({ everySeconds: 15 }))).rejects.toThrow(/permission|timeout/i);
    await expect(presence.alder!.put("alder.extra", JSON.stringify({ everySeconds: 15 }))).rejects.toThrow(/permission|timeout/i);
    await expect(needs.alder!.put("alder", "{}")).rejects.toThrow(/permission|timeout/i);
  });
});

describe("ProviderUnreachable (docs/presence.md §16.2)", () => {
  it("names a need whose provider's every node is unreachable, and ends when one of them writes again", async () => {
    // The provider `vault` on alder and birch; its consumer on dogwood.
    await beHere("alder");
    await beHere("birch");
    await beHere("dogwood", 60);
    await wellModule("alder", "vault");
    await wellModule("birch", "vault");
    await wellModule("dogwood", "app", { provider: "vault" });
    expect((await stateOf("dogwood", "app")).conditions).toEqual([]);
    // alder and birch stop writing: once both are past their limit, the consumer's provider is unreachable.
    await until(async () => (await stateOf("dogwood", "app")).conditions.length > 0, 10_000);
    const [a, b] = await Promise.all([nodeOf("alder"), nodeOf("birch")]);
    expect([a!.presence, b!.presence]).toEqual(["unreachable", "unreachable"]);
    const latest = [a!.since!, b!.since!].sort()[1]!;
    const app = await stateOf("dogwood", "app");
    expect(app.presence).toBe("reachable");
    expect(app.conditions).toEqual([
      {
        type: "ProviderUnreachable",
        reason: "ProviderNodesUnreachable",
        message: "need config.x names provider vault, assigned only to unreachable nodes alder, birch",
        since: latest,
      },
    ]);
    expect((await status()).provisioning.notWell.map((m) => m.key)).toContain("dogwood.app");
    // One provider node back: the need is answerable again.
    await beHere("birch", 60);
    expect((await stateOf("dogwood", "app")).conditions).toEqual([]);
    expect((await status()).provisioning.notWell.map((m) => m.key)).not.toContain("dogwood.app");
  });
});

describe("the client library writes presence (docs/client.md §9.1)", () => {
  it("writes at connect and every everySeconds, and stops at close()", async () => {
    const client = await connectNode({
      servers: bus.url,
      node: "alder",
      credentials: { password: bus.server.users.alder!.password },
      presence: { everySeconds: 1 },
    });
    await until(async () => (await presence.alder!.get("alder"))?.json<{ client?: string }>().client === "mesh-provisioner client");
    const first = (await presence.alder!.get("alder"))!.revision;
    await until(async () => (await presence.alder!.get("alder"))!.revision > first);
    expect((await nodeOf("alder"))!.everySeconds).toBe(1);
    await client.close();
    const last = (await presence.alder!.get("alder"))!.revision;
    await new Promise((r) => setTimeout(r, 1500));
    expect((await presence.alder!.get("alder"))!.revision).toBe(last);
  });

  it("retire() deletes the node's key: silent, never unreachable", async () => {
    await wellModule("elm", "motd");
    const client = await connectNode({ servers: bus.url, node: "elm", credentials: { password: bus.server.users.elm!.password } });
    await until(async () => (await nodeOf("elm"))?.presence === "reachable");
    await client.retire();
    await client.close();
    expect(await nodeOf("elm")).toMatchObject({ presence: "silent", lastSeen: null, modules: 1 });
    expect((await stateOf("elm", "motd")).conditions).toEqual([]);
  });

  it("refuses a bad period with a ClientArgumentError", async () => {
    await expect(
      connectNode({
        servers: bus.url,
        node: "alder",
        credentials: { password: bus.server.users.alder!.password },
        presence: { everySeconds: -1 },
      }),
    ).rejects.toThrow(/presence\.everySeconds/);
  });
});
