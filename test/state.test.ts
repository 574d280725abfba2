import { execFile } from "node:child_process";
import { join } from "node:path";
import { promisify } from "node:util";
import fc from "fast-check";
import type { KV, NatsConnection } from "nats";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Status } from "../functions/_lib/status.ts";
import { currentModel, modelOf, snapshotsOf, type Model, type ModuleState } from "../functions/_lib/state.ts";
import type { Config, Running } from "../runtime/index.ts";
import type { TestBus } from "../runtime/testing.ts";
import { nanosOf } from "../runtime/buckets.ts";
import { request, ROOT, startSet, testBus, until } from "./helpers.ts";

const GRACE_SECONDS = 4;
let bus: TestBus;
let set: Running;
let seat: NatsConnection;
let controller: KV;
const nodes: Record<string, { needs: KV; applied: KV }> = {};

beforeAll(async () => {
  bus = await testBus({ nodes: ["alder", "birch", "cedar", "dogwood", "elm", "fir"] });
  set = await startSet(bus, { provisioning: { graceSeconds: GRACE_SECONDS } } as Partial<Config>);
  seat = await bus.connect();
  controller = await bus.kv("assignments", "mesh-controller");
  for (const node of ["alder", "birch", "cedar", "dogwood", "elm", "fir"]) {
    nodes[node] = { needs: await bus.kv("needs", node), applied: await bus.kv("applied", node) };
  }
});
afterAll(async () => {
  await set.stop();
  await bus.stop();
});

const ask = async (narrowing: Record<string, unknown>) => {
  const reply = await request(seat, "mesh-provisioner.provisioning", { what: "state", ...narrowing });
  return reply.body as { entries: ModuleState[]; outOfShape: { key: string; reason: string }[]; next?: string; error?: unknown };
};
const one = async (node: string, module: string) => (await ask({ node, module })).entries[0];
/** The server's time of the last write of `key`. */
const written = async (kv: KV, key: string) => (await kv.get(key))!.created.toISOString();
const assign = (node: string, module: string) => controller.put(`${node}.${module}`, JSON.stringify({ plan: { module } }));
const need = (node: string, module: string, kindName: string, value: unknown = { v: 1 }) =>
  nodes[node]!.needs.put(`${node}.${module}.${kindName}`, JSON.stringify(value));
const apply = (node: string, module: string, record: unknown = {}) => nodes[node]!.applied.put(`${node}.${module}`, JSON.stringify(record));

describe("the state of a module", () => {
  it("goes never-ran → pending → applied → pending (a new need) → applied, each since the server's time of its write", async () => {
    await assign("alder", "gitea");
    expect(await one("alder", "gitea")).toMatchObject({
      state: "never-ran",
      since: await written(controller, "alder.gitea"),
      assigned: true,
      needs: 0,
      appliedAt: null,
      conditions: [],
    });
    await need("alder", "gitea", "config.db_url");
    const firstNeed = await written(nodes.alder!.needs, "alder.gitea.config.db_url");
    await need("alder", "gitea", "secret.admin_password");
    expect(await one("alder", "gitea")).toMatchObject({ state: "pending", since: firstNeed, needs: 2 });
    await apply("alder", "gitea");
    const appliedAt = await written(nodes.alder!.applied, "alder.gitea");
    expect(await one("alder", "gitea")).toMatchObject({ state: "applied", since: appliedAt, appliedAt, needs: 2, conditions: [] });
    await need("alder", "gitea", "port.http");
    expect(await one("alder", "gitea")).toMatchObject({
      state: "pending",
      since: await written(nodes.alder!.needs, "alder.gitea.port.http"),
      appliedAt,
    });
    await apply("alder", "gitea", { revisions: { "postgres/gitea": "7" } });
    expect(await one("alder", "gitea")).toMatchObject({ state: "applied", since: await written(nodes.alder!.applied, "alder.gitea") });
  });

  it("goes applied → failed (with its error) → applied", async () => {
    await assign("alder", "caddy");
    await need("alder", "caddy", "port.https");
    await apply("alder", "caddy");
    expect((await one("alder", "caddy"))!.state).toBe("applied");
    await apply("alder", "caddy", { error: "port 443 is taken" });
    expect(await one("alder", "caddy")).toMatchObject({
      state: "failed",
      error: "port 443 is taken",
      since: await written(nodes.alder!.applied, "alder.caddy"),
    });
    await apply("alder", "caddy");
    const back = await one("alder", "caddy");
    expect(back!.state).toBe("applied");
    expect(back!.error).toBeUndefined();
  });

  it("says declares-nothing for an applied record without needs, never never-ran", async () => {
    await assign("birch", "motd");
    expect((await one("birch", "motd"))!.state).toBe("never-ran");
    await apply("birch", "motd");
    expect(await one("birch", "motd")).toMatchObject({ state: "declares-nothing", needs: 0, conditions: [] });
  });

  it("goes assigned → unassigned when the controller removes it, since the removal", async () => {
    await assign("birch", "gone");
    await need("birch", "gone", "config.x");
    await apply("birch", "gone");
    expect((await one("birch", "gone"))!.state).toBe("applied");
    await controller.delete("birch.gone");
    expect(await one("birch", "gone")).toMatchObject({
      state: "unassigned",
      assigned: false,
      since: await written(controller, "birch.gone"),
    });
    // Needs left behind on a node that was never assigned the module: unassigned since the newest.
    await need("birch", "stray", "config.y");
    expect(await one("birch", "stray")).toMatchObject({
      state: "unassigned",
      since: await written(nodes.birch!.needs, "birch.stray.config.y"),
    });
  });
});

