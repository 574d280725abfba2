import { join } from "node:path";
import { http, HttpResponse } from "msw";
import { setupServer } from "msw/node";
import type { NatsConnection } from "nats";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { alertsOf, postAlerts, raisedAlerts, staleAlerts, type PostableAlert } from "../functions/_lib/alerts.ts";
import { STATUS } from "../functions/_lib/status.ts";
import { invoke, loadFunction, type KeyRecord, type LoadedFunction, type Running } from "../runtime/index.ts";
import type { TestBus } from "../runtime/testing.ts";
import { request, ROOT, startSet, testBus, until } from "./helpers.ts";

const ALERTMANAGER = "http://alertmanager.test:9093";

/** What the stand-in Alertmanager was sent, and how it answers for now. */
const received: PostableAlert[][] = [];
let answer = 200;
/** The alerts it lists as held (`GET /api/v2/alerts`), in its API's shape, and the filters it was asked with. */
let held: Record<string, unknown>[] = [];
const filters: string[] = [];
const alertmanager = setupServer(
  http.post(`${ALERTMANAGER}/api/v2/alerts`, async ({ request }) => {
    received.push((await request.json()) as PostableAlert[]);
    return answer === 200 ? HttpResponse.json({}) : HttpResponse.text("down for maintenance", { status: answer });
  }),
  http.get(`${ALERTMANAGER}/api/v2/alerts`, ({ request }) => {
    filters.push(...new URL(request.url).searchParams.getAll("filter"));
    return answer === 200 ? HttpResponse.json(held) : HttpResponse.text("down for maintenance", { status: answer });
  }),
);

let bus: TestBus;
let seat: NatsConnection;
let keycloak: NatsConnection;
let set: Running;
let alerts: LoadedFunction;

beforeAll(async () => {
  alertmanager.listen({ onUnhandledRequest: "bypass" });
  bus = await testBus();
  seat = await bus.connect();
  keycloak = await bus.connect("keycloak");
  set = await startSet(bus, {
    alerts: { alertmanager: ALERTMANAGER, retries: 2, backoffMs: 20, timeoutMs: 2000 },
    presence: { ttlSeconds: 1 },
  } as object);
  alerts = set.functions.find((fn) => fn.name === "alerts")!;
});
afterAll(async () => {
  await set.stop();
  await bus.stop();
  alertmanager.close();
});

const emit = (kind: "failing" | "recovered", event: Record<string, string>) =>
  keycloak.jetstream().publish(`keycloak.provisioner.${kind}`, JSON.stringify(event));

const failingOf = async (machine: string) => (await request(seat, STATUS, { machine })).body.failing as unknown[];

const sameLabels = (a: Record<string, string>, b: Record<string, string>) =>
  JSON.stringify(Object.entries(a).sort()) === JSON.stringify(Object.entries(b).sort());

/** The alerts sent for one machine, newest sending last. */
const sentFor = (machine: string) => received.flat().filter((a) => a.labels.machine === machine);

