import { spawn } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { createConnection } from "node:net";
import { dirname, join, relative } from "node:path";
import type { NatsConnection } from "nats";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  ConfigError,
  invoke,
  loadFunction,
  loadConfig,
  LoadError,
  openRunner,
  resolveConfig,
  ServiceError,
  start,
  type Config,
} from "../runtime/index.ts";
import { createLogger } from "../runtime/log.ts";
import { spawnNatsServer } from "../runtime/nats-server.ts";
import type { TestBus } from "../runtime/testing.ts";
import { projectConfig, request, ROOT, testBus, until, withoutFunctionFields } from "./helpers.ts";

const RUNTIME = join(ROOT, "runtime", "index.ts");
const TMP = join(ROOT, ".tmp");

let bus: TestBus;
let seat: NatsConnection;
const folders: string[] = [];

beforeAll(async () => {
  // These tests bind probe subjects no function set declares: the seat may use any subject here.
  bus = await testBus({ seatPermissions: { publish: { allow: [">"] }, subscribe: { allow: [">"] } } });
  seat = await bus.connect();
});
afterAll(async () => {
  await bus.stop();
  for (const dir of folders) rmSync(dir, { recursive: true, force: true });
});

/** A new functions folder holding `files` (name → source). */
function functionsFolder(files: Record<string, string>): string {
  mkdirSync(TMP, { recursive: true });
  const dir = mkdtempSync(join(TMP, "functions-"));
  folders.push(dir);
  for (const [name, source] of Object.entries(files)) writeFileSync(join(dir, name), source);
  return dir;
}

const header = `import { z } from "zod";\nimport { defineFunction, badInput } from ${JSON.stringify(RUNTIME)};\n`;

const ECHO = `${header}
export default defineFunction({
  description: "Echoes what it is told.",
  triggers: [{ subject: "probe.echo" }, { http: "POST /probe/echo" }],
  input: z.object({ say: z.string() }),
  handler: async (input) => ({ said: input.say }),
});
`;

/** The test bus's config with its functions folder at `dir`, and none of the project's fields. */
function configFor(dir: string): Config {
  const config = withoutFunctionFields(bus.config);
  return { ...config, functions: dir };
}

const shown = (file: string) => relative(process.cwd(), file);

