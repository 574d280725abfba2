import { execFileSync, spawn } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync, rmSync, statfsSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import type { JetStreamClient, KV, NatsConnection, NatsError } from "nats";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { STATUS, type Status } from "../functions/_lib/status.ts";
import { pino } from "pino";
import { loadFunctions, start, type Config, type Running } from "../runtime/index.ts";
import { watchStreams } from "../runtime/durables.ts";
import { seatPermissions } from "../runtime/permissions.ts";
import type { TestBus } from "../runtime/testing.ts";
import { projectConfig, request, ROOT, SHIPPED_DIR, startSet, testBus, until } from "./helpers.ts";

let bus: TestBus;
let seat: NatsConnection;
let keycloak: NatsConnection;
let set: Running;

beforeAll(async () => {
  bus = await testBus();
  seat = await bus.connect();
  keycloak = await bus.connect("keycloak");
  set = await startSet(bus);
});
afterAll(async () => {
  await set.stop();
  await bus.stop();
});

const readyz = async () => {
  const response = await fetch(`${set.httpUrl}/readyz`);
  return { status: response.status, body: (await response.json()) as { ready: boolean; reasons?: string[] } };
};

describe("faults the set recovers from by itself", () => {
  it("makes a deleted durable consumer again from where it was, not ready meanwhile, and follows again within 10 s", async () => {
    const failing = (consumer: string) =>
      keycloak
        .jetstream()
        .publish(
          "keycloak.provisioner.failing",
          JSON.stringify({ machine: "alder", consumer, word: "before", at: new Date().toISOString() }),
        );
    const { seq: floor } = await failing("before-delete");
    await until(async () => (await request(seat, STATUS, { consumer: "before-delete" })).body.failing.length === 1, 10_000, "followed");
    const jsm = await seat.jetstreamManager();
    // Followed is not yet acknowledged: the server's floor reaches the event a moment later.
    await until(
      async () => (await jsm.consumers.info("mesh-provisioner_events", "mesh-provisioner-events")).ack_floor.stream_seq === floor,
      5000,
      "the event before acknowledged",
    );

    // As `nats consumer rm` would.
    // nats-server 2.9 may answer a delete with "directory not empty" while the consumer writes its
    // state; the consumer is gone from the stream all the same, or is on the next try.
    await until(
      async () =>
        (await jsm.consumers
          .delete("mesh-provisioner_events", "mesh-provisioner-events")
          .catch((e: Error) => /not found/.test(e.message))) === true,
      5000,
      "the durable consumer deleted",
    );
    const reasons: string[] = [];
    const deletedAt = Date.now();
    await until(
      async () => {
        const { status, body } = await readyz();
        if (status === 503) reasons.push(...(body.reasons ?? []));
        return (await jsm.consumers.info("mesh-provisioner_events", "mesh-provisioner-events").catch(() => undefined)) !== undefined;
      },
      10_000,
      "the durable made again",
    );
    await failing("after-delete");
    await until(
      async () => (await request(seat, STATUS, { consumer: "after-delete" })).body.failing.length === 1,
      10_000,
      "followed again",
    );
    expect(Date.now() - deletedAt).toBeLessThan(10_000);
    // Made again from where it was: nothing acknowledged before is delivered again.
    const info = await jsm.consumers.info("mesh-provisioner_events", "mesh-provisioner-events");
    expect(info.config.opt_start_seq).toBe(floor + 1);
    expect((await readyz()).status).toBe(200);
    if (reasons.length > 0)
      expect(reasons[0]).toMatch(/^durable consumer mesh-provisioner-events of stream mesh-provisioner_events is gone/);
  });
});

describe("refusals only the server sees", () => {
  it("are logged with their subject, and a refused subscription makes the set not ready, naming it", async () => {
    const config = await projectConfig();
    const derived = seatPermissions(config, await loadFunctions(config));
    // Permissions printed before the status function existed: its verb is missing.
    const narrowed = await testBus({
      seatPermissions: { ...derived, subscribe: { allow: derived.subscribe.allow.filter((s) => s !== "mesh-provisioner.status") } },
    });
    const lines: { msg: string; operation?: string; subject?: string }[] = [];
    const log = pino({ level: "error" }, { write: (line: string) => void lines.push(JSON.parse(line)) });
    const started = await start({ config: narrowed.config, log });
    try {
      await until(async () => (await fetch(`${started.httpUrl}/readyz`)).status === 503, 10_000, "not ready");
      const body = (await (await fetch(`${started.httpUrl}/readyz`)).json()) as { reasons: string[] };
      expect(body.reasons).toEqual([
        "the server refuses the seat the subscription to mesh-provisioner.status: grant what `mesh-provisioner permissions` prints",
      ]);
      expect(lines).toContainEqual(
        expect.objectContaining({
          msg: "the server refused a permission of the seat",
          operation: "subscription",
          subject: "mesh-provisioner.status",
        }),
      );
    } finally {
      await started.stop();
      await narrowed.stop();
    }
  });
});

describe("a bucket deleted and made again behind the set", () => {
  it("is loaded again by the view: within 10 s the verb lists what the new bucket holds, and none of the old keys", async () => {
    // The seat may do anything here: the test deletes and makes the bucket's stream itself.
    const wide = await testBus({ seatPermissions: { publish: { allow: [">"] }, subscribe: { allow: [">"] } } });
    const running = await startSet(wide);
    try {
      const alder = await wide.kv("needs", "alder");
      for (let i = 0; i < 30; i++) await alder.put(`alder.old.config.k${i}`, '"old"');
      const asker = await wide.connect("birch");
      const keys = async () =>
        ((await request(asker, "mesh-provisioner.provisioning", { what: "needs", node: "alder" })).body.entries as { key: string }[]).map(
          (e) => e.key,
        );
      expect(await keys()).toHaveLength(30);

      const jsm = await (await wide.connect()).jetstreamManager();
      const { config } = await jsm.streams.info("KV_mesh-provisioner_needs");
      await jsm.streams.delete("KV_mesh-provisioner_needs");
      // nats-server 2.9 removes the deleted stream's folder after it answered: made again at once,
      // the new stream could lose its files to that removal (docs/runtime.md §6.3.2).
      await new Promise((r) => setTimeout(r, 2000));
      await jsm.streams.add(config);
      const recreated = Date.now();
      const again = await wide.kv("needs", "alder");
      for (let i = 0; i < 5; i++) await again.put(`alder.new.config.k${i}`, '"new"');
      const fresh = ["alder.new.config.k0", "alder.new.config.k1", "alder.new.config.k2", "alder.new.config.k3", "alder.new.config.k4"];
      await until(async () => JSON.stringify(await keys()) === JSON.stringify(fresh), 10_000, "the verb lists the new bucket");
      expect(Date.now() - recreated).toBeLessThan(10_000);
    } finally {
      await running.stop();
      await wide.stop();
    }
  });
});

