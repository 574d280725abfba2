import type { KV, NatsConnection } from "nats";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Running } from "../runtime/index.ts";
import type { TestBus } from "../runtime/testing.ts";
import { request, startSet, testBus } from "./helpers.ts";

const VERB = "mesh-provisioner.provisioning";

/** What the node clients of this test write: node → bucket → key → raw value. */
const WRITES: Record<string, Record<string, Record<string, string>>> = {
  alder: {
    needs: {
      "alder.gitea.config.db_url": '{"placeholder":"${config:db_url}"}',
      "alder.gitea.secret.admin_password": '{"placeholder":"${secret:admin_password}"}',
      "alder.gitea.bound.postgres/address": '{"placeholder":"${bound:postgres:address}"}',
      "alder.postgres.port.postgres": '{"placeholder":"${port:postgres}"}',
      "alder.gitea": '{"stray":true}',
      "alder.gitea.config.db.url": '{"stray":true}',
      "alder.gitea.config.not_json": "not json{",
      "alder.postgres.config": '{"stray":true}',
    },
    applied: { "alder.gitea": '{"at":"2026-11-29T08:00:00Z"}', "alder.postgres": '{"at":"2026-11-29T08:01:00Z"}' },
    collect: {
      "alder.shell=3Azsh=3Anormal.docker": '{"lines":["alias dps=docker ps"]}',
      "alder.shell=3Azsh=3Anormal.gitea": '{"lines":["alias g=gitea"]}',
      "alder.environment=3Aposix.docker": '{"vars":{"DOCKER_BUILDKIT":"1"}}',
      "alder.shell=3.docker": '{"bad":"escape"}',
      "alder.shell=3Azsh": '{"too":"short"}',
    },
  },
  birch: {
    needs: {
      "birch.gitea.config.db_url": '{"placeholder":"${config:db_url}"}',
      "birch.caddy.collected.routes": '{"placeholder":"${collected:routes}"}',
    },
    applied: { "birch.caddy": '{"at":"2026-11-29T09:00:00Z"}', "birch.caddy.extra": '{"stray":true}' },
    collect: {
      "birch.shell=3Azsh=3Anormal.docker": '{"lines":["alias dps=docker ps"]}',
      "birch.contribution=3Anode-hotkeys=3Atriggers.grafana": '{"triggers":[{"key":"F10"}]}',
    },
  },
};

let bus: TestBus;
let set: Running;
let client: NatsConnection;
const kvs: Record<string, KV> = {};

beforeAll(async () => {
  bus = await testBus();
  set = await startSet(bus);
  client = await bus.connect("cedar");
  for (const [node, buckets] of Object.entries(WRITES)) {
    for (const [bucket, keys] of Object.entries(buckets)) {
      const kv = (kvs[`${node}/${bucket}`] ??= await bus.kv(bucket, node));
      for (const [key, value] of Object.entries(keys)) await kv.put(key, value);
    }
  }
});
afterAll(async () => {
  await set.stop();
  await bus.stop();
});

const ask = (payload: unknown) => request(client, VERB, payload);
const keysOf = (body: { entries: { key: string }[] }) => body.entries.map((e) => e.key);
const outOf = (body: { outOfShape: { key: string; reason: string }[] }) =>
  Object.fromEntries(body.outOfShape.map((o) => [o.key, o.reason]));