describe("loading function files", () => {
  it("serves a function file dropped into the functions folder, over NATS and HTTP", async () => {
    const dir = functionsFolder({ "echo.ts": ECHO });
    const set = await start({ config: configFor(dir) });
    try {
      expect(set.functions.map((f) => f.name)).toEqual(["echo"]);
      const reply = await request(seat, "probe.echo", { say: "hello" });
      expect(reply.body).toEqual({ said: "hello" });
      const http = await fetch(`${set.httpUrl}/probe/echo`, { method: "POST", body: JSON.stringify({ say: "over http" }) });
      expect(await http.json()).toEqual({ said: "over http" });
      const bad = await fetch(`${set.httpUrl}/probe/echo`, { method: "POST", body: "{not json" });
      expect(bad.status).toBe(400);
      expect(await bad.json()).toEqual({ error: { code: 400, message: expect.stringContaining("payload is not JSON") } });
      const wrong = await request(seat, "probe.echo", { say: 3 });
      expect(wrong.errorCode).toBe(400);
      expect(wrong.errorText).toBe("say: Invalid input: expected string, received number");
    } finally {
      await set.stop();
    }
  });

  it("answers an HTTP trigger with the status a handler gives with WithStatus, and NATS with the value alone", async () => {
    const withStatus = `import { defineFunction, JsonText, WithStatus } from ${JSON.stringify(RUNTIME)};
export default defineFunction({
  description: "Says it took the request, with a status of its own.",
  triggers: [{ subject: "probe.taken" }, { http: "GET /probe/taken" }, { http: "GET /probe/taken-text" }, { http: "GET /probe/odd" }],
  handler: async (_input, ctx) => {
    const path = ctx.trigger.kind === "http" ? ctx.trigger.path : "";
    if (path === "/probe/odd") return new WithStatus(99, {});
    return path === "/probe/taken-text" ? new WithStatus(202, new JsonText('{"taken":"as text"}')) : new WithStatus(202, { taken: true });
  },
});
`;
    const set = await start({ config: configFor(functionsFolder({ "taken.ts": withStatus })) });
    try {
      const taken = await fetch(`${set.httpUrl}/probe/taken`);
      expect([taken.status, taken.headers.get("content-type"), await taken.json()]).toEqual([202, "application/json", { taken: true }]);
      const text = await fetch(`${set.httpUrl}/probe/taken-text`);
      expect([text.status, await text.text()]).toEqual([202, '{"taken":"as text"}']);
      const reply = await request(seat, "probe.taken", {});
      expect([reply.errorCode, reply.body]).toEqual([undefined, { taken: true }]);
      const odd = await fetch(`${set.httpUrl}/probe/odd`);
      expect([odd.status, await odd.json()]).toEqual([
        500,
        { error: { code: 500, message: "taken failed: an HTTP status must be a whole number from 200 to 599, not 99" } },
      ]);
    } finally {
      await set.stop();
    }
  });

  it("refuses two functions on one subject or one route, naming both files", async () => {
    const dir = functionsFolder({ "a.ts": ECHO, "b.ts": ECHO.replace("probe.echo", "probe.other") });
    const failure = await start({ config: configFor(dir) }).catch((e: unknown) => e);
    expect(failure).toBeInstanceOf(LoadError);
    expect((failure as LoadError).problems).toEqual([
      `route POST /probe/echo is bound more than once: by ${shown(join(dir, "a.ts"))} and ${shown(join(dir, "b.ts"))}`,
    ]);
    const same = functionsFolder({ "one.ts": ECHO, "two.ts": ECHO.replace("POST /probe/echo", "POST /probe/two") });
    const twice = await start({ config: configFor(same) }).catch((e: unknown) => e);
    expect((twice as LoadError).problems).toEqual([
      `subject probe.echo is bound more than once: by ${shown(join(same, "one.ts"))} and ${shown(join(same, "two.ts"))}`,
    ]);
  });

  it("refuses event triggers whose subjects cross on one stream, and binds one that covers another", async () => {
    const eventFn = (event: string) => `${header}
export default defineFunction({
  description: "Hears ${event}.",
  triggers: [{ event: ${JSON.stringify(event)}, stream: "events" }],
  handler: () => {},
});
`;
    const crossing = functionsFolder({ "a.ts": eventFn("probe.said.*.x"), "b.ts": eventFn("probe.said.alder.*") });
    const failure = await start({ config: configFor(crossing) }).catch((e: unknown) => e);
    expect(failure).toBeInstanceOf(LoadError);
    expect((failure as LoadError).problems).toEqual([
      `events probe.said.*.x and probe.said.alder.* overlap on stream events, and neither covers the other: one stream cannot capture both: by ${shown(join(crossing, "a.ts"))} and ${shown(join(crossing, "b.ts"))}`,
    ]);
    // One covering the other: the stream captures the wider alone, and both are bound.
    const covering = functionsFolder({ "wide.ts": eventFn("probe.heard.*"), "narrow.ts": eventFn("probe.heard.alder") });
    const set = await start({ config: configFor(covering) });
    try {
      const { config } = await (await seat.jetstreamManager()).streams.info(bus.config.streams.events!.stream);
      expect(config.subjects).toContain("probe.heard.*");
      expect(config.subjects).not.toContain("probe.heard.alder");
    } finally {
      await set.stop();
    }
  });

  it("refuses a file that is not a valid function, naming the file and the problem", async () => {
    const dir = functionsFolder({
      "good.ts": ECHO,
      "no-handler.ts": `${header}export default defineFunction({ description: "x", triggers: [{ subject: "a.b" }] } as any);\n`,
      "no-default.ts": `${header}export const x = 1;\n`,
      "broken.ts": `${header}export default defineFunction({ description: "x", triggers: [{ subject: "a.*" }], handler: () => 1 });\n`,
      "bad-cron.ts": `${header}export default defineFunction({ description: "x", triggers: [{ cron: "61 * * * *" }], handler: () => 1 });\n`,
      "cron-input.ts": `${header}export default defineFunction({ description: "x", triggers: [{ cron: "0 * * * *" }], input: z.object({ n: z.number() }), handler: () => 1 });\n`,
      "unknown-bucket.ts": `${header}export default defineFunction({ description: "x", triggers: [{ subject: "u.b" }], access: { reads: ["nope"] }, handler: () => 1 });\n`,
      "unknown-trigger.ts": `${header}export default defineFunction({ description: "x", triggers: [{ topic: "t" } as any], handler: () => 1 });\n`,
      "_helper.ts": "this is not even TypeScript, and it is not a function file",
      "throws-null.ts": "throw null;\n",
    });
    const failure = await start({ config: configFor(dir) }).catch((e: unknown) => e);
    expect(failure).toBeInstanceOf(LoadError);
    const f = (name: string) => shown(join(dir, name));
    expect((failure as LoadError).problems).toEqual([
      expect.stringMatching(new RegExp(`^${f("bad-cron.ts")}: triggers\\.0\\.cron: `)),
      `${f("broken.ts")}: not a valid function: triggers.0.subject: must be a NATS subject without wildcards or spaces`,
      `${f("cron-input.ts")}: triggers.0: a cron run's input is {}, which the input schema refuses`,
      `${f("no-default.ts")}: has no default export; export default defineFunction({...})`,
      `${f("no-handler.ts")}: not a valid function: handler: must be a function (input, ctx) => answer`,
      // What it throws as it loads is said, whatever it is.
      `${f("throws-null.ts")}: cannot be loaded: null`,
      `${f("unknown-trigger.ts")}: not a valid function: triggers.0: must be one of { subject }, { event, stream? }, { cron, onStart? }, { http: "METHOD /path" }`,
      // checks of the set against the config come after the checks of each file
      `${f("unknown-bucket.ts")}: access.reads: no bucket "nope" in the config (it has registry, needs, applied, collect, failing, assignments, rotations, presence, checks)`,
    ]);
  });
});