describe("a server back with an empty store", () => {
  it("gets its buckets, stream and durables asserted again, is not ready until then, and serves again by itself", async () => {
    const lost = await testBus();
    const running = await startSet(lost);
    try {
      await (await lost.kv("needs", "alder")).put("alder.before.config.k", '"before"');
      await lost.restart({ emptyStore: true });
      const readiness: number[] = [];
      const back = Date.now();
      const birch = await lost.connect("birch");
      const keycloak = await lost.connect("keycloak");
      // Serving again: the verb answers from the new, empty bucket, and a provider's event is followed.
      await until(
        async () => {
          readiness.push((await fetch(`${running.httpUrl}/readyz`)).status);
          const answer = await request(birch, "mesh-provisioner.provisioning", { what: "needs", node: "alder" }).catch(() => undefined);
          return answer?.errorCode === undefined && answer?.body.entries.length === 0;
        },
        15_000,
        "the verb answers from the asserted bucket",
      );
      await until(
        async () => {
          const ack = await keycloak
            .jetstream()
            .publish(
              "keycloak.provisioner.failing",
              JSON.stringify({ machine: "alder", consumer: "after", word: "back", at: new Date().toISOString() }),
            )
            .catch(() => undefined);
          return ack !== undefined;
        },
        15_000,
        "the events stream takes events again",
      );
      await until(
        async () => (await request(birch, "mesh-provisioner.status", { consumer: "after" })).body.failing?.length === 1,
        15_000,
        "the follower follows again",
      );
      await until(async () => (await fetch(`${running.httpUrl}/readyz`)).status === 200, 10_000, "ready again");
      expect(Date.now() - back).toBeLessThan(30_000);
      expect(readiness).toContain(503);
      await (await lost.kv("needs", "alder")).put("alder.after.config.k", '"after"');
      const answer = await request(birch, "mesh-provisioner.provisioning", { what: "needs", node: "alder" });
      expect(answer.body.entries.map((e: { key: string }) => e.key)).toEqual(["alder.after.config.k"]);
    } finally {
      await running.stop();
      await lost.stop();
    }
  }, 90_000);
});

/** Publishes, on `keycloak`'s JetStream, keycloak's failing of `consumer` on alder, at now. */
const publishFailing = (keycloak: JetStreamClient, consumer: string) =>
  keycloak.publish(
    "keycloak.provisioner.failing",
    JSON.stringify({ machine: "alder", consumer, word: "down", at: new Date().toISOString() }),
  );
/** Whether status, asked on `seat`, names the one failing of `consumer`. */
const followedOn = (seat: NatsConnection, consumer: string) => async () =>
  (await request(seat, STATUS, { consumer }).catch(() => undefined))?.body.failing?.length === 1;

describe("a durable made again, then the server back with an empty store", () => {
  it("follows the new stream from its first message, and hands nothing twice while the stream stays the one it was", async () => {
    const lost = await testBus();
    const lines: { msg: string; reason?: string }[] = [];
    const log = pino({ level: "warn" }, { write: (line: string) => void lines.push(JSON.parse(line)) });
    const running = await start({ config: lost.config, log });
    const EVENTS = "mesh-provisioner_events";
    const DURABLE = "mesh-provisioner-events";
    try {
      const connect = async () => ({ seat: await lost.connect(), keycloak: (await lost.connect("keycloak")).jetstream() });
      let { seat, keycloak } = await connect();
      const failing = (consumer: string) => publishFailing(keycloak, consumer);
      const followed = (consumer: string) => followedOn(seat, consumer);
      const runs = async () => {
        const text = await (await fetch(`${running.httpUrl}/metrics`)).text();
        return Number(/^function_runs_total\{function="provider-failing",trigger="event"\} (\S+)$/m.exec(text)?.[1] ?? 0);
      };

      const { seq: floor } = await failing("before");
      await until(followed("before"), 10_000, "the event before followed");
      // Deleted behind the set's back: made again on the same stream, from the first event not acknowledged.
      const jsm = await seat.jetstreamManager();
      await until(
        async () => (await jsm.consumers.info(EVENTS, DURABLE)).ack_floor.stream_seq === floor,
        5000,
        "the event before acknowledged",
      );
      await until(
        async () => (await jsm.consumers.delete(EVENTS, DURABLE).catch((e: Error) => /not found/.test(e.message))) === true,
        5000,
        "the durable consumer deleted",
      );
      await until(async () => (await jsm.consumers.info(EVENTS, DURABLE).catch(() => undefined)) !== undefined, 10_000, "made again");
      expect((await jsm.consumers.info(EVENTS, DURABLE)).config.opt_start_seq).toBe(floor + 1);
      await failing("between");
      await until(followed("between"), 10_000, "the event between followed");
      // The event handled before the delete was not handed again.
      expect(await runs()).toBe(2);

      // A disk lost: the stream is made anew and starts again at sequence 1, below where the durable was.
      await lost.restart({ emptyStore: true });
      const back = Date.now();
      ({ seat, keycloak } = await connect());
      // Published as soon as the set has made the stream again, as a provider asking again would.
      const events = await seat.jetstreamManager();
      await until(async () => (await events.streams.info(EVENTS).catch(() => undefined)) !== undefined, 15_000, "the stream made again");
      await failing("after");
      await until(followed("after"), 20_000, "the event published after the restart followed");
      expect(Date.now() - back).toBeLessThan(30_000);
      expect(await runs()).toBe(3);
      expect(lines).toContainEqual(
        expect.objectContaining({
          msg: "the durable's sequences are another stream's; making it from the stream's first message",
          reason: expect.stringMatching(/^the stream was made anew/),
        }),
      );
      const made = await (await seat.jetstreamManager()).consumers.info(EVENTS, DURABLE);
      expect(made.config.deliver_policy).toBe("all");
    } finally {
      await running.stop();
      await lost.stop();
    }
  }, 90_000);
});

