import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  ClientArgumentError,
  ClientClosed,
  connectNode,
  connectProvider,
  MeshRefusal,
  MeshUnanswered,
  needOf,
  type NodeClient,
  type ProviderClient,
} from "../client/index.ts";
import type { Config, Running } from "../runtime/index.ts";
import type { TestBus } from "../runtime/testing.ts";
import { startSet, testBus, until } from "./helpers.ts";

let bus: TestBus;
let set: Running;
let alder: NodeClient;
let birch: NodeClient;
let keycloak: ProviderClient;

const node = (name: string) => connectNode({ servers: bus.url, node: name, credentials: { password: bus.server.users[name]!.password } });

beforeAll(async () => {
  bus = await testBus({ nodes: ["alder", "birch"], providers: ["keycloak"] });
  set = await startSet(bus, { rotation: { graceSeconds: 300, renoticeMinutes: 60, renoticeEverySeconds: 1 } } as Partial<Config>);
  alder = await node("alder");
  birch = await node("birch");
  keycloak = await connectProvider({
    servers: bus.url,
    provider: "keycloak",
    credentials: { password: bus.server.users.keycloak!.password },
  });
});
afterAll(async () => {
  await Promise.all([alder?.close(), birch?.close(), keycloak?.close()]);
  await set?.stop();
  await bus?.stop();
});

type Page = { entries: { key: string; value: any; revision: number }[]; outOfShape: { key: string }[] };
const needsOf = async (client: NodeClient, module: string) => (await client.ask({ what: "needs", node: client.node, module })) as Page;