describe("the conditions of a module", () => {
  it("says Unanswerable (NoDomain) for a need whose kind no domain answers", async () => {
    await assign("cedar", "tunnel");
    await need("cedar", "tunnel", "wormhole.exit");
    await apply("cedar", "tunnel");
    const m = await one("cedar", "tunnel");
    expect(m!.state).toBe("applied");
    expect(m!.conditions).toEqual([
      {
        type: "Unanswerable",
        reason: "NoDomain",
        message: "no domain answers kind wormhole (need wormhole.exit)",
        since: await written(nodes.cedar!.needs, "cedar.tunnel.wormhole.exit"),
      },
    ]);
  });

  it("says ProviderNotAssigned, then ProviderNotReady, then nothing, as the provider module is assigned and applied", async () => {
    await assign("cedar", "gitea");
    await need("cedar", "gitea", "bound.db", { provider: "pgsql" });
    await apply("cedar", "gitea");
    const since = await written(nodes.cedar!.needs, "cedar.gitea.bound.db");
    expect((await one("cedar", "gitea"))!.conditions).toEqual([
      {
        type: "ProviderNotAssigned",
        reason: "ProviderNotAssigned",
        message: "need bound.db names provider pgsql, assigned to no node",
        since,
      },
    ]);
    await assign("dogwood", "pgsql");
    await need("dogwood", "pgsql", "dir.data");
    expect((await one("cedar", "gitea"))!.conditions).toEqual([
      {
        type: "ProviderNotReady",
        reason: "ProviderNotApplied",
        message: "need bound.db names provider pgsql, assigned to dogwood but applied on none",
        since,
      },
    ]);
    await apply("dogwood", "pgsql");
    expect((await one("cedar", "gitea"))!.conditions).toEqual([]);
  });

  it("says ProviderFailing while a provider fails that module on that node", async () => {
    await assign("dogwood", "grafana");
    await need("dogwood", "grafana", "config.url");
    await apply("dogwood", "grafana");
    const keycloak = (await bus.connect("keycloak")).jetstream();
    const at = new Date().toISOString();
    await keycloak.publish(
      "keycloak.provisioner.failing",
      JSON.stringify({ machine: "dogwood", consumer: "grafana", word: "invalid_client", at }),
    );
    await until(async () => (await one("dogwood", "grafana"))!.conditions.length === 1, 10_000, "the failing reaches the state");
    expect((await one("dogwood", "grafana"))!.conditions).toEqual([
      { type: "ProviderFailing", reason: "ProviderSaysFailing", message: "keycloak fails it: invalid_client", since: at },
    ]);
    await keycloak.publish(
      "keycloak.provisioner.recovered",
      JSON.stringify({ machine: "dogwood", consumer: "grafana", at: new Date().toISOString() }),
    );
    await until(async () => (await one("dogwood", "grafana"))!.conditions.length === 0, 10_000, "the recovery reaches the state");
  });

  it("says OutOfShape for a bad error or revisions, a provider that is not one token, a key out of shape; never drops them", async () => {
    await assign("elm", "odd");
    await need("elm", "odd", "bound.db", { provider: "a.b" });
    await nodes.elm!.needs.put("elm.odd.config", '"three tokens"');
    await apply("elm", "odd", { error: 42, revisions: { p: 3 } });
    const m = await one("elm", "odd");
    // The bad error is read as absent: not failed.
    expect(m!.state).toBe("applied");
    expect(m!.conditions.map((c) => c.type)).toEqual(["OutOfShape"]);
    expect(m!.conditions[0]!.message).toBe(
      [
        "needs:elm.odd.bound.db: value's provider \"a.b\" is not one token (a module's name)",
        "needs:elm.odd.config: needs keys have 4 tokens, this has 3",
        "applied:elm.odd: applied record's error is not a string",
        "applied:elm.odd: applied record's revisions is not an object of strings",
      ].join("; "),
    );
    // An assignment key that names no module is said in the answer's outOfShape, and so is a value that is not JSON.
    await controller.put("elm", "{}");
    await controller.put("elm.weird", "not json");
    const { outOfShape } = await ask({});
    expect(outOfShape).toContainEqual({ key: "assignments:elm", reason: "assignments keys have 2 tokens, this has 1" });
    // A value that is not JSON is its module's: said there, not in the answer's list.
    expect(outOfShape.find((o) => o.key === "assignments:elm.weird")).toBeUndefined();
    const weird = (await one("elm", "weird"))!.conditions;
    expect(weird.map((c) => c.type)).toEqual(["OutOfShape"]);
    expect(weird[0]!.message).toMatch(/^assignments:elm.weird: assignment value is not JSON: /);
  });

  it("says Late once never-ran or pending outlasts the grace", async () => {
    await assign("elm", "slow");
    const since = await written(controller, "elm.slow");
    expect((await one("elm", "slow"))!.conditions).toEqual([]);
    await until(async () => (await one("elm", "slow"))!.conditions.length === 1, (GRACE_SECONDS + 3) * 1000, "Late");
    expect((await one("elm", "slow"))!.conditions).toEqual([
      {
        type: "Late",
        reason: "NeverRan",
        message: `never-ran for longer than ${GRACE_SECONDS} s: no applied record and no needs`,
        since: new Date(Date.parse(since) + GRACE_SECONDS * 1000).toISOString(),
      },
    ]);
  });
});