/** A set on a server whose seat may delete streams, as an operator would; its warnings kept in `lines`. */
async function deletingSeat(
  test: (s: {
    bus: TestBus;
    running: Running;
    lines: { msg: string; bucket?: string }[];
    seat: NatsConnection;
    keycloak: JetStreamClient;
  }) => Promise<void>,
): Promise<void> {
  const bus = await testBus({ seatPermissions: { publish: { allow: [">"] }, subscribe: { allow: [">"] } } });
  const lines: { msg: string; bucket?: string }[] = [];
  const log = pino({ level: "warn" }, { write: (line: string) => void lines.push(JSON.parse(line)) });
  const running = await start({ config: bus.config, log });
  try {
    await test({ bus, running, lines, seat: await bus.connect(), keycloak: (await bus.connect("keycloak")).jetstream() });
  } finally {
    await running.stop();
    await bus.stop();
  }
}
/** Publishes keycloak's failing of `consumer` until status names it: the stream or bucket may still be being made again. */
const followedAfter = (keycloak: JetStreamClient, seat: NatsConnection, consumer: string) =>
  until(
    async () =>
      (await publishFailing(keycloak, consumer)
        .then(() => true)
        .catch(() => false)) && (await followedOn(seat, consumer)()),
    15_000,
    `followed ${consumer}`,
  );
const readyAgain = (running: Running) =>
  until(async () => (await fetch(`${running.httpUrl}/readyz`)).status === 200, 10_000, "ready again");
/** Until `/readyz` gives a reason that includes `text`. */
const readinessSays = (running: Running, text: string) =>
  until(
    async () =>
      (((await (await fetch(`${running.httpUrl}/readyz`)).json()) as { reasons?: string[] }).reasons ?? []).some((r) => r.includes(text)),
    10_000,
    `readiness says ${text}`,
  );
const madeAgainWarnings = (lines: { msg: string; bucket?: string }[]) =>
  lines.filter((l) => l.msg === "bucket gone; making it again").map((l) => l.bucket);

describe("the events stream deleted behind the set (`nats stream rm`)", () => {
  it(
    "is made again, the durable with it, and events published after it are followed",
    () =>
      deletingSeat(async ({ running, lines, seat, keycloak }) => {
        const EVENTS = "mesh-provisioner_events";
        await publishFailing(keycloak, "before");
        await until(followedOn(seat, "before"), 10_000, "the event before followed");
        const jsm = await seat.jetstreamManager();
        await jsm.streams.delete(EVENTS);
        // Said at once, not at the next reading of the streams' use (every 5 s).
        const recording = async () => ((await request(seat, STATUS, {})).body as Status).events.recording;
        await until(async () => (await recording()) === false, 2000, "status: no event recorded");
        await until(async () => (await jsm.streams.info(EVENTS).catch(() => undefined)) !== undefined, 15_000, "the stream made again");
        await followedAfter(keycloak, seat, "after");
        await until(recording, 2000, "status: events recorded again");
        await readyAgain(running);
        expect(lines.map((l) => l.msg)).toContain("stream gone; making it again");
      }),
    60_000,
  );
});

describe("the events' durable deleted, then its stream, one right after the other", () => {
  it(
    "is followed again within seconds: the stream found missing is made again, not asked for 30 s",
    () =>
      deletingSeat(async ({ running, seat, keycloak }) => {
        const EVENTS = "mesh-provisioner_events";
        await publishFailing(keycloak, "before");
        await until(followedOn(seat, "before"), 10_000, "the event before followed");
        const jsm = await seat.jetstreamManager();
        await jsm.consumers.delete(EVENTS, "mesh-provisioner-events");
        await jsm.streams.delete(EVENTS);
        const deletedAt = Date.now();
        await followedAfter(keycloak, seat, "after");
        // Made again 2 s after it was found missing; asking for the stream until the durable's 30 s
        // of retries ran out took 35 s.
        expect(Date.now() - deletedAt).toBeLessThan(15_000);
        await readyAgain(running);
      }),
    60_000,
  );
});

describe("a bucket deleted behind the set (`nats kv rm`)", () => {
  it(
    "is said in readiness and refused at once while it is missing, made again, and written and read as before",
    () =>
      deletingSeat(async ({ running, lines, seat, keycloak }) => {
        const FAILING = "KV_mesh-provisioner_failing";
        await publishFailing(keycloak, "before");
        await until(followedOn(seat, "before"), 10_000, "the event before followed");
        const jsm = await seat.jetstreamManager();
        const { created } = await jsm.streams.info(FAILING);
        await jsm.streams.delete(FAILING);
        // Found by the view's next comparison with its stream (every 5 s), and said.
        await readinessSays(running, "bucket mesh-provisioner_failing does not exist on the server");
        // Made again 2 s after it is found missing: meanwhile a fresh read is refused at once, saying why.
        let took = Infinity;
        await until(
          async () => {
            const began = Date.now();
            const { error } = (await request(seat, STATUS, {})).body as { error?: { code: number; message: string } };
            took = Date.now() - began;
            return error?.code === 503 && error.message.includes("bucket mesh-provisioner_failing does not exist on the server");
          },
          3000,
          "a fresh read refused, naming the bucket missing",
        );
        expect(took).toBeLessThan(1000);
        await until(async () => (await jsm.streams.info(FAILING).catch(() => undefined))?.created !== undefined, 15_000, "made again");
        expect((await jsm.streams.info(FAILING)).created).not.toBe(created);
        // What it held is gone with it; what comes after is followed, kept and read.
        await followedAfter(keycloak, seat, "after");
        expect((await request(seat, STATUS, { consumer: "before" })).body.failing).toEqual([]);
        await readyAgain(running);
        expect(madeAgainWarnings(lines)).toEqual(["mesh-provisioner_failing"]);
      }),
    60_000,
  );
});

