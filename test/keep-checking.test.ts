import { execFile } from "node:child_process";
import { join } from "node:path";
import { promisify } from "node:util";
import type { NatsConnection } from "nats";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ClientArgumentError, connectNode, type BackgroundFailure, type NodeClient } from "../client/index.ts";
import type { Check } from "../functions/_lib/checks.ts";
import type { Running } from "../runtime/index.ts";
import type { TestBus } from "../runtime/testing.ts";
import { request, ROOT, startSet, testBus, until } from "./helpers.ts";

// docs/client.md §9.1: a probe run on a timer, its result published only when it changes. A file
// of its own: its first test takes a minute, and runs beside the other files.
let bus: TestBus;
let set: Running;
let seat: NatsConnection;
let alder: NodeClient;

beforeAll(async () => {
  bus = await testBus();
  set = await startSet(bus);
  seat = await bus.connect();
  alder = await connectNode({ servers: bus.url, node: "alder", credentials: { password: bus.server.users.alder!.password } });
});
afterAll(async () => {
  await alder?.close();
  await set?.stop();
  await bus?.stop();
});

/** How many check events of node alder the events stream holds. */
const events = async () =>
  (await (await seat.jetstreamManager()).streams.info("mesh-provisioner_events", { subjects_filter: "mesh-provisioner.checked.alder" }))
    .state.subjects?.["mesh-provisioner.checked.alder"] ?? 0;
const checksOf = async (narrowing: Record<string, unknown>) =>
  ((await request(seat, "mesh-provisioner.provisioning", { what: "checks", ...narrowing })).body as { entries: Check[] }).entries;