describe("the state at the edges", () => {
  it("tells a need written in the same millisecond after the applied record: pending, by the server's nanoseconds", async () => {
    for (let i = 0; i < 40; i++) {
      await assign("fir", `tie${i}`);
      await apply("fir", `tie${i}`);
      await need("fir", `tie${i}`, "config.x");
    }
    const states = (await ask({ node: "fir" })).entries;
    expect(states.map((e) => e.state)).toEqual(Array(40).fill("pending"));
  });

  it("says a key out of shape whose module has nothing else, and an entry larger than a reply, never failing the page", async () => {
    await nodes.elm!.needs.put("elm.lonely.threetok", "{}");
    expect((await ask({})).outOfShape).toContainEqual({ key: "needs:elm.lonely.threetok", reason: "needs keys have 4 tokens, this has 3" });
    const small = await testBus({ maxPayload: 65536, nodes: ["alder"] });
    const running = await startSet(small);
    try {
      const asker = await small.connect();
      await (await small.kv("assignments", "mesh-controller")).put("alder.huge", "{}");
      const alderNeeds = await small.kv("needs", "alder");
      for (let i = 0; i < 600; i++) await alderNeeds.put(`alder.huge.wormhole${i}.exit-${"x".repeat(60)}`, "{}");
      await (await small.kv("assignments", "mesh-controller")).put("alder.zz", "{}");
      const first = await request(asker, "mesh-provisioner.provisioning", { what: "state", node: "alder" });
      expect(first.errorCode).toBeUndefined();
      const huge = first.body.entries.find((e: ModuleState) => e.key === "alder.huge") as ModuleState;
      // Each condition names at most 10 needs and counts the rest, within 1,024 characters.
      expect(huge.conditions[0]!.message.length).toBeLessThanOrEqual(1024);
      expect(huge.conditions[0]!.message).toMatch(/ and 590 more\)$|…$/);
      expect(first.body.entries.map((e: ModuleState) => e.key)).toEqual(["alder.huge", "alder.zz"]);
    } finally {
      await running.stop();
      await small.stop();
    }
  }, 60_000);
});

