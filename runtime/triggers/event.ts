/**
 * The `{ event, stream? }` trigger kind: messages on a subject (wildcards allowed). With a stream
 * of the config, through a durable consumer of that stream, so nothing published while the set
 * is down is lost; without, a plain subscription in the seat's queue group (docs/runtime.md §6.3.2).
 */
import {
  ConsumerEvents,
  type ConsumerInfo,
  type ConsumerMessages,
  type JetStreamManager,
  type JsMsg,
  type StreamInfo,
  type Subscription,
} from "nats";
import { z } from "zod";
import type { Config } from "../config.ts";
import { assertStreams } from "../assert.ts";
import { CONSUMER_NOT_FOUND, errCode, reasonOf, retryElecting, STREAM_NOT_FOUND } from "../jetstream.ts";
import { bindDurable, durableName, streamChanged, watchStreams, type Durable } from "../durables.ts";
import { RESERVED, reserved, SUBJECT_PATTERN, subjectMatches } from "../subjects.ts";
import { bindingName, type BindEnv, type FunctionRef, type Target, type TriggerKind } from "./kind.ts";

/** `{ event, stream? }`: a subject or pattern, and the name of a stream in the config's `streams`. */
export type EventTrigger = { readonly event: string; readonly stream?: string };
/**
 * What an event's run says of it: its subject and, with a stream, the stream's name, the
 * message's stream sequence, how often it was delivered and when the server stored it, and how
 * far the durable's acknowledgements had reached.
 */
export type EventInfo = {
  readonly kind: "event";
  readonly subject: string;
  readonly stream?: string;
  readonly sequence?: number;
  readonly deliveries?: number;
  /** With a stream: when the server stored the message (its time, not the publisher's). */
  readonly storedAt?: Date;
  /** With a stream: the same, in nanoseconds since the epoch (as precise as a double holds it). */
  readonly storedNanos?: number;
  /**
   * With a stream: its durable consumer's acknowledgement floor (`ack_floor.stream_seq`), the
   * highest the server said to this replica on this stream, at binding and every
   * {@link STREAMS_MS}: every message up to it was acknowledged, so handled (a durable made again
   * from below it delivers those again). The server's, never this replica's own
   * acknowledgements; the records forget counted refusals at or below it (docs/failing.md §5.3).
   */
  readonly ackFloor?: number;
  /** With a stream: when the stream was made (its info's `created`); one made anew numbers its messages from 1 again. */
  readonly streamCreated?: string;
};

const schema = z.strictObject({
  event: z
    .string()
    .regex(SUBJECT_PATTERN, "must be a NATS subject (tokens, `*`, a final `>`) without spaces")
    .refine((s) => !s.startsWith(">"), "must not be > alone: that is every message of the bus")
    .refine(
      (s) => s.startsWith(">") || s.split(".").some((t) => t !== "*" && t !== ">"),
      "must hold a token besides wildcards: `*.>` is nearly every message of the bus, the server's own among them",
    )
    .refine((s) => !reserved(s), RESERVED),
  stream: z.string().min(1).optional(),
});

/** Messages a durable consumer pulls at once, and handles at once. */
const BATCH = 64;
/**
 * The pull is topped up to {@link BATCH} once at most this many of the messages asked are still to
 * come: half, not nats.js's three quarters, so half as many pull requests (each a write of its own).
 */
const REFILL = BATCH / 2;

/**
 * A message no trigger of this replica matches comes again after {@link UNMATCHED_DELAY_MS} (a
 * replica of another version, sharing the durable, may have a function for it), up to this many
 * deliveries, about a minute, before it is acknowledged.
 */
export const UNMATCHED_DELIVERIES = 60;
export const UNMATCHED_DELAY_MS = 1000;

/**
 * A promise shared by every caller within one turn of the event loop, resolved once that turn's
 * I/O is handled (`setImmediate`). What waits for it runs in one round of microtasks, so the
 * protocol lines it sends (acknowledgements, the handlers' requests) leave in one socket write
 * rather than one each: nats.js writes its outbound buffer at the end of the round that filled it.
 */
function loopTurns(): () => Promise<void> {
  let next: Promise<void> | undefined;
  return () =>
    (next ??= new Promise<void>((resolve) =>
      setImmediate(() => {
        next = undefined;
        resolve();
      }),
    ));
}