describe("views and narrowings", () => {
  it("answers the registry by default, in key order, narrowed by kind", async () => {
    const all = await ask(new Uint8Array());
    expect(all.body.what).toBe("registry");
    expect(keysOf(all.body)).toEqual([
      "access",
      "bound",
      "collected",
      "config",
      "consumers",
      "contribution",
      "dir",
      "environment",
      "machine",
      "port",
      "seat",
      "secret",
      "shell",
    ]);
    const secret = await ask({ kind: "secret" });
    expect(secret.body.entries).toEqual([
      {
        key: "secret",
        kind: "secret",
        value: { kind: "secret", module: "mesh-vault", verb: "mesh-vault.secret" },
        revision: expect.any(Number),
        at: expect.stringMatching(/^\d{4}-\d\d-\d\dT/),
      },
    ]);
    expect(secret.body.next).toBeUndefined();
  });

  it("answers all needs in key order, each key an entry or out of shape", async () => {
    const { body } = await ask({ what: "needs" });
    expect(keysOf(body)).toEqual([
      "alder.gitea.bound.postgres/address",
      "alder.gitea.config.db_url",
      "alder.gitea.secret.admin_password",
      "alder.postgres.port.postgres",
      "birch.caddy.collected.routes",
      "birch.gitea.config.db_url",
    ]);
    expect(outOf(body)).toEqual({
      "alder.gitea": "needs keys have 4 tokens, this has 2",
      "alder.gitea.config.db.url": "needs keys have 4 tokens, this has 5",
      "alder.gitea.config.not_json": expect.stringMatching(/^value is not JSON: /),
      "alder.postgres.config": "needs keys have 4 tokens, this has 3",
    });
    expect(body.entries[1]).toEqual({
      key: "alder.gitea.config.db_url",
      node: "alder",
      module: "gitea",
      kind: "config",
      name: "db_url",
      value: { placeholder: "${config:db_url}" },
      revision: expect.any(Number),
      at: expect.stringMatching(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/),
    });
  });

  it("narrows needs by node, module, kind and their combinations", async () => {
    const cases: [Record<string, string>, string[], string[]][] = [
      [{ node: "birch" }, ["birch.caddy.collected.routes", "birch.gitea.config.db_url"], []],
      [
        { node: "alder", module: "gitea" },
        ["alder.gitea.bound.postgres/address", "alder.gitea.config.db_url", "alder.gitea.secret.admin_password"],
        ["alder.gitea", "alder.gitea.config.db.url", "alder.gitea.config.not_json"],
      ],
      [
        { kind: "config" },
        ["alder.gitea.config.db_url", "birch.gitea.config.db_url"],
        ["alder.gitea.config.db.url", "alder.gitea.config.not_json", "alder.postgres.config"],
      ],
      [{ node: "alder", kind: "port" }, ["alder.postgres.port.postgres"], []],
      [
        { module: "gitea" },
        [
          "alder.gitea.bound.postgres/address",
          "alder.gitea.config.db_url",
          "alder.gitea.secret.admin_password",
          "birch.gitea.config.db_url",
        ],
        ["alder.gitea", "alder.gitea.config.db.url", "alder.gitea.config.not_json"],
      ],
      [{ node: "birch", module: "gitea", kind: "config" }, ["birch.gitea.config.db_url"], []],
      // a key with a token too few is reached by the narrowing that names all it has
      [{ node: "alder", module: "postgres", kind: "config" }, [], ["alder.postgres.config"]],
      [{ node: "cedar" }, [], []],
    ];
    for (const [narrowing, entries, outOfShape] of cases) {
      const { body } = await ask({ what: "needs", ...narrowing });
      expect({ narrowing, entries: keysOf(body), outOfShape: body.outOfShape.map((o: { key: string }) => o.key) }).toEqual({
        narrowing,
        entries,
        outOfShape,
      });
    }
  });

  it("answers applied, narrowed by node and module", async () => {
    const all = await ask({ what: "applied" });
    expect(keysOf(all.body)).toEqual(["alder.gitea", "alder.postgres", "birch.caddy"]);
    expect(outOf(all.body)).toEqual({ "birch.caddy.extra": "applied keys have 2 tokens, this has 3" });
    const caddy = await ask({ what: "applied", node: "birch", module: "caddy" });
    expect(keysOf(caddy.body)).toEqual(["birch.caddy"]);
    expect(outOf(caddy.body)).toEqual({ "birch.caddy.extra": "applied keys have 2 tokens, this has 3" });
    const one = await ask({ what: "applied", node: "alder", module: "postgres" });
    expect(one.body.entries).toEqual([
      expect.objectContaining({ key: "alder.postgres", node: "alder", module: "postgres", value: { at: "2026-11-29T08:01:00Z" } }),
    ]);
  });

  it("asks and answers collections by name, never by their encoded form", async () => {
    const shell = await ask({ what: "collect", collection: "shell:zsh:normal" });
    expect(shell.body.entries.map((e: Record<string, string>) => [e.node, e.collection, e.contributor])).toEqual([
      ["alder", "shell:zsh:normal", "docker"],
      ["alder", "shell:zsh:normal", "gitea"],
      ["birch", "shell:zsh:normal", "docker"],
    ]);
    const encoded = await ask({ what: "collect", collection: "shell=3Azsh=3Anormal" });
    expect(encoded.body.entries).toEqual([]);
    const hotkeys = await ask({ what: "collect", collection: "contribution:node-hotkeys:triggers", contributor: "grafana" });
    expect(hotkeys.body.entries).toEqual([
      expect.objectContaining({
        key: "birch.contribution=3Anode-hotkeys=3Atriggers.grafana",
        collection: "contribution:node-hotkeys:triggers",
        value: { triggers: [{ key: "F10" }] },
      }),
    ]);
    const exact = await ask({ what: "collect", node: "alder", collection: "environment:posix", contributor: "docker" });
    expect(keysOf(exact.body)).toEqual(["alder.environment=3Aposix.docker"]);
  });

  it("says a bad = escape and a short collect key out of shape", async () => {
    const { body } = await ask({ what: "collect", node: "alder" });
    expect(keysOf(body)).toEqual([
      "alder.environment=3Aposix.docker",
      "alder.shell=3Azsh=3Anormal.docker",
      "alder.shell=3Azsh=3Anormal.gitea",
    ]);
    expect(outOf(body)).toEqual({
      "alder.shell=3.docker": 'token 2 (collection): bad = escape at offset 5: "=3" is not = and two upper-case hex digits',
      "alder.shell=3Azsh": "collect keys have 3 tokens, this has 2",
    });
  });
});

