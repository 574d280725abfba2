import { execFileSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { connect, headers, type KV } from "nats";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { STATUS } from "../functions/_lib/status.ts";
import { VERB } from "../functions/_lib/provisioning.ts";
import { loadFunctions, resolveConfig, start } from "../runtime/index.ts";
import { spawnNatsServer } from "../runtime/nats-server.ts";
import { authorization, seatPermissions } from "../runtime/permissions.ts";
import { toConf } from "../runtime/users.ts";
import type { TestBus } from "../runtime/testing.ts";
import { projectConfig, request, ROOT, SHIPPED_CONFIG, startSet, testBus } from "./helpers.ts";

let bus: TestBus;

beforeAll(async () => {
  bus = await testBus();
  const set = await startSet(bus); // asserts the buckets
  await set.stop();
});
afterAll(() => bus.stop());

/** What a put does: its revision, or the server's refusal. Then the key's value, to show it unchanged. */
async function tryPut(kv: KV, key: string, value: string): Promise<string> {
  try {
    await kv.put(key, value);
    return "written";
  } catch (err) {
    return (err as Error).message;
  }
}

const refusal = (bucket: string, key: string) => `'Permissions Violation for Publish to "$KV.${bucket}.${key}"'`;

describe("the server enforces who writes what (docs/buckets.md §2)", () => {
  it("refuses the seat a key of needs, applied or collect, leaving it as it was", async () => {
    for (const [bucket, key] of [
      ["needs", "alder.gitea.config.db_url"],
      ["applied", "alder.gitea"],
      ["collect", "alder.routes.gitea"],
    ] as const) {
      const own = await bus.kv(bucket, "alder");
      await own.put(key, '"by alder"');
      const name = `mesh-provisioner_${bucket}`;
      expect(await tryPut(await bus.kv(bucket), key, '"by the seat"')).toBe(refusal(name, key));
      expect((await own.get(key))?.string()).toBe('"by alder"');
    }
  });

  it("lets node alder write and read its own keys, never birch's, nor the registry", async () => {
    for (const [bucket, mine, theirs] of [
      ["needs", "alder.zsh.shell.zsh/normal", "birch.gitea.config.app_name"],
      ["applied", "alder.zsh", "birch.gitea"],
      ["collect", "alder.routes.zsh", "birch.routes.gitea"],
    ] as const) {
      const alder = await bus.kv(bucket, "alder");
      const birch = await bus.kv(bucket, "birch");
      await birch.put(theirs, '"by birch"');
      expect(await tryPut(alder, mine, '"by alder"')).toBe("written");
      expect((await alder.get(mine))?.string()).toBe('"by alder"');
      expect(await tryPut(alder, theirs, '"by alder"')).toBe(refusal(`mesh-provisioner_${bucket}`, theirs));
      expect(await alder.get(theirs).catch((e: Error) => e.message)).toMatch(
        /Permissions Violation for Publish to "\$JS\.API\.DIRECT\.GET/,
      );
      expect((await birch.get(theirs))?.string()).toBe('"by birch"');
    }
    const registry = await bus.kv("registry", "alder");
    expect(await tryPut(registry, "config", "{}")).toBe(refusal("mesh-provisioner_registry", "config"));
    // The stream's info, as standard key-value clients ask it when they open a bucket (the verbs
    // show every node's keys anyway); but no consumer, nor the deletion of another reader's.
    const jsm = await (await bus.connect("alder")).jetstreamManager();
    await expect(jsm.streams.info("KV_mesh-provisioner_needs")).resolves.toMatchObject({ config: { name: "KV_mesh-provisioner_needs" } });
    await expect(jsm.consumers.delete("KV_mesh-provisioner_registry", "someone-elses")).rejects.toThrow(/Permissions Violation/);
  });

  it("lets a provider publish its own events and read the needs, not write them nor speak for another", async () => {
    await (await bus.kv("needs", "birch")).put("birch.gitea.bound.keycloak/issuer", '"by birch"');
    const keycloak = await bus.kv("needs", "keycloak");
    expect((await keycloak.get("birch.gitea.bound.keycloak/issuer"))?.string()).toBe('"by birch"');
    expect(await tryPut(keycloak, "birch.gitea.bound.keycloak/issuer", '"by keycloak"')).toBe(
      refusal("mesh-provisioner_needs", "birch.gitea.bound.keycloak/issuer"),
    );
    expect((await keycloak.get("birch.gitea.bound.keycloak/issuer"))?.string()).toBe('"by birch"');
    const js = (await bus.connect("keycloak")).jetstream();
    await expect(js.publish("keycloak.provisioner.failing", "{}")).resolves.toMatchObject({ stream: "mesh-provisioner_events" });
    await expect(js.publish("postgres.provisioner.failing", "{}")).rejects.toThrow(/Permissions Violation/);
  });

  it("refuses a rollup header, so a node cannot erase the keys of other nodes", async () => {
    const birch = await bus.kv("applied", "birch");
    await birch.put("birch.caddy", '{"at":"2026-11-29T09:00:00Z"}');
    const rollup = headers();
    rollup.set("Nats-Rollup", "all");
    const alder = (await bus.connect("alder")).jetstream();
    await expect(alder.publish("$KV.mesh-provisioner_applied.alder.evil", "{}", { headers: rollup })).rejects.toThrow(/rollup/i);
    expect((await (await bus.kv("applied")).get("birch.caddy"))?.string()).toBe('{"at":"2026-11-29T09:00:00Z"}');
  });
});

describe("replies", () => {
  it("go to inboxes only: a request whose reply subject is a bucket's key is not answered", async () => {
    const set = await startSet(bus);
    try {
      const alder = await bus.connect("alder");
      const registry = await bus.kv("registry");
      const before = (await registry.get("port"))!.revision;
      alder.publish(VERB, JSON.stringify({ what: "registry", kind: "port" }), { reply: "$KV.mesh-provisioner_registry.port" });
      alder.publish(STATUS, "{}", { reply: "$KV.mesh-provisioner_failing.keycloak.alder.forged" });
      await alder.flush();
      await request(alder, VERB, {}); // the set has handled both by now
      expect((await registry.get("port"))!.revision).toBe(before);
      expect(await (await bus.kv("failing")).get("keycloak.alder.forged")).toBeNull();
    } finally {
      await set.stop();
    }
  });

  it("let an operator holding the seat's credentials describe the service ($SRV.INFO)", async () => {
    const set = await startSet(bus);
    try {
      const seat = await bus.connect();
      const infos = [];
      for await (const info of await seat.services.client().info("mesh-provisioner")) infos.push(info);
      expect(infos.map((i) => i.endpoints.map((e) => e.name).sort())).toEqual([["provisioning", "status"]]);
    } finally {
      await set.stop();
    }
  });

  it("reach only their user: a node cannot listen on the inboxes of others", async () => {
    const alder = await bus.connect("alder");
    const errors: string[] = [];
    void (async () => {
      for await (const s of alder.status()) if (s.type === "error") errors.push(String(s.data));
    })();
    for (const subject of ["_INBOX.>", "_INBOX.birch.>", "_INBOX.mesh-provisioner.>"]) alder.subscribe(subject);
    alder.subscribe("_INBOX.alder.>");
    await alder.flush();
    await new Promise((r) => setTimeout(r, 200));
    // One refusal per foreign inbox; its own still works.
    expect(errors).toEqual(["PERMISSIONS_VIOLATION", "PERMISSIONS_VIOLATION", "PERMISSIONS_VIOLATION"]);
    const info = await (await alder.jetstreamManager()).getAccountInfo(); // its reply comes to _INBOX.alder.…
    expect(info.streams).toBeGreaterThan(0);
  });
});

describe("the seat's permissions, derived from the functions", () => {
  it("refuse user names that are not one token, or name two users", async () => {
    const config = await projectConfig();
    const functions = await loadFunctions(config);
    expect(() => authorization(config, functions, { nodes: ["*"], providers: ["a.b"] })).toThrow(
      'a user\'s name must be one token (A-Z a-z 0-9 - _ / =): "*", "a.b"',
    );
    expect(() => authorization(config, functions, { nodes: ["mesh-provisioner"], providers: [] })).toThrow(
      "a user is named twice (the seat, nodes and providers share one namespace): mesh-provisioner",
    );
    expect(() => toConf(authorization(config, functions, { nodes: ["a-b", "a_b"], providers: [] }))).toThrow(
      "two users would share the password variable $A_B_PASSWORD: rename one of them",
    );
  });

  it("grant no JetStream or KV wildcard, and no write to a node-written bucket but the views' marker key", async () => {
    const config = await projectConfig();
    const { publish, subscribe } = seatPermissions(config, await loadFunctions(config));
    for (const subject of [...publish.allow, ...subscribe.allow]) {
      expect(subject).not.toMatch(/^\$JS\.(API\.)?>$|^\$KV\.>$|^>$/);
    }
    expect(publish.allow.filter((s) => s.startsWith("$KV."))).toEqual([
      "$KV.mesh-provisioner_checks.>",
      "$KV.mesh-provisioner_rotations.>",
      "$KV.mesh-provisioner_failing.>",
      "$KV.mesh-provisioner_registry.>",
      "$KV.mesh-provisioner_runtime.>",
      "$KV.mesh-provisioner_claims.>",
      // Of the buckets others write, the live views' marker key alone (docs/verb.md §4.6).
      "$KV.mesh-controller_assignments._freshness",
      "$KV.mesh-provisioner_needs._freshness",
      "$KV.mesh-provisioner_applied._freshness",
      "$KV.mesh-provisioner_presence._freshness",
      "$KV.mesh-provisioner_collect._freshness",
    ]);
    expect(subscribe.allow).toContain("mesh-provisioner.provisioning");
  });

  it("as `mesh-provisioner permissions` prints them, run a real nats-server the set serves on", async () => {
    const config = await projectConfig();
    const printed = execFileSync(
      "node",
      [join(ROOT, "bin", "mesh-provisioner.mjs"), "-c", SHIPPED_CONFIG, "permissions", "--node", "alder", "--provider", "keycloak"],
      {
        cwd: ROOT,
        encoding: "utf8",
        env: { ...process.env, LOG_LEVEL: "silent" },
      },
    );
    expect(printed).toBe(
      `${toConf(
        authorization(config, await loadFunctions(config), { nodes: ["alder"], providers: ["keycloak"], controllers: ["mesh-controller"] }),
      ).trimEnd()}\n`,
    );
    const dir = mkdtempSync(join(tmpdir(), "mesh-provisioner-printed-"));
    try {
      const server = await spawnNatsServer({
        conf: `${printed}\njetstream { store_dir: ${JSON.stringify(join(dir, "store"))} }`,
        confFile: join(dir, "nats-server.conf"),
        env: {
          ...process.env,
          MESH_PROVISIONER_PASSWORD: "seat-pw",
          ALDER_PASSWORD: "alder-pw",
          KEYCLOAK_PASSWORD: "kc-pw",
          MESH_CONTROLLER_PASSWORD: "mc-pw",
        },
      });
      try {
        const set = await start({
          config: {
            ...resolveConfig(
              { ...config, nats: { servers: [server.url], user: "mesh-provisioner", password: "seat-pw" }, http: { port: 0 } },
              config.file,
              {},
            ),
            root: config.root,
          },
        });
        const alder = await connect({ servers: server.url, user: "alder", pass: "alder-pw", inboxPrefix: "_INBOX.alder" });
        expect((await request(alder, VERB, { what: "registry", kind: "port" })).body.entries[0].value.module).toBe("mesh-controller");
        await alder.close();
        await set.stop();
      } finally {
        await server.stop();
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