describe("a bucket deleted while its view loads it again", () => {
  it(
    "ends that load, is made again and loaded, and the set is ready with no write to the new bucket",
    () =>
      deletingSeat(async ({ bus, running, lines, seat }) => {
        const NEEDS = "KV_mesh-provisioner_needs";
        const alder = await bus.kv("needs", "alder");
        // Large enough that making the load's consumer takes the server a while.
        for (let i = 0; i < 20_000; i += 1000) {
          await Promise.all(Array.from({ length: 1000 }, (_, j) => alder.put(`alder.m${i + j}.config.k`, '"v"')));
        }
        await readyAgain(running);
        const jsm = await seat.jetstreamManager();
        const before = lines.length;
        // A key removed without a marker: the view holds a key more than the stream, and loads it again.
        await jsm.streams.purge(NEEDS, { filter: "$KV.mesh-provisioner_needs.alder.m0.config.k" });
        await until(() => lines.slice(before).some((l) => l.msg === "loading the bucket again"), 15_000, "the load begun");
        const { created } = await jsm.streams.info(NEEDS);
        await jsm.streams.delete(NEEDS);
        await until(
          async () => ![undefined, created].includes((await jsm.streams.info(NEEDS).catch(() => undefined))?.created),
          20_000,
          "made again",
        );
        // A load left on the new, empty stream waited for ever: ready only after a write to it.
        await until(async () => (await fetch(`${running.httpUrl}/readyz`)).status === 200, 20_000, "ready again, nothing written");
        const { body } = await request(seat, "mesh-provisioner.provisioning", { what: "needs", node: "alder" });
        expect(body.entries).toEqual([]);
      }),
    90_000,
  );
});

describe("a bucket deleted and made again by hand (`nats kv rm`, then `nats kv add`)", () => {
  it(
    "is never read as fresh from what the deleted one held: told by the server's advisories, the view loads the new one",
    () =>
      deletingSeat(async ({ bus, seat }) => {
        const NEEDS = "KV_mesh-provisioner_needs";
        const old = await bus.kv("needs", "alder");
        for (let i = 0; i < 5; i++) await old.put(`alder.old${i}.config.k`, '"old"');
        const keys = async () => {
          const { body } = await request(seat, "mesh-provisioner.provisioning", { what: "needs", node: "alder" });
          return body.error === undefined ? (body.entries as { key: string }[]).map((e) => e.key) : body.error.code;
        };
        expect(await keys()).toHaveLength(5);
        const jsm = await seat.jetstreamManager();
        const { config } = await jsm.streams.info(NEEDS);
        await jsm.streams.delete(NEEDS);
        // As an operator would: nats-server 2.9 removes the deleted stream's folder late.
        await new Promise((r) => setTimeout(r, 2000));
        await jsm.streams.add(config);
        await (await bus.kv("needs", "alder")).put("alder.new.config.k", '"new"');
        // Every answer from now on: the new bucket's keys, or refused; never the old ones.
        const answers: (string[] | number)[] = [];
        await until(
          async () => {
            answers.push(await keys());
            return JSON.stringify(answers.at(-1)) === JSON.stringify(["alder.new.config.k"]);
          },
          10_000,
          "the new bucket read",
        );
        expect(answers.filter((a) => typeof a !== "number" && a.some((k) => k.startsWith("alder.old")))).toEqual([]);
      }),
    60_000,
  );
});

describe("the registry's bucket deleted behind the set", () => {
  it(
    "is made again and compiled again at once, as at start, not at the next hour",
    () =>
      deletingSeat(async ({ running, seat }) => {
        const REGISTRY = "KV_mesh-provisioner_registry";
        const kinds = async () =>
          ((await (await fetch(`${running.httpUrl}/provisioning?what=registry`)).json()) as { entries?: unknown[] }).entries?.length;
        const compiled = (await kinds())!;
        expect(compiled).toBeGreaterThan(0);
        const jsm = await seat.jetstreamManager();
        await jsm.streams.delete(REGISTRY);
        await readinessSays(running, "bucket mesh-provisioner_registry does not exist on the server");
        await until(
          async () => (await jsm.streams.info(REGISTRY).catch(() => undefined))?.state.messages === compiled,
          15_000,
          "compiled again",
        );
        await readyAgain(running);
        expect(await kinds()).toBe(compiled);
      }),
    60_000,
  );
});

describe("the runtime's own bucket deleted behind the set", () => {
  it(
    "is said missing and made again; JetStream is not said to store nothing",
    () =>
      deletingSeat(async ({ running, lines, seat }) => {
        const RUNTIME = "KV_mesh-provisioner_runtime";
        const jsm = await seat.jetstreamManager();
        await jsm.streams.delete(RUNTIME);
        await readinessSays(running, "bucket mesh-provisioner_runtime does not exist on the server");
        // Deleted again each time it is made, for longer than the capacity probe's 5 s between two
        // writes to it: one of them finds it missing.
        for (const until6 = Date.now() + 6000; ;) {
          await until(async () => (await jsm.streams.info(RUNTIME).catch(() => undefined)) !== undefined, 15_000, "made again");
          if (Date.now() > until6) break;
          await jsm.streams.delete(RUNTIME);
        }
        await readyAgain(running);
        expect(lines.filter((l) => l.msg.startsWith("JetStream stores nothing"))).toEqual([]);
        expect(new Set(madeAgainWarnings(lines))).toEqual(new Set(["mesh-provisioner_runtime"]));
      }),
    60_000,
  );
});