describe("refusals", () => {
  const refusals: [string, unknown, string][] = [
    ["a payload that is not JSON", new TextEncoder().encode("{what: needs"), "payload is not JSON"],
    ["a payload that is not an object", ["needs"], "expected object, received array"],
    ["an unknown what", { what: "secrets" }, "what: Invalid option"],
    ["an unknown field", { what: "needs", nod: "alder" }, "nod: unknown field"],
    ["a field that does not apply", { what: "applied", kind: "config" }, "kind: does not apply to what=applied"],
    ["collection on needs", { what: "needs", collection: "shell:zsh:normal" }, "collection: does not apply to what=needs"],
    ["node *", { what: "needs", node: "*" }, "node: must be one token"],
    ["node >", { what: "needs", node: ">" }, "node: must be one token"],
    ["node n1.>", { what: "needs", node: "n1.>" }, "node: must be one token"],
    ["node 'a b'", { what: "needs", node: "a b" }, "node: must be one token"],
    ['node ""', { what: "needs", node: "" }, "node: must be one token"],
    ["module with a dot", { what: "needs", module: "gitea.config" }, "module: must be one token"],
    ["an empty collection", { what: "collect", collection: "" }, "collection: must be a non-empty collection name"],
    ["a limit of 0", { what: "needs", limit: 0 }, "limit:"],
    ["a cursor not issued here", { what: "needs", cursor: "bm90IGEgY3Vyc29y" }, "cursor: not a cursor of this verb"],
    ["a node of 257 characters", { what: "needs", node: "a".repeat(257) }, "node: must be at most 256 characters"],
    ["a stale that is not true or false", { what: "needs", stale: "maybe" }, "stale: must be true or false"],
    [
      "a collection whose key token would be too long",
      { what: "collect", collection: "é".repeat(200) },
      "collection: is too long: its key token may be at most 1024 characters",
    ],
  ];
  for (const [what, payload, message] of refusals) {
    it(`refuses ${what} with a 400 naming the field, and answers the next request`, async () => {
      const refused = await ask(payload);
      expect(refused.errorCode).toBe(400);
      expect(refused.errorText).toContain(message);
      expect(refused.body).toEqual({ error: { code: 400, message: expect.stringContaining(message) } });
      const next = await ask({ what: "applied", node: "alder", module: "gitea" });
      expect(next.errorCode).toBeUndefined();
      expect(keysOf(next.body)).toEqual(["alder.gitea"]);
    });
  }

  it("answers the longest narrowing it takes", async () => {
    const longest = await ask({ what: "collect", node: "a".repeat(256), collection: "é".repeat(170), contributor: "c".repeat(256) });
    expect(longest.errorCode).toBeUndefined();
    expect(longest.body.entries).toEqual([]);
  });

  it("cuts a refusal's message so the refusal always fits in a reply", async () => {
    const refused = await ask({ ["x".repeat(700_000)]: 1 });
    expect(refused.errorCode).toBe(400);
    expect(refused.errorText).toHaveLength(1024);
    expect(refused.errorText).toMatch(/^x+…$/);
    expect(refused.body).toEqual({ error: { code: 400, message: refused.errorText } });
    expect((await ask({ what: "applied", node: "alder", module: "gitea" })).errorCode).toBeUndefined();
  });

  it("refuses a cursor issued for another narrowing", async () => {
    const first = await ask({ what: "needs", node: "alder", limit: 1 });
    expect(first.body.next).toEqual(expect.any(String));
    const other = await ask({ what: "needs", node: "birch", cursor: first.body.next });
    expect(other.errorCode).toBe(400);
    expect(other.errorText).toBe("cursor: was issued for another what or narrowing; ask with the same ones");
  });
});

