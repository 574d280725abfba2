import { execFile, spawn, type ChildProcess } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createServer, type AddressInfo } from "node:net";
import { join } from "node:path";
import { promisify } from "node:util";
import { connect } from "nats";
import { afterAll, afterEach, describe, expect, it } from "vitest";
import { alive } from "../runtime/embedded.ts";
import { findNatsServer, NatsServerMissing } from "../runtime/nats-server.ts";
import { killGroups, ROOT, SHIPPED_DIR, until } from "./helpers.ts";

const BIN = join(ROOT, "bin", "mesh-provisioner.mjs");
const run = promisify(execFile);

/** The environment of a user with none of the NATS variables set. */
const cleanEnv = (extra: NodeJS.ProcessEnv = {}): NodeJS.ProcessEnv => {
  const env: NodeJS.ProcessEnv = { ...process.env, LOG_LEVEL: "warn", HTTP_PORT: "0", ...extra };
  for (const name of ["NATS_URL", "NATS_USER", "NATS_PASSWORD", "NATS_TOKEN", "NATS_CREDS", "NATS_NKEY"]) {
    if (!(name in extra)) delete env[name];
  }
  return env;
};

/** A project folder whose config is the project's, with its own state folder. */
function project(overrides = ""): { dir: string; config: string } {
  mkdirSync(join(ROOT, ".tmp"), { recursive: true });
  const dir = mkdtempSync(join(ROOT, ".tmp", "project-"));
  const config = join(dir, "wrangler-free.config.ts");
  writeFileSync(
    config,
    `import base from ${JSON.stringify(join(ROOT, "wrangler-free.config.ts"))};\n` +
      `export default { ...base, functions: ${JSON.stringify(SHIPPED_DIR)}, state: "state"${overrides} };\n`,
  );
  return { dir, config };
}

async function cli(config: string, args: string[], env: NodeJS.ProcessEnv = {}) {
  try {
    const { stdout, stderr } = await run("node", [BIN, "-c", config, ...args], { env: cleanEnv(env), cwd: ROOT });
    return { code: 0, stdout, stderr };
  } catch (err) {
    const e = err as { code: number; stdout: string; stderr: string };
    return { code: e.code, stdout: e.stdout, stderr: e.stderr };
  }
}

/**
 * A project folder with one function, `slow` on `probe.slow`, which writes `slow: in hand` on
 * stderr when it starts and answers `{ late: true }` after `ms`.
 */
function slowProject(ms: number): { dir: string; config: string } {
  mkdirSync(join(ROOT, ".tmp"), { recursive: true });
  const dir = mkdtempSync(join(ROOT, ".tmp", "project-"));
  mkdirSync(join(dir, "functions"));
  writeFileSync(
    join(dir, "functions", "slow.ts"),
    `import { defineFunction } from ${JSON.stringify(join(ROOT, "runtime", "index.ts"))};
export default defineFunction({
  description: "Answers after ${ms} ms.",
  triggers: [{ subject: "probe.slow" }],
  handler: async () => {
    process.stderr.write("slow: in hand\\n");
    await new Promise((r) => setTimeout(r, ${ms}));
    return { late: true };
  },
});
`,
  );
  const config = join(dir, "wrangler-free.config.ts");
  writeFileSync(
    config,
    `import base from ${JSON.stringify(join(ROOT, "wrangler-free.config.ts"))};\n` +
      `const { registry: _, alerts: __, provisioning: ___, rotation: ____, presence: _____, ...rest } = base as Record<string, unknown>;\n` +
      `export default { ...rest, functions: "functions", state: "state" };\n`,
  );
  return { dir, config };
}

/** The seat's connection to the embedded server of a project folder. */
function seatOf(dir: string) {
  const marker = JSON.parse(readFileSync(join(dir, "state", "embedded.json"), "utf8")) as { url: string };
  const password = (JSON.parse(readFileSync(join(dir, "state", "users.json"), "utf8")) as Record<string, string>)["mesh-provisioner"];
  return connect({ servers: marker.url, user: "mesh-provisioner", pass: password, inboxPrefix: "_INBOX.mesh-provisioner" });
}