describe("keepChecking (docs/client.md §9.1)", () => {
  it("publishes one event over a minute of steady results, and one more when the result changes", { timeout: 120_000 }, async () => {
    const before = await events();
    let probes = 0;
    let failing = false;
    const steady = alder.keepChecking(
      "caddy",
      "acme",
      () => {
        probes++;
        if (failing) throw new Error("certificate expired");
      },
      { everySeconds: 1 },
    );
    const began = Date.now();
    await until(() => Date.now() - began >= 60_000, 70_000);
    // A minute of one result, a probe a second: one event.
    expect(probes).toBeGreaterThanOrEqual(55);
    expect((await events()) - before).toBe(1);
    failing = true;
    const seen = probes;
    await until(() => probes >= seen + 3);
    steady.stop();
    expect((await events()) - before).toBe(2);
    await until(async () => (await checksOf({ node: "alder", module: "caddy", provision: "acme" }))[0]?.ok === false);
    expect((await checksOf({ node: "alder", module: "caddy", provision: "acme" }))[0]).toMatchObject({
      ok: false,
      message: "certificate expired",
    });
  });

  it("gives a probe that hangs up after its timeout: a failing check, reason Timeout", async () => {
    const hung = alder.keepChecking("caddy", "dns", () => new Promise<void>(() => {}), { everySeconds: 60, timeoutSeconds: 0.3 });
    await until(async () => (await checksOf({ node: "alder", module: "caddy", provision: "dns" })).length === 1);
    hung.stop();
    expect((await checksOf({ node: "alder", module: "caddy", provision: "dns" }))[0]).toMatchObject({
      ok: false,
      reason: "Timeout",
      message: "the probe did not finish within 0.3 s",
    });
  });

  it("gives a probe that throws a value with no text a failing check, CheckFailed, and goes on probing", async () => {
    let probes = 0;
    const odd = alder.keepChecking(
      "caddy",
      "odd",
      () => {
        probes++;
        // No prototype: String() of it throws.
        throw Object.create(null);
      },
      { everySeconds: 0.2 },
    );
    await until(async () => (await checksOf({ node: "alder", module: "caddy", provision: "odd" })).length === 1);
    await until(() => probes >= 3);
    odd.stop();
    expect((await checksOf({ node: "alder", module: "caddy", provision: "odd" }))[0]).toMatchObject({
      ok: false,
      reason: "CheckFailed",
      message: "the probe threw a value that cannot be said as text",
    });
    // An error whose message cannot be read, with a reason that can: the reason, and the same message.
    const unreadable = Object.defineProperty(new Error("never read"), "message", {
      get() {
        throw new Error("no");
      },
    });
    const hidden = alder.keepChecking("caddy", "hidden", () => Promise.reject(Object.assign(unreadable, { reason: "AuthFailed" })), {
      everySeconds: 60,
    });
    await until(async () => (await checksOf({ node: "alder", module: "caddy", provision: "hidden" })).length === 1);
    hidden.stop();
    expect((await checksOf({ node: "alder", module: "caddy", provision: "hidden" }))[0]).toMatchObject({
      ok: false,
      reason: "AuthFailed",
      message: "the probe threw a value that cannot be said as text",
    });
    // A revoked proxy: not even its prototype can be read.
    const { proxy, revoke } = Proxy.revocable({}, {});
    revoke();
    const revoked = alder.keepChecking("caddy", "revoked", () => Promise.reject(proxy), { everySeconds: 60 });
    await until(async () => (await checksOf({ node: "alder", module: "caddy", provision: "revoked" })).length === 1);
    revoked.stop();
    expect((await checksOf({ node: "alder", module: "caddy", provision: "revoked" }))[0]).toMatchObject({
      ok: false,
      reason: "CheckFailed",
      message: "the probe threw a value that cannot be said as text",
    });
  });

  it("publishes a probe's revision, whatever else it returns, and a revision out of shape as a failing check", async () => {
    const gave: unknown[] = [{ revision: 7 }, "PONG", { revision: "r3", rows: 1 }, { revision: "" }];
    const seen: unknown[] = [];
    let next = 0;
    // A second each: every result stays long enough to be seen.
    const checking = alder.keepChecking("caddy", "answers", () => gave[Math.min(next++, gave.length - 1)] as never, {
      everySeconds: 1,
    });
    const kept = async () => (await checksOf({ node: "alder", module: "caddy", provision: "answers" }))[0];
    for (const want of [
      { ok: false, reason: "CheckFailed" },
      { ok: true, revision: null },
      { ok: true, revision: "r3" },
      { ok: false, reason: "CheckFailed" },
    ]) {
      await until(async () => {
        const check = await kept();
        return (
          check !== undefined &&
          check.ok === want.ok &&
          (want.revision === undefined || check.revision === want.revision) &&
          !seen.includes(check.at)
        );
      });
      const check = (await kept())!;
      seen.push(check.at);
      expect(check).toMatchObject(want);
      if (!check.ok) expect(check.message).toMatch(/^the probe gave a revision out of shape: /);
    }
    checking.stop();
  });

  it("publishes a message longer than one message can carry, cut to 1,024 characters as the set keeps it", async () => {
    const long = "x".repeat(2 * 1024 * 1024);
    expect(await alder.check("caddy", "long", { ok: false, reason: "AuthFailed", message: long })).toBe(true);
    await until(async () => (await checksOf({ node: "alder", module: "caddy", provision: "long" })).length === 1);
    const { message } = (await checksOf({ node: "alder", module: "caddy", provision: "long" }))[0]!;
    expect(message).toBe(`${"x".repeat(1023)}…`);
  });

  it("refuses bad arguments with a ClientArgumentError", () => {
    expect(() => alder.keepChecking("caddy", "a/b", () => {})).toThrow(ClientArgumentError);
    expect(() => alder.keepChecking("caddy", "a/b", () => {})).toThrow(/provision/);
    expect(() => alder.keepChecking("caddy", "acme", "nope" as never)).toThrow(/probe must be a function/);
    expect(() => alder.keepChecking("caddy", "acme", () => {}, { everySeconds: 0 })).toThrow(/options\.everySeconds/);
  });
});