describe("a node client", () => {
  it("declares a module's needs by the need-name rule, leaves unchanged ones, deletes those no longer declared", async () => {
    const first = await alder.declare("gitea", {
      "${config:db_url}": { file: "/etc/gitea/app.ini" },
      "${bound:postgres:address}": { file: "/etc/gitea/app.ini", provider: "postgres" },
      "${secret:admin_password}": {},
    });
    expect(first).toEqual({
      written: ["alder.gitea.config.db_url", "alder.gitea.bound.postgres/address", "alder.gitea.secret.admin_password"],
      deleted: [],
      unchanged: [],
    });
    const page = await needsOf(alder, "gitea");
    expect(page.entries.map((e) => [e.key, e.value])).toEqual([
      [
        "alder.gitea.bound.postgres/address",
        { placeholder: "${bound:postgres:address}", file: "/etc/gitea/app.ini", provider: "postgres" },
      ],
      ["alder.gitea.config.db_url", { placeholder: "${config:db_url}", file: "/etc/gitea/app.ini" }],
      ["alder.gitea.secret.admin_password", { placeholder: "${secret:admin_password}" }],
    ]);
    const revisions = new Map(page.entries.map((e) => [e.key, e.revision]));

    const second = await alder.declare("gitea", {
      "${config:db_url}": { file: "/etc/gitea/app.ini" },
      "${bound:postgres:address}": { file: "/etc/gitea/app.ini", provider: "postgres" },
    });
    expect(second).toEqual({
      written: [],
      deleted: ["alder.gitea.secret.admin_password"],
      unchanged: ["alder.gitea.config.db_url", "alder.gitea.bound.postgres/address"],
    });
    const after = await needsOf(alder, "gitea");
    expect(after.entries.map((e) => [e.key, e.revision])).toEqual([
      ["alder.gitea.bound.postgres/address", revisions.get("alder.gitea.bound.postgres/address")],
      ["alder.gitea.config.db_url", revisions.get("alder.gitea.config.db_url")],
    ]);
    // A list of placeholders alone: each need's value holds its placeholder.
    expect((await alder.declare("caddy", ["${port:https}"])).written).toEqual(["alder.caddy.port.https"]);
  });

  it("deletes a key of its module out of shape when it declares again", async () => {
    const raw = await bus.kv("needs", "alder");
    await raw.put("alder.stray.config", "{}");
    expect((await needsOf(alder, "stray")).outOfShape.map((o) => o.key)).toEqual(["alder.stray.config"]);
    expect(await alder.declare("stray", [])).toEqual({ written: [], deleted: ["alder.stray.config"], unchanged: [] });
    expect((await needsOf(alder, "stray")).outOfShape).toEqual([]);
  });

  it("deletes its keys out of shape whatever they hold, and writes again a need whose value it cannot write back", async () => {
    // Keys nats.js's KV refuses to name, written by hand on the node's own subjects.
    const js = (await bus.connect("alder")).jetstream();
    await js.publish("$KV.mesh-provisioner_needs.alder.odd.config.a:b", "{}");
    await js.publish("$KV.mesh-provisioner_needs.alder.odd.config.naïve", "{}");
    // A need whose value is nested deeper than JSON.stringify reaches.
    let deep = "1";
    for (let i = 0; i < 20_000; i++) deep = `[${deep}]`;
    await js.publish("$KV.mesh-provisioner_needs.alder.odd.config.a", `{"placeholder":"\${config:a}","deep":${deep}}`);
    expect((await needsOf(alder, "odd")).outOfShape.map((o) => o.key)).toEqual(["alder.odd.config.a:b", "alder.odd.config.naïve"]);
    expect(await alder.declare("odd", ["${config:a}"])).toEqual({
      written: ["alder.odd.config.a"],
      deleted: ["alder.odd.config.a:b", "alder.odd.config.naïve"],
      unchanged: [],
    });
    const after = await needsOf(alder, "odd");
    expect([after.entries.map((e) => [e.key, e.value]), after.outOfShape]).toEqual([
      [["alder.odd.config.a", { placeholder: "${config:a}" }]],
      [],
    ]);
  });

  it("writes the applied record with its revisions, which the module's state and holders read", async () => {
    await alder.declare("grafana", ["${secret:keycloak:client_secret}"]);
    const revision = await alder.applied("grafana", { revisions: { keycloak: "k1" } });
    expect(revision).toBeGreaterThan(0);
    const applied = (await alder.ask({ what: "applied", node: "alder", module: "grafana" })) as Page;
    expect(applied.entries[0]!.value).toMatchObject({ revisions: { keycloak: "k1" } });
    expect(typeof applied.entries[0]!.value.at).toBe("string");
    const holders = await keycloak.holders("keycloak");
    expect(holders).toMatchObject([{ key: "alder.grafana.secret.keycloak/client_secret", revision: "k1", stale: false }]);
  });

  it("contributes and withdraws an item of a collection, its name encoded", async () => {
    await birch.contribute("shell:zsh:normal", "docker", { alias: "d=docker" });
    const collect = (await birch.ask({ what: "collect", node: "birch" })) as Page & { entries: { collection: string }[] };
    expect(collect.entries.map((e) => [e.key, (e as any).collection, e.value])).toEqual([
      ["birch.shell=3Azsh=3Anormal.docker", "shell:zsh:normal", { alias: "d=docker" }],
    ]);
    await birch.withdraw("shell:zsh:normal", "docker");
    expect(((await birch.ask({ what: "collect", node: "birch" })) as Page).entries).toEqual([]);
  });

  it("publishes one check when the same result is given several times at once", async () => {
    const published = await Promise.all(Array.from({ length: 5 }, () => birch.check("gitea", "keycloak", { ok: true })));
    expect(published.filter(Boolean)).toHaveLength(1);
    expect(await birch.check("gitea", "keycloak", { ok: true })).toBe(false);
    expect(await birch.check("gitea", "keycloak", { ok: false, reason: "AuthFailed" })).toBe(true);
  });

  it("goes on hearing notices, and asking, after a handler that throws at once", async () => {
    const seat = await bus.connect();
    const heard: string[] = [];
    const refresh = birch.onRefresh((n) => {
      if (n.revision === "r1") throw new Error("the caller's own mistake");
      heard.push(n.revision);
    });
    try {
      // The subscription is at the server before the first notice.
      await birch.nc.flush();
      for (const revision of ["r1", "r2"]) {
        const notice = { provider: "keycloak", provision: "keycloak", revision, at: new Date().toISOString(), modules: ["grafana"] };
        seat.publish("mesh-provisioner.refresh.birch", JSON.stringify(notice));
        await seat.flush();
      }
      await until(() => heard.length > 0, 5000, "the second notice");
      expect(heard).toEqual(["r2"]);
      expect(((await birch.ask({ what: "registry" })) as Page).entries.length).toBeGreaterThan(0);
    } finally {
      refresh.stop();
      await seat.close();
    }
  });

  it("says a refusal of the verb as a MeshRefusal with its code", async () => {
    const refused = await alder.ask({ what: "wormholes" }).catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(MeshRefusal);
    expect((refused as MeshRefusal).code).toBe(400);
  });
});