describe("the claims bucket deleted behind the set (`nats kv rm`)", () => {
  it(
    "is found by the next claim, said in readiness, made again, and scheduled runs are claimed again",
    () =>
      deletingSeat(async ({ running, lines, seat }) => {
        const CLAIMS = "KV_mesh-provisioner_claims";
        const jsm = await seat.jetstreamManager();
        await jsm.streams.delete(CLAIMS);
        // rotation-fanout claims a run every second.
        await readinessSays(running, "bucket mesh-provisioner_claims does not exist on the server");
        await until(
          async () => ((await jsm.streams.info(CLAIMS).catch(() => undefined))?.state.messages ?? 0) > 0,
          15_000,
          "claimed again",
        );
        await readyAgain(running);
        expect(madeAgainWarnings(lines)).toEqual(["mesh-provisioner_claims"]);
      }),
    60_000,
  );
});

/**
 * Deletes `stream` and makes it again with another history, as an operator would by hand before
 * the set makes it again (2 s after it learns of the deletion): once the server removed the
 * deleted stream's folder (nats-server 2.9 removes it after it answered the delete; a stream made
 * before then loses its files, and may be gone).
 */
async function madeAgainWithOtherHistory(bus: TestBus, seat: NatsConnection, stream: string): Promise<void> {
  const jsm = await seat.jetstreamManager();
  const { config } = await jsm.streams.info(stream);
  const args = readFileSync(`/proc/${bus.server.pid}/cmdline`, "utf8").split("\0");
  const store = dirname(args[args.indexOf("-c") + 1]!);
  const folders = () => (readdirSync(store, { recursive: true }) as string[]).filter((p) => p.endsWith(`/streams/${stream}`)).length;
  expect(folders()).toBe(1);
  await jsm.streams.delete(stream);
  await until(() => folders() === 0, 1500, `the folder of ${stream} removed`);
  await jsm.streams.add({ ...config, max_msgs_per_subject: config.max_msgs_per_subject + 4 });
}
/** Deletes `stream` (made by {@link madeAgainWithOtherHistory}) and waits until the set made it again as the config says, and is ready. */
async function deletedAndMadeAsTheConfigSays(running: Running, seat: NatsConnection, stream: string): Promise<void> {
  const jsm = await seat.jetstreamManager();
  const history = (await jsm.streams.info(stream)).config.max_msgs_per_subject;
  await jsm.streams.delete(stream);
  await until(
    async () => (await jsm.streams.info(stream).catch(() => undefined))?.config.max_msgs_per_subject === history - 4,
    15_000,
    "made again as the config says",
  );
  await readyAgain(running);
}

describe("a bucket made again by hand with other settings than the config, before the set made it again", () => {
  it(
    "is said in readiness in the assertion's words, its view refuses fresh reads, and once it is deleted again the set makes it as the config says",
    () =>
      deletingSeat(async ({ bus, running, seat }) => {
        const NEEDS = "KV_mesh-provisioner_needs";
        await madeAgainWithOtherHistory(bus, seat, NEEDS);
        await readinessSays(running, "bucket mesh-provisioner_needs was deleted behind the set and cannot be made again");
        const reasons = ((await (await fetch(`${running.httpUrl}/readyz`)).json()) as { reasons: string[] }).reasons;
        expect(reasons.find((r) => r.includes("cannot be made again"))).toMatch(
          /exists with other settings than the config: history 5 \(the config says 1\)/,
        );
        const { body } = await request(seat, "mesh-provisioner.provisioning", { what: "needs", node: "alder" });
        expect(body.error).toMatchObject({ code: 503, message: expect.stringContaining("cannot be made again") });
        await deletedAndMadeAsTheConfigSays(running, seat, NEEDS);
        await (await bus.kv("needs", "alder")).put("alder.after.config.k", '"after"');
        const after = await request(seat, "mesh-provisioner.provisioning", { what: "needs", node: "alder" });
        expect((after.body.entries as { key: string }[]).map((e) => e.key)).toEqual(["alder.after.config.k"]);
      }),
    60_000,
  );
  it(
    "the claims bucket so: not ready, saying so, until it is deleted again and the set made it; runs are claimed again",
    () =>
      deletingSeat(async ({ bus, running, lines, seat }) => {
        const CLAIMS = "KV_mesh-provisioner_claims";
        await madeAgainWithOtherHistory(bus, seat, CLAIMS);
        await readinessSays(running, "bucket mesh-provisioner_claims was deleted behind the set and cannot be made again");
        // Still so at the next claims (rotation-fanout claims a run every second): asserted again each time, and refused.
        await new Promise((r) => setTimeout(r, 3000));
        await readinessSays(running, "bucket mesh-provisioner_claims was deleted behind the set and cannot be made again");
        // Warned once, not at each time it is tried again.
        expect(lines.filter((l) => l.msg === "bucket not made again; trying again at the next claim")).toHaveLength(1);
        // Holding no other bucket back: one deleted meanwhile is made again, and no longer said.
        const FAILING = "KV_mesh-provisioner_failing";
        const jsm = await seat.jetstreamManager();
        await jsm.streams.delete(FAILING);
        await until(async () => (await jsm.streams.info(FAILING).catch(() => undefined)) !== undefined, 10_000, "failing made again");
        await until(
          async () => {
            const { reasons } = (await (await fetch(`${running.httpUrl}/readyz`)).json()) as { reasons: string[] };
            return reasons.length === 1 && reasons[0]!.startsWith("bucket mesh-provisioner_claims was deleted behind the set");
          },
          10_000,
          "only the claims bucket said",
        );
        await deletedAndMadeAsTheConfigSays(running, seat, CLAIMS);
        await until(
          async () => ((await jsm.streams.info(CLAIMS).catch(() => undefined))?.state.messages ?? 0) > 0,
          15_000,
          "claimed again",
        );
      }),
    60_000,
  );
});