describe("the verb what=state", () => {
  it("narrows by node, module and state, in key order, and pages", async () => {
    const alder = await ask({ node: "alder" });
    expect(alder.entries.map((e) => e.key)).toEqual(["alder.caddy", "alder.gitea"]);
    expect((await ask({ module: "gitea" })).entries.map((e) => e.key)).toEqual(["alder.gitea", "cedar.gitea"]);
    expect((await ask({ state: "declares-nothing" })).entries.map((e) => e.key)).toEqual(["birch.motd"]);
    const first = await ask({ node: "alder", limit: 1 });
    expect(first.entries.map((e) => e.key)).toEqual(["alder.caddy"]);
    const second = await ask({ node: "alder", limit: 1, cursor: first.next });
    expect(second.entries.map((e) => e.key)).toEqual(["alder.gitea"]);
    // Unnarrowed, the keys out of shape said first are items of the page too (docs/verb.md §4.5).
    const whole = await ask({});
    expect(whole.outOfShape.length).toBeGreaterThan(0);
    const page = await ask({ limit: whole.outOfShape.length + 1 });
    expect(page.outOfShape).toEqual(whole.outOfShape);
    expect(page.entries.map((e) => e.key)).toEqual([whole.entries[0]!.key]);
    expect((await ask({ limit: whole.outOfShape.length + 1, cursor: page.next })).entries[0]!.key).toBe(whole.entries[1]!.key);
  });

  it("refuses an unknown state, a field that does not apply and a widening value, naming the field", async () => {
    const refused = async (body: unknown) => {
      const reply = await request(seat, "mesh-provisioner.provisioning", body);
      return { code: reply.errorCode, text: reply.errorText };
    };
    expect(await refused({ what: "state", state: "sleeping" })).toMatchObject({ code: 400, text: expect.stringContaining("state:") });
    expect(await refused({ what: "needs", state: "applied" })).toMatchObject({
      code: 400,
      text: expect.stringContaining("state: does not apply to what=needs"),
    });
    expect(await refused({ what: "state", kind: "config" })).toMatchObject({
      code: 400,
      text: expect.stringContaining("kind: does not apply"),
    });
    expect(await refused({ what: "state", node: "al*" })).toMatchObject({
      code: 400,
      text: expect.stringContaining("node: must be one token"),
    });
    const http = await fetch(`${set.httpUrl}/provisioning?what=state&state=bogus`);
    expect(http.status).toBe(400);
  });

  it("answers over HTTP as over NATS", async () => {
    const http = (await (await fetch(`${set.httpUrl}/provisioning?what=state&node=birch&module=motd`)).json()) as {
      entries: ModuleState[];
    };
    expect(http.entries).toEqual((await ask({ node: "birch", module: "motd" })).entries);
  });
});

describe("status and the CLI", () => {
  it("counts modules by state and lists those that count against the mesh, not well while any does", async () => {
    const status = (await request(seat, "mesh-provisioner.status", {})).body as Status;
    expect(status.well).toBe(false);
    const { counts, notWell } = status.provisioning;
    const states = (await ask({})).entries;
    for (const [state, n] of Object.entries(counts)) expect(states.filter((e) => e.state === state)).toHaveLength(n);
    // Against the mesh: unassigned ones, conditions; not the well ones.
    const against = notWell.map((m) => m.key);
    expect(against).toEqual(expect.arrayContaining(["birch.gone", "birch.stray", "cedar.tunnel", "elm.odd", "elm.slow"]));
    expect(against).not.toContain("alder.gitea");
    expect(against).not.toContain("birch.motd");
    const narrowed = (await request(seat, "mesh-provisioner.status", { machine: "birch", consumer: "motd" })).body as Status;
    expect(narrowed.provisioning.notWell).toEqual([]);
    expect(narrowed.well).toBe(true);
  });

  it("prints the state table and the modules not well in status, exiting 1 then", async () => {
    const run = promisify(execFile);
    const env = {
      ...process.env,
      LOG_LEVEL: "warn",
      NATS_URL: bus.url,
      NATS_USER: bus.config.nats.user!,
      NATS_PASSWORD: bus.config.nats.password!,
    };
    const bin = join(ROOT, "bin", "mesh-provisioner.mjs");
    const state = await run("node", [bin, "state", "--node", "cedar"], { env, cwd: ROOT });
    const lines = state.stdout.trimEnd().split("\n");
    expect(lines[0]).toMatch(/^NODE\s+MODULE\s+STATE\s+PRESENCE\s+CONDITIONS$/);
    expect(lines.find((l) => l.startsWith("cedar  tunnel"))).toMatch(
      /applied \d+s\s+silent\s+Unanswerable: no domain answers kind wormhole \(need wormhole.exit\)$/,
    );
    expect(lines.at(-1)).toBe("2 modules");
    const failed = await run("node", [bin, "status"], { env, cwd: ROOT }).catch((err: { code: number; stdout: string }) => err);
    expect((failed as { code: number }).code).toBe(1);
    expect((failed as { stdout: string }).stdout).toMatch(/^NOT WELL: .*modules? not well/);
    expect((failed as { stdout: string }).stdout).toContain("Unanswerable: no domain answers kind wormhole");
  }, 30_000);

  it("puts modules by state and conditions on /metrics", async () => {
    const text = await (await fetch(`${set.httpUrl}/metrics`)).text();
    const states = (await ask({})).entries;
    expect(text).toContain(`modules_by_state{state="declares-nothing"} ${states.filter((e) => e.state === "declares-nothing").length}`);
    expect(text).toMatch(/module_conditions\{type="Unanswerable"\} [1-9]/);
  });
});

