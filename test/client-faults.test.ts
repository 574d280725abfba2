import type { NatsConnection } from "nats";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { connectNode, type NodeClient } from "../client/index.ts";
import type { Check } from "../functions/_lib/checks.ts";
import type { Running } from "../runtime/index.ts";
import type { TestBus } from "../runtime/testing.ts";
import { request, startSet, testBus, until } from "./helpers.ts";

// docs/client.md §9: a node client while its server is paused. A file of its own: it pauses the
// server its set and clients share.
let bus: TestBus;
let set: Running;
let seat: NatsConnection;

beforeAll(async () => {
  bus = await testBus();
  set = await startSet(bus);
  seat = await bus.connect();
});
afterAll(async () => {
  await set?.stop();
  await bus?.stop();
});

const node = (name: string) =>
  connectNode({ servers: bus.url, node: name, credentials: { password: bus.server.users[name]!.password }, presence: false });
/** Runs `during` with the server paused (SIGSTOP), and resumes it (SIGCONT) whatever happens. */
async function paused<T>(during: () => Promise<T>): Promise<T> {
  process.kill(bus.server.pid, "SIGSTOP");
  try {
    return await during();
  } finally {
    process.kill(bus.server.pid, "SIGCONT");
  }
}
/** The set's newest check of alder's `module` and `provision`; none while the set cannot answer (just after the pause). */
const checkOf = async (module: string, provision: string) =>
  (
    (await request(seat, "mesh-provisioner.provisioning", { what: "checks", node: "alder", module, provision })).body as {
      entries?: Check[];
    }
  ).entries?.[0];

describe("a node client whose server is paused (docs/client.md §9.1)", () => {
  it("publishes the next check after one whose publish timed out, whatever its result: the one timed out may yet be stored", async () => {
    const alder = await node("alder");
    try {
      expect(await alder.check("caddy", "acme", { ok: true })).toBe(true);
      await until(async () => (await checkOf("caddy", "acme"))?.ok === true);
      // Sent, unanswered within its 5 s: the server stores it once it runs again.
      const failing = await paused(() =>
        alder.check("caddy", "acme", { ok: false, reason: "AuthFailed" }).then(
          () => "published",
          (err: { code?: string }) => err.code,
        ),
      );
      expect(failing).toBe("TIMEOUT");
      await until(async () => (await checkOf("caddy", "acme"))?.ok === false);
      // What this client last knew to be published was ok; what the set keeps is not: published again.
      expect(await alder.check("caddy", "acme", { ok: true })).toBe(true);
      await until(async () => (await checkOf("caddy", "acme"))?.ok === true);
    } finally {
      await alder.close();
    }
  });

  it("close() closes the connection though the server answers no drain, within seconds", async () => {
    const birch = await node("birch");
    const { closedIn, closed } = await paused(async () => {
      const began = performance.now();
      await birch.close();
      return { closedIn: performance.now() - began, closed: birch.nc.isClosed() };
    });
    expect(closed).toBe(true);
    expect(closedIn).toBeLessThan(8000);
  });
});