describe("what a function gets", () => {
  it("hands a function only the buckets it declared, read handles without writes", async () => {
    const dir = functionsFolder({
      "probe.ts": `${header}
export default defineFunction({
  description: "Says what ctx holds.",
  triggers: [{ subject: "probe.ctx" }],
  access: { reads: ["needs"], writes: ["registry"], publishes: ["probe.out.*"] },
  handler: async (_input, ctx) => {
    const refused = async (act: () => unknown) => {
      try {
        await act();
        return "allowed";
      } catch (err) {
        return (err as Error).name + ": " + (err as Error).message;
      }
    };
    return {
      buckets: Object.keys(ctx.buckets).sort(),
      putNeeds: await refused(() => (ctx.buckets.needs as any).put("alder.x.config.y", "{}")),
      readFailing: await refused(() => (ctx.buckets as any).failing.list(">")),
      publishOut: await refused(() => ctx.publish("probe.out.one", "hi")),
      publishElsewhere: await refused(() => ctx.publish("probe.elsewhere", "hi")),
      registryCanPut: typeof ctx.buckets.registry.put,
      maxPayload: ctx.limits.maxPayload,
      trigger: ctx.trigger,
    };
  },
});
`,
      "bare.ts": `${header}
export default defineFunction({
  description: "Declares nothing.",
  triggers: [{ subject: "probe.bare" }],
  handler: async (_input, ctx) => ({ buckets: Object.keys(ctx.buckets) }),
});
`,
    });
    const set = await start({ config: configFor(dir) });
    try {
      const out = seat.subscribe("probe.out.*", { max: 1 });
      expect((await request(seat, "probe.ctx", {})).body).toEqual({
        buckets: ["needs", "registry"],
        putNeeds:
          "AccessError: function probe cannot put in bucket mesh-provisioner_needs: it declares the bucket in access.reads, not access.writes",
        readFailing: "AccessError: function probe uses bucket failing, which its access does not declare",
        publishOut: "allowed",
        publishElsewhere: "AccessError: function probe publishes probe.elsewhere, which its access.publishes (probe.out.*) does not name",
        registryCanPut: "function",
        maxPayload: 1024 * 1024,
        trigger: { kind: "subject", subject: "probe.ctx" },
      });
      for await (const m of out) expect([m.subject, m.string()]).toEqual(["probe.out.one", "hi"]);
      expect((await request(seat, "probe.bare", {})).body).toEqual({ buckets: [] });
    } finally {
      await set.stop();
    }
  });

  it("answers a throw with a 500, a refusal with its code, and keeps serving", async () => {
    const dir = functionsFolder({
      "moody.ts": `${header}
export default defineFunction({
  description: "Fails on demand.",
  triggers: [{ subject: "probe.moody" }, { http: "GET /probe/moody" }],
  input: z.object({ mood: z.enum(["fine", "refuse", "throw", "reject", "string", "nothing", "bigint", "cycle", "function"]) }),
  handler: async ({ mood }) => {
    if (mood === "refuse") throw badInput("not in that mood");
    if (mood === "throw") throw new Error("boom");
    if (mood === "reject") return Promise.reject(new Error("async boom"));
    if (mood === "string") throw "grumpy";
    if (mood === "nothing") throw undefined;
    if (mood === "bigint") return { n: 10n };
    if (mood === "cycle") {
      const cycle: Record<string, unknown> = {};
      cycle.self = cycle;
      return cycle;
    }
    if (mood === "function") return () => "hi";
    return { mood };
  },
});
`,
    });
    const set = await start({ config: configFor(dir) });
    try {
      const refused = await request(seat, "probe.moody", { mood: "refuse" });
      expect([refused.errorCode, refused.body]).toEqual([400, { error: { code: 400, message: "not in that mood" } }]);
      const thrown = await request(seat, "probe.moody", { mood: "throw" });
      expect([thrown.errorCode, thrown.body]).toEqual([500, { error: { code: 500, message: "moody failed: boom" } }]);
      const rejected = await request(seat, "probe.moody", { mood: "reject" });
      expect(rejected.errorCode).toBe(500);
      // A value thrown that is no Error, and an answer JSON cannot write: a 500 saying so, over NATS and HTTP.
      const said = {
        string: "moody failed: grumpy",
        nothing: "moody failed: undefined",
        bigint: "moody failed: its answer is no JSON value: Do not know how to serialize a BigInt",
        cycle: expect.stringMatching(/^moody failed: its answer is no JSON value: Converting circular structure to JSON/),
        function: "moody failed: its answer is no JSON value: a function is no JSON value",
      };
      const errors = async () =>
        Number(
          /\nfunction_run_errors_total\{function="moody",trigger="http",code="500"\} (\d+)\n/.exec(
            await (await fetch(`${set.httpUrl}/metrics`)).text(),
          )?.[1] ?? 0,
        );
      const before = await errors();
      for (const [mood, message] of Object.entries(said)) {
        const nats = await request(seat, "probe.moody", { mood });
        expect([nats.errorCode, nats.body]).toEqual([500, { error: { code: 500, message } }]);
        const http = await fetch(`${set.httpUrl}/probe/moody?mood=${mood}`);
        expect([http.status, await http.json()]).toEqual([500, { error: { code: 500, message } }]);
      }
      expect(await errors()).toBe(before + 5);
      expect((await request(seat, "probe.moody", { mood: "fine" })).body).toEqual({ mood: "fine" });
    } finally {
      await set.stop();
    }
  });

  it("runs cron functions on schedule, never two runs of one at once", async () => {
    const dir = functionsFolder({
      "ticker.ts": `${header}
const runs: { start: number; end: number }[] = ((globalThis as any).__tickerRuns = []);
export default defineFunction({
  description: "Ticks every second, taking 1.5 s.",
  triggers: [{ cron: "* * * * * *" }],
  handler: async () => {
    const start = Date.now();
    await new Promise((r) => setTimeout(r, 1500));
    runs.push({ start, end: Date.now() });
  },
});
`,
    });
    const set = await start({ config: configFor(dir) });
    await new Promise((r) => setTimeout(r, 5000));
    await set.stop();
    const runs = (globalThis as any).__tickerRuns as { start: number; end: number }[];
    expect(runs.length).toBeGreaterThanOrEqual(2);
    for (let i = 1; i < runs.length; i++) expect(runs[i]!.start).toBeGreaterThanOrEqual(runs[i - 1]!.end);
  });

  it("answers a request in hand when it stops", async () => {
    const dir = functionsFolder({
      "slow.ts": `${header}
export default defineFunction({
  description: "Answers after a while.",
  triggers: [{ subject: "probe.slow" }],
  handler: async () => {
    await new Promise((r) => setTimeout(r, 800));
    return { late: true };
  },
});
`,
    });
    const set = await start({ config: configFor(dir) });
    const asked = request(seat, "probe.slow", {});
    await new Promise((r) => setTimeout(r, 200));
    const stopped = set.stop();
    expect((await asked).body).toEqual({ late: true });
    await stopped;
    await expect(seat.request("probe.slow", "{}", { timeout: 1000 })).rejects.toThrow(/503|no responders/i);
  });

  it("stops within its grace though an HTTP client never finishes its request", async () => {
    const dir = functionsFolder({ "echo.ts": ECHO });
    const set = await start({ config: configFor(dir), stopGraceMs: 500, log: createLogger({ LOG_LEVEL: "silent" }) });
    const { port } = new URL(set.httpUrl);
    const socket = createConnection({ host: "127.0.0.1", port: Number(port) });
    await new Promise((resolve) => socket.once("connect", resolve));
    socket.write("POST /probe/echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{");
    const closed = new Promise((resolve) => socket.once("close", resolve));
    const began = performance.now();
    await set.stop();
    expect(performance.now() - began).toBeLessThan(5000);
    await closed;
  });

  it("runs each scheduled time once across two replicas of the set", async () => {
    const dir = functionsFolder({
      "twice.ts": `${header}
export default defineFunction({
  description: "Notes each run's scheduled time, every second.",
  triggers: [{ cron: "* * * * * *" }],
  handler: async (_input, ctx) => {
    if (ctx.trigger.kind !== "cron") throw new Error("not cron");
    ((globalThis as any).__twiceRuns ??= []).push(ctx.trigger.scheduledAt.getTime());
  },
});
`,
    });
    const first = await start({ config: configFor(dir) });
    const second = await start({ config: configFor(dir) });
    await new Promise((r) => setTimeout(r, 4500));
    await Promise.all([first.stop(), second.stop()]);
    const runs = (globalThis as any).__twiceRuns as number[];
    expect(runs.length).toBeGreaterThanOrEqual(3);
    expect(new Set(runs).size).toBe(runs.length);
    expect(runs.every((at) => at % 1000 === 0)).toBe(true);
  });

  it("never runs a scheduled time twice when a replica stalls (SIGSTOP) across its tick", async () => {
    const dir = functionsFolder({
      "ticks.ts": `${header}
export default defineFunction({
  description: "Says each run's scheduled time and when it ran, every second.",
  triggers: [{ cron: "* * * * * *" }],
  access: { publishes: ["probe.ticks"] },
  handler: async (_input, ctx) => {
    if (ctx.trigger.kind !== "cron") throw new Error("not cron");
    ctx.publish("probe.ticks", JSON.stringify({ at: ctx.trigger.scheduledAt.getTime(), ranAt: Date.now(), pid: process.pid }));
  },
});
`,
    });
    const config = configFor(dir);
    const configFile = join(dir, "_config.ts");
    const { root: _root, file: _file, ...raw } = config;
    writeFileSync(configFile, `export default ${JSON.stringify(raw)};\n`);
    const runs: { at: number; ranAt: number; pid: number }[] = [];
    const sub = seat.subscribe("probe.ticks", { callback: (_err, msg) => runs.push(msg.json()) });
    const inProcess = await start({ config });
    const child = spawn("node", [join(ROOT, "bin", "mesh-provisioner.mjs"), "-c", configFile, "start"], {
      cwd: ROOT,
      env: { ...process.env, LOG_LEVEL: "silent" },
      stdio: "ignore",
    });
    try {
      await until(() => runs.some((r) => r.pid === child.pid), 30_000, "the child replica runs ticks");
      for (let stall = 0; stall < 3; stall++) {
        // Stopped 200 ms before a tick, for 800 ms: it wakes 600 ms after the tick it was due to run.
        await new Promise((r) => setTimeout(r, 1000 - (Date.now() % 1000) + 800));
        child.kill("SIGSTOP");
        await new Promise((r) => setTimeout(r, 800));
        child.kill("SIGCONT");
        await new Promise((r) => setTimeout(r, 1200));
      }
    } finally {
      child.kill("SIGTERM");
      await new Promise((r) => child.once("exit", r));
      await inProcess.stop();
      sub.unsubscribe();
    }
    const times = runs.map((r) => r.at);
    expect(runs.length).toBeGreaterThanOrEqual(6);
    expect(new Set(times).size).toBe(times.length);
    // Each run is named by the time it was due: never one that had not come yet.
    expect(runs.filter((r) => r.ranAt < r.at)).toEqual([]);
  }, 60_000);

  it("invokes one function on its own with the context the runtime builds", async () => {
    const config = { ...(await projectConfig()), ...bus.config };
    const runner = await openRunner({ nc: seat, config, log: createLogger({ LOG_LEVEL: "silent" }) });
    const compile = await loadFunction(join(ROOT, "functions", "registry-compile.ts"));
    const first = (await invoke(runner, compile)) as { written: string[] };
    expect(first.written.length + ((first as any).unchanged as number)).toBe(13);
    const provisioning = await loadFunction(join(ROOT, "functions", "provisioning.ts"));
    const answer = await invoke(runner, provisioning, { what: "registry", kind: "port" });
    expect(answer).toMatchObject({ what: "registry", entries: [{ key: "port", value: { module: "mesh-controller" } }], outOfShape: [] });
    const refused = await invoke(runner, provisioning, { what: "registry", node: "alder" }).catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(ServiceError);
    expect((refused as ServiceError).code).toBe(400);
  });
});

