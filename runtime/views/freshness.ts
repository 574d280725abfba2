/**
 * Freshness of a live view: whether it holds every write acknowledged before a read (docs/verb.md §4).
 * It asks the stream whether anything follows the last sequence the view applied, else for the
 * stream's last sequence, and waits up to {@link CATCH_UP_MS} for the view to reach it.
 * Concurrent reads share these requests. It knows sequences only, nothing of the view's store.
 */
import type { JetStreamManager, NatsConnection, StreamConfig } from "nats";
import type { Logger } from "pino";
import { requesterOf } from "../publisher.ts";

/**
 * How long a read waits for the view to reach the stream's last sequence before it reads from
 * the server instead, in milliseconds. Only a stream whose last message was removed by hand
 * (a stream purge) keeps a view from reaching it.
 */
export const CATCH_UP_MS = 500;

/**
 * Coalesces an asking of the server: a caller gets the answer of a request sent after it
 * called, and callers that arrive while one request is out share the next one, so at most two
 * are ever out.
 */
export function coalesced(read: () => Promise<number>): () => Promise<number> {
  let inFlight: Promise<number> | undefined;
  let queued: Promise<number> | undefined;
  const send = () => {
    const sent = read().finally(() => {
      if (inFlight === sent) inFlight = undefined;
    });
    inFlight = sent;
    return sent;
  };
  return () => {
    if (inFlight === undefined) return send();
    queued ??= inFlight
      .catch(() => 0)
      .then(() => {
        queued = undefined;
        return send();
      });
    return queued;
  };
}

/** Whether the stream holds no message after the given stream sequence. */
export type NothingAfter = (sequence: number) => Promise<boolean>;

/**
 * Asks whether stream `KV_<bucket>` holds no message after a sequence: a direct get
 * (`$JS.API.DIRECT.GET.KV_<bucket>`) of the first message of `$KV.<bucket>.>` after it, or,
 * when `config` does not allow direct gets or has replicas, the stream API's get
 * (`$JS.API.STREAM.MSG.GET.KV_<bucket>`, the leader's answer). Both answer 404 when there is
 * none. Each request times out after 5 s; the probe rejects when its request fails. Asked with
 * the connection's {@link requesterOf}: no Error made per request, answered or not.
 */
export function nothingAfterProbe(
  nc: NatsConnection,
  bucket: string,
  config: Pick<StreamConfig, "allow_direct" | "num_replicas">,
): NothingAfter {
  const stream = `KV_${bucket}`;
  // A replicated stream's followers answer direct gets too, and may lag: ask its leader.
  const direct = config.allow_direct === true && config.num_replicas === 1;
  const next = JSON.stringify({ next_by_subj: `$KV.${bucket}.>` }).slice(1);
  const ask = requesterOf(nc);
  return async (sequence) => {
    const request = `{"seq":${sequence + 1},${next}`;
    if (direct) return (await ask(`$JS.API.DIRECT.GET.${stream}`, request)).headers?.code === 404;
    const reply = await ask(`$JS.API.STREAM.MSG.GET.${stream}`, request);
    return (reply.json() as { error?: { code?: number } }).error?.code === 404;
  };
}

/**
 * The stream sequence a view must reach to hold every write acknowledged before the call:
 * `applied()` when `nothingAfter` finds nothing after it, else the last sequence of stream
 * `KV_<bucket>` (`$JS.API.STREAM.INFO.KV_<bucket>`). Calls are {@link coalesced}; a call rejects
 * when a request fails.
 */
export function targetSequence(
  jsm: JetStreamManager,
  bucket: string,
  applied: () => number,
  nothingAfter: NothingAfter,
): () => Promise<number> {
  const stream = `KV_${bucket}`;
  return coalesced(async () => {
    const held = applied();
    if (await nothingAfter(held)) return held;
    return (await jsm.streams.info(stream)).state.last_seq;
  });
}

/** Waiting for a view to catch up with its stream. */
export interface CatchUp {
  /**
   * Whether the view holds every write acknowledged before the call; `false` when that cannot
   * be told: `unavailable()`, `target` failed, or the view did not reach it within {@link CATCH_UP_MS}.
   * Never rejects.
   */
  caughtUp(): Promise<boolean>;
  /** When the view was last known to hold every write acknowledged before (a read found it current); `null` before any. */
  confirmedAt(): Date | null;
  /** The view now holds every record up to stream sequence `sequence`: the reads waiting for no more go on. */
  reached(sequence: number): void;
  /** Every waiting read gives up, with `false`. */
  release(): void;
}

/**
 * Catching up with the stream: {@link CatchUp.caughtUp} asks `target` and, when the view has
 * not applied that far (`applied()`), waits for {@link CatchUp.reached}. Failures and timeouts are
 * logged as warnings with `bucket`.
 */
export function catchUp({
  bucket,
  applied,
  target,
  unavailable,
  log,
}: {
  bucket: string;
  applied: () => number;
  target: () => Promise<number>;
  unavailable: () => boolean;
  log: Logger;
}): CatchUp {
  const waiters = new Set<{ target: number; done: (reached: boolean) => void }>();
  let confirmed: Date | null = null;
  const confirm = (reached: boolean) => {
    if (reached) confirmed = new Date();
    return reached;
  };
  return {
    confirmedAt: () => confirmed,
    async caughtUp() {
      if (unavailable()) return false;
      let wanted: number;
      try {
        wanted = await target();
      } catch (err) {
        log.warn({ bucket, err }, "cannot tell whether the view is current; reading from the server");
        return false;
      }
      if (wanted <= applied()) return confirm(true);
      return new Promise<boolean>((resolve) => {
        const waiter = {
          target: wanted,
          done: (reached: boolean) => {
            clearTimeout(timer);
            waiters.delete(waiter);
            resolve(confirm(reached));
          },
        };
        const timer = setTimeout(() => {
          log.warn({ bucket, applied: applied(), target: wanted }, "view behind the stream; reading from the server");
          waiter.done(false);
        }, CATCH_UP_MS);
        waiters.add(waiter);
      });
    },
    reached(sequence) {
      if (waiters.size === 0) return;
      for (const waiter of waiters) if (waiter.target <= sequence) waiter.done(true);
    },
    release() {
      for (const waiter of waiters) waiter.done(false);
    },
  };
}
