import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Running } from "../runtime/index.ts";
import type { TestBus } from "../runtime/testing.ts";
import { VERB } from "../functions/_lib/provisioning.ts";
import { request, startSet, testBus, until } from "./helpers.ts";

let bus: TestBus;
let set: Running;

beforeAll(async () => {
  bus = await testBus();
  set = await startSet(bus);
});
afterAll(async () => {
  await set.stop();
  await bus.stop();
});

const get = async (path: string) => {
  const response = await fetch(`${set.httpUrl}${path}`);
  return { status: response.status, body: await response.json() };
};

describe("metrics", () => {
  it("count runs, refusals (a payload that is not JSON too) and durations per function and trigger, and say NATS is connected", async () => {
    const asker = await bus.connect("birch");
    for (let i = 0; i < 3; i++) await request(asker, VERB, { what: "registry" });
    for (let i = 0; i < 2; i++) await request(asker, VERB, { what: "nope" });
    await asker.request(VERB, "not json", { timeout: 5000 }); // refused before any schema: counted all the same
    const response = await fetch(`${set.httpUrl}/metrics`);
    expect(response.status).toBe(200);
    expect(response.headers.get("content-type")).toMatch(/^text\/plain; version=0\.0\.4/);
    const text = await response.text();
    // Prometheus text: comment lines, and `name{labels} value` samples.
    for (const line of text
      .trim()
      .split("\n")
      .filter((l) => l !== ""))
      expect(line).toMatch(/^(# (HELP|TYPE) \S+ .+|[a-z_]+(\{[^}]*\})? [0-9.e+-]+|[a-z_]+(\{[^}]*\})? \+Inf)$/);
    const sample = (name: string, labels: string) => Number(new RegExp(`^${name}\\{${labels}\\} (\\S+)$`, "m").exec(text)?.[1]);
    const verb = 'function="provisioning",trigger="subject"';
    expect(sample("function_runs_total", verb)).toBe(6);
    expect(sample("function_run_errors_total", `${verb},code="400"`)).toBe(3);
    expect(sample("function_run_seconds_count", verb)).toBe(6);
    expect(sample("function_runs_total", 'function="registry-compile",trigger="start"')).toBe(1);
    expect(sample("events_refused_total", 'function="provider-failing"')).toBe(0);
    expect(text).toMatch(/^nats_connected 1$/m);
    expect(text).toMatch(/^nats_reconnects_total 0$/m);
  });
});

describe("the provisioner's own metrics", () => {
  const scrape = async () => (await fetch(`${set.httpUrl}/metrics`)).text();
  const sample = (text: string, name: string) => Number(new RegExp(`^${name} (\\S+)$`, "m").exec(text)?.[1]);

  it("count registry compiles and the kinds they wrote and deleted", async () => {
    const text = await scrape();
    // The compile at start, on an empty registry bucket: every kind of the table written.
    expect(sample(text, "registry_compiles_total")).toBe(1);
    expect(sample(text, "registry_kinds_written_total")).toBe(13);
    expect(sample(text, "registry_kinds_deleted_total")).toBe(0);
  });

  it("gauge the failing triples the failing bucket holds, at each scrape", async () => {
    expect(sample(await scrape(), "failing_triples")).toBe(0);
    const postgres = (await bus.connect("postgres")).jetstream();
    const at = new Date(Date.now() - 10_000).toISOString();
    for (const consumer of ["gitea", "forgejo", "nextcloud"]) {
      await postgres.publish("postgres.provisioner.failing", JSON.stringify({ machine: "birch", consumer, word: "disk full", at }));
    }
    await until(async () => sample(await scrape(), "failing_triples") === 3, 10_000, "three failing triples");
    await postgres.publish(
      "postgres.provisioner.recovered",
      JSON.stringify({ machine: "birch", consumer: "gitea", at: new Date().toISOString() }),
    );
    await until(async () => sample(await scrape(), "failing_triples") === 2, 10_000, "two failing triples");
  });
});

describe("health and readiness", () => {
  it("says the process is up, and the set ready once started; not ready while NATS is gone", async () => {
    expect(await get("/healthz")).toEqual({ status: 200, body: { ok: true } });
    expect(await get("/readyz")).toEqual({ status: 200, body: { ready: true } });
    await bus.server.stop();
    await until(async () => (await get("/readyz")).status === 503, 10_000, "not ready once the server is gone");
    expect(await get("/readyz")).toEqual({ status: 503, body: { ready: false, reasons: ["not connected to NATS: reconnecting"] } });
    expect((await get("/healthz")).status).toBe(200);
    // The functions' routes answer at once, saying why, instead of waiting for a server that is not there.
    for (const path of ["/provisioning?what=needs&node=alder", "/status"]) {
      const began = Date.now();
      expect(await get(path)).toEqual({
        status: 503,
        body: { error: { code: 503, message: "NATS is unreachable: the set is reconnecting" } },
      });
      expect(Date.now() - began).toBeLessThan(1000);
    }
  });
});
