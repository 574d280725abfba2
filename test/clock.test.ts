import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import type { ModuleState } from "../functions/_lib/state.ts";
import type { Status } from "../functions/_lib/status.ts";
import type { Config } from "../runtime/index.ts";
import type { TestBus } from "../runtime/testing.ts";
import { bannerUrl, killGroups, ROOT, SHIPPED_DIR, testBus, until } from "./helpers.ts";

const BIN = join(ROOT, "bin", "mesh-provisioner.mjs");
const FAKE_CLOCK = join(ROOT, "test", "fixtures", "fake-clock.mjs");
const GRACE_SECONDS = 6;

const spawned: ChildProcess[] = [];
let bus: TestBus | undefined;
const dirs: string[] = [];
afterEach(async () => {
  killGroups(spawned);
  await bus?.stop();
  for (const dir of dirs.splice(0)) rmSync(dir, { recursive: true, force: true });
  bus = undefined;
});

/** Starts the set as its own process whose clock runs `offsetMs` away from the host's and the server's; resolves with its HTTP URL. */
function startSkewed(config: Config, offsetMs: number): Promise<string> {
  const dir = mkdtempSync(join(tmpdir(), "mesh-provisioner-clock-"));
  dirs.push(dir);
  const { root: _root, file: _file, ...raw } = { ...config, functions: SHIPPED_DIR, provisioning: { graceSeconds: GRACE_SECONDS } };
  const file = join(dir, "skewed.config.mts");
  writeFileSync(file, `export default ${JSON.stringify(raw)};\n`);
  const child = spawn("node", ["--import", FAKE_CLOCK, BIN, "-c", file, "start"], {
    cwd: ROOT,
    detached: true,
    env: { ...process.env, FAKE_CLOCK_OFFSET_MS: String(offsetMs), HTTP_PORT: "0", LOG_LEVEL: "warn" },
  });
  spawned.push(child);
  child.stdout!.resume();
  return bannerUrl(child);
}

const json = async <T>(url: string): Promise<T> => (await (await fetch(url)).json()) as T;
const event = (consumer: string, aheadMs: number) =>
  JSON.stringify({ machine: "alder", consumer, word: "refused the login", at: new Date(Date.now() + aheadMs).toISOString() });

// docs/runtime.md §6.15: the set's host clock decides nothing the docs state in the server's time.
describe.each([
  ["30 s ahead of", 30_000],
  ["30 s behind", -30_000],
  ["6 minutes behind", -6 * 60_000],
])("the set's host clock %s the server's", (_name, offsetMs) => {
  it(`says Late ${GRACE_SECONDS} s after the server stored the assignment, and refuses only events more than 5 minutes ahead of the server`, async () => {
    bus = await testBus({ nodes: ["alder"] });
    const url = await startSkewed(bus.config, offsetMs);
    await until(async () => (await fetch(`${url}/readyz`)).status === 200, 15_000, "ready");

    // A provider's true clock (this host's, as the server's) and one 6 minutes ahead.
    const keycloak = (await bus.connect("keycloak")).jetstream();
    await keycloak.publish("keycloak.provisioner.failing", event("true-clock", 4 * 60_000 + 30_000));
    await keycloak.publish("keycloak.provisioner.failing", event("fast-clock", 6 * 60_000));

    const controller = await bus.kv("assignments", "mesh-controller");
    await controller.put("alder.slow", JSON.stringify({ plan: { module: "slow" } }));
    const assignedAt = (await controller.get("alder.slow"))!.created.getTime();
    const state = async () => (await json<{ entries: ModuleState[] }>(`${url}/provisioning?what=state&node=alder&module=slow`)).entries[0];
    await until(async () => (await state())?.conditions.some((c) => c.type === "Late") === true, (GRACE_SECONDS + 40) * 1000, "Late");
    const lateAfter = Date.now() - assignedAt;
    expect(lateAfter).toBeGreaterThanOrEqual(GRACE_SECONDS * 1000);
    expect(lateAfter).toBeLessThan(GRACE_SECONDS * 1000 + 2500);
    expect((await state())!.conditions.find((c) => c.type === "Late")!.since).toBe(
      new Date(assignedAt + GRACE_SECONDS * 1000).toISOString(),
    );

    const status = await json<Status>(`${url}/status`);
    expect(status.failing.map((f) => f.consumer)).toEqual(["true-clock"]);
    expect(status.rejectedEvents).toBe(1);
  }, 90_000);
});

describe("two replicas whose hosts' clocks disagree", () => {
  it("run each second of an every-second cron once between them", async () => {
    bus = await testBus({ nodes: ["alder"] });
    const urls = [await startSkewed(bus.config, 30_000), await startSkewed(bus.config, -1500)];
    for (const url of urls) await until(async () => (await fetch(`${url}/readyz`)).status === 200, 15_000, "ready");
    /** The scheduled runs of rotation-fanout each replica made so far. */
    const runs = async () =>
      Promise.all(
        urls.map(async (url) => {
          const text = await (await fetch(`${url}/metrics`)).text();
          return Number(/^function_runs_total\{function="rotation-fanout",trigger="cron"\} (\d+)$/m.exec(text)?.[1] ?? 0);
        }),
      );
    const before = await runs();
    const began = Date.now();
    await new Promise((r) => setTimeout(r, 10_000));
    const after = await runs();
    const seconds = (Date.now() - began) / 1000;
    const made = after[0]! - before[0]! + after[1]! - before[1]!;
    // One run a second between the two (a second at each end may fall either side of the reads).
    expect(made).toBeGreaterThanOrEqual(Math.floor(seconds) - 2);
    expect(made).toBeLessThanOrEqual(Math.ceil(seconds) + 2);
  }, 60_000);
});
