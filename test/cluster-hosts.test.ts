/**
 * The harness of hosts in network namespaces (test/hosts.ts) on itself: a cluster of one server
 * a host, a partition that takes a stream's leadership from the host cut off and a heal after
 * which every server holds the stream's last message, a paused and a killed server, and nothing
 * of a run left behind: after stop(), after a test that fails without stopping, after kill -9.
 */
import { execFile, spawn } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { setTimeout as sleep } from "node:timers/promises";
import { join } from "node:path";
import { promisify } from "node:util";
import type { NatsConnection, PubAck } from "nats";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { OPERATOR } from "../runtime/testing.ts";
import { projectConfig, ROOT, until } from "./helpers.ts";
import {
  canMakeHosts,
  meshUsers,
  startHostCluster,
  startHosts,
  sweepHosts,
  type HostCluster,
  type HostServer,
  type Hosts,
} from "./hosts.ts";

const run = promisify(execFile);
const STREAM = "harness";

/** The namespaces, links and folder of the run `pid` that exist now. */
async function leftovers(pid: number): Promise<string[]> {
  const namespaces = (await run("ip", ["netns", "list"])).stdout.split("\n").map((line) => line.split(" ")[0]!);
  const links = (await run("ip", ["-br", "link"])).stdout.split("\n").map((line) => line.split(" ")[0]!.split("@")[0]!);
  const folder = join(tmpdir(), `mesh-provisioner-hosts-${pid}`);
  return [
    ...[...namespaces, ...links].filter((name) => new RegExp(`^mpt${pid}(br|[hvp]\\d+)$`).test(name)),
    ...(existsSync(folder) ? [folder] : []),
  ];
}

/** The state of process `pid` as the kernel says it (`R`, `S`, `D`, `T` stopped, `Z` a zombie…); `undefined` when there is none. */
function stateOf(pid: number): string | undefined {
  const stat = `/proc/${pid}/stat`;
  if (!existsSync(stat)) return undefined;
  try {
    return readFileSync(stat, "utf8").split(") ")[1]?.[0];
  } catch {
    return undefined;
  }
}

/** Whether process `pid` lives (a zombie does not: it is dead, only not yet reaped). */
function lives(pid: number): boolean {
  const state = stateOf(pid);
  return state !== undefined && state !== "Z";
}

/** Each server's replica of the stream, as it says: `<server>: leader <name>, last <seq>`. */
async function replicas(cluster: HostCluster, servers = cluster.servers): Promise<string[]> {
  const seen = await Promise.all(servers.map((s) => cluster.replicaOf(STREAM, s)));
  return seen.map((r, i) => `${servers[i]!.name}: ${r ? `leader ${r.leader?.name ?? "none"}, last ${r.lastSeq}` : "no answer"}`);
}

/** Waits until every server of `servers` holds `seq` as the stream's last message; throws saying each replica. */
async function caughtUp(cluster: HostCluster, seq: number, timeoutMs: number, servers = cluster.servers): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const seen = await replicas(cluster, servers);
    if (seen.every((r) => r.endsWith(`, last ${seq}`))) return;
    if (Date.now() > deadline) throw new Error(`not every server holds message ${seq} within ${timeoutMs} ms: ${seen.join("; ")}`);
    await sleep(100);
  }
}

/** Publishes through `nc` until a publish is acknowledged within 1 s (a leader elected). */
async function publishUntilAcknowledged(nc: NatsConnection, subject: string, timeoutMs: number): Promise<PubAck> {
  let ack: PubAck | undefined;
  await until(
    async () =>
      (ack = await nc
        .jetstream()
        .publish(subject, "", { timeout: 1000 })
        .catch(() => undefined)) !== undefined,
    timeoutMs,
    `a publish to ${subject} acknowledged`,
  );
  return ack!;
}