interface Started {
  readonly child: ChildProcess;
  readonly banner: string;
  /** What it wrote on stdout so far: the log lines (and npm's own, through npm). */
  readonly stdout: () => string;
  /** What it wrote on stderr so far. */
  readonly stderr: () => string;
  /** The exit code, or the signal that ended the process; once its output is read to the end. */
  readonly exited: Promise<number | string | null>;
}

interface StartOptions {
  readonly env?: NodeJS.ProcessEnv;
  /** `start` by default. */
  readonly command?: "start" | "cluster";
  /** Through the package's npm script (`npm start`, `npm run cluster`), as a user runs it. */
  readonly viaNpm?: boolean;
  /** In a process group of its own, so a signal can reach the whole group, as from a terminal or a supervisor. */
  readonly group?: boolean;
  /** What on stderr says it is ready: by default the start banner's last function. */
  readonly ready?: RegExp;
}

/** `mesh-provisioner start` (or `npm start`, or the cluster), resolved once it printed its banner. */
function startCli(config: string, options: StartOptions = {}): Promise<Started> {
  const { command = "start", viaNpm = false, group = false, ready = /\n {2}status .*\n/ } = options;
  const [bin, args] = viaNpm ? ["npm", ["run", command, "--", "-c", config]] : ["node", [BIN, "-c", config, command]];
  const child = spawn(bin, args, { env: cleanEnv(options.env), cwd: ROOT, detached: group });
  if (group) groups.push(child);
  const exited = new Promise<number | string | null>((resolve) => child.once("close", (code, signal) => resolve(code ?? signal)));
  let out = "";
  let err = "";
  child.stdout!.on("data", (d) => (out += d));
  return new Promise((resolve, reject) => {
    // The banner goes to stderr: stdout holds only log lines.
    child.stderr!.on("data", (d) => {
      err += d;
      if (ready.test(err)) resolve({ child, banner: err, stdout: () => out, stderr: () => err, exited });
    });
    void exited.then((code) => reject(new Error(`${command} exited (${code}): ${err}${out}`)));
  });
}

/** The pids of the nats-servers running on the state folder of the project folder `dir`. */
function natsServersOf(dir: string): number[] {
  const conf = join(dir, "state", "nats-server.conf");
  return readdirSync("/proc")
    .filter((entry) => /^\d+$/.test(entry))
    .filter((pid) => {
      try {
        const args = readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0");
        return args[0]!.endsWith("nats-server") && args.includes(conf);
      } catch {
        return false; // gone meanwhile
      }
    })
    .map(Number);
}

/** The `msg` of each JSON log line of a process's stdout, from its line `started` on. */
const messagesSinceStarted = (stdout: string): string[] => {
  const messages = stdout
    .split("\n")
    .filter((line) => line.startsWith("{"))
    .map((line) => (JSON.parse(line) as { msg: string }).msg);
  return messages.slice(messages.indexOf("started"));
};

const children: ChildProcess[] = [];
/** Children leading a process group of their own: a failed test kills the whole group. */
const groups: ChildProcess[] = [];
const dirs: string[] = [];
afterEach(() => {
  for (const child of children.splice(0)) if (child.exitCode === null) child.kill("SIGKILL");
  killGroups(groups);
});
afterAll(() => {
  for (const dir of dirs) {
    // A child killed by SIGKILL (a failed test) cannot stop its nats-server: stop it here.
    const marker = join(dir, "state", "embedded.json");
    if (existsSync(marker)) {
      const { pid } = JSON.parse(readFileSync(marker, "utf8")) as { pid: number };
      if (alive(pid)) process.kill(pid, "SIGTERM");
    }
    rmSync(dir, { recursive: true, force: true });
  }
});

describe("the version", () => {
  it("is the package's, with --version or -V, and --help lists it; start --help lists the environment", async () => {
    const run = promisify(execFile);
    const bin = join(ROOT, "bin", "mesh-provisioner.mjs");
    const { version } = JSON.parse(readFileSync(join(ROOT, "package.json"), "utf8")) as { version: string };
    expect((await run("node", [bin, "--version"])).stdout).toBe(`${version}\n`);
    expect((await run("node", [bin, "-V"])).stdout).toBe(`${version}\n`);
    expect((await run("node", [bin, "--help"])).stdout).toMatch(/^ {2}-V, --version +print the version$/m);
    // start --help says the environment it reads.
    const start = (await run("node", [bin, "start", "--help"])).stdout;
    for (const variable of ["NATS_URL", "NATS_USER, NATS_PASSWORD", "HTTP_HOST, HTTP_PORT", "HTTP_TOKEN", "LOG_LEVEL"]) {
      expect(start).toContain(`  ${variable} `);
    }
  });
});

