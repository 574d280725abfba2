/**
 * The durable consumers of the config's streams, one per stream for the whole set
 * (docs/runtime.md §6.3.2): their names, binding one (made when missing, from where it must
 * start; an earlier version's per-trigger durables replaced), whether a stream was made anew
 * under one, and the streams' use and the durables' progress as the server says them
 * (docs/runtime.md §6.11).
 */
import { AckPolicy, DeliverPolicy, nanos, type ConsumerInfo, type JetStreamManager, type NatsConnection } from "nats";
import type { Logger } from "pino";
import { ASSERT_RETRY_MS, CONSUMER_NOT_FOUND, errCode, retryElecting, STREAM_NOT_FOUND } from "./jetstream.ts";
import type { Config } from "./config.ts";
import type { StreamUse } from "./types.ts";

/**
 * One stream's durable: the stream's name in the config (`name`) and on the server (`stream`),
 * the durable's name ({@link durableName}), and the durables an earlier version made in its place.
 */
export interface Durable {
  readonly name: string;
  readonly stream: string;
  readonly durable: string;
  readonly earlier: readonly string[];
}

/**
 * The durable consumer of one stream of the config for the whole set: `<seat>-<name>`, `name`
 * the stream's name in the config's `streams` (`mesh-provisioner-events`). Every `{ event, stream }`
 * trigger naming that stream reads it, and every replica shares it (docs/runtime.md §6.3.2).
 */
export const durableName = (seat: string, stream: string): string => `${seat}-${stream}`;

/** Whether the server said a stream is not there. */
const streamNotFound = (err: unknown): boolean => errCode(err) === STREAM_NOT_FOUND;

/**
 * Binds `durable` on `stream` and returns its info as it then stands: every message, explicit
 * acknowledgement. Made when missing: from the stream's first message when `from` is `"first"`
 * (made again on a stream made anew), from stream sequence `from` when a number (made again
 * after being deleted), else from the first message after the lowest acknowledgement floor of
 * the `earlier` durables that exist (an earlier version's, one per trigger), else from the oldest
 * message. The `earlier` ones are then deleted, only once `durable` exists: they are what it
 * replaces, and it holds everything above their floors. It takes every message of the stream,
 * unfiltered: nats-server 2.9 counts a filtered consumer's pending messages by scanning the
 * stream at each delivery, which slows it as the stream grows. A durable of that name made
 * filtered is made again unfiltered, from the first message after its acknowledgement floor:
 * nothing is lost, and what it had acknowledged above the floor comes again (handlers bear
 * running twice). Safe while other replicas bind it too: each request is asked again while the
 * cluster elects a leader ({@link retryElecting}, {@link ASSERT_RETRY_MS} in all), and a durable
 * another replica made meanwhile stands as that one made it. Throws the server's last reason.
 */
export async function bindDurable(
  jsm: JetStreamManager,
  { stream, durable, earlier }: Pick<Durable, "stream" | "durable" | "earlier">,
  ackWaitSeconds: number,
  log: Logger,
  from?: number | "first",
): Promise<ConsumerInfo> {
  // The stream was just asserted: one said not found has a group without a leader yet. Made
  // again from the consume loop (`from`), a stream not found is its to handle (deleted meanwhile).
  const retry = {
    log,
    about: { stream, durable },
    deadline: Date.now() + ASSERT_RETRY_MS,
    ...(from === undefined ? { alsoWhile: streamNotFound } : {}),
  };
  const ask = <T>(request: () => Promise<T>) => retryElecting(request, retry);
  /** A consumer's info, or `undefined` only when the server says it is not there. */
  const info = (name: string) =>
    ask(() => jsm.consumers.info(stream, name)).catch((err: unknown) => {
      if (errCode(err) === CONSUMER_NOT_FOUND) return undefined;
      throw err;
    });
  const ackWait = nanos(ackWaitSeconds * 1000);
  const config = { durable_name: durable, ack_policy: AckPolicy.Explicit, ack_wait: ackWait, max_deliver: -1, max_ack_pending: 1000 };
  // Another replica may make it meanwhile (the server says `consumer name already in use` when its
  // start differs): then it stands as that one made it.
  const add = (start: number | undefined) =>
    ask(() =>
      jsm.consumers.add(
        stream,
        start === undefined
          ? { ...config, deliver_policy: DeliverPolicy.All }
          : { ...config, deliver_policy: DeliverPolicy.StartSequence, opt_start_seq: start },
      ),
    ).catch(async (err: unknown) => (await info(durable)) ?? Promise.reject(err));
  // Only a durable the server says is not there is made: any other failure is thrown, so an
  // existing durable is never made again from elsewhere.
  const existing = await info(durable);
  const old = from === undefined ? (await Promise.all(earlier.map(info))).filter((c) => c !== undefined) : [];
  let bound: ConsumerInfo;
  if (existing === undefined) {
    const floor = old.length > 0 ? Math.min(...old.map((c) => c.ack_floor.stream_seq)) + 1 : undefined;
    const start = from === "first" ? undefined : (from ?? floor);
    if (old.length > 0) log.info({ stream, durable, from: start, earlier: old.map((c) => c.name) }, "one durable consumer for the stream");
    bound = await add(start);
  } else if (existing.config.filter_subject) {
    const after = existing.ack_floor.stream_seq + 1;
    log.info({ stream, durable, from: after }, "making the durable consumer unfiltered");
    await ask(() => jsm.consumers.delete(stream, durable)).catch((err: unknown) => {
      if (errCode(err) !== CONSUMER_NOT_FOUND) throw err;
    });
    bound = await add(after);
  } else {
    bound = existing;
    if (existing.config.ack_wait !== ackWait) {
      // Replicas with other configs would change it back and forth: said, never applied.
      log.warn(
        { stream, durable, ackWaitSeconds: (existing.config.ack_wait ?? 0) / 1e9, config: ackWaitSeconds },
        `the durable consumer keeps its ack wait; to change it: nats consumer edit ${stream} ${durable} --wait ${ackWaitSeconds}s`,
      );
    }
  }
  for (const c of old) {
    // nats-server 2.9 may answer "directory not empty" while the consumer writes its state: asked
    // again; one left is deleted at the next start, and takes nothing from `durable` meanwhile.
    for (let attempt = 1; ; attempt++) {
      const failure = await jsm.consumers.delete(stream, c.name).then(
        () => undefined,
        (err: unknown) => (errCode(err) === CONSUMER_NOT_FOUND ? undefined : (err as Error)),
      );
      if (failure === undefined) {
        log.info({ stream, durable: c.name, ackFloor: c.ack_floor.stream_seq }, "earlier durable consumer deleted");
        break;
      }
      if (attempt === 3) {
        log.warn({ stream, durable: c.name, err: failure.message }, "earlier durable consumer not deleted; deleted at the next start");
        break;
      }
      await new Promise((r) => setTimeout(r, 200));
    }
  }
  return bound;
}