describe("a hung server (SIGSTOP)", () => {
  it("makes the set not ready within 10 s, HTTP answering 503 at once meanwhile, and ready again once it answers", async () => {
    const hung = await testBus();
    const running = await startSet(hung);
    try {
      await (await hung.kv("needs", "alder")).put("alder.zsh.shell.zsh/normal", '"held in memory"');
      const asked = await fetch(`${running.httpUrl}/provisioning?what=needs&node=alder`);
      expect(asked.status).toBe(200);
      const stoppedAt = Date.now();
      process.kill(hung.server.pid, "SIGSTOP");
      try {
        await until(async () => (await fetch(`${running.httpUrl}/readyz`)).status === 503, 10_000, "not ready");
        expect(Date.now() - stoppedAt).toBeLessThan(10_000);
        const body = (await (await fetch(`${running.httpUrl}/readyz`)).json()) as { reasons: string[] };
        expect(body.reasons.join("; ")).toMatch(/NATS does not answer|not connected to NATS/);
        const began = Date.now();
        const answer = await fetch(`${running.httpUrl}/provisioning?what=needs&node=alder`);
        expect(answer.status).toBe(503);
        expect(Date.now() - began).toBeLessThan(1000);
        // The reader's choice: what the view holds, and when it was last confirmed current.
        const stale = await fetch(`${running.httpUrl}/provisioning?what=needs&node=alder&stale=true`);
        expect(stale.status).toBe(200);
        const held = (await stale.json()) as { entries: { key: string }[]; confirmedAt: string };
        expect(held.entries.map((e) => e.key)).toEqual(["alder.zsh.shell.zsh/normal"]);
        expect(Date.parse(held.confirmedAt)).toBeGreaterThanOrEqual(stoppedAt - 60_000);
        expect(Date.parse(held.confirmedAt)).toBeLessThanOrEqual(stoppedAt);
      } finally {
        process.kill(hung.server.pid, "SIGCONT");
      }
      await until(async () => (await fetch(`${running.httpUrl}/readyz`)).status === 200, 30_000, "ready again");
      expect((await fetch(`${running.httpUrl}/provisioning?what=registry&kind=port`)).status).toBe(200);
    } finally {
      await running.stop();
      await hung.stop();
    }
  }, 60_000);
});

const MiB = 1024 * 1024;
/** A need of about 4 KB, one module per write, so the verb can be asked for any one of them. */
const blobKey = (i: number) => `alder.fill${i}.config.blob`;
const BLOB = JSON.stringify("x".repeat(4000));

/** Writes needs as alder until the server refuses one or `stop()` holds: the keys acknowledged, and the first refusal. */
async function fillAsAlder(alder: KV, stop: () => boolean = () => false): Promise<{ acked: string[]; refusal: NatsError }> {
  const acked: string[] = [];
  for (let i = 0; ; i++) {
    if (stop()) throw new Error(`no write refused after ${acked.length} acknowledged`);
    try {
      await alder.put(blobKey(i), BLOB);
      acked.push(blobKey(i));
    } catch (err) {
      return { acked, refusal: err as NatsError };
    }
  }
}

/** The set with a small events stream, so that a small store can hold its reservation. */
const smallEvents = (bus: TestBus): Partial<Config> => ({
  streams: { ...bus.config.streams, events: { ...bus.config.streams.events!, maxBytes: 4 * MiB } },
});

const metric = (text: string, name: string) => {
  const line = text.split("\n").find((l) => l.startsWith(`${name} `) || l.startsWith(`${name}{`));
  return line === undefined ? undefined : Number(line.slice(line.lastIndexOf(" ") + 1));
};

describe("JetStream's storage limit reached (max_file_store 40 MB)", () => {
  it("is said in readiness, status and the gauges in the server's words, nothing acknowledged is lost, and the set serves again once the server stores", async () => {
    const limited = await testBus({ maxFileStore: 40 * MiB });
    const running = await startSet(limited, smallEvents(limited));
    try {
      const keycloak = (await limited.connect("keycloak")).jetstream();
      const failing = (consumer: string) =>
        keycloak.publish(
          "keycloak.provisioner.failing",
          JSON.stringify({ machine: "alder", consumer, word: "before the store filled", at: new Date().toISOString() }),
        );
      await failing("before");
      const { acked, refusal } = await fillAsAlder(await limited.kv("needs", "alder"));
      expect(refusal.api_error?.description).toBe("insufficient resources");
      expect(acked.length).toBeGreaterThan(5000);

      await until(async () => (await fetch(`${running.httpUrl}/readyz`)).status === 503, 10_000, "not ready");
      const ready = (await (await fetch(`${running.httpUrl}/readyz`)).json()) as { reasons: string[] };
      expect(ready.reasons.join("; ")).toContain("JetStream refuses to store: insufficient resources");
      const status = (await (await fetch(`${running.httpUrl}/status`)).json()) as Status;
      expect(status.well).toBe(false);
      expect(status.events.recording).toBe(false);
      expect(status.events.reason).toContain("insufficient resources");
      expect(status.events.stream).toMatchObject({ name: "mesh-provisioner_events", maxBytes: 4 * MiB });
      expect(status.events.account!.bytes).toBeGreaterThan(35 * MiB);
      const metrics = await (await fetch(`${running.httpUrl}/metrics`)).text();
      expect(metric(metrics, "jetstream_storing")).toBe(0);
      expect(metric(metrics, "jetstream_account_storage_bytes")).toBeGreaterThan(35 * MiB);
      // The account has no limit of its own: the server's applies.
      expect(metric(metrics, "jetstream_account_max_storage_bytes")).toBe(-1);
      expect(metrics).toContain(`stream_max_bytes{stream="mesh-provisioner_events"} ${4 * MiB}`);
      // What a provider publishes now is refused, not lost silently.
      await expect(failing("during")).rejects.toThrow();
      // The set still answers from what it holds, the last acknowledged write among it.
      const last = acked.at(-1)!;
      const module = last.split(".")[1];
      const answer = await fetch(`${running.httpUrl}/provisioning?what=needs&node=alder&module=${module}`);
      expect(answer.status).toBe(200);
      expect(((await answer.json()) as { entries: { key: string }[] }).entries.map((e) => e.key)).toEqual([last]);

      // The operator gives JetStream more storage; the set sees it by itself.
      await limited.restart({ maxFileStore: 200 * MiB });
      await until(async () => (await fetch(`${running.httpUrl}/readyz`)).status === 200, 30_000, "ready again");
      const after = (await (await fetch(`${running.httpUrl}/status`)).json()) as Status;
      expect(after.events.recording).toBe(true);
      expect(after.failing.map((f) => f.consumer)).toEqual(["before"]);
      const held = await (await limited.kv("needs")).keys("alder.>");
      const keys = new Set<string>();
      for await (const key of held) keys.add(key);
      expect(acked.filter((key) => !keys.has(key))).toEqual([]);
      await failing("after");
      await until(
        async () =>
          ((await (await fetch(`${running.httpUrl}/status`)).json()) as Status).failing.map((f) => f.consumer).join() === "after,before",
        10_000,
        "the event published after is followed",
      );
    } finally {
      await running.stop();
      await limited.stop();
    }
  }, 120_000);
});