describe("Alertmanager", () => {
  it("raises a module that counts against the mesh as ProvisioningNotWell, and resolves it once it no longer does", async () => {
    const controller = await bus.kv("assignments", "mesh-controller");
    const needs = await bus.kv("needs", "cedar");
    const applied = await bus.kv("applied", "cedar");
    await controller.put("cedar.zot", "{}");
    await needs.put("cedar.zot.port.registry", "{}");
    await applied.put("cedar.zot", JSON.stringify({ error: "port 5000 is taken" }));
    const since = (await applied.get("cedar.zot"))!.created.toISOString();
    const zot = () => received.flat().filter((a) => a.labels.alertname === "ProvisioningNotWell" && a.labels.module === "zot");
    // An alert never starts after the server's time as the set reads it (within half a round trip
    // of the truth): asked once that time is past the write, it starts at the write.
    await until(() => set.runner.clock.now().getTime() > Date.parse(since), 5000, "the set's server time past the write");
    await invoke(set.runner, alerts);
    const labels = {
      alertname: "ProvisioningNotWell",
      seat: "mesh-provisioner",
      node: "cedar",
      module: "zot",
      state: "failed",
      condition: "none",
    };
    expect(zot().at(-1)).toEqual({
      labels,
      annotations: { summary: "zot on cedar is failed" },
      startsAt: since,
    });
    await applied.put("cedar.zot", "{}");
    const before = Date.now();
    await invoke(set.runner, alerts);
    const resolved = zot().at(-1)!;
    expect(resolved.labels).toEqual(labels);
    expect(Date.parse(resolved.endsAt!)).toBeGreaterThanOrEqual(before - 1000);
    // Resolved once: the next sending says nothing of it.
    const sent = zot().length;
    await invoke(set.runner, alerts);
    expect(zot()).toHaveLength(sent);
  });

  it("raises an unreachable node as NodeUnreachable, and resolves it once the node writes presence again (docs/presence.md §16.3)", async () => {
    const presence = await bus.kv("presence", "dogwood");
    await presence.put("dogwood", JSON.stringify({ everySeconds: 1 }));
    const lastSeen = (await presence.get("dogwood"))!.created;
    const dogwood = () => received.flat().filter((a) => a.labels.alertname === "NodeUnreachable" && a.labels.node === "dogwood");
    await invoke(set.runner, alerts);
    expect(dogwood()).toEqual([]);
    // Time alone: three seconds (three periods of 1 s, longer than the TTL of 1 s) with no write.
    await new Promise((r) => setTimeout(r, Math.max(0, lastSeen.getTime() + 3100 - Date.now())));
    await invoke(set.runner, alerts);
    expect(dogwood().at(-1)).toEqual({
      labels: { alertname: "NodeUnreachable", seat: "mesh-provisioner", node: "dogwood" },
      annotations: { summary: `node dogwood is unreachable: no presence since ${lastSeen.toISOString()}` },
      startsAt: new Date(lastSeen.getTime() + 3000).toISOString(),
    });
    await presence.put("dogwood", JSON.stringify({ everySeconds: 60 }));
    await invoke(set.runner, alerts);
    expect(dogwood().at(-1)!.endsAt).toBeDefined();
    const sent = dogwood().length;
    await invoke(set.runner, alerts);
    expect(dogwood()).toHaveLength(sent);
  });

  it("resolves what Alertmanager holds of an earlier process that no longer fires, and leaves what still fires (docs/monitoring.md §17.3)", async () => {
    const presence = await bus.kv("presence", "cedar");
    await presence.put("cedar", JSON.stringify({ everySeconds: 600 }));
    // Raised by a process before this one: oak unreachable, cedar unreachable (now reachable), zot not well (a label set that never fires here).
    const gettable = (labels: Record<string, string>) => ({
      labels,
      annotations: { summary: "raised before" },
      startsAt: "2026-12-01T10:00:00.000Z",
      endsAt: "2026-12-01T10:05:00.000Z",
      updatedAt: "2026-12-01T10:00:30.000Z",
      fingerprint: "f00",
      receivers: [{ name: "default" }],
      status: { state: "active", silencedBy: [], inhibitedBy: [] },
    });
    held = [
      gettable({ alertname: "NodeUnreachable", seat: "mesh-provisioner", node: "oak" }),
      gettable({ node: "cedar", seat: "mesh-provisioner", alertname: "NodeUnreachable" }),
      gettable({
        alertname: "ProvisioningNotWell",
        seat: "mesh-provisioner",
        node: "cedar",
        module: "zot",
        state: "pending",
        condition: "Late",
      }),
      // Another system's, of the same name: never the set's to end.
      gettable({ alertname: "NodeUnreachable", instance: "db1:9100", job: "node" }),
    ];
    try {
      const before = Date.now();
      await invoke(set.runner, alerts);
      const resolved = received.at(-1)!.filter((a) => a.endsAt !== undefined && a.annotations.summary === "raised before");
      expect(resolved.map((a) => a.labels)).toEqual([
        { alertname: "NodeUnreachable", seat: "mesh-provisioner", node: "oak" },
        { node: "cedar", seat: "mesh-provisioner", alertname: "NodeUnreachable" },
        { alertname: "ProvisioningNotWell", seat: "mesh-provisioner", node: "cedar", module: "zot", state: "pending", condition: "Late" },
      ]);
      for (const a of resolved) expect(Date.parse(a.endsAt!)).toBeGreaterThanOrEqual(before - 1000);
      expect(filters.slice(-2)).toEqual([
        'alertname=~"^(ProvisioningNotWell|ProvisioningStale|NodeUnreachable|ProvisioningCheckFailing)$"',
        'seat="mesh-provisioner"',
      ]);
      // One that still fires is held and sent as firing, never resolved.
      await (await bus.kv("assignments", "mesh-controller")).put("cedar.kept", "{}");
      await (await bus.kv("applied", "cedar")).put("cedar.kept", JSON.stringify({ error: "still failing" }));
      const labels = {
        alertname: "ProvisioningNotWell",
        seat: "mesh-provisioner",
        node: "cedar",
        module: "kept",
        state: "failed",
        condition: "none",
      };
      held = [gettable(labels)];
      await invoke(set.runner, alerts);
      expect(
        received
          .at(-1)!
          .filter((a) => sameLabels(a.labels, labels))
          .map((a) => a.endsAt),
      ).toEqual([undefined]);
    } finally {
      held = [];
      await (await bus.kv("applied", "cedar")).put("cedar.kept", "{}");
    }
  });

  it("raises a failing check as ProvisioningCheckFailing, and resolves it once the check is ok (docs/presence.md §16.5)", async () => {
    const alder = (await bus.connect("alder")).jetstream();
    const checked = (ok: boolean, at: string) =>
      alder.publish(
        "mesh-provisioner.checked.alder",
        JSON.stringify({
          module: "gitea",
          provision: "postgres",
          ok,
          ...(ok ? {} : { reason: "AuthFailed", message: "password authentication failed" }),
          at,
        }),
      );
    const kept = async () =>
      ((await request(seat, "mesh-provisioner.provisioning", { what: "checks", node: "alder" })).body as { entries: { ok: boolean }[] })
        .entries;
    await checked(false, "2026-12-02T06:00:00Z");
    await until(async () => (await kept()).length === 1);
    const gitea = () => received.flat().filter((a) => a.labels.alertname === "ProvisioningCheckFailing" && a.labels.node === "alder");
    await invoke(set.runner, alerts);
    expect(gitea().at(-1)).toEqual({
      labels: {
        alertname: "ProvisioningCheckFailing",
        seat: "mesh-provisioner",
        node: "alder",
        module: "gitea",
        provision: "postgres",
        reason: "AuthFailed",
      },
      annotations: { summary: "gitea on alder fails its check of postgres: AuthFailed: password authentication failed" },
      startsAt: "2026-12-02T06:00:00.000Z",
    });
    await checked(true, "2026-12-02T06:01:00Z");
    await until(async () => (await kept())[0]?.ok === true);
    await invoke(set.runner, alerts);
    expect(gitea().at(-1)!.endsAt).toBeDefined();
    const sent = gitea().length;
    await invoke(set.runner, alerts);
    expect(gitea()).toHaveLength(sent);
  });

  it("raises a failing with its labels and startsAt, and resolves it with endsAt on recovery", async () => {
    await emit("failing", { machine: "dogwood", consumer: "grafana", word: "invalid_client", at: "2026-11-29T12:00:00Z" });
    await emit("failing", { machine: "dogwood", consumer: "grafana", word: "realm unreachable", at: "2026-11-29T12:05:00Z" });
    await until(async () => (await failingOf("dogwood")).length === 1 && JSON.stringify(await failingOf("dogwood")).includes("realm"));
    expect(await invoke(set.runner, alerts)).toEqual({ sent: 1, firing: 1 });
    expect(sentFor("dogwood").at(-1)).toEqual({
      labels: { alertname: "ProvisioningFailing", provider: "keycloak", machine: "dogwood", consumer: "grafana" },
      annotations: { word: "realm unreachable", summary: "keycloak fails grafana on dogwood: realm unreachable" },
      startsAt: "2026-11-29T12:00:00.000Z",
    });

    const recoveredAt = new Date().toISOString();
    await emit("recovered", { machine: "dogwood", consumer: "grafana", at: recoveredAt });
    await until(async () => (await failingOf("dogwood")).length === 0);
    // Its end is never after the server's time as the set reads it: asked once that time is past the recovery.
    await until(() => set.runner.clock.now().getTime() > Date.parse(recoveredAt), 5000, "the set's server time past the recovery");
    expect(await invoke(set.runner, alerts)).toEqual({ sent: 1, firing: 0 });
    expect(sentFor("dogwood").at(-1)).toEqual({
      labels: { alertname: "ProvisioningFailing", provider: "keycloak", machine: "dogwood", consumer: "grafana" },
      annotations: { summary: "keycloak serves grafana on dogwood again" },
      startsAt: "2026-11-29T12:00:00.000Z",
      endsAt: recoveredAt,
    });
  });

  it("keeps the state right while Alertmanager answers 500, and raises the alert once it is back", async () => {
    answer = 500;
    const before = received.length;
    await emit("failing", { machine: "birch", consumer: "caddy", word: "no issuer", at: "2026-11-29T13:00:00Z" });
    await until(async () => (await failingOf("birch")).length === 1);
    const failure = await invoke(set.runner, alerts).catch((e: unknown) => e);
    expect((failure as Error).message).toMatch(
      /^alerts failed: Alertmanager at http:\/\/alertmanager\.test:9093\/api\/v2\/alerts answered 500/,
    );
    expect(received.length - before).toBeGreaterThanOrEqual(3); // the first try and 2 retries
    // The follower went on meanwhile.
    await emit("failing", { machine: "birch", consumer: "caddy", word: "issuer moved", at: "2026-11-29T13:01:00Z" });
    await until(async () => JSON.stringify(await failingOf("birch")).includes("issuer moved"));

    answer = 200;
    const after = received.length;
    // The birch failing, and dogwood's resolution of the first test, recent enough to send again.
    expect(await invoke(set.runner, alerts)).toEqual({ sent: 2, firing: 1 });
    expect(received.slice(after).flat()).toContainEqual({
      labels: { alertname: "ProvisioningFailing", provider: "keycloak", machine: "birch", consumer: "caddy" },
      annotations: { word: "issuer moved", summary: "keycloak fails caddy on birch: issuer moved" },
      startsAt: "2026-11-29T13:00:00.000Z",
    });
  });

  it("sends nothing while alerts.alertmanager is unset", async () => {
    const off = await loadFunction(join(ROOT, "functions", "alerts.ts"));
    const plain = await startSet(bus, { http: { host: "127.0.0.1", port: 0 } });
    try {
      const before = received.length;
      expect(await invoke(plain.runner, off)).toEqual({ sent: 0, off: "alerts.alertmanager is not set" });
      expect(received.length).toBe(before);
    } finally {
      await plain.stop();
    }
  });
});

