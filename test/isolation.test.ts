import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { AckPolicy, connect, DeliverPolicy, type NatsConnection } from "nats";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { STATUS } from "../functions/_lib/status.ts";
import { VERB } from "../functions/_lib/provisioning.ts";
import { loadFunctions, resolveConfig, start, type Running } from "../runtime/index.ts";
import { spawnNatsServer } from "../runtime/nats-server.ts";
import { authorization } from "../runtime/permissions.ts";
import { startTestBus, startTestCluster } from "../runtime/testing.ts";
import { toConf } from "../runtime/users.ts";
import { projectConfig, request, until } from "./helpers.ts";

/** A bus the set runs on, as each of its users reaches it. */
interface Mesh {
  readonly set: Running;
  /** Connects as the seat (no user), a node or a provider, with the user's own inbox prefix. */
  as(user?: string): Promise<NatsConnection>;
  stop(): Promise<void>;
}

const NEEDS = "mesh-provisioner_needs";
const APPLIED = "mesh-provisioner_applied";
const COLLECT = "mesh-provisioner_collect";
const REGISTRY = "mesh-provisioner_registry";
const FAILING = "mesh-provisioner_failing";
const EVENTS = "mesh-provisioner_events";

const encoder = new TextEncoder();

/** The embedded default's users on a test bus, the set started on it. */
async function onTestBus(): Promise<Mesh> {
  const bus = await startTestBus(await projectConfig());
  const set = await start({ config: bus.config });
  return { set, as: (user) => bus.connect(user), stop: async () => (await set.stop(), await bus.stop()) };
}

