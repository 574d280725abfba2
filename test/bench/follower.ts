/**
 * The follower's figures (test/bench/README.md, "follower"): 10,000 failing/recovered events
 * through the set's durable consumer of the events stream, against a bare ack loop and a
 * put-then-ack loop on new durables of the same stream. `followerFigures` is the measurement
 * test/bench/bench.ts takes; run alone (`npx tsx test/bench/follower.ts`), this file takes only
 * it, on the bench's embedded nats-server (harness.ts), and prints the figures. `BENCH_PROFILE=<folder>`:
 * the set writes a V8 CPU profile there when it stops.
 */
import type { ChildProcess } from "node:child_process";
import { pathToFileURL } from "node:url";
import { AckPolicy, DeliverPolicy, type JsMsg, type NatsConnection } from "nats";
import type { Config, LoadedFunction } from "../../runtime/index.ts";
import { durables as durablesOf, event } from "../../runtime/triggers/event.ts";
import { targetsOf } from "../../runtime/triggers/kind.ts";
import { line, openBench } from "./harness.ts";
import { stopChild } from "./processes.ts";

/** Events published: 1,000 triples, each failing and recovered 5 times. */
export const EVENTS = 10_000;
/** Messages the baselines pull at once and hold at once, as the set does. */
const BATCH = 64;

export interface FollowerFigures {
  readonly events: number;
  readonly followerEventsPerSecond: number;
  readonly ackLoopEventsPerSecond: number;
  readonly storeLoopEventsPerSecond: number;
}

const encoder = new TextEncoder();

/**
 * Publishes {@link EVENTS} events while the set is stopped (it must have run once, asserting the
 * stream and its durable), starts it with `startSet` and times its durable from the first delivery
 * to the last acknowledgement (consumer info polled every 5 ms), stops it; then the two
 * baselines, each on a new durable of the stream, over every message the stream holds. `nc` may
 * publish on the providers' subjects and use the stream's and the `failing` bucket's API.
 */
export async function followerFigures(
  nc: NatsConnection,
  config: Config,
  functions: readonly LoadedFunction[],
  startSet: () => Promise<ChildProcess>,
): Promise<FollowerFigures> {
  const js = nc.jetstream();
  const jsm = await nc.jetstreamManager();
  const stream = config.streams.events!.stream;
  const providers = config.embedded.providers;
  const base = Date.now() - 3_600_000;
  const acks: Promise<unknown>[] = [];
  for (let e = 0; e < EVENTS / 1000; e++) {
    for (let t = 0; t < 1000; t++) {
      const kind = e % 2 === 0 ? "failing" : "recovered";
      const event = {
        machine: `n${t}`,
        consumer: `c${t % 7}`,
        at: new Date(base + e * 1000 + t).toISOString(),
        ...(kind === "failing" ? { word: `down ${e}` } : {}),
      };
      acks.push(js.publish(`${providers[t % providers.length]}.provisioner.${kind}`, encoder.encode(JSON.stringify(event))));
    }
    await Promise.all(acks.splice(0));
  }
  // The one durable consumer of the events stream, which every follower function reads.
  const durable = durablesOf(targetsOf(functions, event), config).find((d) => d.stream === stream)!.durable;
  const delivered = () => jsm.consumers.info(stream, durable);
  const before = (await delivered()).delivered.stream_seq;
  const set = await startSet();
  let first = 0;
  let last = 0;
  for (;;) {
    const info = await delivered();
    const now = performance.now();
    const moved = info.delivered.stream_seq > before;
    const done = info.num_pending === 0 && info.num_ack_pending === 0;
    if (moved && first === 0) first = now;
    if (done && first !== 0) {
      last = now;
      break;
    }
    await new Promise((r) => setTimeout(r, 5));
  }
  const followerRate = EVENTS / ((last - first) / 1000);
  await stopChild(set);

  /**
   * A bare loop over every message of the events stream, on a new durable consumer (explicit
   * acks, {@link BATCH} pulled at once, up to {@link BATCH} in hand): `work` for each, then the ack.
   */
  const consumerLoop = async (durable: string, work: (m: JsMsg) => Promise<unknown> | void) => {
    await jsm.consumers.add(stream, {
      durable_name: durable,
      ack_policy: AckPolicy.Explicit,
      deliver_policy: DeliverPolicy.All,
      max_ack_pending: 1000,
    });
    const total = (await jsm.streams.info(stream)).state.messages;
    const messages = await (await js.consumers.get(stream, durable)).consume({ max_messages: BATCH });
    const running = new Set<Promise<void>>();
    let taken = 0;
    let began = 0;
    for await (const m of messages) {
      if (taken === 0) began = performance.now();
      const done: Promise<void> = Promise.resolve(work(m))
        .then(() => m.ack())
        .finally(() => running.delete(done));
      running.add(done);
      if (running.size >= BATCH) await Promise.race(running);
      if (++taken === total) break;
    }
    await Promise.all(running);
    await nc.flush();
    messages.stop();
    return total / ((performance.now() - began) / 1000);
  };
  const loopRate = await consumerLoop("bench-ack-loop", () => {});
  // The least a follower storing each event does: parse it, put one key, then ack.
  const store = await js.views.kv(config.buckets.failing!.bucket, { bindOnly: true, allow_direct: true });
  const storeRate = await consumerLoop("bench-store-loop", (m) => {
    const event = m.json<{ machine: string; consumer: string }>();
    return store.put(`bench.${event.machine}.${event.consumer}`, m.data);
  });
  await Promise.all(["bench-ack-loop", "bench-store-loop"].map((d) => jsm.consumers.delete(stream, d)));
  return { events: EVENTS, followerEventsPerSecond: followerRate, ackLoopEventsPerSecond: loopRate, storeLoopEventsPerSecond: storeRate };
}

/** This file run alone: the bench's server ({@link openBench}), the set started once to assert its stream, then {@link followerFigures}. */
async function main(): Promise<void> {
  const bench = await openBench();
  try {
    const startSet = async () => (await bench.startSet()).process;
    // The set asserts the buckets, the stream and its durable, then stops.
    await bench.stopChild(await startSet());
    const figures = await followerFigures(bench.nc, bench.config, bench.functions, startSet);
    const { followerEventsPerSecond: follower, ackLoopEventsPerSecond: ack, storeLoopEventsPerSecond: store } = figures;
    line(`${EVENTS.toLocaleString("en-US")} events: follower · bare ack loop · put-then-ack loop`);
    line(`  ${Math.round(follower)} · ${Math.round(ack)} · ${Math.round(store)} events/s`);
    line(`  follower / bare ack loop ${(follower / ack).toFixed(3)} · follower / put-then-ack loop ${(follower / store).toFixed(3)}`);
  } finally {
    await bench.stop();
  }
}

if (import.meta.url === pathToFileURL(process.argv[1]!).href) await main();
