import { describe, expect, it } from "vitest";
import { decodeKey } from "../contract/keys.ts";
import { compileTable, registryTable } from "../functions/_lib/registry.ts";
import { collectKey, needKey } from "../client/index.ts";
import { demoMesh, NODES, STRAY } from "../demo/mesh.ts";
import { projectConfig } from "./helpers.ts";

describe("the demo mesh", () => {
  // The keys each node's client writes through the client library, and its stray ones.
  const records = NODES.flatMap((node) => [
    ...demoMesh(node).flatMap((step) => [
      ...Object.keys(step.declare ?? {}).map((placeholder) => ({ node, bucket: "needs", key: needKey(node, step.module, placeholder) })),
      ...(step.applied === undefined ? [] : [{ node, bucket: "applied", key: `${node}.${step.module}` }]),
      ...(step.contribute ?? []).map(([collection, contributor]) => ({
        node,
        bucket: "collect",
        key: collectKey(node, collection, contributor),
      })),
    ]),
    ...(STRAY[node] ?? []).map(({ key }) => ({ node, bucket: "needs", key })),
  ]);

  it("has 4 nodes, each a user of the embedded server, writing only its own keys", async () => {
    expect(NODES).toEqual((await projectConfig()).embedded.nodes);
    for (const { node, key } of records) expect(key.startsWith(`${node}.`)).toBe(true);
  });

  it("needs every kind the registry answers, from at least 12 modules", async () => {
    const kinds = new Set<string>();
    const modules = new Set<string>();
    for (const { key } of records.filter((r) => r.bucket === "needs")) {
      const decoded = decodeKey("needs", key);
      if (!decoded.ok) continue;
      kinds.add(decoded.fields.kind);
      modules.add(decoded.fields.module);
    }
    const answered = [...compileTable(registryTable.parse((await projectConfig()).registry)).keys()];
    // And one kind no domain answers, to show Unanswerable (docs/state.md §7.4).
    expect([...kinds].sort()).toEqual([...answered, "wormhole"].sort());
    expect(modules.size).toBeGreaterThanOrEqual(12);
  });

  it("holds the collections of the issue by name, and one needs key out of shape", () => {
    const collections = new Set(
      records
        .filter((r) => r.bucket === "collect")
        .map((r) => {
          const decoded = decodeKey("collect", r.key);
          return decoded.ok ? decoded.fields.collection : "out of shape";
        }),
    );
    expect(collections).toEqual(
      new Set(["shell:zsh:normal", "environment:posix", "contribution:node-hotkeys:triggers", "routes", "ssh-keys", "scrape-targets"]),
    );
    const stray = records.filter((r) => r.bucket === "needs" && !decodeKey("needs", r.key).ok).map((r) => r.key);
    expect(stray).toEqual(["dogwood.grafana.config"]);
  });
});