/** The wait before a failed message is delivered again: 0.5 s doubling per delivery, at most 30 s. */
export function backoff(deliveries: number): number {
  return Math.min(500 * 2 ** Math.max(0, deliveries - 1), 30_000);
}

/** The subjects each configured stream must capture: the `event` of every trigger naming it. */
function streamSubjects(targets: readonly Target<EventTrigger>[]): Map<string, string[]> {
  const subjects = new Map<string, string[]>();
  for (const { trigger } of targets) {
    if (trigger.stream === undefined) continue;
    const list = subjects.get(trigger.stream) ?? [];
    if (!list.includes(trigger.event)) list.push(trigger.event);
    subjects.set(trigger.stream, list);
  }
  return subjects;
}

/**
 * The durable consumers of `{ event, stream }` triggers, one per stream they name: the stream's
 * name on the server, the durable's ({@link durableName}), and the durables an earlier version
 * made per trigger ({@link bindingName}: the function's name, `-<n>` from its second one), which
 * binding replaces.
 */
export function durables(targets: readonly Target<EventTrigger>[], config: Config): Durable[] {
  const names = [...new Set(targets.flatMap((t) => (t.trigger.stream === undefined ? [] : [t.trigger.stream])))];
  return names.map((name) => {
    const durable = durableName(config.seat, name);
    const earlier = targets
      .filter((t) => t.trigger.stream === name)
      .map(({ fn, index }) => bindingName(fn, index))
      .filter((d) => d !== durable);
    return { name, stream: config.streams[name]!.stream, durable, earlier: [...new Set(earlier)] };
  });
}

/** What the consumption of each durable shares with its binding. */
interface Shared {
  readonly jsm: JetStreamManager;
  /** Whether the binding is stopping. */
  stopping(): boolean;
  /** The consumptions in hand, which a stop ends. */
  readonly live: Set<ConsumerMessages>;
  /** Durables found gone, not made again yet, by name: why the binding cannot serve. */
  readonly gone: Map<string, string>;
}

/** A trigger of a durable's stream, with its binding's name (what `succeeded` remembers). */
type StreamTrigger<F extends FunctionRef> = Target<EventTrigger, F> & { readonly key: string };

/**
 * Follows `held`'s durable, `bound` on the stream made at `streamCreated`, until the binding
 * stops: each message to every taker whose `event` matches its subject (see {@link event}'s
 * `bind`), the durable made again when found gone. Returns the consumption's loop, what takes
 * the durable's floor as the streams' watch reads it, and the check of the stream as asserted
 * again after a reconnect.
 */
