import { execFile, execFileSync } from "node:child_process";
import { promisify } from "node:util";
import { mkdtempSync, readdirSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { NatsConnection } from "nats";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Running } from "../runtime/index.ts";
import type { TestBus } from "../runtime/testing.ts";
import { request, ROOT, startSet, testBus, until } from "./helpers.ts";

// docs/client.md §9.4: the project packed as npm packs it, installed into a new project with
// nothing but it, and its client used there with plain node, as a node's client and a provider.
let bus: TestBus;
let set: Running;
let seat: NatsConnection;
let dir: string;
let app: string;

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), "mesh-provisioner-package-"));
  // `npm pack` runs `prepack`: the client built into dist-client/.
  const packed = JSON.parse(execFileSync("npm", ["pack", "--json", "--pack-destination", dir], { cwd: ROOT, encoding: "utf8" })) as {
    filename: string;
    size: number;
  }[];
  const tarball = join(dir, packed[0]!.filename);
  console.log(`packed ${packed[0]!.filename}: ${statSync(tarball).size} bytes`);
  app = join(dir, "app");
  execFileSync("mkdir", ["-p", app]);
  writeFileSync(join(app, "package.json"), JSON.stringify({ name: "app", private: true, type: "module" }));
  // From npm's cache where it has the libraries (`npm ci` filled it), else from the registry.
  execFileSync("npm", ["install", "--no-audit", "--no-fund", "--prefer-offline", tarball], { cwd: app, stdio: "ignore" });
  bus = await testBus();
  set = await startSet(bus);
  seat = await bus.connect();
}, 240_000);
afterAll(async () => {
  await set?.stop();
  await bus?.stop();
  if (dir !== undefined) rmSync(dir, { recursive: true, force: true });
});

describe("the client package (docs/client.md §9.4)", () => {
  it("installs with its own dependencies only, and its client runs as a node and a provider with plain node", async () => {
    expect(readdirSync(join(app, "node_modules", "mesh-provisioner", "dist-client")).sort()).toEqual(["index.js", "index.js.map", "types"]);
    writeFileSync(
      join(app, "main.js"),
      `import { connectNode, connectProvider, ClientArgumentError } from "mesh-provisioner/client";
const env = process.env;
const alder = await connectNode({ servers: env.NATS_URL, node: "alder", credentials: { password: env.ALDER_PASSWORD } });
await alder.declare("gitea", { "\${config:db_url}": { file: "/etc/gitea/app.ini" } });
await alder.applied("gitea", {});
let refused = "";
try { await alder.declare("gitea", "not needs"); } catch (err) { refused = err instanceof ClientArgumentError ? "ClientArgumentError" : String(err); }
const keycloak = await connectProvider({ servers: env.NATS_URL, provider: "keycloak", credentials: { password: env.KEYCLOAK_PASSWORD } });
await keycloak.failing("alder", "gitea", "invalid_client");
await alder.close();
await keycloak.close();
console.log(JSON.stringify({ refused }));
`,
    );
    // Not execFileSync: the set answering it runs in this process.
    const { stdout: out } = await promisify(execFile)(process.execPath, ["main.js"], {
      cwd: app,
      encoding: "utf8",
      env: {
        PATH: process.env.PATH,
        NATS_URL: bus.url,
        ALDER_PASSWORD: bus.server.users.alder!.password,
        KEYCLOAK_PASSWORD: bus.server.users.keycloak!.password,
      },
    });
    expect(JSON.parse(out)).toEqual({ refused: "ClientArgumentError" });
    const needs = (await request(seat, "mesh-provisioner.provisioning", { what: "needs", node: "alder", module: "gitea" })).body;
    expect(needs.entries.map((e: { key: string }) => e.key)).toEqual(["alder.gitea.config.db_url"]);
    await until(async () => (await request(seat, "mesh-provisioner.status", { machine: "alder" })).body.failing.length === 1);
  });

  it("gives its types to a TypeScript project", () => {
    writeFileSync(
      join(app, "typed.ts"),
      `import { connectNode, type NodeClient } from "mesh-provisioner/client";
export async function open(url: string, password: string): Promise<NodeClient> {
  return connectNode({ servers: url, node: "alder", credentials: { password } });
}
// @ts-expect-error: a node's name is a string
export const wrong = () => connectNode({ servers: "nats://x", node: 7, credentials: { password: "p" } });
`,
    );
    writeFileSync(
      join(app, "tsconfig.json"),
      JSON.stringify({
        compilerOptions: { module: "NodeNext", moduleResolution: "NodeNext", strict: true, noEmit: true, skipLibCheck: false, types: [] },
        files: ["typed.ts"],
      }),
    );
    const tsc = join(ROOT, "node_modules", "typescript", "bin", "tsc");
    expect(() => execFileSync(process.execPath, [tsc, "-p", join(app, "tsconfig.json")], { cwd: app, encoding: "utf8" })).not.toThrow();
  });
});