describe("what a function may declare", () => {
  it("refuses subjects of the server or of replies, wildcards that reach them, and writes to node buckets", async () => {
    const fn = (name: string, body: string) => [
      name,
      `${header}export default defineFunction({ description: "x", ${body}, handler: () => 1 });\n`,
    ];
    const dir = functionsFolder(
      Object.fromEntries([
        fn("purge.ts", `triggers: [{ subject: "$JS.API.STREAM.PURGE.KV_x" }]`),
        fn("everything.ts", `triggers: [{ event: ">" }]`),
        fn("inbox.ts", `triggers: [{ event: "_INBOX.>" }]`),
        fn("nearly-everything.ts", `triggers: [{ event: "*.>" }, { event: "*.*.*" }, { event: "*.provisioner.failing" }]`),
        fn("wide.ts", `triggers: [{ subject: "w.x" }], access: { publishes: [">", "*.x", "$KV.b.>", "ok.>"] }`),
        fn("writer.ts", `triggers: [{ subject: "w.y" }], access: { writes: ["needs"] }`),
        fn("health.ts", `triggers: [{ http: "GET /readyz" }]`),
      ]),
    );
    const failure = await start({ config: configFor(dir) }).catch((e: unknown) => e);
    const f = (name: string) => shown(join(dir, name));
    const RESERVED = "must not start with $ (the server's subjects) or _INBOX (replies)";
    const ONLY_WILDCARDS = "must hold a token besides wildcards: `*.>` is nearly every message of the bus, the server's own among them";
    expect((failure as LoadError).problems).toEqual([
      `${f("everything.ts")}: not a valid function: triggers.0.event: must not be > alone: that is every message of the bus`,
      `${f("inbox.ts")}: not a valid function: triggers.0.event: ${RESERVED}`,
      `${f("nearly-everything.ts")}: not a valid function: triggers.0.event: ${ONLY_WILDCARDS}; triggers.1.event: ${ONLY_WILDCARDS}`,
      `${f("purge.ts")}: not a valid function: triggers.0.subject: ${RESERVED}`,
      `${f("wide.ts")}: not a valid function: access.publishes.0: must start with a token, not a wildcard (it would reach the server's subjects); access.publishes.1: must start with a token, not a wildcard (it would reach the server's subjects); access.publishes.2: ${RESERVED}`,
      `${f("health.ts")}: triggers.0.http: /readyz is the runtime's own (/healthz, /readyz, /metrics)`,
      `${f("writer.ts")}: access.writes: bucket "needs" is written by nodes only (docs/buckets.md §2), never by the seat`,
    ]);
  });
});

