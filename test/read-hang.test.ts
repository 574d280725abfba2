import { readFileSync } from "node:fs";
import { monitorEventLoopDelay } from "node:perf_hooks";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { KV } from "nats";
import type { LoadedFunction, Running } from "../runtime/index.ts";
import type { TestBus } from "../runtime/testing.ts";
import { READ_DEADLINE_MS } from "../runtime/views/index.ts";
import { coalesced } from "../runtime/serial.ts";
import type { LastSequence } from "../runtime/views/probes.ts";
import { catchUpOf, startSet, testBus, until } from "./helpers.ts";

// A read in flight when the server stops answering ends within the read's deadline
// (docs/verb.md §4.6, "The deadline"): a 503 saying why, or with `stale=true` what the view
// holds; over NATS the handler ends as soon (its answer waits for the server). Once the server
// answers again, reads are fresh again within seconds.

/** What a read may take beyond the deadline: the event loop's and the HTTP server's own time. */
const MARGIN_MS = 1000;
/** How long the server is stopped, and how often each read is sent meanwhile. */
const STOP_MS = 20_000;
const EVERY_MS = 100;

let bus: TestBus;
let set: Running;
let alder: KV;
let stopped = false;

beforeAll(async () => {
  bus = await testBus();
  set = await startSet(bus);
  alder = await bus.kv("needs", "alder");
});
afterAll(async () => {
  // The server goes on before anything is stopped, whatever failed.
  if (stopped) {
    try {
      process.kill(bus.server.pid, "SIGCONT");
    } catch {
      // the server is gone already
    }
  }
  await set?.stop();
  await bus?.stop();
}, 60_000);

/** The HTTP reads sent, by name: their paths. */
const HTTP_READS = {
  needs: "/provisioning?what=needs&node=alder",
  needsStale: "/provisioning?what=needs&node=alder&stale=true",
  state: "/provisioning?what=state",
  stateStale: "/provisioning?what=state&stale=true",
  status: "/status",
  history: "/provisioning?what=history",
} as const;
/** The verb's requests as the NATS endpoint runs them, by name. */
const NATS_READS = { natsNeeds: { what: "needs", node: "alder" }, natsState: { what: "state" } } as const;

interface Read {
  readonly name: string;
  /** When it was sent, in ms since the server was stopped; how long it took. */
  readonly sentAt: number;
  readonly ms: number;
  readonly status: number;
  readonly body: { error?: { message: string }; confirmedAt?: string | null; entries?: { key: string }[] };
}

const NEEDS = ["alder.zsh.shell.zsh/normal", "alder.gitea.config.domain", "alder.gitea.secret.token"];