describe("a provider client", () => {
  it("publishes failing and recovered, which status follows", async () => {
    expect(await keycloak.failing("alder", "grafana", "invalid_client")).toBeGreaterThan(0);
    await until(async () => ((await alder.status({ provider: "keycloak" })) as { failing: unknown[] }).failing.length === 1);
    expect(((await alder.status({ provider: "keycloak" })) as { failing: unknown[] }).failing).toMatchObject([
      { provider: "keycloak", machine: "alder", consumer: "grafana", word: "invalid_client" },
    ]);
    await keycloak.recovered("alder", "grafana");
    await until(async () => ((await alder.status({ provider: "keycloak" })) as { failing: unknown[] }).failing.length === 0);
  });

  it("cuts a failing word longer than the follower keeps, as the follower would (docs/failing.md §5)", async () => {
    expect(await keycloak.failing("birch", "grafana", "w".repeat(2 * 1024 * 1024))).toBeGreaterThan(0);
    const failingOf = async () =>
      ((await alder.status({ provider: "keycloak", machine: "birch" })) as { failing: { word: string }[] }).failing;
    await until(async () => (await failingOf()).length === 1);
    expect((await failingOf())[0]!.word).toBe(`${"w".repeat(1023)}…`);
    await keycloak.recovered("birch", "grafana");
    await until(async () => (await failingOf()).length === 0);
  });

  it("rotates a provision: its holder's node hears the notice, and the provider the release once it caught up", async () => {
    const notices: unknown[] = [];
    const releases: unknown[] = [];
    const refresh = alder.onRefresh((n) => void notices.push(n));
    const release = keycloak.onReleased((r) => void releases.push(r));
    await alder.nc.flush();
    await keycloak.nc.flush();
    await keycloak.rotated("keycloak", "k2");
    await until(() => notices.length > 0, 10_000, "the refresh notice");
    expect(notices[0]).toMatchObject({ provider: "keycloak", provision: "keycloak", revision: "k2", modules: ["grafana"] });
    expect(releases).toEqual([]);
    await alder.applied("grafana", { revisions: { keycloak: "k2" } });
    await until(() => releases.length > 0, 10_000, "the release");
    expect(releases[0]).toMatchObject({ provision: "keycloak", revision: "k2", holders: 1 });
    refresh.stop();
    release.stop();
  });
});

describe("closing a client (docs/client.md §9)", () => {
  it("a node's: the declare under way writes all its keys before the connection drains; a call after close() sends nothing", async () => {
    const closing = await node("alder");
    const placeholders = Object.fromEntries(Array.from({ length: 20 }, (_, i) => [`\${config:k${i}}`, {}]));
    const declared = closing.declare("closing", placeholders);
    let settled = false;
    void declared.finally(() => (settled = true));
    await closing.close();
    // Settled before close() resolved: declared in full.
    expect(settled).toBe(true);
    expect((await declared).written).toHaveLength(20);
    expect((await needsOf(alder, "closing")).entries).toHaveLength(20);
    const after = await closing.declare("closing", {}).then(
      () => "declared",
      (e: Error) => e,
    );
    expect(after).toBeInstanceOf(ClientClosed);
    expect(after).toMatchObject({ operation: "declare", message: "declare: the client is closed, nothing was sent" });
    await expect(closing.check("closing", "postgres", { ok: true })).rejects.toBeInstanceOf(ClientClosed);
    expect(() => closing.onRefresh(() => {})).toThrow(ClientClosed);
    // Nothing deleted by the refused declare of none.
    expect((await needsOf(alder, "closing")).entries).toHaveLength(20);
  });

  it("a provider's: the publish under way is stored before the connection drains; one after close() is refused", async () => {
    const closing = await connectProvider({
      servers: bus.url,
      provider: "keycloak",
      credentials: { password: bus.server.users.keycloak!.password },
    });
    const published = closing.failing("birch", "closing", "invalid_client");
    let settled = false;
    void published.finally(() => (settled = true));
    await closing.close();
    expect(settled).toBe(true);
    expect(await published).toBeGreaterThan(0);
    await expect(closing.recovered("birch", "closing")).rejects.toMatchObject({ name: "ClientClosed", operation: "recovered" });
    expect(() => closing.onReleased(() => {})).toThrow("onReleased: the client is closed, nothing was sent");
    const failingOf = async () =>
      ((await alder.status({ provider: "keycloak", machine: "birch", consumer: "closing" })) as { failing: unknown[] }).failing;
    await until(async () => (await failingOf()).length === 1, 10_000, "the failing followed");
    await keycloak.recovered("birch", "closing");
    await until(async () => (await failingOf()).length === 0, 10_000, "the recovered followed");
  });
});

