import { execFile } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { connect, type NatsConnection } from "nats";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { VERB } from "../functions/_lib/provisioning.ts";
import { resolveConfig, start, type Running } from "../runtime/index.ts";
import { findNatsServer, freePort, startNatsServer, type RunningNatsServer } from "../runtime/nats-server.ts";
import { projectConfig, request, ROOT, until } from "./helpers.ts";

const run = promisify(execFile);

/** The environment without a NATS connection of whoever runs the tests. */
const outside = Object.fromEntries(Object.entries(process.env).filter(([name]) => !name.startsWith("NATS_") || name === "NATS_SERVER_BIN"));

/** `mesh-provisioner <args>` as an operator runs it in the project's folder: its stdout, stderr and exit code. */
async function cli(args: readonly string[], env: NodeJS.ProcessEnv = {}) {
  try {
    const { stdout, stderr } = await run("node", [join(ROOT, "bin", "mesh-provisioner.mjs"), ...args], {
      cwd: ROOT,
      encoding: "utf8",
      env: { ...outside, LOG_LEVEL: "silent", ...env },
    });
    return { stdout, stderr, code: 0 };
  } catch (err) {
    const failed = err as { stdout: string; stderr: string; code: number };
    return { stdout: failed.stdout, stderr: failed.stderr, code: failed.code };
  }
}