/** How often the streams' use and the durables' progress are read, in milliseconds. */
export const STREAMS_MS = 5000;

/**
 * The use of each of the `held` streams and the progress of its durable, read every
 * {@link STREAMS_MS} and when `refresh` asks (stream info, consumer info, each within 2 s); what a read that fails
 * would have said is left as it last was (docs/runtime.md §6.11). Each durable's
 * acknowledgement floor read goes to `floors`, with the creation time of the stream read; a
 * durable whose stream the server says does not exist goes to `missing`.
 */
export function watchStreams(
  nc: NatsConnection,
  config: Config,
  held: readonly Pick<Durable, "name" | "stream" | "durable">[],
  floors: (durable: string, created: string, floor: number) => void,
  missing: (durable: string) => void = () => {},
): { streams(): Record<string, StreamUse>; refresh(): void; stop(): void } {
  const use: Record<string, StreamUse> = {};
  let reading: Promise<void> | undefined;
  const read = () =>
    (reading ??= (async () => {
      const jsm = await nc.jetstreamManager({ timeout: 2000, checkAPI: false });
      await Promise.all(
        held.map(async ({ name, stream, durable }) => {
          const { ackWaitSeconds } = config.streams[name]!;
          const info = await jsm.streams.info(stream).catch((err: unknown) => {
            // Gone behind the set (`nats stream rm`): said, until its trigger makes it again; and
            // its durable told, which may not have heard (a pull in flight as the stream went).
            if (errCode(err) === STREAM_NOT_FOUND) {
              if (use[name] !== undefined) {
                use[name] = { ...use[name], missing: `stream ${stream} does not exist on the server: nothing is recorded in it` };
              }
              missing(durable);
            }
            return undefined;
          });
          if (info === undefined) return;
          const c = await jsm.consumers.info(stream, durable).catch(() => undefined);
          // Read after the stream's info: a stream made anew between the two gives a floor lower than its own.
          if (c !== undefined) floors(durable, info.created, c.ack_floor.stream_seq);
          const was = use[name]?.consumers.find((k) => k.durable === durable);
          const consumers = [
            c === undefined
              ? (was ?? { durable, pending: 0, unacknowledged: 0 })
              : { durable, pending: c.num_pending, unacknowledged: c.num_ack_pending },
          ];
          use[name] = {
            stream,
            bytes: info.state.bytes,
            maxBytes: info.config.max_bytes > 0 ? info.config.max_bytes : null,
            messages: info.state.messages,
            ackWaitSeconds,
            consumers,
            missing: null,
          };
        }),
      );
    })()
      .catch(() => {})
      .finally(() => (reading = undefined)));
  void read();
  const timer = setInterval(read, STREAMS_MS);
  timer.unref();
  return {
    streams: () => ({ ...use }),
    // A read in hand may have started before the change: another follows it.
    refresh: () => void (reading ?? Promise.resolve()).then(read),
    stop: () => clearInterval(timer),
  };
}