describe("paging, HTTP and freshness", () => {
  it("pages with limit and cursor, listing each key once, in key order across pages", async () => {
    const pages: string[][] = [];
    let cursor: string | undefined;
    do {
      const { body } = await ask({ what: "needs", node: "alder", limit: 2, ...(cursor ? { cursor } : {}) });
      pages.push([...body.entries, ...body.outOfShape].map((item: { key: string }) => item.key).sort());
      cursor = body.next;
    } while (cursor !== undefined);
    expect(pages).toEqual([
      ["alder.gitea", "alder.gitea.bound.postgres/address"],
      ["alder.gitea.config.db.url", "alder.gitea.config.db_url"],
      ["alder.gitea.config.not_json", "alder.gitea.secret.admin_password"],
      ["alder.postgres.config", "alder.postgres.port.postgres"],
    ]);
  });

  it("gives over HTTP the same answer as the verb for the same narrowing", async () => {
    const narrowings = [
      {},
      { what: "needs" },
      { what: "needs", node: "alder", kind: "config" },
      { what: "applied", node: "birch" },
      { what: "collect", collection: "shell:zsh:normal", node: "alder" },
      { what: "needs", node: "alder", limit: "2" },
    ];
    for (const narrowing of narrowings) {
      const query = new URLSearchParams(narrowing as Record<string, string>);
      const response = await fetch(`${set.httpUrl}/provisioning?${query}`);
      expect(response.status).toBe(200);
      expect(await response.json()).toEqual((await ask({ ...narrowing, ...("limit" in narrowing ? { limit: 2 } : {}) })).body);
    }
  });

  it("refuses bad input over HTTP with a 400 and the same body", async () => {
    const response = await fetch(`${set.httpUrl}/provisioning?what=needs&node=${encodeURIComponent("n1.>")}`);
    expect(response.status).toBe(400);
    expect(await response.json()).toEqual({ error: { code: 400, message: expect.stringContaining("node: must be one token") } });
    // A parameter given twice is said so, whichever: never as a value of another type.
    const twiceSaid = "must be one value, not a list (a query parameter given more than once)";
    for (const [path, field] of [
      ["/provisioning?what=needs&node=alder&node=birch", "node"],
      ["/provisioning?what=needs&what=needs", "what"],
      ["/provisioning?what=needs&limit=5&limit=5", "limit"],
      ["/status?provider=keycloak&provider=keycloak", "provider"],
      ["/page.json?node=alder&node=alder", "node"],
    ]) {
      const twice = await fetch(`${set.httpUrl}${path}`);
      expect([path, twice.status, ((await twice.json()) as { error: { message: string } }).error.message]).toEqual([
        path,
        400,
        `${field}: ${twiceSaid}`,
      ]);
    }
    const missing = await fetch(`${set.httpUrl}/nowhere`);
    expect(missing.status).toBe(404);
    expect(await missing.json()).toEqual({ error: { code: 404, message: "no function at GET /nowhere" } });
  });

  it("answers every write acknowledged before the request, and forgets a deleted key", async () => {
    const kv = kvs["birch/needs"]!;
    for (let i = 0; i < 100; i++) {
      const key = `birch.fresh.config.k${i}`;
      await kv.put(key, JSON.stringify({ i }));
      const after = await ask({ what: "needs", node: "birch", module: "fresh" });
      expect(keysOf(after.body)).toContain(key);
      await kv.delete(key);
      const gone = await ask({ what: "needs", node: "birch", module: "fresh" });
      expect(keysOf(gone.body)).not.toContain(key);
    }
  });
});

describe("values", () => {
  it("come back exactly as the node wrote them, numbers past double precision included", async () => {
    const written = '{"big": 123456789012345678901234567890, "tiny": 1e-400, "neg": -0, "same": "é\\u00e9"}';
    await kvs["birch/needs"]!.put("birch.exact.config.value", written);
    const reply = await client.request(VERB, JSON.stringify({ what: "needs", node: "birch", module: "exact" }));
    const text = new TextDecoder().decode(reply.data);
    expect(text).toContain(`"value":${written},"revision":`);
    expect(JSON.parse(text).entries[0].value).toEqual({ big: 123456789012345678901234567890, tiny: 0, neg: -0, same: "éé" });
  });
});
