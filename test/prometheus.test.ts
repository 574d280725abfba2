import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { NatsConnection } from "nats";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { invoke, type LoadedFunction, type Running } from "../runtime/index.ts";
import { freePort } from "../runtime/nats-server.ts";
import type { TestBus } from "../runtime/testing.ts";
import { killGroups, request, ROOT, startSet, testBus, until } from "./helpers.ts";

// docs/monitoring.md §17: the rules Prometheus loads, checked by Debian's promtool, and the set's
// alerts sent to Debian's Alertmanager, a real one on a free port.
const DEPLOY = join(ROOT, "deploy", "prometheus");
const promtool = (...args: string[]) => spawnSync("promtool", args, { cwd: DEPLOY, encoding: "utf8" });

let bus: TestBus;
let seat: NatsConnection;
let keycloak: NatsConnection;
let set: Running;
let alerts: LoadedFunction;
let alertmanagerUrl: string;
let dir: string;
const processes: ChildProcess[] = [];

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), "mesh-provisioner-alertmanager-"));
  writeFileSync(
    join(dir, "alertmanager.yml"),
    "route:\n  receiver: none\n  group_wait: 1s\n  group_interval: 1s\nreceivers:\n  - name: none\n",
  );
  const port = await freePort();
  alertmanagerUrl = `http://127.0.0.1:${port}`;
  processes.push(
    spawn(
      "prometheus-alertmanager",
      [
        `--config.file=${join(dir, "alertmanager.yml")}`,
        `--storage.path=${join(dir, "data")}`,
        `--web.listen-address=127.0.0.1:${port}`,
        // One Alertmanager, no gossip with others.
        "--cluster.listen-address=",
      ],
      { stdio: "ignore", detached: true },
    ),
  );
  await until(async () => (await fetch(`${alertmanagerUrl}/-/ready`).catch(() => undefined))?.ok === true, 15_000, "Alertmanager ready");
  bus = await testBus();
  seat = await bus.connect();
  keycloak = await bus.connect("keycloak");
  set = await startSet(bus, { alerts: { alertmanager: alertmanagerUrl, retries: 2, backoffMs: 20, timeoutMs: 2000 } } as object);
  alerts = set.functions.find((fn) => fn.name === "alerts")!;
});
afterAll(async () => {
  await set?.stop();
  await bus?.stop();
  killGroups(processes);
  if (dir !== undefined) rmSync(dir, { recursive: true, force: true });
});

describe("the Prometheus rules (deploy/prometheus)", () => {
  it("pass promtool's checks and its unit tests", () => {
    const rules = promtool("check", "rules", "rules.yml");
    expect(rules.stdout + rules.stderr).toContain("SUCCESS: 6 rules found");
    expect(rules.status).toBe(0);
    const config = promtool("check", "config", "prometheus.yml");
    expect(config.status, config.stdout + config.stderr).toBe(0);
    const tested = promtool("test", "rules", "rules.test.yml");
    expect(tested.stdout + tested.stderr).toContain("SUCCESS");
    expect(tested.status, tested.stdout + tested.stderr).toBe(0);
  });

  it("read only metrics the set serves", async () => {
    const text = await (await fetch(`${set.httpUrl}/metrics`)).text();
    const served = new Set([...text.matchAll(/^# TYPE (\S+)/gm)].map((m) => m[1]!));
    const exprs = [...readFileSync(join(DEPLOY, "rules.yml"), "utf8").matchAll(/expr: (\|\n(?:\s{10}.*\n)+|.*)/g)].map((m) => m[1]!);
    const read = new Set(exprs.flatMap((e) => [...e.matchAll(/([a-z_]+)\{job="mesh-provisioner"/g)].map((m) => m[1]!)));
    read.delete("up"); // Prometheus's own
    expect([...read].sort()).toEqual([
      "failing_keys_out_of_shape",
      "failing_triples",
      "modules_not_well",
      "nats_connected",
      "nodes_by_presence",
      "stale_holders",
      "stream_bytes",
      "stream_max_bytes",
    ]);
    expect([...read].filter((name) => !served.has(name))).toEqual([]);
  });
});

describe("a real Alertmanager", () => {
  type Alert = { labels: Record<string, string>; status: { state: string } };
  const firing = async () => (await (await fetch(`${alertmanagerUrl}/api/v2/alerts`)).json()) as Alert[];
  const emit = (kind: "failing" | "recovered", event: Record<string, string>) =>
    keycloak.jetstream().publish(`keycloak.provisioner.${kind}`, JSON.stringify(event));
  const failingOf = async () => (await request(seat, "mesh-provisioner.status", { machine: "dogwood" })).body.failing as unknown[];

  it("receives a failing provider and a module not well from the set, and resolves them", async () => {
    await emit("failing", { machine: "dogwood", consumer: "grafana", word: "invalid_client", at: new Date().toISOString() });
    await until(async () => (await failingOf()).length === 1);
    const controller = await bus.kv("assignments", "mesh-controller");
    await controller.put("cedar.zot", "{}");
    await (await bus.kv("needs", "cedar")).put("cedar.zot.port.registry", "{}");
    await (await bus.kv("applied", "cedar")).put("cedar.zot", JSON.stringify({ error: "port 5000 is taken" }));
    expect(await invoke(set.runner, alerts)).toMatchObject({ firing: 2 });
    await until(async () => (await firing()).length === 2, 10_000, "two alerts in Alertmanager");
    const got = await firing();
    expect(got.map((a) => a.labels).sort((a, b) => a.alertname!.localeCompare(b.alertname!))).toEqual([
      { alertname: "ProvisioningFailing", provider: "keycloak", machine: "dogwood", consumer: "grafana" },
      { alertname: "ProvisioningNotWell", seat: "mesh-provisioner", node: "cedar", module: "zot", state: "failed", condition: "none" },
    ]);
    expect(got.map((a) => a.status.state)).toEqual(["active", "active"]);

    await emit("recovered", { machine: "dogwood", consumer: "grafana", at: new Date().toISOString() });
    await until(async () => (await failingOf()).length === 0);
    await (await bus.kv("applied", "cedar")).put("cedar.zot", "{}");
    expect(await invoke(set.runner, alerts)).toMatchObject({ firing: 0 });
    // Resolved: Alertmanager lists no active alert of them any more.
    await until(async () => (await firing()).length === 0, 10_000, "no alert left in Alertmanager");
  });
});