describe("the seat's account's own JetStream limit reached (max_file 24 MiB)", () => {
  it("is said though the probe's own key is overwritten, and the set serves again once the account may store", async () => {
    const limited = await testBus({ seatMaxFile: 24 * MiB });
    const running = await startSet(limited, smallEvents(limited));
    try {
      const { acked, refusal } = await fillAsAlder(await limited.kv("needs", "alder"));
      expect(refusal.api_error?.description).toMatch(/resource limits exceeded for account/);
      await until(async () => (await fetch(`${running.httpUrl}/readyz`)).status === 503, 10_000, "not ready");
      const status = (await (await fetch(`${running.httpUrl}/status`)).json()) as Status;
      expect(status.events.recording).toBe(false);
      expect(status.events.reason).toContain("the account's storage is full");
      expect(status.events.account!.maxBytes).toBe(24 * MiB);
      const metrics = await (await fetch(`${running.httpUrl}/metrics`)).text();
      expect(metric(metrics, "jetstream_storing")).toBe(0);
      expect(metric(metrics, "jetstream_account_max_storage_bytes")).toBe(24 * MiB);

      await limited.restart({ seatMaxFile: 200 * MiB });
      await until(async () => (await fetch(`${running.httpUrl}/readyz`)).status === 200, 30_000, "ready again");
      const keys = new Set<string>();
      for await (const key of await (await limited.kv("needs")).keys("alder.>")) keys.add(key);
      expect(acked.filter((key) => !keys.has(key))).toEqual([]);
    } finally {
      await running.stop();
      await limited.stop();
    }
  }, 120_000);
});

describe("a full disk (the store on a 30 MiB tmpfs)", () => {
  const root = process.getuid?.() === 0;
  it.runIf(root)(
    "makes the set not ready saying JetStream does not answer or refuses, stale reads answer from memory, nothing acknowledged is lost, and it serves again once the server does",
    async () => {
      const mount = mkdtempSync(join(tmpdir(), "mesh-provisioner-disk-"));
      execFileSync("mount", ["-t", "tmpfs", "-o", "size=30m", "tmpfs", mount]);
      const filler = join(mount, "filler");
      const full = await testBus({ under: mount });
      const running = await startSet(full, smallEvents(full));
      try {
        const keycloak = (await full.connect("keycloak")).jetstream();
        await keycloak.publish(
          "keycloak.provisioner.failing",
          JSON.stringify({ machine: "alder", consumer: "before", word: "before the disk filled", at: new Date().toISOString() }),
        );
        // Something else fills the disk, leaving 3 MiB to the server's store.
        const free = statfsSync(mount);
        execFileSync("fallocate", ["-l", String(free.bavail * free.bsize - 3 * MiB), filler]);
        const { acked } = await fillAsAlder(await full.kv("needs", "alder"));
        expect(acked.length).toBeGreaterThan(100);

        // The server's word, or that it does not answer (a wedged server may stop answering core NATS too).
        const saysJetStream = /JetStream does not answer|JetStream refuses to store|NATS does not answer/;
        await until(
          async () =>
            saysJetStream.test(((await (await fetch(`${running.httpUrl}/readyz`)).json()) as { reasons?: string[] }).reasons?.join() ?? ""),
          15_000,
          "not ready, saying what JetStream does",
        );
        // Reads that must ask the server do not wait for it: a 503 at once, saying why.
        const began = Date.now();
        const refused = await fetch(`${running.httpUrl}/status`);
        expect(refused.status).toBe(503);
        expect(((await refused.json()) as { error: { message: string } }).error.message).toMatch(/does not answer/);
        expect(Date.now() - began).toBeLessThan(1000);
        // The reader's choice meanwhile: what the view holds, the last acknowledged write among it.
        const last = acked.at(-1)!;
        const stale = await fetch(`${running.httpUrl}/provisioning?what=needs&node=alder&module=${last.split(".")[1]}&stale=true`);
        expect(stale.status).toBe(200);
        expect(((await stale.json()) as { entries: { key: string }[] }).entries.map((e) => e.key)).toEqual([last]);

        // The disk is freed, and the server (wedged by nats-server 2.9 until it restarts) restarted.
        rmSync(filler);
        await full.restart();
        await until(async () => (await fetch(`${running.httpUrl}/readyz`)).status === 200, 30_000, "ready again");
        const status = (await (await fetch(`${running.httpUrl}/status`)).json()) as Status;
        expect(status.events.recording).toBe(true);
        expect(status.failing.map((f) => f.consumer)).toEqual(["before"]);
        const keys = new Set<string>();
        for await (const key of await (await full.kv("needs")).keys("alder.>")) keys.add(key);
        expect(acked.filter((key) => !keys.has(key))).toEqual([]);
        const answer = await fetch(`${running.httpUrl}/provisioning?what=needs&node=alder&module=${last.split(".")[1]}`);
        expect(((await answer.json()) as { entries: { key: string }[] }).entries.map((e) => e.key)).toEqual([last]);
      } finally {
        await running.stop();
        await full.stop();
        execFileSync("umount", [mount]);
        rmSync(mount, { recursive: true, force: true });
      }
    },
    120_000,
  );
});

