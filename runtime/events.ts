import {
  AckPolicy,
  DeliverPolicy,
  DiscardPolicy,
  nanos,
  RetentionPolicy,
  StorageType,
  type ConsumerMessages,
  type JetStreamManager,
  type JsMsg,
  type NatsConnection,
  type Subscription,
} from "nats";
import type { Logger } from "pino";
import { parsePayload, triggersOf, type Binding } from "./bind.ts";
import type { Config } from "./config.ts";
import type { TriggerInfo } from "./define.ts";
import { settingsDiffer, type Host } from "./host.ts";
import type { LoadedFunction } from "./loader.ts";
import { subjectMatches } from "./subjects.ts";

/** Messages a durable consumer pulls at once, and handles at once. */
const BATCH = 64;

/** The wait before a failed message is delivered again: 0.5 s doubling per delivery, at most 30 s. */
export function backoff(deliveries: number): number {
  return Math.min(500 * 2 ** Math.max(0, deliveries - 1), 30_000);
}

/**
 * A `{ event, stream }` trigger's durable consumer: the function's name, `-<n>` from its second
 * one, shared by every replica that has the function. It takes every message of the stream and
 * acknowledges at once those its trigger does not match: nats-server 2.9 counts a filtered
 * consumer's pending messages by scanning the stream at each delivery, which slows it as the
 * stream grows.
 */
export const durableOf = (fn: LoadedFunction, i: number) => (i === 0 ? fn.name : `${fn.name}-${i + 1}`);

/** The subjects each configured stream must capture: the `event` of every trigger naming it. */
export function streamSubjects(functions: readonly LoadedFunction[]): Map<string, string[]> {
  const subjects = new Map<string, string[]>();
  for (const { trigger } of triggersOf(functions, "event")) {
    if (trigger.stream === undefined) continue;
    const list = subjects.get(trigger.stream) ?? [];
    if (!list.includes(trigger.event)) list.push(trigger.event);
    subjects.set(trigger.stream, list);
  }
  return subjects;
}

/**
 * Asserts the streams that `{ event, stream }` triggers name (`config.streams`): a missing one
 * is created limits-based (file storage, `maxAgeSeconds`, `maxBytes`, the oldest dropped
 * first, `replicas` copies: the stream's, else the config's); an existing one is given the
 * subjects it lacks, never emptied nor given other limits. Throws naming the stream when the
 * server refuses (e.g. subjects another stream already captures), or saying each difference
 * when the existing one has other replicas or limits.
 */
export async function assertStreams(
  jsm: JetStreamManager,
  config: Config,
  functions: readonly LoadedFunction[],
  log: Logger,
): Promise<void> {
  for (const [name, subjects] of streamSubjects(functions)) {
    const { stream, maxAgeSeconds, maxBytes, replicas = config.replicas } = config.streams[name]!;
    const wanted = { num_replicas: replicas, max_age: nanos(maxAgeSeconds * 1000), max_bytes: maxBytes };
    try {
      const info = await jsm.streams.info(stream).catch((err: Error) => {
        if (err.message !== "stream not found") throw err;
        log.info({ stream, subjects }, "creating stream");
        return jsm.streams.add({
          name: stream,
          subjects,
          retention: RetentionPolicy.Limits,
          storage: StorageType.File,
          discard: DiscardPolicy.Old,
          // Publish ids are remembered 2 minutes, never longer than a message is kept.
          duplicate_window: nanos(Math.min(120, maxAgeSeconds) * 1000),
          ...wanted,
        });
      });
      // Other limits could drop events not handled yet: said, never applied.
      const differs = settingsDiffer(stream, info.config, { ...wanted, max_msgs_per_subject: info.config.max_msgs_per_subject });
      if (differs !== undefined) throw new Error(`it exists with other settings than the config: ${differs}`);
      const missing = subjects.filter((s) => !info.config.subjects.includes(s));
      if (missing.length > 0) {
        log.info({ stream, missing }, "adding subjects to the stream");
        await jsm.streams.update(stream, { ...info.config, subjects: [...info.config.subjects, ...missing] });
      }
    } catch (err) {
      throw new Error(`cannot assert stream ${stream} (for ${subjects.join(", ")}): ${(err as Error).message}`);
    }
  }
}

type Verdict = "done" | "refused" | "failed";

/**
 * Runs `fn` for one message: `done` when the handler returned, `refused` when the payload is
 * not JSON or the input schema or handler refused it (counted in the runtime's records, with
 * the reason logged), `failed` on a fault (or when the refusal could not be counted).
 */
async function handle(host: Host, fn: LoadedFunction, data: Uint8Array, trigger: TriggerInfo & { kind: "event" }): Promise<Verdict> {
  const payload = parsePayload(data);
  const outcome = payload.ok ? await host.run(fn, payload.value, trigger) : host.refuse(fn, trigger, payload.error);
  if (outcome.ok) return "done";
  if (outcome.error.code >= 500) return "failed";
  const reason = outcome.error.message;
  host.metrics.refused.inc({ function: fn.name });
  try {
    await host.records.refused(fn.name, { subject: trigger.subject, reason, at: new Date().toISOString() }, trigger.sequence);
    return "refused";
  } catch (err) {
    host.log.error({ function: fn.name, err }, "refused event not counted; it will be delivered again");
    return "failed";
  }
}