describe.skipIf(!canMakeHosts)("hosts in network namespaces, a cluster across them (as root)", () => {
  let hosts: Hosts;
  let cluster: HostCluster;
  let s1: HostServer, s2: HostServer, s3: HostServer;

  beforeAll(async () => {
    hosts = await startHosts(3);
    cluster = await startHostCluster(hosts, { users: await meshUsers(await projectConfig()) });
    [s1, s2, s3] = cluster.servers as [HostServer, HostServer, HostServer];
  }, 60_000);

  afterAll(async () => {
    await cluster?.stop();
    await hosts?.stop();
  });

  it("runs one server a host, named after this process, routed over the hosts' addresses", async () => {
    expect(hosts.bridge).toBe(`mpt${process.pid}br`);
    expect(hosts.hosts.map((h) => h.name)).toEqual([1, 2, 3].map((n) => `mpt${process.pid}h${n}`));
    expect(cluster.urls).toEqual(hosts.hosts.map((h) => `nats://${h.ip}:4222`));
    await cluster.ready();
    const routez = (await (await fetch(`${s1.monitor}/routez`)).json()) as { routes: { ip: string }[] };
    expect(routez.routes.map((r) => r.ip).sort()).toEqual([s2.host.ip, s3.host.ip].sort());
  });

  it("cut off, host 1 loses the stream's leadership and acknowledges nothing; healed, every server holds the last message", async ({
    annotate,
  }) => {
    const via1 = await cluster.connect(OPERATOR, s1);
    const via2 = await cluster.connect(OPERATOR, s2);
    await (await via2.jetstreamManager()).streams.add({ name: STREAM, subjects: [`${STREAM}.>`], num_replicas: 3 });
    await cluster.moveLeader(STREAM, s1);
    await via1.jetstream().publish(`${STREAM}.before`);

    await hosts.partition(s1.host);
    const cut = Date.now();
    const through1 = via1
      .jetstream()
      .publish(`${STREAM}.one`, "", { timeout: 5000 })
      .then(() => "acknowledged")
      .catch(() => "not acknowledged");
    const ack = await publishUntilAcknowledged(via2, `${STREAM}.two`, 15_000);
    const elected = Date.now() - cut;
    expect([s2, s3]).toContain(await cluster.leaderOf(STREAM));
    expect(await through1).toBe("not acknowledged");
    // The test machine still reaches server 1: on the connection it had, and on a new one.
    await via1.flush();
    await (await cluster.connect(OPERATOR, s1)).flush();
    expect((await fetch(`${s1.monitor}/varz`)).ok).toBe(true);
    // Healed only once server 1 no longer thinks it leads (it steps down 10 to 20 s after losing its quorum):
    // healed before, nats-server 2.9.10 may keep on server 1, for good, the publishes the hung routes
    // delivered to it at the heal, none of them acknowledged (a replica whose last message is 9 where the
    // others' is 2), and no server would hold the stream's last message as the others do.
    await until(async () => (await cluster.leaderOf(STREAM, s1)) !== s1, 25_000, "server 1 no longer leading in its own view");
    const steppedDown = Date.now() - cut;

    await hosts.heal();
    const healed = Date.now();
    await caughtUp(cluster, ack.seq, 30_000);
    const caught = Date.now() - healed;
    await cluster.ready();
    const ready = Date.now() - healed;
    expect(await cluster.leaderOf(STREAM, s1)).toBe(await cluster.leaderOf(STREAM));
    await annotate(
      `acknowledged through server 2 ${elected} ms after the cut, server 1 stepped down after ${steppedDown} ms; ` +
        `healed: caught up in ${caught} ms, meta ready in ${ready} ms`,
    );
  });

  it("a paused server answers nothing, and catches up once resumed", async () => {
    const via2 = await cluster.connect(OPERATOR, s2);
    await cluster.moveLeader(STREAM, s2);
    s3.pause();
    expect(s3.paused).toBe(true);
    // A stop takes effect as each of the server's threads is next scheduled: the kernel says when it has.
    await until(() => stateOf(s3.pid!) === "T", 2000, `${s3.name} (pid ${s3.pid}) stopped`);
    const varz = fetch(`${s3.monitor}/varz`, { signal: AbortSignal.timeout(1000) });
    await expect(varz, `${s3.name}'s /varz, its pid ${s3.pid} in state ${stateOf(s3.pid!)}`).rejects.toThrow();
    const ack = await via2.jetstream().publish(`${STREAM}.paused`, "", { timeout: 5000 });
    await caughtUp(cluster, ack.seq, 5000, [s1, s2]);
    s3.resume();
    await caughtUp(cluster, ack.seq, 15_000);
    await cluster.ready();
  });

  it("a killed server starts again on its store", async () => {
    const via1 = await cluster.connect(OPERATOR, s1);
    const pid = s3.pid!;
    await s3.kill();
    expect(s3.pid).toBeUndefined();
    expect(lives(pid)).toBe(false);
    const ack = await publishUntilAcknowledged(via1, `${STREAM}.killed`, 15_000);
    await s3.start();
    await caughtUp(cluster, ack.seq, 15_000);
    await cluster.ready();
  });

  it("stop() leaves no namespace, veth, bridge, folder or process of this run", async () => {
    const sleeper = hosts.hosts[1]!.spawn("sleep", ["300"], { stdio: "ignore" });
    // In the host's namespace once `ip netns exec` entered it (and exec'd the command).
    const namespace = async () => (await run("ip", ["netns", "identify", String(sleeper.pid)])).stdout.trim();
    await until(async () => (await namespace()) === hosts.hosts[1]!.name, 5000, "the process in host 2's namespace");
    const started = [...hosts.started];
    expect(started).toContain(sleeper.pid);
    // 3 namespaces, the bridge, 3 veths (their peers are in the namespaces), the run's folder.
    expect((await leftovers(process.pid)).length).toBe(3 + 1 + 3 + 1);
    await cluster.stop();
    await hosts.stop();
    await hosts.stop();
    expect(await leftovers(process.pid)).toEqual([]);
    expect(started.filter(lives)).toEqual([]);
    await until(() => !lives(hosts.watchdog), 5000, "the watchdog gone");
  });
});