describe("close() (docs/client.md §9.1)", () => {
  it(
    "lets the process end at once with a probe still hanging, resolves when called again, and keepChecking then throws",
    { timeout: 60_000 },
    async () => {
      // In a process of its own: what is measured is when that process can end.
      const script = `
      import { connectNode, connectProvider } from ${JSON.stringify(join(ROOT, "client", "index.ts"))};
      const node = await connectNode({ servers: process.env.URL, node: "birch", credentials: { password: process.env.PASSWORD } });
      node.keepChecking("caddy", "hung", () => new Promise(() => {}), { everySeconds: 1, timeoutSeconds: 30 });
      await new Promise((r) => setTimeout(r, 500));
      await Promise.all([node.close(), node.close()]);
      await node.close();
      const provider = await connectProvider({ servers: process.env.URL, provider: "keycloak", credentials: { password: process.env.KEYCLOAK } });
      await Promise.all([provider.close(), provider.close()]);
      await provider.close();
      console.log("each closed three times");
      try {
        node.keepChecking("caddy", "late", () => {});
      } catch (err) {
        console.log("refused:", err.name, err.message);
      }
      console.log("closed at", Date.now());
    `;
      const began = Date.now();
      const { stdout } = await promisify(execFile)(process.execPath, ["--import", "tsx", "--input-type=module", "-e", script], {
        cwd: ROOT,
        env: { ...process.env, URL: bus.url, PASSWORD: bus.server.users.birch!.password, KEYCLOAK: bus.server.users.keycloak!.password },
        timeout: 45_000,
      });
      const ended = Date.now();
      // close() called again, at once or later, resolves as the first did.
      expect(stdout).toContain("each closed three times");
      expect(stdout).toContain("refused: ClientClosed keepChecking: the client is closed, nothing was sent");
      const closedAt = Number(/closed at (\d+)/.exec(stdout)![1]);
      // The probe's 30 s limit does not hold the process; it ends as soon as it is idle.
      expect(ended - closedAt).toBeLessThan(5000);
      expect(ended - began).toBeLessThan(25_000);
    },
  );
});

describe("a node client's own writes that fail (docs/client.md §9.1)", () => {
  it("tells onError of each failed presence write and check publish, goes on, and writes again once it can", async () => {
    // The seat may do anything here: the test changes the streams' limits itself.
    const wide = await testBus({ seatPermissions: { publish: { allow: [">"] }, subscribe: { allow: [">"] } } });
    let running: Running | undefined;
    let birch: NodeClient | undefined;
    const failures: BackgroundFailure[] = [];
    const asker = await wide.connect();
    const jsm = await asker.jetstreamManager();
    // The streams refuse every message of more than 16 bytes: a presence write, a check event.
    const refuse = async (stream: string, maxMsgSize: number) => {
      const { config } = await jsm.streams.info(stream);
      await jsm.streams.update(stream, { ...config, max_msg_size: maxMsgSize });
    };
    try {
      running = await startSet(wide);
      birch = await connectNode({
        servers: wide.url,
        node: "birch",
        credentials: { password: wide.server.users.birch!.password },
        presence: { everySeconds: 1 },
        // Its own mistakes are ignored: thrown (presence), or a rejected promise (check; unhandled, it would fail the run).
        onError: (failure) => {
          failures.push(failure);
          if (failure.what === "presence") throw new Error("the caller's own mistake");
          return Promise.reject(new Error("the caller's own mistake, later"));
        },
      });
      const presence = await wide.kv("presence");
      const checkOf = async () =>
        (
          (await request(asker, "mesh-provisioner.provisioning", { what: "checks", node: "birch", module: "caddy", provision: "acme" }))
            .body as { entries: Check[] }
        ).entries[0];
      await refuse("KV_mesh-provisioner_presence", 16);
      await refuse("mesh-provisioner_events", 16);
      const checking = birch.keepChecking("caddy", "acme", () => {}, { everySeconds: 1 });
      await until(() => failures.some((f) => f.what === "presence") && failures.some((f) => f.what === "check"), 10_000, "both told");
      expect(failures.find((f) => f.what === "presence")).toMatchObject({ what: "presence", node: "birch" });
      expect(failures.find((f) => f.what === "check")).toMatchObject({ what: "check", node: "birch", module: "caddy", provision: "acme" });
      for (const f of failures) expect(f.error.message).toMatch(/message size exceeds maximum/);
      await refuse("KV_mesh-provisioner_presence", -1);
      await refuse("mesh-provisioner_events", -1);
      // Written again at the next tick: the presence key written anew, the check published.
      const told = failures.length;
      const revision = (await presence.get("birch"))?.revision ?? 0;
      await until(async () => ((await presence.get("birch"))?.revision ?? 0) > revision, 5000, "presence written again");
      await until(async () => (await checkOf())?.ok === true, 5000, "the check published");
      checking.stop();
      expect(failures.length - told).toBeLessThanOrEqual(2);
    } finally {
      await refuse("KV_mesh-provisioner_presence", -1).catch(() => {});
      await refuse("mesh-provisioner_events", -1).catch(() => {});
      await birch?.close();
      await running?.stop();
      await wide.stop();
    }
  });

  it("refuses an onError that is not a function", async () => {
    await expect(
      connectNode({ servers: bus.url, node: "birch", credentials: { password: bus.server.users.birch!.password }, onError: 7 as never }),
    ).rejects.toThrow(/onError must be a function/);
  });
});
