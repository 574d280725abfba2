import { execFileSync } from "node:child_process";
import { readdirSync, readFileSync, statSync } from "node:fs";
import { join, relative } from "node:path";
import { cruise, type ICruiseResult } from "dependency-cruiser";
import { describe, expect, it } from "vitest";
import { ROOT, SHIPPED_DIR, SHIPPED_FUNCTIONS } from "./helpers.ts";

/** The runtime's import graph, type-only imports included: file → the runtime files it imports. */
async function runtimeImports(): Promise<Map<string, string[]>> {
  const { output } = await cruise(["runtime"], { tsPreCompilationDeps: true, baseDir: ROOT, doNotFollow: { path: "node_modules" } });
  const graph = new Map<string, string[]>();
  for (const module of (output as ICruiseResult).modules) {
    if (!module.source.startsWith("runtime/")) continue;
    graph.set(
      module.source,
      module.dependencies.map((d) => d.resolved).filter((r) => r.startsWith("runtime/")),
    );
  }
  return graph;
}

/** The longest chain of imports from any file of `graph`, as the files it passes (the graph has no cycle). */
function longestChain(graph: Map<string, string[]>): string[] {
  const memo = new Map<string, string[]>();
  const from = (file: string): string[] => {
    const known = memo.get(file);
    if (known !== undefined) return known;
    const chain = [file, ...(graph.get(file) ?? []).map(from).reduce<string[]>((a, b) => (b.length > a.length ? b : a), [])];
    memo.set(file, chain);
    return chain;
  };
  return [...graph.keys()].map(from).reduce<string[]>((a, b) => (b.length > a.length ? b : a), []);
}

describe("the runtime's layers (docs/runtime.md §6.10)", () => {
  it("keep every import chain inside runtime/ at 10 files or fewer", async () => {
    const chain = longestChain(await runtimeImports());
    expect(chain.length, chain.join(" → ")).toBeLessThanOrEqual(10);
  });

  it("keep the trigger kinds in their own files, listed once", async () => {
    const graph = await runtimeImports();
    const kinds = readdirSync(join(ROOT, "runtime", "triggers"))
      .filter((f) => f.endsWith(".ts") && f !== "kind.ts" && f !== "index.ts")
      .map((f) => `runtime/triggers/${f}`);
    expect(kinds.length).toBeGreaterThanOrEqual(4);
    const importers = (file: string) => [...graph].filter(([, deps]) => deps.includes(file)).map(([from]) => from);
    for (const kind of kinds) expect(importers(kind)).toEqual(["runtime/triggers/index.ts"]);
  });
});

/** Every source file of the project outside node_modules and local state. */
function sources(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    if (["node_modules", ".state", ".git", "docs"].includes(name)) return [];
    if (statSync(path).isDirectory()) return sources(path);
    return /\.(ts|mjs|cjs)$/.test(name) ? [path] : [];
  });
}

/** The headings of docs/<file>: their section numbers (`§4.2`). */
function sections(file: string): Set<string> {
  const text = readFileSync(join(ROOT, "docs", file), "utf8");
  return new Set([...text.matchAll(/^#+ §(\d+(?:\.\d+)*)\b/gm)].map((m) => m[1]!));
}

describe("citations of docs/ in the code", () => {
  it("resolve each to a heading of the file it names, and none cites anything else", () => {
    const unresolved: string[] = [];
    const bare: string[] = [];
    for (const file of sources(ROOT)) {
      readFileSync(file, "utf8")
        .split("\n")
        .forEach((line, i) => {
          const at = `${relative(ROOT, file)}:${i + 1}`;
          for (const m of line.matchAll(/docs\/([a-z-]+\.md) ((?:§\d+(?:\.\d+)*(?:, )?)+)/g)) {
            let known: Set<string>;
            try {
              known = sections(m[1]!);
            } catch {
              unresolved.push(`${at}: docs/${m[1]} does not exist`);
              continue;
            }
            for (const cited of m[2]!
              .split(", ")
              .map((s) => s.replace("§", "").trim())
              .filter(Boolean)) {
              if (!known.has(cited)) unresolved.push(`${at}: docs/${m[1]} has no heading §${cited}`);
            }
          }
          // A § that no `docs/<file>.md` names is a citation a reader cannot follow.
          const rest = line.replace(/docs\/[a-z-]+\.md (?:§\d+(?:\.\d+)*(?:, )?)+/g, "");
          if (/§\d/.test(rest) && !file.endsWith("architecture.unit.test.ts")) bare.push(`${at}: ${line.trim()}`);
        });
    }
    expect(unresolved).toEqual([]);
    expect(bare).toEqual([]);
  });
});

describe("the shipped functions", () => {
  it("are the function files the project tracks, and the tests' folder of them holds them alone", () => {
    const tracked = execFileSync("git", ["ls-files", "functions"], { cwd: ROOT, encoding: "utf8" })
      .split("\n")
      .filter((file) => /^functions\/[^/_][^/]*\.ts$/.test(file))
      .map((file) => file.slice("functions/".length, -".ts".length));
    expect(tracked).toEqual([...SHIPPED_FUNCTIONS]);
    expect(readdirSync(SHIPPED_DIR).sort()).toEqual([...SHIPPED_FUNCTIONS.map((f) => `${f}.ts`), "_lib"].sort());
  });
});

describe("the wire contract and the client (docs/runtime.md §6.10)", () => {
  it("the contract imports zod and itself alone", async () => {
    const { output } = await cruise(["contract"], { tsPreCompilationDeps: true, baseDir: ROOT, doNotFollow: { path: "node_modules" } });
    const imports = (output as ICruiseResult).modules
      .filter((m) => m.source.startsWith("contract/"))
      .flatMap((m) => m.dependencies.map((d) => (d.resolved.startsWith("contract/") ? "contract/" : d.module)));
    expect(new Set(imports)).toEqual(new Set(["contract/", "zod/mini"]));
  });

  it("bundles a node's client without the server: nats apart, under 100 KB", async () => {
    const { build } = await import("esbuild");
    const result = await build({
      entryPoints: [join(ROOT, "client", "index.ts")],
      bundle: true,
      platform: "node",
      format: "esm",
      minify: true,
      write: false,
      metafile: true,
      external: ["nats"],
      logLevel: "silent",
    });
    const inputs = Object.entries(Object.values(result.metafile.outputs)[0]!.inputs);
    const sources = new Set(inputs.map(([file]) => /^node_modules\/((?:@[^/]+\/)?[^/]+)/.exec(file)?.[1] ?? file.split("/")[0]!));
    expect([...sources].sort()).toEqual(["client", "contract", "is-network-error", "p-retry", "retry", "zod"]);
    const bytes = (keep: (file: string) => boolean) => inputs.filter(([file]) => keep(file)).reduce((n, [, v]) => n + v.bytesInOutput, 0);
    const withoutZod = bytes((file) => !file.startsWith("node_modules/zod/"));
    console.log(`client bundle, minified: ${bytes(() => true)} B without nats; ${withoutZod} B without nats and zod`);
    expect(bytes(() => true)).toBeLessThan(100 * 1024);
  });
});
