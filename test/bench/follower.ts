/**
 * The follower's figures (test/bench/README.md, "follower"): 10,000 failing/recovered events
 * through the set's durable consumer of the events stream, against a bare ack loop and a
 * put-then-ack loop on new durables of the same stream, 3 runs in turn, medians. `followerFigures` is the measurement
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
import { line, median, openBench } from "./harness.ts";
import { stopChild } from "./processes.ts";

/** Events published: 1,000 triples, each failing and recovered 5 times. */
export const EVENTS = 10_000;
/** Messages the baselines pull at once and hold at once, as the set does. */
const BATCH = 64;

export interface FollowerFigures {
  readonly events: number;
  /** Medians of the runs, events per second. */
  readonly followerEventsPerSecond: number;
  readonly ackLoopEventsPerSecond: number;
  readonly storeLoopEventsPerSecond: number;
  /** Each run's figures, in the order taken. */
  readonly runs: { follower: number; ackLoop: number; storeLoop: number }[];
}

const encoder = new TextEncoder();

/**
 * `runs` times, in turn (so that the machine's noise falls on the three alike): publishes
 * {@link EVENTS} events while the set is stopped (it must have run once, asserting the stream
 * and its durable), starts it with `startSet` and times its durable from the first delivery to
 * the last acknowledgement (consumer info polled every 5 ms), stops it; then the two baselines,
 * each on a new durable of the stream starting at that run's first event, over that run's
 * events. Resolves with the medians and each run. `nc` may publish on the providers' subjects
 * and use the stream's and the `failing` bucket's API.
 */
export async function followerFigures(
  nc: NatsConnection,
  config: Config,
  functions: readonly LoadedFunction[],
  startSet: () => Promise<ChildProcess>,
  runs = 3,
): Promise<FollowerFigures> {
  const js = nc.jetstream();
  const jsm = await nc.jetstreamManager();
  const stream = config.streams.events!.stream;
  const providers = config.embedded.providers;
  // The one durable consumer of the events stream, which every follower function reads.
  const durable = durablesOf(targetsOf(functions, event), config).find((d) => d.stream === stream)!.durable;
  const delivered = () => jsm.consumers.info(stream, durable);
  const store = await js.views.kv(config.buckets.failing!.bucket, { bindOnly: true, allow_direct: true });

  /** Publishes one run's events, each newer than the runs' before; resolves with the stream sequence of its first. */
  const publish = async (run: number): Promise<number> => {
    const base = Date.now() - 3_600_000 + run * 60_000;
    const acks: Promise<{ seq: number }>[] = [];
    let firstSeq = 0;
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
      const seqs = (await Promise.all(acks.splice(0))).map((ack) => ack.seq);
      if (e === 0) firstSeq = Math.min(...seqs);
    }
    return firstSeq;
  };

  /** The set's durable over one run's events: from its first delivery to its last acknowledgement, events per second. */
  const follow = async (): Promise<number> => {
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
    await stopChild(set);
    return EVENTS / ((last - first) / 1000);
  };

  /**
   * A bare loop over one run's events, on a new durable consumer from `firstSeq` (explicit acks,
   * {@link BATCH} pulled at once, up to {@link BATCH} in hand): `work` for each, then the ack;
   * the durable deleted after. Events per second.
   */
  const consumerLoop = async (name: string, firstSeq: number, work: (m: JsMsg) => Promise<unknown> | void) => {
    await jsm.consumers.add(stream, {
      durable_name: name,
      ack_policy: AckPolicy.Explicit,
      deliver_policy: DeliverPolicy.StartSequence,
      opt_start_seq: firstSeq,
      max_ack_pending: 1000,
    });
    const messages = await (await js.consumers.get(stream, name)).consume({ max_messages: BATCH });
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
      if (++taken === EVENTS) break;
    }
    await Promise.all(running);
    await nc.flush();
    messages.stop();
    await jsm.consumers.delete(stream, name);
    return EVENTS / ((performance.now() - began) / 1000);
  };

  const taken: FollowerFigures["runs"] = [];
  for (let run = 0; run < runs; run++) {
    const firstSeq = await publish(run);
    const follower = await follow();
    const ackLoop = await consumerLoop("bench-ack-loop", firstSeq, () => {});
    // The least a follower storing each event does: parse it, put one key, then ack.
    const storeLoop = await consumerLoop("bench-store-loop", firstSeq, (m) => {
      const event = m.json<{ machine: string; consumer: string }>();
      return store.put(`bench.${event.machine}.${event.consumer}`, m.data);
    });
    taken.push({ follower, ackLoop, storeLoop });
  }
  return {
    events: EVENTS,
    followerEventsPerSecond: median(taken.map((r) => r.follower)),
    ackLoopEventsPerSecond: median(taken.map((r) => r.ackLoop)),
    storeLoopEventsPerSecond: median(taken.map((r) => r.storeLoop)),
    runs: taken,
  };
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
    line(`${EVENTS.toLocaleString("en-US")} events: follower · bare ack loop · put-then-ack loop (events/s)`);
    for (const run of figures.runs) line(`  run: ${Math.round(run.follower)} · ${Math.round(run.ackLoop)} · ${Math.round(run.storeLoop)}`);
    line(`  medians: ${Math.round(follower)} · ${Math.round(ack)} · ${Math.round(store)}`);
    line(`  follower / bare ack loop ${(follower / ack).toFixed(3)} · follower / put-then-ack loop ${(follower / store).toFixed(3)}`);
  } finally {
    await bench.stop();
  }
}

if (import.meta.url === pathToFileURL(process.argv[1]!).href) await main();