describe("postAlerts", () => {
  it("sends a user and password of the URL as Basic authorization, and never shows them", async () => {
    let authorization: string | null = null;
    alertmanager.use(
      http.post("http://am.test/api/v2/alerts", ({ request }) => {
        authorization = request.headers.get("authorization");
        return HttpResponse.text("no", { status: 400 });
      }),
    );
    const failure = await postAlerts({ alertmanager: "http://am:s3cret@am.test", retries: 0, backoffMs: 1, timeoutMs: 1000 }, []).catch(
      (e: Error) => e,
    );
    expect(authorization).toBe(`Basic ${Buffer.from("am:s3cret").toString("base64")}`);
    expect((failure as Error).message).toBe("Alertmanager at http://am.test/api/v2/alerts answered 400: no");
    const unreachable = await postAlerts(
      { alertmanager: "http://am:s3cret@127.0.0.1:1", retries: 0, backoffMs: 1, timeoutMs: 1000 },
      [],
    ).catch((e: Error) => e);
    expect((unreachable as Error).message).toMatch(/^Alertmanager at http:\/\/127\.0\.0\.1:1\/api\/v2\/alerts cannot be reached: /);
    expect((unreachable as Error).message).not.toContain("s3cret");
  });
});

describe("alertsOf", () => {
  const record = (key: string, value: unknown, deleted: boolean): KeyRecord => ({
    key,
    value: new TextEncoder().encode(JSON.stringify(value)),
    revision: 1,
    created: new Date(),
    createdNanos: 0,
    deleted,
  });
  it("fires failing triples, resolves recent recoveries only, and skips keys out of shape", () => {
    const now = new Date("2026-11-29T14:00:00Z");
    const sent = alertsOf(
      [
        record("p.m.c", { word: "w", since: "2026-11-29T10:00:00+01:00", at: "2026-11-29T13:00:00Z" }, false),
        record("p.m.recent", { recovered: "2026-11-29T13:30:00Z", since: "2026-11-29T12:00:00Z" }, true),
        record("p.m.long-ago", { recovered: "2026-11-29T12:00:00Z" }, true),
        record("p.m", { word: "w", since: "2026-11-29T10:00:00Z", at: "2026-11-29T10:00:00Z" }, false),
      ],
      now,
    );
    expect(sent.map((a) => [a.labels.consumer, a.startsAt, a.endsAt])).toEqual([
      ["c", "2026-11-29T09:00:00.000Z", undefined],
      ["recent", "2026-11-29T12:00:00.000Z", "2026-11-29T13:30:00.000Z"],
    ]);
  });

  it("never sends a time after now, which Alertmanager would refuse or keep firing", () => {
    const now = new Date("2026-11-29T14:00:00Z");
    const sent = alertsOf(
      [
        record("p.m.ahead", { word: "w", since: "2026-11-29T14:03:00Z", at: "2026-11-29T14:03:00Z" }, false),
        record("p.m.done", { recovered: "2026-11-29T14:04:00Z", since: "2026-11-29T13:00:00Z" }, true),
      ],
      now,
    );
    expect(sent.map((a) => [a.labels.consumer, a.startsAt, a.endsAt])).toEqual([
      ["ahead", "2026-11-29T14:00:00.000Z", undefined],
      ["done", "2026-11-29T13:00:00.000Z", "2026-11-29T14:00:00.000Z"],
    ]);
  });
});