describe("permissions of the assignments mirror", () => {
  it("refuses the seat a write; the controller writes it and nothing else of the set's buckets", async () => {
    const asSeat = await bus.kv("assignments");
    await expect(asSeat.put("alder.x", "{}")).rejects.toThrow();
    await expect((await bus.kv("needs", "mesh-controller")).put("alder.x.config.y", "{}")).rejects.toThrow();
    await expect((await bus.kv("applied", "mesh-controller")).put("alder.x", "{}")).rejects.toThrow();
    await expect((await bus.kv("registry", "mesh-controller")).put("port", "{}")).rejects.toThrow();
    await expect((await bus.kv("failing", "mesh-controller")).put("a.b.c", "{}")).rejects.toThrow();
    await controller.put("alder.fine", "{}");
    expect((await controller.get("alder.fine"))?.string()).toBe("{}");
  });
});

describe("the state kept up to date equals the state made whole", () => {
  type Op =
    | { op: "assign" | "unassign" | "misassign"; node: number; module: number }
    | { op: "need" | "unneed" | "name" | "misname" | "misshape"; node: number; module: number; name: number }
    | { op: "apply"; node: number; module: number; error: boolean };
  const ids = { node: fc.integer({ min: 0, max: 1 }), module: fc.integer({ min: 0, max: 2 }) };
  const op: fc.Arbitrary<Op> = fc.oneof(
    fc.record({ op: fc.constantFrom("assign" as const, "unassign" as const, "misassign" as const), ...ids }),
    fc.record({
      op: fc.constantFrom("need" as const, "unneed" as const, "name" as const, "misname" as const, "misshape" as const),
      ...ids,
      name: fc.integer({ min: 0, max: 1 }),
    }),
    fc.record({ op: fc.constant("apply" as const), ...ids, error: fc.boolean() }),
  );
  const all = (modules: Model["modules"]) => [...modules.values()].map((k) => k.base);

  it("after random writes of assignments, needs naming providers, keys out of shape and applied records", async () => {
    const fn = set.functions.find((f) => f.name === "provisioning")!;
    const views = () => set.runner.context(fn, { kind: "invoke" }).views as unknown as Parameters<typeof snapshotsOf>[0];
    // The modules of these runs are q0, q1 and q2 on alder and birch; a need may name another as its provider.
    const node = (n: number) => ["alder", "birch"][n]!;
    const module = (m: number) => `q${m}`;
    await currentModel(await snapshotsOf(views()), GRACE_SECONDS);
    await fc.assert(
      fc.asyncProperty(fc.array(op, { minLength: 1, maxLength: 8 }), async (ops) => {
        for (const o of ops) {
          const key = `${node(o.node)}.${module(o.module)}`;
          const own = nodes[node(o.node)]!;
          if (o.op === "assign") await controller.put(key, "{}");
          if (o.op === "unassign") await controller.delete(key);
          if (o.op === "misassign") await controller.put(`${key}.extra`, "{}");
          if (o.op === "need") await own.needs.put(`${key}.config.n${o.name}`, "{}");
          if (o.op === "unneed") await own.needs.delete(`${key}.config.n${o.name}`);
          if (o.op === "name") await own.needs.put(`${key}.bound.n${o.name}`, JSON.stringify({ provider: module((o.module + 1) % 3) }));
          if (o.op === "misname") await own.needs.put(`${key}.bound.n${o.name}`, JSON.stringify({ provider: "a b" }));
          if (o.op === "misshape") await own.needs.put(`${key}.threetokens`, "{}");
          if (o.op === "apply") await own.applied.put(key, JSON.stringify(o.error ? { error: "no" } : {}));
        }
        const inputs = await snapshotsOf(views());
        const kept = await currentModel(inputs, GRACE_SECONDS);
        const whole = await modelOf(inputs, GRACE_SECONDS);
        expect(all(kept.modules)).toEqual(all(whole.modules));
        expect([...kept.watched.keys()]).toEqual([...whole.watched.keys()]);
        expect(kept.outOfShape).toEqual(whole.outOfShape);
        expect(kept.counts).toEqual(whole.counts);
        expect(kept.conditions).toEqual(whole.conditions);
      }),
      { numRuns: 30 },
    );
  }, 120_000);
});

