import { execFile, spawn, type ChildProcess } from "node:child_process";
import { cpSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { connect } from "nats";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { alive } from "../runtime/embedded.ts";
import { killGroups, request, ROOT, SHIPPED_FUNCTIONS } from "./helpers.ts";

const run = promisify(execFile);

/**
 * A copy of the project under `.tmp/`: its bin, command line, runtime, shipped functions and
 * config, its own state folder, and node_modules as links to the project's packages but tsx's
 * (added by {@link withTsx}), so a start that loads tsx fails there.
 */
function copyProject(): string {
  mkdirSync(join(ROOT, ".tmp"), { recursive: true });
  const dir = mkdtempSync(join(ROOT, ".tmp", "bundle-"));
  for (const part of [
    "bin",
    "cli",
    "client",
    "contract",
    "demo",
    "runtime",
    "functions/_lib",
    "functions/_shipped.json",
    "package.json",
    "tsconfig.json",
    "wrangler-free.config.ts",
  ]) {
    cpSync(join(ROOT, part), join(dir, part), { recursive: true });
  }
  for (const f of SHIPPED_FUNCTIONS) cpSync(join(ROOT, "functions", `${f}.ts`), join(dir, "functions", `${f}.ts`));
  mkdirSync(join(dir, "node_modules"));
  for (const pkg of readdirSync(join(ROOT, "node_modules"))) {
    if (pkg !== "tsx") symlinkSync(join(ROOT, "node_modules", pkg), join(dir, "node_modules", pkg));
  }
  return dir;
}

const withTsx = (dir: string) => symlinkSync(join(ROOT, "node_modules", "tsx"), join(dir, "node_modules", "tsx"));

const env = (): NodeJS.ProcessEnv => {
  const e: NodeJS.ProcessEnv = { ...process.env, LOG_LEVEL: "warn", HTTP_PORT: "0" };
  for (const name of ["NATS_URL", "NATS_USER", "NATS_PASSWORD", "NATS_TOKEN", "NATS_CREDS", "NATS_NKEY"]) delete e[name];
  return e;
};

const groups: ChildProcess[] = [];

/** `npm start` in `dir`, in a process group of its own; resolved once its banner named `last`. */
function npmStart(dir: string, last = "status"): Promise<{ child: ChildProcess; banner: string; exited: Promise<unknown> }> {
  const child = spawn("npm", ["start"], { cwd: dir, env: env(), detached: true });
  groups.push(child);
  const exited = new Promise((resolve) => child.once("close", (code, signal) => resolve(code ?? signal)));
  let err = "";
  child.stdout!.on("data", () => {});
  return new Promise((resolve, reject) => {
    child.stderr!.on("data", (d) => {
      err += d;
      if (new RegExp(`\\n {2}${last} .*\\n`).test(err)) resolve({ child, banner: err, exited });
    });
    void exited.then((code) => reject(new Error(`npm start exited (${String(code)}): ${err}`)));
  });
}

/** The seat's connection to the embedded server of a project folder. */
function seatOf(dir: string) {
  const marker = JSON.parse(readFileSync(join(dir, ".state", "embedded.json"), "utf8")) as { url: string };
  const password = (JSON.parse(readFileSync(join(dir, ".state", "users.json"), "utf8")) as Record<string, string>)["mesh-provisioner"];
  return connect({ servers: marker.url, user: "mesh-provisioner", pass: password, inboxPrefix: "_INBOX.mesh-provisioner" });
}

let dir: string;
beforeAll(() => {
  dir = copyProject();
});
afterEach(() => {
  killGroups(groups);
});
afterAll(() => {
  const marker = join(dir, ".state", "embedded.json");
  if (existsSync(marker)) {
    const { pid } = JSON.parse(readFileSync(marker, "utf8")) as { pid: number };
    if (alive(pid)) process.kill(pid, "SIGTERM");
  }
  rmSync(dir, { recursive: true, force: true });
});

const stop = async (started: { child: ChildProcess; exited: Promise<unknown> }) => {
  process.kill(-started.child.pid!, "SIGTERM");
  expect(await started.exited).toBe(0);
};

describe("the bundled start (docs/scale.md §11.2)", () => {
  it("builds at `npm start` and serves the shipped functions without tsx", async () => {
    const started = await npmStart(dir);
    const build = JSON.parse(readFileSync(join(dir, "dist", "build.json"), "utf8")) as { entries: Record<string, string> };
    expect(Object.keys(build.entries)).toEqual(
      expect.arrayContaining(["cli/main.ts", "wrangler-free.config.ts", ...SHIPPED_FUNCTIONS.map((f) => `functions/${f}.ts`)]),
    );
    const nc = await seatOf(dir);
    try {
      const answer = await request(nc, "mesh-provisioner.provisioning", { what: "registry" });
      expect(answer.errorCode).toBeUndefined();
      expect(answer.body.what).toBe("registry");
      // A refusal thrown by a built function is the built runtime's own ServiceError.
      expect((await request(nc, "mesh-provisioner.provisioning", { what: "nothing" })).errorCode).toBe(400);
    } finally {
      await nc.close();
    }
    await stop(started);
  });

  it("loads a function file dropped into functions/ through tsx, on the built runtime", async () => {
    withTsx(dir);
    writeFileSync(
      join(dir, "functions", "echo.ts"),
      `import { z } from "zod";
import { badInput, defineFunction, JsonText } from "../runtime/index.ts";

export default defineFunction({
  description: "Echoes what it is told.",
  triggers: [{ subject: "probe.echo" }, { http: "POST /probe/echo" }],
  input: z.object({ say: z.string() }),
  access: { views: ["registry"] },
  handler: async (input, ctx) => {
    if (input.say === "") throw badInput("say something");
    if (input.say === "as JSON text") return new JsonText('{"said":"as it is"}');
    return { said: input.say, kinds: (await ctx.views.registry.list(">")).length };
  },
});
`,
    );
    const started = await npmStart(dir);
    expect(started.banner).toMatch(/^ {2}echo +subject probe\.echo, http POST \/probe\/echo$/m);
    const nc = await seatOf(dir);
    try {
      const answer = await request(nc, "probe.echo", { say: "hi" });
      expect(answer.body).toEqual({ said: "hi", kinds: expect.any(Number) });
      // The runtime the file imports is the built one: its JsonText is the runner's, sent as it is.
      expect((await request(nc, "probe.echo", { say: "as JSON text" })).body).toEqual({ said: "as it is" });
      const refused = await request(nc, "probe.echo", { say: "" });
      expect([refused.errorCode, refused.errorText]).toEqual([400, "say something"]);
    } finally {
      await nc.close();
    }
    await stop(started);
    rmSync(join(dir, "functions", "echo.ts"));
  });

  it("never runs a build older than its sources: the TypeScript runs until it is built again", async () => {
    const bin = join(dir, "bin", "mesh-provisioner.mjs");
    const help = async () => (await run("node", [bin, "--help"], { cwd: dir, env: env() })).stdout;
    await run("node", [join(dir, "bin", "build.mjs")], { cwd: dir });
    const main = join(dir, "cli", "main.ts");
    writeFileSync(main, readFileSync(main, "utf8").replace("The provisioner's server of the mesh", "The changed server of the mesh"));
    expect(await help()).toContain("The changed server of the mesh");
    const before = readFileSync(join(dir, "dist", "build.json"), "utf8");
    await run("node", [join(dir, "bin", "build.mjs")], { cwd: dir });
    expect(readFileSync(join(dir, "dist", "build.json"), "utf8")).not.toBe(before);
    // Built again, without tsx: the bundle holds the change.
    rmSync(join(dir, "node_modules", "tsx"));
    expect(await help()).toContain("The changed server of the mesh");
  });

  it("reads a config file that sits where no package says it is an ES module, built or not (docs/configuration.md §18)", async () => {
    if (!existsSync(join(dir, "node_modules", "tsx"))) withTsx(dir);
    // Outside the project: /etc/mesh-provisioner/config.ts, say. One exports its data, one defineConfig's.
    const etc = mkdtempSync(join(tmpdir(), "mesh-provisioner-etc-"));
    const project = readFileSync(join(dir, "wrangler-free.config.ts"), "utf8")
      .replace('"./runtime/index.ts"', JSON.stringify(join(dir, "runtime", "index.ts")))
      .replace(/state: "[^"]*"/, `state: ${JSON.stringify(join(etc, "state"))}`);
    writeFileSync(join(etc, "config.ts"), project);
    writeFileSync(join(etc, "plain.config.ts"), project.replace(/^import .*$/m, "").replace("defineConfig(", "("));
    // And one beside a package.json as `npm init` writes it (npm 11): a config file is an ES module all the same.
    mkdirSync(join(etc, "npm"));
    writeFileSync(join(etc, "npm", "package.json"), '{ "name": "etc", "type": "commonjs" }\n');
    writeFileSync(join(etc, "npm", "config.ts"), project);
    /** The command's first line of output, or what it said on stderr when it failed. */
    const said = (file: string, ...command: string[]) =>
      run("node", [join(dir, "bin", "mesh-provisioner.mjs"), "-c", join(etc, file), ...command], { cwd: dir, env: env() }).then(
        ({ stdout }) => stdout.split("\n")[0],
        (err: { stderr: string }) => err.stderr.trim(),
      );
    // No server runs for it: the command got as far as the state folder the file names.
    const loaded = `mesh-provisioner: no NATS_URL is set and no embedded nats-server runs for ${join(etc, "state")}: start one with \`npm start\``;
    // A function file there, whose helper's package says it is CommonJS: that one stays so.
    mkdirSync(join(etc, "functions", "_lib"), { recursive: true });
    writeFileSync(
      join(etc, "functions.config.ts"),
      `export default ${JSON.stringify({ seat: "t", functions: "functions", state: "state", nats: { servers: [] }, buckets: {} })};\n`,
    );
    writeFileSync(
      join(etc, "functions", "hello.ts"),
      `import { defineFunction } from ${JSON.stringify(join(dir, "runtime", "index.ts"))};
import { greet } from "./_lib/helper.ts";
export default defineFunction({ description: greet(), triggers: [{ subject: "t.hello" }], handler: () => greet() });
`,
    );
    writeFileSync(join(etc, "functions", "_lib", "package.json"), '{ "type": "commonjs" }\n');
    writeFileSync(join(etc, "functions", "_lib", "helper.ts"), 'exports.greet = (): string => "hello from " + typeof require;\n');
    /** `status` with each config file, then `permissions` with the one whose function imports a CommonJS helper. */
    const everyFile = async () => [
      await said("config.ts", "status"),
      await said("plain.config.ts", "status"),
      await said("npm/config.ts", "status"),
      await said("functions.config.ts", "permissions", "--node", "alder"),
    ];
    try {
      await run("node", [join(dir, "bin", "build.mjs")], { cwd: dir });
      expect(await everyFile()).toEqual([loaded, loaded, loaded, "accounts {"]);
      // The TypeScript through tsx, the build older than a source.
      const main = join(dir, "cli", "main.ts");
      writeFileSync(main, `${readFileSync(main, "utf8")}\n`);
      expect(await everyFile()).toEqual([loaded, loaded, loaded, "accounts {"]);
    } finally {
      rmSync(etc, { recursive: true, force: true });
    }
  });
});