/**
 * Binds `durable` on `stream`: every message, explicit acknowledgement. A durable of that name
 * made filtered (as sets before this one made them) is made again unfiltered, from the first
 * message after its acknowledgement floor: nothing is lost, and what it had acknowledged above
 * the floor comes again (handlers bear running twice).
 */
async function bindDurable(jsm: JetStreamManager, stream: string, durable: string, ackWaitSeconds: number, log: Logger): Promise<void> {
  const ackWait = nanos(ackWaitSeconds * 1000);
  const config = { durable_name: durable, ack_policy: AckPolicy.Explicit, ack_wait: ackWait, max_deliver: -1, max_ack_pending: 1000 };
  const existing = await jsm.consumers.info(stream, durable).catch(() => undefined);
  if (existing === undefined) {
    await jsm.consumers.add(stream, { ...config, deliver_policy: DeliverPolicy.All });
    return;
  }
  if (!existing.config.filter_subject) {
    // Replicas with other configs would change it back and forth: said, never applied.
    if (existing.config.ack_wait !== ackWait) {
      log.warn(
        { stream, durable, ackWaitSeconds: (existing.config.ack_wait ?? 0) / 1e9, config: ackWaitSeconds },
        `the durable consumer keeps its ack wait; to change it: nats consumer edit ${stream} ${durable} --wait ${ackWaitSeconds}s`,
      );
    }
    return;
  }
  const from = existing.ack_floor.stream_seq + 1;
  log.info({ stream, durable, from }, "making the durable consumer unfiltered");
  await jsm.consumers.delete(stream, durable);
  await jsm.consumers.add(stream, { ...config, deliver_policy: DeliverPolicy.StartSequence, opt_start_seq: from });
}

/**
 * Binds every `{ event }` trigger. With a stream: asserts the streams, then one durable pull
 * consumer per trigger ({@link durableOf}), whose messages the trigger's `event` matches are
 * handled up to {@link BATCH} at a time, in no set order (handlers that keep state must
 * compare-and-set); the others are acknowledged at once. A message is acknowledged once its
 * handler returned, or refused it (counted); on a fault it is negatively acknowledged with
 * {@link backoff}, so it comes again later, for ever until it succeeds. Without a stream: a
 * subscription in the seat's queue group (what is published while the set is down is lost).
 */
export async function bindEvents(host: Host, functions: readonly LoadedFunction[]): Promise<Binding> {
  const triggers = triggersOf(functions, "event");
  if (triggers.length === 0) return { stop: async () => {} };
  const nc: NatsConnection = host.nc;
  const jsm = await nc.jetstreamManager();
  await assertStreams(jsm, host.config, functions, host.log);

  const subscriptions: Subscription[] = [];
  const consumers: { messages: ConsumerMessages; loop: Promise<void> }[] = [];
  let stopping = false;

  for (const { fn, trigger, i } of triggers) {
    if (trigger.stream === undefined) {
      subscriptions.push(
        nc.subscribe(trigger.event, {
          queue: host.config.seat,
          callback: (err, msg) => {
            if (err) return host.log.error({ function: fn.name, err }, "subscription stopped");
            void handle(host, fn, msg.data, { kind: "event", subject: msg.subject });
          },
        }),
      );
      continue;
    }
    // Counted from 0, so the series is on `GET /metrics` before any refusal.
    host.metrics.refused.inc({ function: fn.name }, 0);
    const { stream, ackWaitSeconds } = host.config.streams[trigger.stream]!;
    const durable = durableOf(fn, i);
    await bindDurable(jsm, stream, durable, ackWaitSeconds, host.log).catch((err: Error) => {
      throw new Error(`cannot bind durable consumer ${durable} on stream ${stream}: ${err.message}`);
    });
    const consumer = await nc.jetstream().consumers.get(stream, durable);
    const messages = await consumer.consume({ max_messages: BATCH });
    const one = async (m: JsMsg) => {
      if (!subjectMatches(trigger.event, m.subject)) return m.ack();
      const verdict = await handle(host, fn, m.data, {
        kind: "event",
        subject: m.subject,
        stream,
        sequence: m.seq,
        deliveries: m.info.redeliveryCount,
      });
      if (verdict === "failed") m.nak(backoff(m.info.redeliveryCount));
      else m.ack();
    };
    const loop = (async () => {
      const running = new Set<Promise<void>>();
      for await (const m of messages) {
        if (stopping) {
          m.nak();
          continue;
        }
        const handled: Promise<void> = one(m)
          .catch((err: unknown) => host.log.error({ function: fn.name, durable, err }, "event not handled"))
          .finally(() => running.delete(handled));
        running.add(handled);
        if (running.size >= BATCH) await Promise.race(running);
      }
      await Promise.all(running);
    })().catch((err: unknown) => host.log.error({ function: fn.name, durable, err }, "consumer stopped"));
    consumers.push({ messages, loop });
  }

  return {
    stop: async () => {
      stopping = true;
      for (const sub of subscriptions) sub.unsubscribe();
      for (const { messages } of consumers) messages.stop();
      await Promise.all(consumers.map(({ loop }) => loop));
    },
  };
}