describe("a replica of the set killed while it holds events", () => {
  // Long enough that the replica started after the kill, on a loaded machine, sees the events held before they come again.
  const ACK_WAIT_SECONDS = 40;
  it("leaves status saying how many events are delivered and not acknowledged, until another replica gets them after the ack wait", async () => {
    const crash = await testBus();
    const dir = mkdtempSync(join(tmpdir(), "mesh-provisioner-replica-"));
    const ackWait: Partial<Config> = {
      streams: { ...crash.config.streams, events: { ...crash.config.streams.events!, ackWaitSeconds: ACK_WAIT_SECONDS } },
    };
    const { root: _root, file: _file, ...raw } = { ...crash.config, ...ackWait, functions: SHIPPED_DIR };
    const configFile = join(dir, "replica.config.mts");
    writeFileSync(configFile, `export default ${JSON.stringify(raw)};\n`);
    const child = spawn("node", [join(ROOT, "bin", "mesh-provisioner.mjs"), "-c", configFile, "start"], {
      cwd: ROOT,
      env: { ...process.env, LOG_LEVEL: "silent" },
      stdio: "ignore",
    });
    let running: Running | undefined;
    try {
      const keycloak = (await crash.connect("keycloak")).jetstream();
      const failing = (consumer: string) =>
        keycloak.publish(
          "keycloak.provisioner.failing",
          JSON.stringify({ machine: "alder", consumer, word: "w", at: new Date().toISOString() }),
        );
      const asker = await crash.connect();
      await until(async () => (await request(asker, STATUS, {}).catch(() => undefined)) !== undefined, 30_000, "the first replica answers");
      await failing("first");
      await until(
        async () => (await request(asker, STATUS, {}).catch(() => undefined))?.body.failing?.length === 1,
        30_000,
        "the first replica follows",
      );
      // "first" is written before it is acknowledged: stopped in between, it would be counted twice.
      const jsm = await (await crash.connect()).jetstreamManager();
      await until(
        async () => (await jsm.consumers.info("mesh-provisioner_events", "mesh-provisioner-events")).num_ack_pending === 0,
        10_000,
        "the first replica acknowledged what it followed",
      );
      // Stopped, it still has its pull outstanding: the server hands it the next events, which it never acknowledges.
      child.kill("SIGSTOP");
      for (let i = 0; i < 10; i++) await failing(`held${i}`);
      // What the test is about: the stopped replica was handed some of them, and holds them unacknowledged.
      await until(
        async () => (await jsm.consumers.info("mesh-provisioner_events", "mesh-provisioner-events")).num_ack_pending > 0,
        5000,
        "the stopped replica handed some of the ten events (its pull still outstanding)",
      );
      child.kill("SIGKILL");

      running = await startSet(crash, ackWait);
      const status = async () => (await (await fetch(`${running!.httpUrl}/status`)).json()) as Status;
      // The killed replica's pulls held some of the ten (all of them, unless the machine was slow
      // to hand them over): status counts those, and this replica follows the rest at once.
      let last: Status | undefined;
      await until(
        async () => {
          const { events, failing } = (last = await status());
          return events.unacknowledged > 0 && failing.length + events.unacknowledged === 11;
        },
        15_000,
        "status says what the killed replica holds",
      ).catch((err: Error) => {
        throw new Error(`${err.message}; it said: ${JSON.stringify({ events: last?.events, failing: last?.failing.length })}`);
      });
      const held = await status();
      expect(held.failing.map((f) => f.consumer)).toContain("first");
      expect(held.failing.length).toBe(11 - held.events.unacknowledged);
      expect(held.events.ackWaitSeconds).toBe(ACK_WAIT_SECONDS);
      // After the ack wait, the other replica gets them.
      await until(async () => (await status()).failing.length === 11, (ACK_WAIT_SECONDS + 10) * 1000, "the held events are followed");
      await until(async () => (await status()).events.unacknowledged === 0, 10_000, "nothing held any more");
    } finally {
      child.kill("SIGKILL");
      await running?.stop();
      await crash.stop();
      rmSync(dir, { recursive: true, force: true });
    }
  }, 150_000);
});

describe("the streams' watch (docs/runtime.md §6.11)", () => {
  it("tells a durable whose stream the server says does not exist, within a read or two", async () => {
    const bus = await testBus({ seatPermissions: { publish: { allow: [">"] }, subscribe: { allow: [">"] } } });
    const seat = await bus.connect();
    const jsm = await seat.jetstreamManager();
    const EVENTS = "mesh-provisioner_events";
    await jsm.streams.add({ name: EVENTS, subjects: ["*.provisioner.failing"] });
    const told: string[] = [];
    const held = [{ name: "events", stream: EVENTS, durable: "mesh-provisioner-events" }];
    const watch = watchStreams(
      seat,
      bus.config,
      held,
      () => {},
      (durable) => void told.push(durable),
    );
    try {
      await until(() => watch.streams().events !== undefined, 10_000, "read once");
      expect(told).toEqual([]);
      await jsm.streams.delete(EVENTS);
      await until(() => told.length > 0, 12_000, "told the stream is missing");
      expect([told[0], watch.streams().events?.missing]).toEqual([
        "mesh-provisioner-events",
        `stream ${EVENTS} does not exist on the server: nothing is recorded in it`,
      ]);
    } finally {
      watch.stop();
      await bus.stop();
    }
  });
});