function followDurable<F extends FunctionRef>(
  held: Durable,
  bound: ConsumerInfo,
  streamCreated: string,
  streamTriggers: readonly StreamTrigger<F>[],
  env: BindEnv<F, EventInfo>,
  shared: Shared,
): { loop: Promise<void>; floors(created: string, floor: number): void; reasserted(streams: ReadonlyMap<string, StreamInfo>): void } {
  const { nc, config, log } = env;
  const { jsm } = shared;
  const { stream, durable } = held;
  const { ackWaitSeconds } = config.streams[held.name]!;
  // What this replica knows of the durable's progress, to make it again from there: the stream
  // sequences handed to it and not acknowledged yet (in hand, or failed and waiting), the
  // highest it saw acknowledged (the durable's floor as bound), and when the stream those are
  // sequences of was made.
  const pending = new Set<number>();
  let acked = bound.ack_floor.stream_seq;
  let created = streamCreated;
  // The durable's floor as the server said it (not `acked`: other replicas acknowledge too),
  // for the records to forget refusals counted at or below it; it only rises on one stream.
  let floor = bound.ack_floor.stream_seq;
  const floors = (of: string, read: number) => {
    if (of === created) floor = Math.max(floor, read);
  };
  /** By stream sequence, the triggers that succeeded on a message that comes again for another's fault. */
  const succeeded = new Map<number, Set<string>>();
  // The messages of one pull start together and are acknowledged together (see loopTurns).
  const started = loopTurns();
  const decided = loopTurns();
  const ack = (m: JsMsg) =>
    void decided()
      .then(() => {
        m.ack();
        pending.delete(m.seq);
        acked = Math.max(acked, m.seq);
      })
      // A connection closed meanwhile: the message comes again after the ack wait.
      .catch((err: unknown) => log.warn({ stream, durable, sequence: m.seq, err }, "message not acknowledged"));
  /** The triggers matching each subject seen lately (a provider's few subjects come again and again). */
  const matches = new Map<string, typeof streamTriggers>();
  const triggersOf = (subject: string) => {
    let matched = matches.get(subject);
    if (matched === undefined) {
      if (matches.size >= 1024) matches.clear();
      matches.set(subject, (matched = streamTriggers.filter((t) => subjectMatches(t.trigger.event, subject))));
    }
    return matched;
  };
  const handle = async (m: JsMsg) => {
    const matched = triggersOf(m.subject);
    if (matched.length === 0) {
      if (m.info.redeliveryCount < UNMATCHED_DELIVERIES) return m.nak(UNMATCHED_DELAY_MS);
      log.warn({ stream, durable, subject: m.subject, sequence: m.seq }, "message matched by no trigger; acknowledged");
      return ack(m);
    }
    const info = {
      kind: "event",
      subject: m.subject,
      stream,
      sequence: m.seq,
      deliveries: m.info.redeliveryCount,
      storedAt: new Date(m.info.timestampNanos / 1e6),
      storedNanos: m.info.timestampNanos,
      ackFloor: floor,
      streamCreated: created,
    } as const;
    const done = succeeded.get(m.seq) ?? new Set<string>();
    const outcomes = await Promise.all(
      matched.filter((t) => !done.has(t.key)).map(async (t) => ({ t, outcome: await env.run(t.fn, { data: m.data }, info) })),
    );
    // A refusal is acknowledged (the runner counted it); a fault comes again.
    for (const { t, outcome } of outcomes) if (outcome.ok || outcome.error.code < 500) done.add(t.key);
    if (done.size < matched.length) {
      succeeded.delete(m.seq);
      succeeded.set(m.seq, done);
      // Kept for as many messages as the durable hands out unacknowledged.
      if (succeeded.size > 1000) succeeded.delete(succeeded.keys().next().value!);
      return m.nak(backoff(m.info.redeliveryCount));
    }
    succeeded.delete(m.seq);
    ack(m);
  };
  /** The consumption in hand; why it must be bound again, when the stream was found made anew behind it. */
  let current: ConsumerMessages | undefined;
  let streamLost: string | undefined;
  /** Consumes until stopped (`undefined`) or until the durable must be bound again: says why. */
  const consumeOnce = async (): Promise<string | undefined> => {
    let messages: ConsumerMessages;
    try {
      const consumer = await retryElecting(() => nc.jetstream().consumers.get(stream, durable), { log, about: { stream, durable } });
      messages = await consumer.consume({ max_messages: BATCH, threshold_messages: REFILL });
    } catch (err) {
      if (shared.stopping()) return undefined;
      const code = errCode(err);
      return code === CONSUMER_NOT_FOUND ? "not found" : code === STREAM_NOT_FOUND ? "its stream not found" : reasonOf(err);
    }
    current = messages;
    shared.live.add(messages);
    // A stop while the consumer was being opened did not see it.
    if (shared.stopping() || streamLost !== undefined) messages.stop();
    let said: string | undefined;
    void (async () => {
      for await (const s of await messages.status()) {
        if (
          s.type === ConsumerEvents.ConsumerDeleted ||
          s.type === ConsumerEvents.ConsumerNotFound ||
          s.type === ConsumerEvents.StreamNotFound
        ) {
          said =
            s.type === ConsumerEvents.ConsumerDeleted
              ? "deleted"
              : s.type === ConsumerEvents.ConsumerNotFound
                ? "not found"
                : "its stream not found";
          messages.stop();
          return;
        }
      }
    })().catch(() => {});
    const running = new Set<Promise<void>>();
    for await (const m of messages) {
      if (shared.stopping()) {
        m.nak();
        continue;
      }
      pending.add(m.seq);
      const handled: Promise<void> = started()
        .then(() => handle(m))
        .catch((err: unknown) => log.error({ stream, durable, err }, "event not handled"))
        .finally(() => running.delete(handled));
      running.add(handled);
      if (running.size >= BATCH) await Promise.race(running);
    }
    await Promise.all(running);
    // The acknowledgements of the last messages leave before the binding says it stopped.
    await decided();
    shared.live.delete(messages);
    current = undefined;
    return shared.stopping() ? undefined : (streamLost ?? said);
  };
  // After a reconnect: a stream made anew while the durable was still found (another replica
  // made it again first) is one whose sequences this replica's progress does not belong to.
  const reasserted = (streams: ReadonlyMap<string, StreamInfo>) => {
    const info = streams.get(held.name);
    if (info === undefined || info.created === created || shared.gone.has(durable)) return;
    streamLost = "its stream made anew";
    current?.stop();
  };
  // A durable deleted behind the set (`nats consumer rm`) is made again from where this
  // replica was, and not ready meanwhile; on a stream made anew (a server back with an empty
  // store, the stream deleted and made again), or whose sequences went back, from its first
  // message: the sequences this replica had reached are another stream's.
  const loop = (async () => {
    for (let why = await consumeOnce(); why !== undefined; why = await consumeOnce()) {
      const from = pending.size > 0 ? Math.min(...pending) : acked + 1;
      shared.gone.set(durable, `durable consumer ${durable} of stream ${stream} is gone (${why}): making it again`);
      log.warn({ stream, durable, from, why }, "durable consumer gone; making it again");
      let start: number | "first" = from;
      for (;;) {
        if (shared.stopping()) return;
        try {
          const info = await retryElecting(() => jsm.streams.info(stream), { log, about: { stream, durable } });
          const changed = streamChanged(info, created, from);
          if (changed !== undefined) {
            log.warn(
              { stream, durable, from, reason: changed },
              "the durable's sequences are another stream's; making it from the stream's first message",
            );
          }
          start = changed === undefined ? from : "first";
          acked = (await bindDurable(jsm, held, ackWaitSeconds, log, start)).ack_floor.stream_seq;
          // Made again from below its floor, what it delivers again up to there was handled already.
          floor = info.created === created ? Math.max(floor, acked) : acked;
          created = info.created;
          break;
        } catch (err) {
          log.warn({ stream, durable, err: reasonOf(err) }, "durable consumer not made again; trying again in 1 s");
          await new Promise((r) => setTimeout(r, 1000));
        }
      }
      streamLost = undefined;
      pending.clear();
      succeeded.clear();
      shared.gone.delete(durable);
      log.info({ stream, durable, from: start }, "durable consumer made again");
    }
  })().catch((err: unknown) => log.error({ stream, durable, err }, "consumer stopped"));
  return { loop, floors, reasserted };
}