describe("metrics a function declares", () => {
  const scrape = async (httpUrl: string) => (await fetch(`${httpUrl}/metrics`)).text();
  const sample = (text: string, name: string, labels = "") =>
    Number(new RegExp(`^${name}${labels === "" ? "" : `\\{${labels}\\}`} (\\S+)$`, "m").exec(text)?.[1]);

  it("serves a function's counters and gauges on GET /metrics, a gauge's collect read at each scrape", async () => {
    const dir = functionsFolder({
      "tally.ts": `${header}
let scrapes = 0;
export default defineFunction({
  description: "Counts what it is told.",
  triggers: [{ subject: "probe.tally" }],
  input: z.object({ color: z.string(), by: z.number() }),
  metrics: {
    probe_tallied_total: { type: "counter", help: "Tallies", labels: ["color"] },
    probe_level: { type: "gauge", help: "Level" },
    probe_collected: { type: "gauge", help: "Read at each scrape", collect: () => { if (++scrapes === 3) throw new Error("no reading"); return scrapes * 10; } },
    probe_stuck: { type: "gauge", help: "Gives no value the second time", collect: () => (scrapes === 2 ? new Promise<number>(() => {}) : 7) },
    probe_thrown: { type: "gauge", help: "Throws what is no error the third time", collect: () => { if (scrapes === 3) throw null; return 5; } },
  },
  handler: (input, ctx) => {
    ctx.metrics.probe_tallied_total.inc(input.by, { color: input.color });
    ctx.metrics.probe_level.set(input.by);
    return { ok: true };
  },
});
`,
    });
    const set = await start({ config: configFor(dir), log: createLogger({ LOG_LEVEL: "silent" }) });
    try {
      const before = await scrape(set.httpUrl);
      expect(before).toMatch(/^# HELP probe_tallied_total Tallies$/m);
      expect(before).toMatch(/^# TYPE probe_level gauge$/m);
      expect(sample(before, "probe_collected")).toBe(10);
      await request(seat, "probe.tally", { color: "red", by: 2 });
      await request(seat, "probe.tally", { color: "red", by: 3 });
      await request(seat, "probe.tally", { color: "blue", by: 1 });
      const after = await scrape(set.httpUrl);
      expect(sample(after, "probe_tallied_total", 'color="red"')).toBe(5);
      expect(sample(after, "probe_tallied_total", 'color="blue"')).toBe(1);
      expect(sample(after, "probe_level")).toBe(1);
      expect(sample(after, "probe_collected")).toBe(20);
      // The second scrape's collect of probe_stuck never ended: the scrape answered anyway, with its last value.
      expect(sample(after, "probe_stuck")).toBe(7);
      const nan = await request(seat, "probe.tally", { color: "red", by: Number.NaN });
      expect(nan.errorCode).toBe(400); // JSON has no NaN: it arrives as null
      const negative = await request(seat, "probe.tally", { color: "red", by: -1 });
      expect([negative.errorCode, negative.errorText]).toEqual([
        500,
        "tally failed: metric probe_tallied_total: inc takes a finite number ≥ 0, not -1",
      ]);
      // A collect that throws (an error, or what is none): the scrape still answers, and the gauge keeps its last value.
      const failed = await fetch(`${set.httpUrl}/metrics`);
      expect(failed.status).toBe(200);
      const failedText = await failed.text();
      expect(sample(failedText, "probe_collected")).toBe(20);
      expect(sample(failedText, "probe_thrown")).toBe(5);
      expect(sample(await scrape(set.httpUrl), "probe_collected")).toBe(40);
    } finally {
      await set.stop();
    }
  });

  it("refuses a metric declared twice, one named as the runtime's, and bad names or labels", async () => {
    const fn = (name: string, metrics: string) => [
      name,
      `${header}export default defineFunction({ description: "x", triggers: [{ subject: "m.${name.slice(0, -3)}" }], metrics: ${metrics}, handler: () => 1 });\n`,
    ];
    const dir = functionsFolder(
      Object.fromEntries([
        fn("one.ts", `{ probe_total: { type: "counter", help: "h" } }`),
        fn("two.ts", `{ probe_total: { type: "gauge", help: "h" } }`),
        fn("own.ts", `{ function_run_seconds_bucket: { type: "counter", help: "h" } }`),
        fn("bad-name.ts", `{ "probe-total": { type: "counter", help: "h" } }`),
        fn(
          "bad-labels.ts",
          `{ probe_a: { type: "counter", help: "h", labels: ["__x"] }, probe_b: { type: "gauge", help: "h", collect: 1 }, probe_c: { type: "counter", help: "h", labels: ["a", "a"] } }`,
        ),
        fn("object-name.ts", `{ constructor: { type: "counter", help: "h" } }`),
      ]),
    );
    const failure = await start({ config: configFor(dir) }).catch((e: unknown) => e);
    const f = (name: string) => shown(join(dir, name));
    expect((failure as LoadError).problems).toEqual([
      `${f("bad-labels.ts")}: not a valid function: metrics.probe_a.labels.0: must not start with __ (Prometheus's own); metrics.probe_b.collect: must be a function (ctx) => number or samples; metrics.probe_c.labels: must not name a label twice`,
      `${f("bad-name.ts")}: not a valid function: metrics.probe-total: must be a Prometheus metric name: letters, digits, _ and :, not starting with a digit`,
      `${f("object-name.ts")}: not a valid function: metrics.constructor: must not start with __ nor be a name every JavaScript object has`,
      `${f("own.ts")}: metrics.function_run_seconds_bucket: the runtime's own metric (or one of its samples)`,
      `metric probe_total is declared more than once: by ${f("one.ts")} and ${f("two.ts")}`,
    ]);
  });
});

describe("the config", () => {
  const FILE = join(ROOT, "wrangler-free.config.ts");
  const base = { seat: "s", buckets: { b: { bucket: "b", writtenBy: "seat" } } };
  const refusal = (raw: unknown, env: NodeJS.ProcessEnv = {}) => {
    try {
      resolveConfig(raw, FILE, env);
      return "accepted";
    } catch (err) {
      expect(err).toBeInstanceOf(ConfigError);
      return (err as Error).message;
    }
  };

  it("refuses a bad field, naming it", () => {
    expect(refusal({ ...base, http: { port: "80" } })).toBe(
      "wrangler-free.config.ts: http.port: Invalid input: expected number, received string",
    );
    expect(refusal({ ...base, buckets: { b: { bucket: "b", writtenBy: "everyone" } } })).toContain(
      "wrangler-free.config.ts: buckets.b.writtenBy: Invalid option",
    );
    expect(refusal({ buckets: {} })).toBe("wrangler-free.config.ts: seat: Invalid input: expected string, received undefined");
    expect(refusal(base, { HTTP_PORT: "eighty" })).toContain("environment: HTTP_PORT: ");
  });

  it("refuses a config file with no default export, saying so", async () => {
    const file = join(mkdtempSync(join(TMP, "config-")), "wrangler-free.config.ts");
    folders.push(dirname(file));
    writeFileSync(file, "export const seat = 'mesh-provisioner';\n");
    await expect(loadConfig(file)).rejects.toThrow(`${file}: has no default export; export default defineConfig({...})`);
    // What a config file throws as it loads is said, whatever it is.
    const throwing = join(dirname(file), "throwing.config.ts");
    writeFileSync(throwing, "throw undefined;\n");
    await expect(loadConfig(throwing)).rejects.toThrow(`${throwing}: cannot be loaded: undefined`);
  });

  it("refuses two names of one bucket, the runtime's own buckets included", () => {
    expect(
      refusal({
        ...base,
        buckets: { failing: { bucket: "shared", writtenBy: "seat" }, collect: { bucket: "shared", writtenBy: "nodes" } },
      }),
    ).toBe("wrangler-free.config.ts: bucket shared is named by buckets.failing and buckets.collect: each bucket has one name");
    expect(refusal({ ...base, seat: "s", buckets: { failing: { bucket: "s_runtime", writtenBy: "seat" } } })).toBe(
      "wrangler-free.config.ts: bucket s_runtime is named by buckets.failing and the runtime's records: each bucket has one name",
    );
  });

  it("takes replicas from the config, a bucket's or stream's own, or NATS_REPLICAS", () => {
    const config = resolveConfig({ ...base, buckets: { b: { bucket: "b", writtenBy: "seat", replicas: 5 } } }, FILE, {
      NATS_REPLICAS: "3",
    });
    expect([config.replicas, config.buckets.b!.replicas]).toEqual([3, 5]);
    expect(resolveConfig(base, FILE, {}).replicas).toBe(1);
    expect(refusal(base, { NATS_REPLICAS: "2" })).toBe("environment: NATS_REPLICAS: must be 1, 3 or 5");
  });

  it("refuses to start on a bucket that exists with other settings, saying each difference and leaving it as it is", async () => {
    const dir = functionsFolder({ "echo.ts": ECHO });
    const probe = (settings: Record<string, unknown>): Config => ({
      ...configFor(dir),
      buckets: { probe: { bucket: "probe_settings", writtenBy: "seat", readBy: [], history: 1, ...settings } },
    });
    await (await start({ config: probe({}), log: createLogger({ LOG_LEVEL: "silent" }) })).stop();
    const changed = probe({ history: 5, maxAgeSeconds: 3600 });
    const withNew = {
      ...changed,
      buckets: { ...changed.buckets, fresh: { bucket: "probe_fresh", writtenBy: "seat" as const, readBy: [], history: 1 } },
    };
    const failure = await start({ config: withNew, log: createLogger({ LOG_LEVEL: "silent" }) }).catch((e: unknown) => e);
    expect((failure as Error).message).toBe(
      "bucket probe_settings exists with other settings than the config: history 1 (the config says 5), maxAgeSeconds none (the config says 3600); " +
        "it is left as it is: edit it (nats stream edit KV_probe_settings --max-msgs-per-subject 5 --max-age 3600s) or make the config say what it has",
    );
    const jsm = await seat.jetstreamManager();
    const info = await jsm.streams.info("KV_probe_settings");
    expect([info.config.max_msgs_per_subject, info.config.max_age]).toEqual([1, 0]);
    // Nothing was created either: a refused start leaves the bus as it found it.
    await expect(jsm.streams.info("KV_probe_fresh")).rejects.toThrow("stream not found");
  });

  it("takes NATS_URL, credentials and HTTP from the environment over the file", () => {
    const config = resolveConfig(base, FILE, {
      NATS_URL: "nats://a:4222, nats://b:4222",
      NATS_USER: "u",
      NATS_PASSWORD: "p",
      HTTP_PORT: "9000",
    });
    expect(config.nats).toEqual({ servers: ["nats://a:4222", "nats://b:4222"], user: "u", password: "p" });
    expect(config.http).toEqual({ host: "127.0.0.1", port: 9000 });
  });

  it("says that JetStream is off, and which setting turns it on, on a server without it", async () => {
    const dir = functionsFolder({ "echo.ts": ECHO });
    const server = await spawnNatsServer({
      conf: { authorization: { users: [{ user: "seat", password: "pw" }] } },
      confFile: join(dir, "no-jetstream.conf"),
    });
    try {
      const failure = await start({ config: { ...configFor(dir), nats: { servers: [server.url], user: "seat", password: "pw" } } }).catch(
        (e: unknown) => e,
      );
      expect((failure as Error).message).toMatch(/^JetStream is off on .* for the seat's account: start nats-server with --jetstream/);
    } finally {
      await server.stop();
    }
  });

  it("names streams.<name>.maxBytes when the server cannot reserve the events stream", async () => {
    const config = await projectConfig();
    const dir = mkdtempSync(join(TMP, "small-store-"));
    folders.push(dir);
    const server = await spawnNatsServer({
      conf: {
        jetstream: { store_dir: join(dir, "store"), max_file_store: 64 * 1024 * 1024 },
        authorization: { users: [{ user: "seat", password: "pw" }] },
      },
      confFile: join(dir, "small.conf"),
    });
    try {
      const failure = await start({
        config: {
          ...config,
          nats: { servers: [server.url], user: "seat", password: "pw" },
          http: { host: "127.0.0.1", port: 0 },
          state: join(dir, "state"),
        },
      }).catch((e: unknown) => e);
      expect((failure as Error).message).toMatch(
        /^cannot assert stream mesh-provisioner_events .*\(the config's streams\.events\.maxBytes asks the server to reserve 1073741824 bytes: lower it, or give JetStream more storage\)$/,
      );
    } finally {
      await server.stop();
    }
  });

  it("refuses a top-level field no function reads", async () => {
    const dir = functionsFolder({ "echo.ts": ECHO });
    const failure = await start({ config: { ...configFor(dir), registy: [] } as Config }).catch((e: unknown) => e);
    expect((failure as LoadError).problems).toEqual([
      "wrangler-free.config.ts: registy: unknown field (neither the runtime nor any function reads it)",
    ]);
  });
});