describe("the embedded default, end to end", () => {
  it("starts, takes the demo, answers `ask`, `invoke` and HTTP, and stops its nats-server on SIGTERM", async () => {
    const { dir, config } = project();
    dirs.push(dir);
    const started = await startCli(config);
    children.push(started.child);
    expect(started.banner).toMatch(/^NATS  nats:\/\/127\.0\.0\.1:\d+ \(embedded nats-server\)$/m);
    expect(started.banner).toMatch(/^  provisioning +subject mesh-provisioner\.provisioning, http GET \/provisioning$/m);
    expect(started.banner).toMatch(/^  registry-compile +cron 0 \* \* \* \* \(and at start\)$/m);
    expect(started.banner).toMatch(/^  provider-failing +event \*\.provisioner\.failing \(stream events\)$/m);
    expect(started.banner).toMatch(/^  status +subject mesh-provisioner\.status, http GET \/status$/m);
    const httpUrl = started.banner.match(/^HTTP  (\S+)$/m)![1]!;
    const marker = JSON.parse(readFileSync(join(dir, "state", "embedded.json"), "utf8")) as { pid: number };
    expect(alive(marker.pid)).toBe(true);

    const demo = await cli(config, ["demo"]);
    expect(demo.stderr).toBe("");
    expect(demo.stdout).toContain("birch: wrote 32 records as node birch");
    expect(demo.stdout).toContain("mesh-controller: wrote 21 assignments as the controller");
    expect(demo.stdout).toContain("keycloak: published keycloak.provisioner.failing for grafana on dogwood");

    // The demo's identity provider fails grafana on dogwood until it recovers.
    const failing = await cli(config, ["status"]);
    expect(failing.code).toBe(1);
    expect(failing.stdout).toMatch(
      /^NOT WELL: 1 failing; 5 modules not well\n\nPROVIDER +MACHINE +CONSUMER +FAILING FOR +WORD\nkeycloak +dogwood +grafana +\d+s +invalid_client: /,
    );
    expect(failing.stdout).toMatch(/^registry: 13 kinds, compiled \d+s ago \(/m);
    expect(JSON.parse((await cli(config, ["status", "--machine", "dogwood", "--json"])).stdout).failing[0]).toMatchObject({
      provider: "keycloak",
      consumer: "grafana",
    });
    expect((await cli(config, ["status", "--machine", "cedar", "--consumer", "motd"])).code).toBe(0);
    // Every state and condition of docs/state.md §7 shows after the demo.
    const state = await cli(config, ["state", "--json"]);
    const states = (JSON.parse(state.stdout) as { entries: { key: string; state: string; conditions: { type: string }[] }[] }).entries;
    expect(new Set(states.map((m) => m.state))).toEqual(
      new Set(["unassigned", "never-ran", "pending", "failed", "declares-nothing", "applied"]),
    );
    expect(new Set(states.flatMap((m) => m.conditions.map((c) => c.type)))).toEqual(
      new Set(["Unanswerable", "ProviderNotAssigned", "ProviderNotReady", "ProviderFailing", "OutOfShape", "RevisionMismatch"]),
    );
    // The demo's rotation: grafana on dogwood is its one holder, stale until it catches up; then keycloak is told.
    expect(demo.stdout).toMatch(/\ndogwood +grafana +bound\.keycloak\/issuer +- +\S+ ago +stale\n/);
    const caught = await cli(config, ["demo", "--catch-up"]);
    expect(caught.stdout).toContain(
      'keycloak: received mesh-provisioner.released.keycloak {"provision":"keycloak","revision":"grafana-client-2"',
    );
    expect(caught.stdout).toMatch(/\nkeycloak +keycloak +grafana on dogwood +grafana-client-2 +\S+ ago +1 of 1 +\S+ ago\n/);
    // Caught up, and its check of keycloak fails all the same: the provider does not accept the newest revision.
    expect(caught.stdout).toMatch(
      /\ndogwood +grafana +keycloak +AuthFailed \S+ +no \(node unreachable or silent\) +grafana-client-2 +401 Unauthorized/,
    );
    const recovered = await cli(config, ["demo", "--recover"]);
    expect(recovered.stdout).toContain("NOT WELL: 5 modules not well; 1 check failing");
    const well = await cli(config, ["status", "--provider", "keycloak"]);
    expect([well.code, well.stdout.split("\n")[0]]).toEqual([0, "WELL: nothing fails"]);
    const modules = await cli(config, ["status"]);
    expect([modules.code, modules.stdout.split("\n")[0]]).toEqual([1, "NOT WELL: 5 modules not well; 1 check failing"]);

    const ask = await cli(config, ["ask", "needs", "--node", "birch", "--module", "gitea"]);
    expect(ask.code).toBe(0);
    expect(
      ask.stdout.split("\n").map((line) =>
        line
          .trimEnd()
          .split(/\s{2,}/)
          .slice(0, 4)
          .join("|"),
      ),
    ).toEqual([
      "NODE|MODULE|KIND|NAME",
      "birch|gitea|bound|postgres/address",
      "birch|gitea|bound|redis/address",
      "birch|gitea|collected|ssh-keys",
      "birch|gitea|config|app_name",
      "birch|gitea|dir|state",
      "birch|gitea|port|http",
      "birch|gitea|secret|admin_password",
      "birch|gitea|wormhole|exit",
      "8 needs entries",
      "",
    ]);
    const whole = await cli(config, ["ask", "needs", "--node", "birch"]);
    expect(whole.stdout).toContain("20 needs entries");
    const json = JSON.parse(
      (await cli(config, ["ask", "collect", "--collection", "shell:zsh:normal", "--node", "birch", "--json"])).stdout,
    );
    expect(json.entries.map((e: { contributor: string }) => e.contributor)).toEqual(["docker", "gitea"]);

    const refused = await cli(config, ["ask", "needs", "--node", "n1.>"]);
    expect(refused.code).toBe(2);
    expect(refused.stderr).toMatch(/^mesh-provisioner: refused \(400\): node: must be one token/);

    const invoked = await cli(config, ["invoke", "provisioning", '{"what":"registry","kind":"seat"}']);
    expect(JSON.parse(invoked.stdout).entries[0].value).toEqual({
      kind: "seat",
      module: "mesh-controller",
      bucket: "mesh-controller_assignments",
      key: "<node>.<module>",
    });
    const http = await fetch(`${httpUrl}/provisioning?what=applied&node=alder&module=zsh`);
    expect(((await http.json()) as { entries: { value: unknown }[] }).entries[0]!.value).toEqual({
      at: "2026-11-29T08:00:00.000Z",
      placeholders: 2,
      files: ["/etc/zsh/zshrc", "/etc/profile.d/mesh.sh"],
    });

    started.child.kill("SIGTERM");
    expect(await started.exited).toBe(0);
    expect(alive(marker.pid)).toBe(false);
    expect(existsSync(join(dir, "state", "embedded.json"))).toBe(false);

    // A restart keeps what the nodes wrote: the store is under the state folder.
    const again = await startCli(config);
    children.push(again.child);
    expect((await cli(config, ["ask", "needs", "--node", "birch"])).stdout).toContain("20 needs entries");
    again.child.kill("SIGINT");
    expect(await again.exited).toBe(0);
  });

  it("stops with its nats-server when `npm start` is sent SIGTERM", async () => {
    const { dir, config } = project();
    dirs.push(dir);
    const started = await startCli(config, { viaNpm: true });
    children.push(started.child);
    const marker = JSON.parse(readFileSync(join(dir, "state", "embedded.json"), "utf8")) as { pid: number; owner: number };
    started.child.kill("SIGTERM");
    expect(await started.exited).toBe(0);
    expect(alive(marker.owner)).toBe(false);
    expect(alive(marker.pid)).toBe(false);
  });

  it("answers a slow request in hand when sent SIGTERM, then exits 0 with its nats-server stopped", async () => {
    const { dir, config } = slowProject(1500);
    dirs.push(dir);
    const started = await startCli(config, { ready: /\n {2}slow .*\n/ });
    children.push(started.child);
    const marker = JSON.parse(readFileSync(join(dir, "state", "embedded.json"), "utf8")) as { pid: number };
    const nc = await seatOf(dir);
    try {
      const asked = nc.request("probe.slow", "{}", { timeout: 10_000 });
      await until(() => started.stderr().includes("slow: in hand\n"));
      started.child.kill("SIGTERM");
      expect((await asked).json()).toEqual({ late: true });
      expect(await started.exited).toBe(0);
      expect(alive(marker.pid)).toBe(false);
    } finally {
      await nc.close().catch(() => {});
    }
  });

  it("refuses a second start on the same state folder, and cleans up after a killed one", async () => {
    const { dir, config } = project();
    dirs.push(dir);
    const first = await startCli(config);
    children.push(first.child);
    const second = await cli(config, ["start"]);
    expect(second.code).toBe(1);
    expect(second.stderr).toMatch(
      /^mesh-provisioner: the embedded nats-server of this folder \(nats:\/\/127\.0\.0\.1:\d+\) is in use by process \d+/,
    );

    const orphan = (JSON.parse(readFileSync(join(dir, "state", "embedded.json"), "utf8")) as { pid: number }).pid;
    first.child.kill("SIGKILL");
    await first.exited;
    const third = await startCli(config);
    children.push(third.child);
    expect(alive(orphan)).toBe(false);
    // Back on the same port: clients connected to the killed one's URL find it again.
    const url = (banner: string) => /^NATS {2}(\S+)/m.exec(banner)?.[1];
    expect(url(third.banner)).toBe(url(first.banner));
    third.child.kill("SIGHUP");
    expect(await third.exited).toBe(0);
  });

  it("says how to get nats-server when there is none, without a stack trace", async () => {
    expect(() => findNatsServer({ PATH: "/nowhere" }, [])).toThrow(NatsServerMissing);
    const { dir, config } = project();
    dirs.push(dir);
    const result = await cli(config, ["start"], { NATS_SERVER_BIN: "/nowhere/nats-server" });
    expect(result.code).toBe(1);
    expect(result.stderr).toBe(
      "mesh-provisioner: nats-server is not installed. Install it (apt-get install nats-server), " +
        "set NATS_SERVER_BIN to its path, or set NATS_URL to use a running server instead of the embedded one.\n",
    );
  });

  it("stops on a bad config, naming the field", async () => {
    const { dir, config } = project(`, http: { port: "eighty" }`);
    dirs.push(dir);
    const result = await cli(config, ["start"]);
    expect(result.code).toBe(1);
    expect(result.stderr).toMatch(
      /^mesh-provisioner: .*wrangler-free\.config\.ts: http\.port: Invalid input: expected number, received string\n$/,
    );
  });

  it("exits 1 at once on an HTTP port in use, naming it and HTTP_PORT, with its nats-server stopped", async () => {
    const busy = createServer();
    await new Promise<void>((resolve) => busy.listen(0, "127.0.0.1", resolve));
    const port = (busy.address() as AddressInfo).port;
    const { dir, config } = project();
    dirs.push(dir);
    try {
      const child = spawn("node", [BIN, "-c", config, "start"], {
        env: cleanEnv({ HTTP_PORT: String(port), LOG_LEVEL: "info" }),
        cwd: ROOT,
        detached: true,
      });
      groups.push(child);
      let out = "";
      let err = "";
      child.stdout.on("data", (d) => (out += d));
      child.stderr.on("data", (d) => (err += d));
      const exited = new Promise<number | string | null>((resolve) => child.once("close", (code, signal) => resolve(code ?? signal)));
      // The bus is open and every kind before HTTP bound when HTTP finds its port taken: start stops what it opened.
      await until(() => out.includes('"msg":"stopping"') || child.exitCode !== null);
      const late = new Promise<string>((resolve) => setTimeout(resolve, 5000, "still running 5 s after `stopping`").unref());
      expect(await Promise.race([exited, late])).toBe(1);
      expect(err).toBe(`mesh-provisioner: HTTP port ${port} on 127.0.0.1 is in use: set HTTP_PORT to another port (0 picks a free one)\n`);
      expect(natsServersOf(dir)).toEqual([]);
      expect(existsSync(join(dir, "state", "embedded.json"))).toBe(false);
    } finally {
      busy.close();
    }
  });
});

describe("stopping as a terminal or a supervisor stops it", () => {
  /** A signal to the whole process group: what Ctrl-C does, and systemd's `KillMode=control-group`. */
  const toGroup = (started: Started, signal: NodeJS.Signals) => process.kill(-started.child.pid!, signal);

  it("`npm start` sent SIGTERM as a process group (npm forwards it too) stops once, logs `stopped` and exits 0", async () => {
    const { dir, config } = project();
    dirs.push(dir);
    const started = await startCli(config, { viaNpm: true, group: true, env: { LOG_LEVEL: "info" } });
    const marker = JSON.parse(readFileSync(join(dir, "state", "embedded.json"), "utf8")) as { pid: number };
    toGroup(started, "SIGTERM");
    expect(await started.exited).toBe(0);
    expect(messagesSinceStarted(started.stdout())).toEqual(["started", "signal: stopping", "stopping", "stopped"]);
    expect(alive(marker.pid)).toBe(false);
  });

  it("`npm start` sent Ctrl-C twice within a few ms, as a process group, stops once and exits 0", async () => {
    const { dir, config } = project();
    dirs.push(dir);
    const started = await startCli(config, { viaNpm: true, group: true, env: { LOG_LEVEL: "info" } });
    toGroup(started, "SIGINT");
    await new Promise((r) => setTimeout(r, 5));
    toGroup(started, "SIGINT");
    expect(await started.exited).toBe(0);
    expect(messagesSinceStarted(started.stdout())).toEqual(["started", "signal: stopping", "stopping", "stopped"]);
  });

  it("a signal more than 1 s after the first, while a request is still in hand, exits at once with 130", async () => {
    // The request in hand takes 8 s and the grace is 10 s: the stop is still going 1.5 s after the first signal.
    const { dir, config } = slowProject(8000);
    dirs.push(dir);
    const started = await startCli(config, { viaNpm: true, group: true, env: { LOG_LEVEL: "info" }, ready: /\n {2}slow .*\n/ });
    const marker = JSON.parse(readFileSync(join(dir, "state", "embedded.json"), "utf8")) as { pid: number };
    const nc = await seatOf(dir);
    try {
      const asked = nc.request("probe.slow", "{}", { timeout: 20_000 }).then(
        () => "answered",
        () => "no answer",
      );
      await until(() => started.stderr().includes("slow: in hand\n"));
      toGroup(started, "SIGINT");
      await new Promise((r) => setTimeout(r, 1500));
      expect(started.child.exitCode).toBe(null);
      toGroup(started, "SIGINT");
      expect(await started.exited).toBe(130);
      expect(messagesSinceStarted(started.stdout())).toEqual(["started", "signal: stopping", "stopping"]);
      await nc.close();
      expect(await asked).toBe("no answer");
      // The exit hook killed the embedded server.
      await until(() => !alive(marker.pid), 5000);
    } finally {
      await nc.close().catch(() => {});
    }
  });

  it("`npm run cluster` sent SIGTERM as a process group stops its servers, removes its env file and exits 0", async () => {
    const { dir, config } = project();
    dirs.push(dir);
    const started = await startCli(config, { command: "cluster", viaNpm: true, group: true, ready: /Ctrl-C stops the cluster/ });
    const env = join(dir, "state", "cluster", "env");
    const urls = /^NATS_URL=(.*)$/m.exec(readFileSync(env, "utf8"))![1]!.split(",");
    expect(urls).toHaveLength(3);
    toGroup(started, "SIGTERM");
    expect(await started.exited).toBe(0);
    expect(existsSync(env)).toBe(false);
    for (const url of urls) {
      await expect(connect({ servers: url, reconnect: false, timeout: 1000 })).rejects.toThrow();
    }
  });
});