export const event: TriggerKind<"event", EventTrigger, EventInfo> = {
  key: "event",
  shape: "{ event, stream? }",
  schema,
  checkConfig(trigger, config) {
    if (trigger.stream === undefined || trigger.stream in config.streams) return [];
    const known = Object.keys(config.streams);
    return [
      {
        at: "stream",
        message:
          `no stream "${trigger.stream}" in the config` + (known.length > 0 ? ` (it has ${known.join(", ")})` : " (it has no streams)"),
      },
    ];
  },
  describe: (trigger) => `event ${trigger.event}${trigger.stream ? ` (stream ${trigger.stream})` : ""}`,
  /** Assert the streams and run the durable consumers (create, info, pull, acknowledge); subscribe to plain events. */
  seatGrants(targets, config) {
    const streams = [
      ...new Set(targets.flatMap((t) => (t.trigger.stream === undefined ? [] : [config.streams[t.trigger.stream]!.stream]))),
    ];
    return {
      publish: [
        ...streams.flatMap((s) => [`$JS.API.STREAM.INFO.${s}`, `$JS.API.STREAM.CREATE.${s}`, `$JS.API.STREAM.UPDATE.${s}`]),
        ...durables(targets, config).flatMap(({ stream, durable, earlier }) => [
          `$JS.API.CONSUMER.CREATE.${stream}.${durable}`,
          `$JS.API.CONSUMER.CREATE.${stream}.${durable}.>`,
          `$JS.API.CONSUMER.INFO.${stream}.${durable}`,
          // To make a filtered durable unfiltered.
          `$JS.API.CONSUMER.DELETE.${stream}.${durable}`,
          `$JS.API.CONSUMER.MSG.NEXT.${stream}.${durable}`,
          `$JS.ACK.${stream}.${durable}.>`,
          // The durables an earlier version made per trigger: their floors read, then deleted.
          ...earlier.flatMap((d) => [`$JS.API.CONSUMER.INFO.${stream}.${d}`, `$JS.API.CONSUMER.DELETE.${stream}.${d}`]),
        ]),
      ],
      subscribe: targets.flatMap((t) => (t.trigger.stream === undefined ? [t.trigger.event] : [])),
    };
  },

  /**
   * With a stream: asserts the streams (their subjects extended, never emptied), then one durable
   * pull consumer per stream ({@link durables}, {@link bindDurable}), whose messages go to every
   * trigger of that stream whose `event` matches the subject, up to {@link BATCH} messages in hand
   * at a time, in no set order (handlers that keep state must compare-and-set). A message is
   * acknowledged once each of its handlers returned or refused it (the runner counts a refusal);
   * when one faulted it is negatively acknowledged with {@link backoff}, so it comes again later,
   * for ever, and runs again only the handlers that had not succeeded on this replica (another
   * replica runs them all: each must bear running twice). A message no trigger matches comes again
   * after {@link UNMATCHED_DELAY_MS}, for a replica with other functions (a rolling upgrade), and
   * is acknowledged at its {@link UNMATCHED_DELIVERIES}th delivery. Without a stream: a
   * subscription in the seat's queue group (what is published while the set is down is lost).
   * A durable found gone is made again from where this replica was, or from its stream's first
   * message when the stream was made anew ({@link streamChanged}; docs/runtime.md §6.3.2).
   * Throws naming the stream or durable the server refuses, or does not answer for
   * {@link ASSERT_RETRY_MS} (docs/buckets.md §2.4).
   */
  async bind(targets, env) {
    if (targets.length === 0) return { stop: async () => {} };
    const { nc, config, log } = env;
    // Whether JetStream is on was asked as the buckets were asserted.
    const jsm = await nc.jetstreamManager({ checkAPI: false });
    const asserted = await assertStreams(jsm, config, streamSubjects(targets), log);
    /** Each durable's check of its stream as asserted again after a reconnect. */
    const reasserted: ((streams: ReadonlyMap<string, StreamInfo>) => void)[] = [];

    const subscriptions: Subscription[] = [];
    const live = new Set<ConsumerMessages>();
    const loops: Promise<void>[] = [];
    /** By durable, what takes its acknowledgement floor as the streams' watch reads it. */
    const floorsOf = new Map<string, (created: string, floor: number) => void>();
    /** Durables found gone, not made again yet: why the binding cannot serve. */
    const gone = new Map<string, string>();
    let stopping = false;
    const shared: Shared = { jsm, stopping: () => stopping, live, gone };
    for (const { fn, trigger } of targets) {
      if (trigger.stream !== undefined) continue;
      subscriptions.push(
        nc.subscribe(trigger.event, {
          queue: config.seat,
          callback: (err, msg) => {
            if (err) return log.error({ function: fn.name, err }, "subscription stopped");
            void env.run(fn, { data: msg.data }, { kind: "event", subject: msg.subject });
          },
        }),
      );
    }
    for (const held of durables(targets, config)) {
      const { stream, durable } = held;
      const { ackWaitSeconds } = config.streams[held.name]!;
      const streamTriggers = targets.filter((t) => t.trigger.stream === held.name).map((t) => ({ ...t, key: bindingName(t.fn, t.index) }));
      const bound = await bindDurable(jsm, held, ackWaitSeconds, log).catch((err: Error) => {
        throw new Error(`cannot bind durable consumer ${durable} on stream ${stream}: ${reasonOf(err)}`, { cause: err });
      });
      const followed = followDurable(held, bound, asserted.get(held.name)!.created, streamTriggers, env, shared);
      floorsOf.set(durable, followed.floors);
      reasserted.push(followed.reasserted);
      loops.push(followed.loop);
    }
    const use = watchStreams(nc, config, durables(targets, config), (durable, of, read) => floorsOf.get(durable)?.(of, read));
    return {
      notReady: () => [...gone.values()],
      reconnected: async () => {
        const streams = await assertStreams(jsm, config, streamSubjects(targets), log);
        for (const check of reasserted) check(streams);
      },
      streams: use.streams,
      stop: async () => {
        stopping = true;
        use.stop();
        for (const sub of subscriptions) sub.unsubscribe();
        for (const messages of live) messages.stop();
        await Promise.all(loops);
      },
    };
  },
};
