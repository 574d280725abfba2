/**
 * The consume loop of a durable consumer (docs/runtime.md §6.3.2): its messages pulled in
 * batches, each run by every trigger whose `event` matches its subject, acknowledged together
 * once handled, delivered again with a backoff when a handler faulted, and the durable made
 * again from this replica's progress when it is found gone.
 */
import { ConsumerEvents, type ConsumerInfo, type ConsumerMessages, type JetStreamManager, type JsMsg, type StreamInfo } from "nats";
import { CONSUMER_NOT_FOUND, errCode, reasonOf, retryElecting, STREAM_NOT_FOUND, STREAM_REMADE_AFTER_MS } from "./jetstream.ts";
import { subjectMatches } from "./subjects.ts";
import type { NatsConnection } from "nats";
import type { Logger } from "pino";
import type { Outcome, RawInput } from "./types.ts";

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

/** Messages a durable consumer pulls at once, and handles at once. */
export const BATCH = 64;
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

/** What the consumption of each durable shares with its binding. */
export interface Shared {
  readonly jsm: JetStreamManager;
  /** Whether the binding is stopping. */
  stopping(): boolean;
  /** The consumptions in hand, which a stop ends. */
  readonly live: Set<ConsumerMessages>;
  /** Durables found gone, not made again yet, by name: why the binding cannot serve. */
  readonly gone: Map<string, string>;
  /** Asserts the binding's streams again, as at the start (one deleted behind the set is made again), and tells each durable of them; callers meanwhile share one. */
  reassert(): Promise<void>;
  /** The streams' use is read again now (a stream found gone, or a durable made again): status says it at once. */
  changed(): void;
}

/** A durable consumer followed: the stream's name in the config and on the server, and the durable's name. */
export interface FollowedDurable {
  readonly name: string;
  readonly stream: string;
  readonly durable: string;
}

/**
 * Why the durable's stream sequences, up to `from - 1`, do not belong to the stream `info` says:
 * it was made anew since `created` (a server back with an empty store, the stream deleted and
 * made again), or its sequences went back; `undefined` when they do.
 */
export function streamChanged(info: StreamInfo, created: string, from: number): string | undefined {
  if (info.created !== created) return `the stream was made anew at ${info.created} (the durable followed the one made at ${created})`;
  if (info.state.last_seq < from - 1)
    return `the stream's last sequence is ${info.state.last_seq}, below ${from - 1} the durable had reached`;
  return undefined;
}

/** A trigger of a durable's stream, with its binding's name (what `succeeded` remembers). */
export interface StreamTrigger<F> {
  readonly fn: F;
  readonly trigger: EventTrigger;
  readonly key: string;
}

/** What the consume loop needs of the binding's environment: the connection, the log, and the runner (never throws). */
export interface ConsumeEnv<F> {
  readonly nc: NatsConnection;
  readonly log: Logger;
  run(fn: F, input: RawInput, trigger: EventInfo): Promise<Outcome>;
}

/**
 * Follows `held`'s durable, `bound` on the stream made at `streamCreated`, until the binding
 * stops: each message to every trigger whose `event` matches its subject (see the event kind's
 * `bind`), the durable made again by `rebind` (from a stream sequence, or the stream's first
 * message) when found gone. Returns the consumption's loop, what takes the durable's floor as
 * the streams' watch reads it, and the check of the stream as asserted again after a reconnect.
 */
export function followDurable<F>(
  held: FollowedDurable,
  bound: ConsumerInfo,
  streamCreated: string,
  streamTriggers: readonly StreamTrigger<F>[],
  env: ConsumeEnv<F>,
  shared: Shared,
  rebind: (start: number | "first") => Promise<ConsumerInfo>,
): {
  loop: Promise<void>;
  floors(created: string, floor: number): void;
  reasserted(streams: ReadonlyMap<string, StreamInfo>): void;
  streamMissing(): void;
} {
  const { nc, log } = env;
  const { jsm } = shared;
  const { stream, durable } = held;
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
          acked = (await rebind(start)).ack_floor.stream_seq;
          // Made again from below its floor, what it delivers again up to there was handled already.
          floor = info.created === created ? Math.max(floor, acked) : acked;
          created = info.created;
          break;
        } catch (err) {
          if (errCode(err) === STREAM_NOT_FOUND) {
            // Deleted behind the set: made again as at the start, then the durable from its first message.
            shared.gone.set(durable, `stream ${stream} does not exist: making it again, then durable consumer ${durable}`);
            log.warn({ stream, durable }, "stream gone; making it again");
            shared.changed();
            await new Promise((r) => setTimeout(r, STREAM_REMADE_AFTER_MS));
            if (shared.stopping()) return;
            await shared.reassert().catch((e: unknown) => log.warn({ stream, err: reasonOf(e) }, "stream not made again"));
            continue;
          }
          log.warn({ stream, durable, err: reasonOf(err) }, "durable consumer not made again; trying again in 1 s");
          await new Promise((r) => setTimeout(r, 1000));
        }
      }
      streamLost = undefined;
      pending.clear();
      succeeded.clear();
      shared.gone.delete(durable);
      shared.changed();
      log.info({ stream, durable, from: start }, "durable consumer made again");
    }
  })().catch((err: unknown) => log.error({ stream, durable, err }, "consumer stopped"));
  // The streams' watch found the stream missing, and the consumption was not told (a pull in
  // flight as the stream went): consumed again, the stream made again first.
  const streamMissing = () => {
    if (shared.gone.has(durable) || current === undefined) return;
    streamLost = "its stream not found";
    current.stop();
  };
  return { loop, floors, reasserted, streamMissing };
}