describe("permissions --conf: a nats-server configuration that starts as it is printed (docs/runtime.md §6.7)", () => {
  let dir: string;
  let server: RunningNatsServer | undefined;
  let set: Running | undefined;
  const opened: NatsConnection[] = [];

  beforeAll(() => {
    dir = mkdtempSync(join(tmpdir(), "mesh-provisioner-conf-"));
  });
  afterAll(async () => {
    await Promise.all(opened.map((nc) => nc.close()));
    await set?.stop();
    await server?.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  it("serves the set and a node; a node added, the server reloaded, the new node writes its need while the set serves on", async () => {
    const port = await freePort();
    const url = `nats://127.0.0.1:${port}`;
    const confFile = join(dir, "nats-server.conf");
    const credentials = join(dir, "users.json");
    /** Prints the configuration over `confFile`, as `permissions --conf … > nats-server.conf` does. */
    const print = async (args: readonly string[], env?: NodeJS.ProcessEnv) => {
      const printed = await cli(
        [
          "permissions",
          "--conf",
          "--listen",
          `127.0.0.1:${port}`,
          "--store-dir",
          join(dir, "store"),
          "--credentials",
          credentials,
          ...args,
        ],
        env,
      );
      expect(printed.stderr).toMatch(/the configuration holds their bcrypt hashes/);
      expect(printed.code).toBe(0);
      writeFileSync(confFile, printed.stdout);
      return printed;
    };
    const as = async (user: string, password: string) => {
      const nc = await connect({ servers: url, user, pass: password, inboxPrefix: `_INBOX.${user}`, reconnect: false });
      opened.push(nc);
      return nc;
    };

    expect((await print(["--node", "alder"])).stderr).toMatch(/\(new: mesh-provisioner, alder, mesh-controller\)/);
    const first: Record<string, string> = JSON.parse(readFileSync(credentials, "utf8"));
    expect(Object.keys(first)).toEqual(["mesh-provisioner", "alder", "mesh-controller"]);
    expect(statSync(credentials).mode & 0o777).toBe(0o600);
    const conf = readFileSync(confFile, "utf8");
    expect(conf).toContain(`listen: "127.0.0.1:${port}"`);
    expect(conf).toContain(`store_dir: ${JSON.stringify(join(dir, "store"))}`);
    // Each password a bcrypt hash of cost 10, none in the clear, no variable to define.
    expect(conf.match(/password: "\$2b\$10\$[./A-Za-z0-9]{53}"/g)).toHaveLength(3);
    for (const password of Object.values(first)) expect(conf).not.toContain(password);
    expect(conf).not.toMatch(/password: \$/);

    // As it is: no variable in the server's environment, nothing added to the file.
    server = await startNatsServer(confFile, port, { PATH: process.env.PATH ?? "" });
    const config = await projectConfig();
    set = await start({
      config: {
        ...resolveConfig(
          { ...config, nats: { servers: [url], user: "mesh-provisioner", password: first["mesh-provisioner"] }, http: { port: 0 } },
          config.file,
          {},
        ),
        root: config.root,
      },
    });
    const alder = await as("alder", first.alder!);
    const alderNeeds = await alder.jetstream().views.kv("mesh-provisioner_needs", { bindOnly: true });
    await alderNeeds.put("alder.gitea.config.db_url", '{"by":"alder"}');
    const needs = async (nc: NatsConnection) =>
      ((await request(nc, VERB, { what: "needs" })).body.entries as { key: string }[]).map((e) => e.key);
    expect(await needs(alder)).toEqual(["alder.gitea.config.db_url"]);
    await expect(as("birch", "any")).rejects.toThrow(/Authorization Violation/);

    // The controller assigns gitea to birch; the next print reads birch from its mirror, as the seat.
    const controller = await as("mesh-controller", first["mesh-controller"]!);
    await (await controller.jetstream().views.kv("mesh-controller_assignments", { bindOnly: true })).put("birch.gitea", "{}");
    const again = await print(["--node", "alder", "--from-assignments"], {
      NATS_URL: url,
      NATS_USER: "mesh-provisioner",
      NATS_PASSWORD: first["mesh-provisioner"],
    });
    expect(again.stderr).toMatch(/\(new: birch\)/);
    const second: Record<string, string> = JSON.parse(readFileSync(credentials, "utf8"));
    expect(Object.keys(second)).toEqual(["mesh-provisioner", "alder", "mesh-controller", "birch"]);
    expect(second).toMatchObject(first);
    expect(readFileSync(confFile, "utf8").match(/password: "\$2b\$10\$/g)).toHaveLength(4);

    // nats-server 2.9.10 lets a user of an account added by a reload connect at once, but wires
    // that account's service imports (every subject birch publishes) only at the next reload.
    const reload = () => run(findNatsServer(), ["--signal", `reload=${server!.pid}`]);
    await reload();
    let birch: NatsConnection | undefined;
    await until(
      async () => (birch = await as("birch", second.birch!).catch(() => undefined)) !== undefined,
      10_000,
      "birch connects after the first reload",
    );
    await reload();
    await until(
      async () => (await birch!.request("$JS.API.INFO", "", { timeout: 1000 }).catch(() => undefined)) !== undefined,
      10_000,
      "birch's imports answer after the second reload",
    );
    const birchNeeds = await birch!.jetstream().views.kv("mesh-provisioner_needs", { bindOnly: true });
    await birchNeeds.put("birch.gitea.config.db_url", '{"by":"birch"}');
    await expect(birchNeeds.put("alder.gitea.config.db_url", '{"by":"birch"}')).rejects.toThrow(/Permissions Violation/);
    expect(await needs(birch!)).toEqual(["alder.gitea.config.db_url", "birch.gitea.config.db_url"]);
    // The connections made before the reload still serve: the set answers alder, alder writes.
    await alderNeeds.put("alder.gitea.config.app_name", '{"by":"alder"}');
    expect(await needs(alder)).toEqual(["alder.gitea.config.app_name", "alder.gitea.config.db_url", "birch.gitea.config.db_url"]);
  });
});

describe("permissions: the users named, never the demo's unasked", () => {
  it("refuses to print without a node, naming the options that name them", async () => {
    const refused = await cli(["permissions", "--provider", "keycloak"]);
    expect(refused.code).toBe(1);
    expect(refused.stdout).toBe("");
    expect(refused.stderr).toBe(
      "mesh-provisioner: no nodes given: name them with --node <name> (repeatable), --nodes-file <file> (one a line) or " +
        "--from-assignments (the controller's assignments mirror); --demo prints the embedded demo's users\n",
    );
  });

  it("refuses a name holding a . * > or white space, naming it and where it came from", async () => {
    const dir = mkdtempSync(join(tmpdir(), "mesh-provisioner-names-"));
    try {
      const why = "must be one token (A-Z a-z 0-9 - _ / =): no ., *, > or white space";
      expect((await cli(["permissions", "--node", "alder", "--node", "a.b"])).stderr).toBe(`mesh-provisioner: --node "a.b": ${why}\n`);
      expect((await cli(["permissions", "--node", "alder", "--provider", ">"])).stderr).toBe(`mesh-provisioner: --provider ">": ${why}\n`);
      const nodes = join(dir, "nodes");
      writeFileSync(nodes, "alder\n# the new ones\n\n  birch  \nce dar\n");
      const refused = await cli(["permissions", "--nodes-file", nodes]);
      expect(refused.code).toBe(1);
      expect(refused.stderr).toBe(`mesh-provisioner: --nodes-file ${nodes} line 5: "ce dar": ${why}\n`);
      writeFileSync(nodes, "alder\n# the new ones\n\n  birch  \n");
      const users = JSON.parse((await cli(["permissions", "--nodes-file", nodes, "--json"])).stdout) as { user: string; role: string }[];
      expect(users.map((u) => `${u.role} ${u.user}`)).toEqual([
        "seat mesh-provisioner",
        "node alder",
        "node birch",
        "controller mesh-controller",
      ]);
      // Nothing was written where the refused print named a users file.
      const credentials = join(dir, "users.json");
      expect((await cli(["permissions", "--conf", "--credentials", credentials, "--node", "*"])).code).toBe(1);
      expect(() => statSync(credentials)).toThrow(/ENOENT/);
      // A users file not of its shape is said, naming the file and the user, and left as it was.
      writeFileSync(credentials, '{"alder": 3}');
      const badFile = await cli(["permissions", "--conf", "--credentials", credentials, "--node", "alder"]);
      expect(badFile.code).toBe(1);
      expect(badFile.stderr).toMatch(`mesh-provisioner: ${credentials}: a users file is { "<user>": "<password>" }: alder: `);
      expect(readFileSync(credentials, "utf8")).toBe('{"alder": 3}');
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it("prints the embedded demo's users only with --demo", async () => {
    const users = JSON.parse((await cli(["permissions", "--demo", "--json"])).stdout) as { user: string }[];
    expect(users.map((u) => u.user)).toEqual([
      "mesh-provisioner",
      "alder",
      "birch",
      "cedar",
      "dogwood",
      "keycloak",
      "postgres",
      "mesh-vault",
      "mesh-controller",
    ]);
  });
});