/** A nats-server started from what `mesh-provisioner permissions` prints, the set started on it. */
async function onPrintedConf(): Promise<Mesh> {
  const config = await projectConfig();
  const users = authorization(config, await loadFunctions(config), { nodes: ["alder", "birch"], providers: ["keycloak", "postgres"] });
  const dir = mkdtempSync(join(tmpdir(), "mesh-provisioner-isolation-"));
  const passwords: Record<string, string> = {
    "mesh-provisioner": "seat-pw",
    alder: "alder-pw",
    birch: "birch-pw",
    keycloak: "kc-pw",
    postgres: "pg-pw",
  };
  const env = Object.fromEntries(Object.entries(passwords).map(([u, p]) => [`${u.toUpperCase().replace(/[^A-Z0-9]/g, "_")}_PASSWORD`, p]));
  const server = await spawnNatsServer({
    conf: `${toConf(users)}\njetstream { store_dir: ${JSON.stringify(join(dir, "store"))} }`,
    confFile: join(dir, "nats-server.conf"),
    env: { ...process.env, ...env },
  });
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
  const opened: NatsConnection[] = [];
  return {
    set,
    as: async (user = "mesh-provisioner") => {
      const nc = await connect({ servers: server.url, user, pass: passwords[user], inboxPrefix: `_INBOX.${user}` });
      opened.push(nc);
      return nc;
    },
    stop: async () => {
      await Promise.all(opened.map((nc) => nc.close()));
      await set.stop();
      await server.stop();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** The local 3-server cluster `npm run cluster` runs, replicas 3, the set started on it. */
async function onCluster(): Promise<Mesh> {
  const tc = await startTestCluster(await projectConfig());
  const set = await start({ config: tc.config });
  return { set, as: (user) => tc.connect(user), stop: async () => (await set.stop(), await tc.stop()) };
}

/** Waits until the server has handled what `nc` sent: a round trip of a verb, then a little more. */
async function handled(nc: NatsConnection): Promise<void> {
  await nc.flush();
  await request(nc, VERB, { what: "registry", kind: "port" });
  await new Promise((r) => setTimeout(r, 200));
}

function attacks(where: string, open: () => Promise<Mesh>) {
  describe(`isolation ${where}`, () => {
    let mesh: Mesh;
    let seat: NatsConnection;
    let alder: NatsConnection;
    let keycloak: NatsConnection;
    /** The last record of a key as the seat reads it (a delete marker included): its revision and value. */
    const last = async (bucket: string, key: string) => {
      const kv = await seat.jetstream().views.kv(bucket, { bindOnly: true });
      const entry = await kv.get(key);
      return entry === null ? null : { revision: entry.revision, operation: entry.operation, value: entry.string() };
    };
    const events = async () => (await (await seat.jetstreamManager()).streams.info(EVENTS)).state.messages;

    beforeAll(async () => {
      mesh = await open();
      seat = await mesh.as();
      alder = await mesh.as("alder");
      keycloak = await mesh.as("keycloak");
      const birch = await (await mesh.as("birch")).jetstream().views.kv(NEEDS);
      await birch.put("birch.gitea.config.app_name", '"by birch"');
      await (await (await mesh.as("birch")).jetstream().views.kv(APPLIED)).put("birch.gitea", '{"by":"birch"}');
      await (await (await mesh.as("birch")).jetstream().views.kv(COLLECT)).put("birch.routes.gitea", '"by birch"');
    }, 120_000);
    afterAll(() => mesh?.stop(), 60_000);

    it("a direct get's reply aimed at another node's key, or at a provider's event subject, writes nothing", async () => {
      const needs = await alder.jetstream().views.kv(NEEDS);
      await needs.put("alder.x.config.a", '"by alder"');
      await needs.put("alder.x.config.gone", '"soon gone"');
      await needs.delete("alder.x.config.gone");
      const now = new Date().toISOString();
      await needs.put("alder.x.config.event", JSON.stringify({ machine: "birch", consumer: "caddy", word: "forged", at: now }));
      const before = { birch: await last(NEEDS, "birch.gitea.config.app_name"), events: await events() };
      const get = (key: string) => `$JS.API.DIRECT.GET.KV_${NEEDS}.$KV.${NEEDS}.${key}`;
      alder.publish(get("alder.x.config.a"), "", { reply: `$KV.${NEEDS}.birch.gitea.config.app_name` });
      alder.publish(get("alder.x.config.gone"), "", { reply: `$KV.${NEEDS}.birch.gitea.config.app_name` });
      alder.publish(get("alder.x.config.event"), "", { reply: "keycloak.provisioner.failing" });
      alder.publish(get("alder.x.config.event"), "", { reply: "keycloak.provisioner.recovered" });
      await handled(alder);
      expect(await last(NEEDS, "birch.gitea.config.app_name")).toEqual(before.birch);
      expect(await events()).toBe(before.events);
      const status = await request(alder, STATUS, { provider: "keycloak" });
      expect(status.body.failing).toEqual([]);
    });

    it("a stream info's or account info's reply aimed at the registry or the failing bucket writes nothing", async () => {
      const secret = await last(REGISTRY, "secret");
      const stored = await events();
      alder.publish(`$JS.API.STREAM.INFO.KV_${REGISTRY}`, "", { reply: `$KV.${REGISTRY}.secret` });
      alder.publish("$JS.API.INFO", "", { reply: `$KV.${FAILING}.postgres.db.main` });
      keycloak.publish("$JS.API.INFO", "", { reply: `$KV.${FAILING}.postgres.db.main` });
      await handled(alder);
      await handled(keycloak);
      expect(await last(REGISTRY, "secret")).toEqual(secret);
      expect(await last(FAILING, "postgres.db.main")).toBeNull();
      expect(await events()).toBe(stored);
      // Nothing failing nor out of shape (the modules' provisioning is not what this is about).
      expect((await request(alder, STATUS, {})).body).toMatchObject({ failing: [], outOfShape: [] });
    });

    it("a put's acknowledgement aimed at another node's key writes nothing, in needs, applied and collect", async () => {
      const targets = [
        [NEEDS, "alder.y.config.b", "birch.gitea.config.app_name"],
        [APPLIED, "alder.y", "birch.gitea"],
        [COLLECT, "alder.routes.y", "birch.routes.gitea"],
      ] as const;
      const before = await Promise.all(targets.map(([bucket, , theirs]) => last(bucket, theirs)));
      const stored = await events();
      for (const [bucket, mine, theirs] of targets) {
        alder.publish(`$KV.${bucket}.${mine}`, encoder.encode('"by alder"'), { reply: `$KV.${bucket}.${theirs}` });
      }
      await handled(alder);
      expect(await Promise.all(targets.map(([bucket, , theirs]) => last(bucket, theirs)))).toEqual(before);
      expect(await events()).toBe(stored);
      // The puts themselves were made: they were the node's own keys.
      expect((await last(APPLIED, "alder.y"))?.value).toBe('"by alder"');
    });

    it("refuses every consumer a node or provider asks for: durable, ephemeral, or pushing to another subject", async () => {
      const consumers = async (stream: string) => (await (await seat.jetstreamManager()).streams.info(stream)).state.consumer_count;
      const before = { registry: await consumers(`KV_${REGISTRY}`), needs: await consumers(`KV_${NEEDS}`) };
      const asks = [
        [alder, `KV_${REGISTRY}`, { durable_name: "kept-for-ever", ack_policy: AckPolicy.None }],
        [alder, `KV_${REGISTRY}`, { ack_policy: AckPolicy.None, deliver_policy: DeliverPolicy.LastPerSubject, inactive_threshold: 5e9 }],
        [alder, `KV_${REGISTRY}`, { ack_policy: AckPolicy.None, deliver_subject: `$KV.${NEEDS}.birch.gitea.config.app_name` }],
        [keycloak, `KV_${NEEDS}`, { durable_name: "kept-for-ever", ack_policy: AckPolicy.None }],
        [keycloak, `KV_${NEEDS}`, { ack_policy: AckPolicy.None, deliver_subject: "keycloak.provisioner.failing" }],
        [keycloak, `KV_${NEEDS}`, { ack_policy: AckPolicy.None, deliver_subject: STATUS }],
      ] as const;
      for (const [nc, stream, config] of asks) {
        await expect((await nc.jetstreamManager()).consumers.add(stream, config)).rejects.toThrow(/Permissions Violation/);
      }
      expect({ registry: await consumers(`KV_${REGISTRY}`), needs: await consumers(`KV_${NEEDS}`) }).toEqual(before);
    });

    it("keeps every legitimate path: a node's own keys with the standard key-value API, a provider's events, the verbs", async () => {
      // nats.js's standard key-value API: no option beyond the inbox prefix the connection has.
      const needs = await alder.jetstream().views.kv(NEEDS);
      const revision = await needs.put("alder.zsh.shell.zsh/normal", '{"placeholder":"${shell:zsh:normal}"}');
      // Any replica answers a direct get, one that has not applied the put yet among them
      // (docs/buckets.md §2.4): the node reads its key back as a client would, until it is there.
      const read: { value?: string } = {};
      await until(
        async () => {
          const entry = await needs.get("alder.zsh.shell.zsh/normal");
          read.value = entry?.string();
          return entry?.revision === revision;
        },
        5_000,
        "alder's put read back",
      );
      expect(read.value).toBe('{"placeholder":"${shell:zsh:normal}"}');
      const registry = await alder.jetstream().views.kv(REGISTRY);
      expect(JSON.parse((await registry.get("port"))!.string()).module).toBe("mesh-controller");
      expect(JSON.parse((await (await keycloak.jetstream().views.kv(NEEDS)).get("birch.gitea.config.app_name"))!.string())).toBe(
        "by birch",
      );

      const at = new Date().toISOString();
      const ack = await keycloak
        .jetstream()
        .publish("keycloak.provisioner.failing", JSON.stringify({ machine: "alder", consumer: "zsh", word: "real", at }));
      expect(ack.stream).toBe(EVENTS);
      await until(
        async () => (await request(alder, STATUS, { provider: "keycloak" })).body.failing.length === 1,
        15_000,
        "keycloak's failing in status",
      );
      await keycloak
        .jetstream()
        .publish("keycloak.provisioner.recovered", JSON.stringify({ machine: "alder", consumer: "zsh", at: new Date().toISOString() }));
      await until(async () => (await request(keycloak, STATUS, { provider: "keycloak" })).body.well === true, 15_000, "keycloak recovered");

      const answer = await request(alder, VERB, { what: "needs", node: "alder", module: "zsh" });
      expect(answer.body.entries.map((e: { key: string }) => e.key)).toEqual(["alder.zsh.shell.zsh/normal"]);
      expect((await request(keycloak, VERB, { what: "needs", node: "birch" })).body.entries.map((e: { key: string }) => e.key)).toContain(
        "birch.gitea.config.app_name",
      );
      expect((await request(seat, VERB, { what: "registry", kind: "port" })).body.entries).toHaveLength(1);
    });
  });
}

attacks("on the embedded default's users", onTestBus);
attacks("on a server started from the printed configuration", onPrintedConf);
attacks("on the local cluster (npm run cluster)", onCluster);

/** nats.go as Debian packages it, for a node client built the way the mesh's own are. */
const GOPATH = "/usr/share/gocode";
const goThere = existsSync("/usr/bin/go") && existsSync(join(GOPATH, "src/github.com/nats-io/nats.go"));

describe("a Go node client (nats.go's standard key-value API)", () => {
  // CI installs Go and nats.go (.ci/run); elsewhere the test needs `apt-get install golang-go golang-github-nats-io-go-nats-dev`.
  it.runIf(goThere || process.env.CI !== undefined)(
    "opens the needs, writes and reads its own key, reads the registry, writes its presence, asks the verb; never another node's key or presence",
    async () => {
      const dir = mkdtempSync(join(tmpdir(), "mesh-provisioner-go-"));
      const mesh = await onPrintedConf();
      try {
        const binary = join(dir, "nodeclient");
        // Built and run without blocking: the set answering the client runs in this process.
        const run = promisify(execFile);
        await run("go", ["build", "-o", binary, join(import.meta.dirname, "go", "nodeclient.go")], {
          env: { ...process.env, GOPATH, GO111MODULE: "off", GOCACHE: join(dir, "cache"), GOFLAGS: "" },
        });
        await (await (await mesh.as("birch")).jetstream().views.kv(NEEDS)).put("birch.gitea.config.app_name", '"by birch"');
        const seat = await mesh.as();
        const url = seat.getServer().startsWith("nats://") ? seat.getServer() : `nats://${seat.getServer()}`;
        const args = [url, "alder", "alder-pw", "alder.go.config.client", "birch.gitea.config.app_name", "birch"];
        const out = JSON.parse((await run(binary, args, { encoding: "utf8", timeout: 30_000 })).stdout) as Record<
          string,
          string | undefined
        >;
        expect(out.open).toBe("opened");
        expect(out.put).toBe("written");
        expect(out.get).toBe('{"placeholder":"${config:go}"}');
        expect(out.putOther).toMatch(/Permissions Violation|timeout|no responders/i);
        // Its own presence key (docs/presence.md §16.1), never another node's.
        expect(out.presence).toBe("written");
        expect(out.presenceOther).toMatch(/Permissions Violation|timeout|no responders/i);
        expect(JSON.parse(out.registry ?? "null")?.module).toBe("mesh-controller");
        expect(JSON.parse(out.verb ?? "null")?.entries[0].key).toBe("port");
        const kv = await seat.jetstream().views.kv(NEEDS, { bindOnly: true });
        expect((await kv.get("birch.gitea.config.app_name"))?.string()).toBe('"by birch"');
      } finally {
        await mesh.stop();
        rmSync(dir, { recursive: true, force: true });
      }
    },
    180_000,
  );
});

describe("an embedded store of an earlier version, every user in one account", () => {
  it("is read by the seat's account after the upgrade: the buckets keep what was written", async () => {
    const dir = mkdtempSync(join(tmpdir(), "mesh-provisioner-upgrade-"));
    try {
      // As earlier versions ran it: users in the global account, the store in <state>/jetstream.
      const before = await spawnNatsServer({
        conf: { jetstream: { store_dir: join(dir, "jetstream") }, authorization: { users: [{ user: "old", password: "old-pw" }] } },
        confFile: join(dir, "old.conf"),
      });
      const old = await connect({ servers: before.url, user: "old", pass: "old-pw" });
      const kept = await old.jetstream().views.kv(NEEDS, { history: 1 });
      await kept.put("birch.gitea.config.app_name", '"written before the upgrade"');
      await old.close();
      await before.stop();

      const config = await projectConfig();
      const set = await start({ config: { ...config, state: dir, http: { host: "127.0.0.1", port: 0 } } });
      try {
        const birch = await connect({
          servers: set.natsUrl,
          user: "birch",
          pass: (JSON.parse(readFileSync(join(dir, "users.json"), "utf8")) as Record<string, string>).birch,
          inboxPrefix: "_INBOX.birch",
        });
        const answer = await request(birch, VERB, { what: "needs", node: "birch" });
        expect(answer.body.entries.map((e: { key: string; value: unknown }) => [e.key, e.value])).toEqual([
          ["birch.gitea.config.app_name", "written before the upgrade"],
        ]);
        await birch.close();
      } finally {
        await set.stop();
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }, 60_000);
});
