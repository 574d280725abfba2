import { execFile, spawn } from "node:child_process";
import { join } from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { STATUS } from "../functions/_lib/status.ts";
import { VERB } from "../functions/_lib/provisioning.ts";
import type { TestBus } from "../runtime/testing.ts";
import { request, ROOT, SHIPPED_CONFIG, testBus, until } from "./helpers.ts";

const BIN = join(ROOT, "bin", "mesh-provisioner.mjs");
const CONFIG = SHIPPED_CONFIG;

/** The environment of the set's process: only the NATS variables given. */
const envWith = (extra: NodeJS.ProcessEnv): NodeJS.ProcessEnv => {
  const env: NodeJS.ProcessEnv = { ...process.env, HTTP_PORT: "0", ...extra };
  for (const name of ["NATS_URL", "NATS_USER", "NATS_PASSWORD", "NATS_TOKEN", "NATS_CREDS", "NATS_NKEY"]) {
    if (!(name in extra)) delete env[name];
  }
  return env;
};

interface LogLine {
  readonly level: number;
  readonly msg: string;
  readonly function?: string;
  readonly trigger?: { kind: string; subject?: string; stream?: string };
  readonly [field: string]: unknown;
}

let bus: TestBus;
beforeAll(async () => {
  bus = await testBus();
});
afterAll(async () => {
  await bus.stop();
});

describe("the logs of a running set", () => {
  it("are JSON lines on stdout, one per start, compile, refusal and error, naming function, trigger and subject, and never a credential", async () => {
    const password = bus.server.seat.password;
    const [host, port] = [new URL(bus.url).hostname, new URL(bus.url).port];
    const child = spawn("node", [BIN, "-c", CONFIG, "start"], {
      cwd: ROOT,
      env: envWith({ NATS_URL: `nats://${bus.server.seat.user}:${password}@${host}:${port}`, LOG_LEVEL: "debug" }),
    });
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (d) => (stdout += d));
    child.stderr.on("data", (d) => (stderr += d));
    const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
    const lines = () =>
      stdout
        .split("\n")
        .filter((l) => l !== "")
        .map((l) => JSON.parse(l) as LogLine);
    try {
      await until(() => lines().some((l) => l.msg === "started"), 15_000, "the set started");
      const started = lines().find((l) => l.msg === "started")!;
      expect(started.nats).toBe(`nats://***@${host}:${port}`);
      const httpUrl = started.http as string;

      const birch = await bus.connect("birch");
      expect((await request(birch, VERB, { what: "registry" })).errorCode).toBeUndefined();
      expect((await request(birch, VERB, { what: "registry", node: "two.tokens" })).errorCode).toBe(400);
      expect((await fetch(`${httpUrl}/provisioning?what=nope`)).status).toBe(400);
      const postgres = (await bus.connect("postgres")).jetstream();
      await postgres.publish(
        "postgres.provisioner.failing",
        JSON.stringify({ machine: "birch", consumer: "gitea", word: "disk full", at: new Date().toISOString() }),
      );
      await postgres.publish("postgres.provisioner.failing", JSON.stringify({ machine: "birch" }));
      await postgres.publish("postgres.provisioner.failing", "not json");
      await until(async () => (await request(birch, STATUS, {})).body.rejectedEvents === 2, 10_000, "both bad events refused");

      // The server goes and comes back: reconnecting is logged without the password too.
      await bus.restart();
      await until(async () => (await fetch(`${httpUrl}/readyz`)).status === 200, 15_000, "ready again");
      child.kill("SIGTERM");
      expect(await exited).toBe(0);

      // Every stdout line parsed above as JSON; the banner went to stderr.
      expect(stderr).toMatch(/^NATS  nats:\/\/\*\*\*@127\.0\.0\.1:\d+$/m);
      for (const text of [stdout, stderr]) {
        expect(text).not.toContain(password);
        expect(text).not.toContain(encodeURIComponent(password));
      }
      const all = lines();
      expect(all.filter((l) => l.msg === "started")).toHaveLength(1);
      expect(all.find((l) => l.msg === "registry compiled")).toMatchObject({
        function: "registry-compile",
        trigger: { kind: "start" },
        written: expect.any(Array),
      });
      // A server killed with SIGKILL may forget the last acks: a refused event may come again, under the same sequence.
      const refusals = all.filter((l) => typeof l.refused === "string");
      const seen = new Set(
        refusals.map((l) =>
          JSON.stringify([
            l.function,
            l.trigger?.kind,
            l.trigger?.subject ?? (l.trigger as { path?: string })?.path,
            l.code,
            (l.trigger as { sequence?: number })?.sequence,
          ]),
        ),
      );
      expect([...seen].map((l) => (JSON.parse(l) as unknown[]).slice(0, 4))).toEqual([
        ["provisioning", "subject", VERB, 400],
        ["provisioning", "http", "/provisioning", 400],
        ["provider-failing", "event", "postgres.provisioner.failing", 400],
        ["provider-failing", "event", "postgres.provisioner.failing", 400],
      ]);
      expect(all.find((l) => l.msg === "failing")).toMatchObject({
        function: "provider-failing",
        trigger: { kind: "event", subject: "postgres.provisioner.failing", stream: "mesh-provisioner_events" },
      });
      expect(all.map((l) => l.msg)).toEqual(
        expect.arrayContaining(["NATS disconnected; reconnecting", "NATS reconnected", "signal: stopping", "stopping", "stopped"]),
      );
    } finally {
      if (child.exitCode === null) child.kill("SIGKILL");
    }
  });

  it("never say a refused password or token, nor take a level that is not one", async () => {
    const [host, port] = [new URL(bus.url).hostname, new URL(bus.url).port];
    const start = async (env: NodeJS.ProcessEnv) =>
      promisify(execFile)("node", [BIN, "-c", CONFIG, "start"], { cwd: ROOT, env: envWith(env) }).then(
        () => ({ code: 0, stdout: "", stderr: "" }),
        (err: { code: number; stdout: string; stderr: string }) => err,
      );
    const wrong = await start({ NATS_URL: bus.url, NATS_USER: "mesh-provisioner", NATS_PASSWORD: "wrong-horse-battery" });
    expect(wrong.code).toBe(1);
    expect(wrong.stderr).toContain("the server refused the credentials");
    const token = await start({ NATS_URL: `nats://sesame-token-4711@${host}:${port}` });
    expect(token.code).toBe(1);
    expect(token.stderr).toContain(`cannot connect to nats://***@${host}:${port}`);
    for (const { stdout, stderr } of [wrong, token]) {
      for (const secret of ["wrong-horse-battery", "sesame-token-4711"]) expect(stdout + stderr).not.toContain(secret);
    }
    const level = await start({ NATS_URL: bus.url, LOG_LEVEL: "chatty" });
    expect([level.code, level.stderr.trim()]).toEqual([
      1,
      'mesh-provisioner: LOG_LEVEL: "chatty" is not a level (trace, debug, info, warn, error, fatal, silent)',
    ]);
  });
});
