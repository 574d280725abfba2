import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Running } from "../runtime/index.ts";
import type { TestBus } from "../runtime/testing.ts";
import { startSet, testBus, until } from "./helpers.ts";

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

describe("health and readiness", () => {
  it("says the process is up, and the set ready once started; not ready while NATS is gone", async () => {
    expect(await get("/healthz")).toEqual({ status: 200, body: { ok: true } });
    expect(await get("/readyz")).toEqual({ status: 200, body: { ready: true } });
    await bus.server.stop();
    await until(async () => (await get("/readyz")).status === 503, 10_000, "not ready once the server is gone");
    expect(await get("/readyz")).toEqual({ status: 503, body: { ready: false, reasons: ["not connected to NATS: reconnecting"] } });
    expect((await get("/healthz")).status).toBe(200);
  });
});