describe("the state equals a model of the writes", () => {
  type Op =
    | { op: "assign" | "unassign"; node: number; module: number }
    | { op: "need" | "unneed"; node: number; module: number; name: number }
    | { op: "apply"; node: number; module: number; error: boolean };
  const ids = { node: fc.integer({ min: 0, max: 1 }), module: fc.integer({ min: 0, max: 1 }) };
  const op: fc.Arbitrary<Op> = fc.oneof(
    fc.record({ op: fc.constantFrom("assign" as const, "unassign" as const), ...ids }),
    fc.record({ op: fc.constantFrom("need" as const, "unneed" as const), ...ids, name: fc.integer({ min: 0, max: 1 }) }),
    fc.record({ op: fc.constant("apply" as const), ...ids, error: fc.boolean() }),
  );

  it("for random sequences of assignment, need and applied writes and deletes", async () => {
    let run = 0;
    await fc.assert(
      fc.asyncProperty(fc.array(op, { minLength: 1, maxLength: 12 }), async (ops) => {
        run++;
        // Modules of this run only: m<run>x on the two nodes.
        const node = (n: number) => ["alder", "birch"][n]!;
        const module = (m: number) => `p${run}m${m}`;
        for (const o of ops) {
          const key = `${node(o.node)}.${module(o.module)}`;
          if (o.op === "assign") await controller.put(key, "{}");
          if (o.op === "unassign") await controller.delete(key);
          if (o.op === "need") await nodes[node(o.node)]!.needs.put(`${key}.config.n${o.name}`, "{}");
          if (o.op === "unneed") await nodes[node(o.node)]!.needs.delete(`${key}.config.n${o.name}`);
          if (o.op === "apply") await nodes[node(o.node)]!.applied.put(key, JSON.stringify(o.error ? { error: "no" } : {}));
        }
        // The model: what the server holds now, by its times.
        const expected: { key: string; state: string; since: string }[] = [];
        for (const n of [0, 1]) {
          for (const m of [0, 1]) {
            const key = `${node(n)}.${module(m)}`;
            // By the server's nanoseconds, as docs/state.md §7.1 says; `since` is then cut to the millisecond.
            const a = await controller.get(key);
            const assigned = a !== null && a.operation === "PUT";
            const needTimes: number[] = [];
            for (const name of [0, 1]) {
              const e = await nodes[node(n)]!.needs.get(`${key}.config.n${name}`);
              if (e !== null && e.operation === "PUT") needTimes.push(nanosOf(e));
            }
            const ap = await nodes[node(n)]!.applied.get(key);
            const applied = ap === null ? undefined : { at: nanosOf(ap), error: JSON.parse(ap.string()).error !== undefined };
            if (!assigned && needTimes.length === 0 && applied === undefined) continue;
            const t = (nanos: number) => new Date(Math.floor(nanos / 1e6)).toISOString();
            let state: string;
            let since: number;
            if (!assigned) {
              state = "unassigned";
              since = a !== null ? nanosOf(a) : Math.max(...needTimes, applied?.at ?? -Infinity);
            } else if (applied === undefined) {
              [state, since] = needTimes.length === 0 ? ["never-ran", nanosOf(a!)] : ["pending", Math.min(...needTimes)];
            } else {
              const after = needTimes.filter((x) => x > applied.at);
              if (after.length > 0) [state, since] = ["pending", Math.min(...after)];
              else if (applied.error) [state, since] = ["failed", applied.at];
              else [state, since] = [needTimes.length === 0 ? "declares-nothing" : "applied", applied.at];
            }
            expected.push({ key, state, since: t(since) });
          }
        }
        const got = [...(await ask({ node: "alder" })).entries, ...(await ask({ node: "birch" })).entries]
          .filter((e) => e.module.startsWith(`p${run}m`))
          .map(({ key, state, since }) => ({ key, state, since }));
        expect(got).toEqual(expected.sort((x, y) => (x.key < y.key ? -1 : 1)));
      }),
      { numRuns: 25 },
    );
  }, 120_000);
});