describe("a server of a small max_payload (docs/client.md §9.1)", () => {
  it("takes small values, and refuses one too large for a reply with a limit it can meet", async () => {
    const small = await testBus({ maxPayload: 8192 });
    const running = await startSet(small);
    const cedar = await connectNode({
      servers: small.url,
      node: "cedar",
      credentials: { password: small.server.users.cedar!.password },
      presence: false,
    });
    try {
      expect(await cedar.contribute("shell", "docker", { lines: ["x"] })).toBeGreaterThan(0);
      const refused = await cedar.contribute("shell", "docker", "z".repeat(7000)).catch((e: unknown) => e);
      expect(refused).toBeInstanceOf(ClientArgumentError);
      expect((refused as Error).message).toMatch(
        /^item is 7002 bytes as JSON: at most 6144 fit in one of the verb's replies \(max_payload 8192\)/,
      );
    } finally {
      await cedar.close();
      await running.stop();
      await small.stop();
    }
  });
});

describe("the set not running (docs/client.md §9)", () => {
  it("a request nobody answers throws a MeshUnanswered naming the verb's subject", { timeout: 30_000 }, async () => {
    const lone = await testBus();
    const cedar = await connectNode({
      servers: lone.url,
      node: "cedar",
      credentials: { password: lone.server.users.cedar!.password },
      presence: false,
    });
    try {
      const err = await cedar.ask({ what: "needs" }).then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(err).toBeInstanceOf(MeshUnanswered);
      expect(err).toMatchObject({ subject: "mesh-provisioner.provisioning", code: "TIMEOUT" });
      expect((err as Error).message).toBe(
        "no answer on mesh-provisioner.provisioning within 10 s: the function set is not running, not reachable from this server, or too busy",
      );
    } finally {
      await cedar.close();
      await lone.stop();
    }
  });
});