describe.skipIf(!canMakeHosts)("a run that ends badly leaves nothing behind (as root)", () => {
  let dir: string;
  beforeAll(() => {
    dir = mkdtempSync(join(tmpdir(), "mesh-provisioner-hosts-run-"));
  });
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  /** What a run in a child process made: its pid, its watchdog's, and a process it started in a host. */
  interface Made {
    readonly pid: number;
    readonly watchdog: number;
    readonly sleeper: number;
  }
  const START = `
    const hosts = await startHosts(2);
    const sleeper = hosts.hosts[0].spawn("sleep", ["300"], { stdio: "ignore" });
    const made = JSON.stringify({ pid: process.pid, watchdog: hosts.watchdog, sleeper: sleeper.pid });`;
  const HOSTS = JSON.stringify(join(ROOT, "test", "hosts.ts"));

  async function gone(made: Made): Promise<void> {
    await until(async () => (await leftovers(made.pid)).length === 0, 5000, `nothing of run ${made.pid} left`);
    await until(() => !lives(made.sleeper) && !lives(made.watchdog), 5000, `run ${made.pid}'s processes gone`);
  }

  /** Starts `node script` (TypeScript, through tsx) and resolves with the first line it prints. */
  function runScript(script: string): Promise<Made> {
    const file = join(dir, `run-${Date.now()}.mts`);
    writeFileSync(file, `import { startHosts } from ${HOSTS};\n${script}`);
    const child = spawn(process.execPath, ["--import", "tsx", file], { cwd: ROOT, stdio: ["ignore", "pipe", "inherit"] });
    return new Promise((resolve, reject) => {
      let out = "";
      child.stdout.setEncoding("utf8").on("data", (chunk: string) => {
        out += chunk;
        if (out.includes("\n")) resolve(JSON.parse(out.split("\n")[0]!) as Made);
      });
      child.once("exit", (code) => reject(new Error(`the run exited (${code}) before it said what it made`)));
    });
  }

  // The watchdog killed first: what is removed here, this process removed, on the SIGTERM vitest stops its worker with
  // (and a SIGKILL 500 ms later).
  it("a test whose body throws without stopping: the process removes it all as vitest stops it", async () => {
    const out = join(dir, "made.json");
    writeFileSync(
      join(dir, "inner.test.ts"),
      `import { writeFileSync } from "node:fs";\nimport { it } from "vitest";\nimport { startHosts } from ${HOSTS};\n` +
        `it("fails with its hosts running", async () => {${START}\n  process.kill(hosts.watchdog, "SIGKILL");\n` +
        `  writeFileSync(${JSON.stringify(out)}, made);\n` +
        `  throw new Error("a test that fails");\n});\n`,
    );
    writeFileSync(join(dir, "vitest.config.mjs"), `export default { test: { include: ["inner.test.ts"] } };\n`);
    const env = Object.fromEntries(Object.entries(process.env).filter(([key]) => !key.startsWith("VITEST")));
    const inner = await run(
      join(ROOT, "node_modules", ".bin", "vitest"),
      ["run", "--root", dir, "--config", join(dir, "vitest.config.mjs")],
      {
        cwd: dir,
        env,
        timeout: 60_000,
      },
    ).then(
      () => 0,
      (err: { code?: number }) => err.code,
    );
    expect(inner).toBe(1);
    await gone(JSON.parse(readFileSync(out, "utf8")) as Made);
  });

  it("a run killed with kill -9: its watchdog removes it all", async () => {
    const made = await runScript(`${START}\nconsole.log(made);\nsetInterval(() => {}, 1000);\n`);
    expect((await leftovers(made.pid)).length).toBeGreaterThan(0);
    process.kill(made.pid, "SIGKILL");
    await gone(made);
  });

  it("a run killed with its watchdog: the next run's sweep removes it all", async () => {
    const made = await runScript(`${START}\nconsole.log(made);\nsetInterval(() => {}, 1000);\n`);
    process.kill(made.watchdog, "SIGKILL");
    process.kill(made.pid, "SIGKILL");
    await until(() => !lives(made.pid), 5000, "the run dead");
    expect((await leftovers(made.pid)).length).toBeGreaterThan(0);
    expect(lives(made.sleeper)).toBe(true);
    expect(await sweepHosts()).toContain(made.pid);
    await gone(made);
  });
});