describe("reads while the server hangs (SIGSTOP)", () => {
  it(`end within ${READ_DEADLINE_MS} ms (a 503 saying why, or stale), and are fresh again within seconds of SIGCONT`, async () => {
    for (const key of NEEDS) await alder.put(key, JSON.stringify({ placeholder: "${config:x}", file: "/etc/x" }));
    await until(async () => (await fetch(`${set.httpUrl}/readyz`)).status === 200, 15_000, "ready");
    expect((await fetch(`${set.httpUrl}${HTTP_READS.needs}`)).status).toBe(200);
    const provisioning = set.functions.find((fn) => fn.name === "provisioning") as LoadedFunction;

    const reads: Promise<Read>[] = [];
    let origin = 0;
    const http = async (name: string, path: string): Promise<Read> => {
      const sent = performance.now();
      // Cut far past any bound, so a read that hangs fails the test rather than holding it.
      const response = await fetch(`${set.httpUrl}${path}`, { signal: AbortSignal.timeout(60_000) });
      const body = (await response.json()) as Read["body"];
      return { name, sentAt: sent - origin, ms: performance.now() - sent, status: response.status, body };
    };
    // What the NATS endpoint runs for a request (runtime/triggers/subject.ts): its end is the set's side of the bound.
    const nats = async (name: string, value: object): Promise<Read> => {
      const sent = performance.now();
      const outcome = await set.runner.run(provisioning, { value }, { kind: "subject", subject: "mesh-provisioner.provisioning" });
      const body = outcome.ok ? {} : { error: { message: outcome.error.message } };
      return { name, sentAt: sent - origin, ms: performance.now() - sent, status: outcome.ok ? 200 : outcome.error.code, body };
    };

    // This process's event loop (the set's and the reads' own): a failure says how long it stalled.
    const loop = monitorEventLoopDelay({ resolution: 10 });
    loop.enable();
    process.kill(bus.server.pid, "SIGSTOP");
    stopped = true;
    // Stopped once the kernel says so (a loaded machine may let it run a few ms after the
    // signal): a read confirmed current after this was asked before it.
    await until(() => readFileSync(`/proc/${bus.server.pid}/stat`, "utf8").split(") ")[1]!.startsWith("T"), 5000, "the server stopped");
    const stoppedAt = Date.now();
    origin = performance.now();
    // Its failure is the test's, once all are awaited; not an unhandled rejection meanwhile.
    const send = (read: Promise<Read>) => {
      read.catch(() => {});
      reads.push(read);
    };
    while (performance.now() - origin < STOP_MS) {
      for (const [name, path] of Object.entries(HTTP_READS)) send(http(name, path));
      for (const [name, value] of Object.entries(NATS_READS)) send(nats(name, value));
      await new Promise((resolve) => setTimeout(resolve, EVERY_MS));
    }
    // The reads that ended by now ended while the server was stopped.
    const endedBefore = performance.now() - origin;
    process.kill(bus.server.pid, "SIGCONT");
    stopped = false;
    const done = await Promise.all(reads);
    loop.disable();

    const late = done.filter((r) => r.ms > READ_DEADLINE_MS + MARGIN_MS);
    expect(
      late.map((r) => `${r.name} sent ${(r.sentAt / 1000).toFixed(2)} s after SIGSTOP took ${(r.ms / 1000).toFixed(2)} s: ${r.status}`),
      `the event loop's longest delay meanwhile: ${(loop.max / 1e6).toFixed(0)} ms`,
    ).toEqual([]);
    for (const read of done.filter((r) => r.sentAt + r.ms < endedBefore)) {
      if (read.name.endsWith("Stale")) {
        // What the view holds, and since when it is known current: before the stop.
        expect(read.status, read.name).toBe(200);
        expect(read.body.confirmedAt).not.toBeNull();
        expect(Date.parse(read.body.confirmedAt!)).toBeLessThanOrEqual(stoppedAt);
        if (read.name === "needsStale") expect(read.body.entries!.map((e) => e.key).sort()).toEqual([...NEEDS].sort());
      } else {
        // Nothing claimed fresh while the server cannot say so: a refusal saying why.
        expect(read.status, `${read.name} sent ${read.sentAt} ms after SIGSTOP`).toBe(503);
        expect(read.body.error?.message, read.name).toMatch(
          /cannot confirm that the view of bucket \S+ is current|NATS does not answer|NATS is unreachable|NATS did not answer/,
        );
      }
    }
    // A stream's reads, as the views', are refused at once once the set knows NATS does not answer.
    expect(
      done.filter((r) => r.name === "history").map((r) => r.body.error?.message ?? "answered"),
      "history refused for the reason the set knows",
    ).toContainEqual(expect.stringMatching(/NATS does not answer|NATS is unreachable/));
    // The reads in flight as the server stopped met the deadline itself, and said so.
    expect(
      done.some((r) => r.body.error?.message.includes(`the server did not answer within ${READ_DEADLINE_MS} ms`)),
      "a refusal naming the deadline",
    ).toBe(true);

    // Fresh again within seconds, holding every write acknowledged before the read.
    const back = performance.now();
    await until(
      async () => (await fetch(`${set.httpUrl}${HTTP_READS.needs}`, { signal: AbortSignal.timeout(10_000) })).status === 200,
      10_000,
      "fresh reads answered again",
    );
    // Ready again (every view confirmed current, a view the stop made load again loaded), then a
    // write and a read that holds it.
    await until(async () => (await fetch(`${set.httpUrl}/readyz`)).status === 200, 10_000, "ready again");
    await alder.put("alder.after.config.k", '"after"');
    const after = await fetch(`${set.httpUrl}${HTTP_READS.needs}`);
    const body = (await after.json()) as Read["body"];
    expect(after.status, JSON.stringify(body)).toBe(200);
    expect(body.entries!.map((e) => e.key)).toContain("alder.after.config.k");
    expect((await fetch(`${set.httpUrl}${HTTP_READS.state}`)).status).toBe(200);
    expect(performance.now() - back).toBeLessThan(10_000);
  }, 120_000);
});

describe("a read's deadline over a check that never answers", () => {
  /** A view's freshness whose probes are not answered until `wake()`, as a hung server's are not. */
  const hung = () => {
    let awake = false;
    const waiting: ((found: LastSequence) => void)[] = [];
    const found = () => ({ sequence: 7, askedAt: Date.now(), heldAtAsk: 7 });
    const fresh = catchUpOf({
      applied: () => 7,
      probe: coalesced(() => (awake ? Promise.resolve(found()) : new Promise<LastSequence>((resolve) => waiting.push(resolve)))),
      tail: { nothingAfter: async () => false },
    });
    const wake = () => {
      awake = true;
      for (const resolve of waiting.splice(0)) resolve(found());
    };
    return { fresh, wake };
  };

  it("gives up by the deadline, the read that joined the stuck check too, and says so in the latest check", async () => {
    const { fresh, wake } = hung();
    const began = performance.now();
    const first = fresh.caughtUp(began + 200);
    // Joins the check after the one in flight, which never ends.
    const joined = fresh.caughtUp(began + 300);
    const refused = { current: false, why: `the server did not answer within ${READ_DEADLINE_MS} ms` };
    expect(await first).toEqual(refused);
    expect(performance.now() - began).toBeLessThan(200 + 100);
    expect(await joined).toEqual(refused);
    expect(performance.now() - began).toBeLessThan(300 + 100);
    expect(fresh.latest()?.freshness).toEqual(refused);
    expect(fresh.confirmedAt()).toBeNull();
    // Once the server answers, a read is current again; nothing given up was claimed current.
    wake();
    expect(await fresh.caughtUp(performance.now() + 1000)).toEqual({ current: true });
    expect(fresh.confirmedAt()).not.toBeNull();
  });
});