describe("bad arguments", () => {
  it("throw at once, naming the argument, and write nothing", async () => {
    const refused = async (call: () => unknown) => {
      try {
        await call();
      } catch (err) {
        expect(err).toBeInstanceOf(ClientArgumentError);
        return (err as ClientArgumentError).argument;
      }
      throw new Error("not refused");
    };
    expect(await refused(() => alder.declare("git.ea", []))).toBe("module");
    expect(await refused(() => alder.declare("", []))).toBe("module");
    expect(await refused(() => alder.declare("gitea", ["${config}"]))).toBe("placeholders:");
    expect(await refused(() => alder.declare("gitea", ["${con fig:x}"]))).toBe("placeholders: ${con fig:x}: its kind");
    expect(await refused(() => alder.declare("gitea", ["${config:a.b}"]))).toBe("placeholders: ${config:a.b}: its name");
    expect(await refused(() => alder.declare("gitea", { "${bound:redis:address}": { provider: "re*dis" } }))).toBe(
      "placeholders: ${bound:redis:address}",
    );
    expect(await refused(() => alder.applied("gitea", { revisions: { keycloak: 2 as unknown as string } }))).toBe(
      "record.revisions.keycloak",
    );
    expect(await refused(() => alder.applied("gitea", { error: 5 as unknown as string }))).toBe("record.error");
    expect(await refused(() => alder.contribute("", "docker", {}))).toBe("collection");
    expect(await refused(() => alder.contribute("shell", "dock>er", {}))).toBe("contributor");
    expect(await refused(() => keycloak.failing("al der", "grafana", "x"))).toBe("machine");
    expect(await refused(() => keycloak.failing("alder", "grafana", ""))).toBe("word");
    expect(await refused(() => keycloak.rotated("keycloak/x", "k3"))).toBe("provision");
    expect(await refused(() => keycloak.rotated("keycloak", 3 as unknown as string))).toBe("revision");
    expect(await refused(() => keycloak.rotated("keycloak", "k3", { machine: "alder" }))).toBe("consumer");
    // A holder given as a string, or with a field of its own, is refused: never a rotation of every holder.
    expect(await refused(() => keycloak.rotated("keycloak", "k3", "alder" as never))).toBe("holder");
    expect(await refused(() => keycloak.rotated("keycloak", "k3", { machine: "alder", consumer: "gitea", revision: "k9" } as never))).toBe(
      "holder",
    );
    // A bad argument rejects the promise, never throws before it.
    const rejected = keycloak.failing("al.der", "grafana", "w");
    expect(rejected).toBeInstanceOf(Promise);
    await expect(rejected).rejects.toThrow(ClientArgumentError);
    expect(await refused(() => connectProvider(undefined as never))).toBe("options");
    expect(await refused(() => connectNode(undefined as never))).toBe("options");
    expect(await refused(() => keycloak.holders("*"))).toBe("provision");
    expect(await refused(() => connectNode({ servers: bus.url, node: "al.der", credentials: { password: "x" } }))).toBe("node");
    expect(await refused(() => connectNode({ servers: [], node: "alder", credentials: { password: "x" } }))).toBe("servers");
    expect(await refused(() => connectNode({ servers: 5 as never, node: "alder", credentials: { password: "x" } }))).toBe("servers");
    expect(await refused(() => connectNode({ servers: "nats://[::1", node: "alder", credentials: { password: "x" } }))).toBe("servers");
    expect(
      await refused(() => connectNode({ servers: bus.url, node: "alder", credentials: { password: "x" }, name: "x".repeat(5000) })),
    ).toBe("name");
    // A need's value naming a placeholder of its own, or one that is no JSON, or too large for a reply: refused, and none of the module's needs written.
    expect(await refused(() => alder.declare("gitea", { "${config:db_url}": {}, "${config:x}": { placeholder: "${secret:y}" } }))).toBe(
      "placeholders: ${config:x}",
    );
    expect(await refused(() => alder.declare("gitea", { "${config:db_url}": {}, "${config:x}": { big: 10n } }))).toBe(
      "placeholders: ${config:x}",
    );
    expect(await refused(() => alder.declare("gitea", { "${config:db_url}": {}, "${config:x}": { blob: "z".repeat(1_040_000) } }))).toBe(
      "placeholders: ${config:x}",
    );
    const cycle: Record<string, unknown> = {};
    cycle.self = cycle;
    expect(await refused(() => alder.applied("gitea", cycle))).toBe("record");
    expect(await refused(() => alder.contribute("shell", "docker", "z".repeat(1_040_000)))).toBe("item");
    expect(await refused(() => alder.contribute("shell", "docker", 10n))).toBe("item");
    expect(await refused(() => alder.applied("gitea", { revisions: { "postgres/address": "8" } }))).toMatch(/^record\.revisions/);
    expect(await refused(() => alder.status({ provder: "keycloak" } as never))).toBe("narrowing");
    expect(await refused(() => alder.status({ provider: "key cloak" }))).toBe("narrowing.provider");
    expect(await refused(() => keycloak.holders("keycloak/client-secret"))).toBe("provision");
    // Nothing of these reached the buckets.
    expect((await needsOf(alder, "gitea")).entries.map((e) => e.key)).toEqual([
      "alder.gitea.bound.postgres/address",
      "alder.gitea.config.db_url",
    ]);
    expect(((await alder.ask({ what: "applied", node: "alder", module: "gitea" })) as Page).entries).toEqual([]);
  });

  it("reads a placeholder as its need", () => {
    expect(needOf("${bound:postgres:address}")).toEqual({ kind: "bound", name: "postgres/address" });
    expect(needOf("${shell:zsh:normal}")).toEqual({ kind: "shell", name: "zsh/normal" });
    expect(() => needOf("config:db_url")).toThrow(ClientArgumentError);
  });
});
