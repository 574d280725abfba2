import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { compileRegistry, compileTable, registryTable } from "../functions/_lib/registry.ts";
import { formatIssues, LoadError, type WriteBucket } from "../runtime/index.ts";
import { writeBucket } from "../runtime/buckets.ts";
import type { TestBus } from "../runtime/testing.ts";
import { join, relative } from "node:path";
import { projectConfig, ROOT, SHIPPED_DIR, startSet, testBus } from "./helpers.ts";

const collect = { module: "mesh-provisioner", bucket: "mesh-provisioner_collect", key: "<node>.<collection>.<contributor>" };
const assignments = { module: "mesh-controller", bucket: "mesh-controller_assignments", key: "<node>.<module>" };

/** The 13 values of docs/registry.md §3, as the default table must compile them. */
const SPEC_VALUES = {
  access: { kind: "access", ...assignments },
  bound: {
    kind: "bound",
    module: "<provider-module>",
    bucket: "<provider-module>_bound",
    key: "<node>.<module>.<provision>[.<local>]",
  },
  collected: { kind: "collected", ...collect, collection: "<name>" },
  config: { kind: "config", module: "mesh-config", bucket: "mesh-config_values", key: "<node>.<module>.<name>" },
  consumers: { kind: "consumers", module: "mesh-vault", verb: "mesh-vault.consumers" },
  contribution: { kind: "contribution", ...collect, collection: "contribution:<name>" },
  dir: { kind: "dir", ...assignments },
  environment: { kind: "environment", ...collect, collection: "environment:<name>" },
  machine: { kind: "machine", ...assignments },
  port: { kind: "port", ...assignments },
  seat: { kind: "seat", ...assignments },
  secret: { kind: "secret", module: "mesh-vault", verb: "mesh-vault.secret" },
  shell: { kind: "shell", ...collect, collection: "shell:<name>" },
};

const defaultTable = async () => registryTable.parse((await projectConfig()).registry);

describe("the registry table (docs/registry.md §3)", () => {
  it("compiles the default table into the 13 kinds of the spec", async () => {
    expect(Object.fromEntries(compileTable(await defaultTable()))).toEqual(SPEC_VALUES);
  });

  const refusal = (table: unknown) => {
    const parsed = registryTable.safeParse(table);
    return parsed.success ? "accepted" : formatIssues(parsed.error.issues);
  };

  it("refuses a secret or a consumer credential in a bucket", () => {
    expect(refusal([{ kinds: ["secret"], module: "mesh-vault", bucket: "b", key: "<node>" }])).toBe(
      "0.bucket: a secret is never in a bucket: answer kind secret with a verb (docs/registry.md §3.3)",
    );
    expect(refusal([{ kinds: ["port", "consumers"], module: "m", bucket: "b", key: "k" }])).toBe(
      "0.bucket: a consumers is never in a bucket: answer kind consumers with a verb (docs/registry.md §3.3)",
    );
  });

  it("refuses a kind answered twice, a row with both or neither place, a bucket without key", () => {
    expect(
      refusal([
        { kinds: ["dir"], module: "a", verb: "a.b" },
        { kinds: ["port", "dir"], module: "b", verb: "b.c" },
      ]),
    ).toBe("1.kinds.1: kind dir is answered twice (also by row 0)");
    expect(refusal([{ kinds: ["dir"], module: "a", verb: "a.b", bucket: "x", key: "k" }])).toContain(
      "needs exactly one of bucket (with key) or verb",
    );
    expect(refusal([{ kinds: ["dir"], module: "a" }])).toContain("needs exactly one of bucket (with key) or verb");
    expect(refusal([{ kinds: ["dir"], module: "a", bucket: "x" }])).toBe("0.key: a bucket needs its key shape");
    expect(refusal([{ kinds: ["a.b"], module: "a", verb: "a.b" }])).toContain("0.kinds.0: must be one token");
  });
});

describe("compiling into the registry bucket", () => {
  let bus: TestBus;
  let registry: WriteBucket;
  beforeAll(async () => {
    bus = await testBus();
    const set = await startSet(bus); // asserts the buckets and compiles once at start
    await set.stop();
    registry = writeBucket(await bus.kv("registry"), (await bus.connect()).jetstream(), "mesh-provisioner_registry");
  });
  afterAll(() => bus.stop());

  const stored = async () =>
    Object.fromEntries(
      (await registry.list(">")).map((e) => [e.key, { value: JSON.parse(new TextDecoder().decode(e.value)), revision: e.revision }]),
    );

  it("holds the 13 kinds with the right values after start", async () => {
    const values = Object.fromEntries(Object.entries(await stored()).map(([k, v]) => [k, v.value]));
    expect(values).toEqual(SPEC_VALUES);
  });

  it("changes no revision when compiled again", async () => {
    const before = await stored();
    expect(await compileRegistry(await defaultTable(), registry)).toEqual({ written: [], deleted: [], unchanged: 13 });
    expect(await stored()).toEqual(before);
  });

  it("deletes a kind put in by hand, rewrites a kind edited by hand, and touches nothing else", async () => {
    await registry.put("telepathy", JSON.stringify({ kind: "telepathy", module: "x", verb: "x.y" }));
    const edited = await registry.put("port", JSON.stringify({ kind: "port", module: "someone-else", verb: "x.y" }));
    const before = await stored();
    expect(await compileRegistry(await defaultTable(), registry)).toEqual({
      written: ["port"],
      deleted: ["telepathy"],
      unchanged: 12,
    });
    const after = await stored();
    expect(after.telepathy).toBeUndefined();
    expect(after.port!.value).toEqual(SPEC_VALUES.port);
    expect(after.port!.revision).toBeGreaterThan(edited);
    expect(after.dir).toEqual(before.dir);
  });

  it("converges when two replicas compile at once", async () => {
    for (const key of ["dir", "seat", "secret"]) await registry.delete(key);
    await registry.put("shell", JSON.stringify({ kind: "shell", module: "stale", verb: "a.b" }));
    await registry.put("stray", JSON.stringify({ kind: "stray", module: "x", verb: "x.y" }));
    const table = await defaultTable();
    const [a, b] = await Promise.all([compileRegistry(table, registry), compileRegistry(table, registry)]);
    // Each change is made by exactly one of the two; the other finds it done.
    expect([...a.written, ...b.written].sort()).toEqual(["dir", "seat", "secret", "shell"]);
    expect([...a.deleted, ...b.deleted]).toEqual(["stray"]);
    const values = Object.fromEntries(Object.entries(await stored()).map(([k, v]) => [k, v.value]));
    expect(values).toEqual(SPEC_VALUES);
    expect(await compileRegistry(table, registry)).toEqual({ written: [], deleted: [], unchanged: 13 });
  });

  it("refuses to start with a table that puts a secret in a bucket, naming the field", async () => {
    const config = await projectConfig();
    const registryRows = [
      ...(config.registry as object[]).slice(0, 1),
      { kinds: ["secret"], module: "mesh-vault", bucket: "mesh-vault_secrets", key: "<node>.<name>" },
    ];
    const failure = await startSet(bus, { registry: registryRows } as object).catch((e: unknown) => e);
    expect(failure).toBeInstanceOf(LoadError);
    expect((failure as LoadError).problems).toEqual([
      `wrangler-free.config.ts: registry.1.bucket: a secret is never in a bucket: answer kind secret with a verb (docs/registry.md §3.3) (read by ${relative(ROOT, join(SHIPPED_DIR, "registry-compile.ts"))})`,
    ]);
  });
});