describe("ProvisioningStale", () => {
  const held = {
    provider: "keycloak",
    provision: "keycloak",
    node: "dogwood",
    module: "grafana",
    key: "dogwood.grafana.bound.keycloak/issuer",
    revision: "r2",
    heldRevision: "r1",
    rotatedAt: "2026-12-01T10:00:00.000Z",
    appliedAt: "2026-11-30T10:00:00.000Z",
  };
  const now = new Date("2026-12-01T10:10:00.000Z");

  it("fires for a holder stale past its grace, and is resolved once, when it no longer is", () => {
    const first = raisedAlerts(staleAlerts([held], now), new Map(), now);
    expect(first.alerts).toEqual([
      {
        labels: {
          alertname: "ProvisioningStale",
          seat: "mesh-provisioner",
          provider: "keycloak",
          provision: "keycloak",
          node: "dogwood",
          module: "grafana",
          revision: "r2",
        },
        annotations: { summary: "grafana on dogwood holds r1 of keycloak, rotated to r2 by keycloak" },
        startsAt: "2026-12-01T10:00:00.000Z",
      },
    ]);
    const caughtUp = raisedAlerts(staleAlerts([], now), first.raised, now);
    expect(caughtUp.alerts).toEqual([{ ...first.alerts[0], endsAt: now.toISOString() }]);
    expect(raisedAlerts(staleAlerts([], now), caughtUp.raised, now).alerts).toEqual([]);
  });
});
