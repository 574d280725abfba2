import type { NatsConnection } from "nats";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Running } from "../runtime/index.ts";
import type { TestBus } from "../runtime/testing.ts";
import { request, startSet, testBus, until } from "./helpers.ts";

const KEYS = 20_000;
const MAX_PAYLOAD = 256 * 1024;

let bus: TestBus;
let set: Running;
let client: NatsConnection;

beforeAll(async () => {
  bus = await testBus({ maxPayload: MAX_PAYLOAD });
  set = await startSet(bus);
  const needs = await bus.kv("needs", "alder");
  const value = JSON.stringify({ placeholder: "${config:some_setting}", file: "/etc/some-module/some-module.conf" });
  for (let start = 0; start < KEYS; start += 1000) {
    await Promise.all(Array.from({ length: 1000 }, (_, i) => needs.put(`alder.m${(start + i) % 40}.config.k${start + i}`, value)));
  }
  client = await bus.connect("birch");
});
afterAll(async () => {
  await set.stop();
  await bus.stop();
});

/** Every page of an unnarrowed needs request: the keys of each and the size of its reply. */
async function allPages(extra: Record<string, unknown>) {
  const pages: { keys: string[]; bytes: number }[] = [];
  let cursor: string | undefined;
  do {
    const reply = await request(client, "mesh-provisioner.provisioning", { what: "needs", ...extra, ...(cursor ? { cursor } : {}) });
    expect(reply.errorCode).toBeUndefined();
    pages.push({ keys: reply.body.entries.map((e: { key: string }) => e.key), bytes: reply.bytes });
    cursor = reply.body.next;
  } while (cursor !== undefined);
  return pages;
}

describe(`a needs bucket of ${KEYS} keys`, () => {
  it("comes in pages under max_payload that together hold every key once, in key order", async () => {
    const pages = await allPages({ limit: 10_000 });
    expect(pages.length).toBeGreaterThan(2); // the payload bound, not the limit, cuts these pages
    for (const page of pages) expect(page.bytes).toBeLessThanOrEqual(MAX_PAYLOAD);
    const keys = pages.flatMap((p) => p.keys);
    expect(keys).toHaveLength(KEYS);
    expect(new Set(keys).size).toBe(KEYS);
    expect(keys).toEqual([...keys].sort());
  });

  it("pages by the default limit of 1,000 entries", async () => {
    const pages = await allPages({});
    expect(pages.map((p) => p.keys.length)).toEqual(Array(20).fill(1000));
    expect(new Set(pages.flatMap((p) => p.keys)).size).toBe(KEYS);
  });

  it("answers a narrowing with only what it reaches", async () => {
    const reply = await request(client, "mesh-provisioner.provisioning", { what: "needs", node: "alder", module: "m7" });
    expect(reply.body.entries).toHaveLength(KEYS / 40);
    expect(reply.body.entries.every((e: { module: string }) => e.module === "m7")).toBe(true);
  });

  it("sizes its pages to a smaller max_payload after reconnecting to a server that has one", async () => {
    const SMALLER = 64 * 1024;
    await bus.restart({ maxPayload: SMALLER });
    await until(() => set.runner.nc.info?.max_payload === SMALLER && client.info?.max_payload === SMALLER, 20_000, "both reconnected");
    await until(async () => (await fetch(`${set.httpUrl}/readyz`)).status === 200, 20_000, "ready again");
    const pages = await allPages({ limit: 10_000 });
    for (const page of pages) expect(page.bytes).toBeLessThanOrEqual(SMALLER);
    expect(new Set(pages.flatMap((p) => p.keys)).size).toBe(KEYS);
    const status = await request(client, "mesh-provisioner.status", {});
    expect(status.errorCode).toBeUndefined();
  });
});

describe("what=checks narrowed by ok", () => {
  it("pages over many checks that do not pass it, each passing key once, in key order", async () => {
    // 1,100 kept checks of node elm, failing at two of them far apart.
    const checks = await bus.kv("checks");
    const at = new Date().toISOString();
    const failing = new Set([5, 1090]);
    for (let start = 0; start < 1100; start += 100) {
      await Promise.all(
        Array.from({ length: 100 }, (_, i) => {
          const n = start + i;
          const ok = !failing.has(n);
          const value = { ok, reason: ok ? null : "AuthFailed", message: null, revision: null, since: at, at };
          return checks.put(`elm.m${String(n).padStart(4, "0")}.p`, JSON.stringify(value));
        }),
      );
    }
    const keys: string[] = [];
    let cursor: string | undefined;
    do {
      const page = (
        await request(client, "mesh-provisioner.provisioning", {
          what: "checks",
          node: "elm",
          ok: false,
          limit: 1,
          ...(cursor ? { cursor } : {}),
        })
      ).body as { entries: { key: string }[]; next?: string };
      keys.push(...page.entries.map((e) => e.key));
      cursor = page.next;
    } while (cursor !== undefined);
    expect(keys).toEqual(["elm.m0005.p", "elm.m1090.p"]);
  });
});

describe("keys out of shape of an answer made of several views", () => {
  it("are named over as many pages as they take, before the entries, each once", async () => {
    const needs = await bus.kv("needs", "alder");
    const bad = ["alder.onlytwo", "alder.two2", "alder.two3"];
    for (const key of bad) await needs.put(key, "{}");
    try {
      const outOfShape: string[] = [];
      const entries: string[] = [];
      let cursor: string | undefined;
      do {
        const page = (await request(client, "mesh-provisioner.provisioning", { what: "state", limit: 1, ...(cursor ? { cursor } : {}) }))
          .body as { entries: { key: string }[]; outOfShape: { key: string }[]; next?: string };
        expect(page.entries.length + page.outOfShape.length).toBe(1);
        outOfShape.push(...page.outOfShape.map((o) => o.key));
        entries.push(...page.entries.map((e) => e.key));
        cursor = page.next;
      } while (cursor !== undefined);
      expect(outOfShape).toEqual(bad.map((key) => `needs:${key}`));
      expect(entries).toEqual(Array.from({ length: 40 }, (_, i) => `alder.m${i}`).sort());
    } finally {
      for (const key of bad) await needs.delete(key);
    }
  });
});
