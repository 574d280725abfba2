/**
 * The `{ event, stream? }` trigger kind: messages on a subject (wildcards allowed). With a stream
 * of the config, through a durable consumer of that stream, so nothing published while the set
 * is down is lost; without, a plain subscription in the seat's queue group (docs/runtime.md §6.3.2).
 */
import type { Subscription, ConsumerMessages, StreamInfo } from "nats";
import { z } from "zod";
import type { Config } from "../config.ts";
import { assertStreams } from "../assert.ts";
import { reasonOf } from "../jetstream.ts";
import { bindDurable, durableName, watchStreams, type Durable } from "../durables.ts";
import { followDurable, type EventInfo, type EventTrigger, type Shared } from "../consume.ts";
import { RESERVED, reserved, SUBJECT_PATTERN, subjectCovers, subjectsOverlap, uncovered } from "../subjects.ts";
import { bindingName, type Target, type TriggerKind } from "./kind.ts";

export type { EventInfo, EventTrigger };

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

/**
 * The subjects each configured stream must capture: the `event` of every trigger naming it, but
 * those another of them covers (a stream's subjects may not overlap; the durable still hands each
 * message to every trigger it matches).
 */
function streamSubjects(targets: readonly Target<EventTrigger>[]): Map<string, string[]> {
  const subjects = new Map<string, string[]>();
  for (const { trigger } of targets) {
    if (trigger.stream !== undefined) subjects.set(trigger.stream, [...(subjects.get(trigger.stream) ?? []), trigger.event]);
  }
  return new Map([...subjects].map(([stream, list]) => [stream, uncovered(list)]));
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
  // One stream cannot capture two subjects that overlap unless one covers the other.
  conflict: (a, b) =>
    a.stream !== undefined &&
    a.stream === b.stream &&
    subjectsOverlap(a.event, b.event) &&
    !subjectCovers(a.event, b.event) &&
    !subjectCovers(b.event, a.event)
      ? `events ${a.event} and ${b.event} overlap on stream ${a.stream}, and neither covers the other: one stream cannot capture both`
      : undefined,
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
   * pull consumer per stream ({@link durables}, {@link bindDurable}), followed by its consume loop
   * (`consume.ts`, {@link followDurable}): its messages go to every
   * trigger of that stream whose `event` matches the subject, up to `BATCH` messages in hand
   * at a time, in no set order (handlers that keep state must compare-and-set). A message is
   * acknowledged once each of its handlers returned or refused it (the runner counts a refusal);
   * when one faulted it is negatively acknowledged with `backoff`, so it comes again later,
   * for ever, and runs again only the handlers that had not succeeded on this replica (another
   * replica runs them all: each must bear running twice). A message no trigger matches comes again
   * after `UNMATCHED_DELAY_MS`, for a replica with other functions (a rolling upgrade), and
   * is acknowledged at its `UNMATCHED_DELIVERIES`th delivery. Without a stream: a
   * subscription in the seat's queue group (what is published while the set is down is lost).
   * A durable found gone is made again from where this replica was, or from its stream's first
   * message when the stream was made anew (`streamChanged`; docs/runtime.md §6.3.2); a stream
   * found gone is made again first.
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
    /** By durable, what hears that the streams' watch found its stream missing. */
    const missingOf = new Map<string, () => void>();
    /** Durables found gone, not made again yet: why the binding cannot serve. */
    const gone = new Map<string, string>();
    let stopping = false;
    let reasserting: Promise<void> | undefined;
    const reassert = () =>
      (reasserting ??= (async () => {
        const streams = await assertStreams(jsm, config, streamSubjects(targets), log);
        for (const check of reasserted) check(streams);
      })().finally(() => (reasserting = undefined)));
    // The streams' use, watched once the durables are bound.
    let use: ReturnType<typeof watchStreams> | undefined;
    const shared: Shared = { jsm, stopping: () => stopping, live, gone, reassert, changed: () => use?.refresh() };
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
      const followed = followDurable(held, bound, asserted.get(held.name)!.created, streamTriggers, env, shared, (start) =>
        bindDurable(jsm, held, ackWaitSeconds, log, start),
      );
      floorsOf.set(durable, followed.floors);
      missingOf.set(durable, followed.streamMissing);
      reasserted.push(followed.reasserted);
      loops.push(followed.loop);
    }
    use = watchStreams(
      nc,
      config,
      durables(targets, config),
      (durable, of, read) => floorsOf.get(durable)?.(of, read),
      (durable) => missingOf.get(durable)?.(),
    );
    return {
      notReady: () => [...gone.values()],
      reconnected: reassert,
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
