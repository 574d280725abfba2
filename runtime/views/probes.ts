/**
 * The requests a live view asks its stream to know whether it is current (docs/verb.md §4.6):
 * the stream's last sequence ({@link lastSequenceProbe}: with replicas, from a leader that heard
 * from a quorum lately), whether anything follows a sequence ({@link nothingAfterProbe}), and the
 * marker a view short of a replicated stream writes ({@link endMarker}). Each is asked on the
 * connection's one inbox subscription; `coalesced` (serial.ts) shares one between concurrent reads.
 */
import { randomUUID } from "node:crypto";
import { setTimeout as sleep } from "node:timers/promises";
import { headers, type NatsConnection, type StreamConfig } from "nats";
import { publisherOf, requesterOf } from "../publisher.ts";

/** How long the stream's leader is given to answer a freshness probe ({@link lastSequenceProbe}), in milliseconds. */
export const PROBE_TIMEOUT_MS = 2000;

/**
 * How lately the leader of a replicated stream must have heard from a quorum of its stream's
 * servers for its answer to count, in milliseconds. A leader hears from its followers at least
 * every second (raft heartbeats), and followers elect another leader no sooner than 4 s after
 * they last heard from it (nats-server 2.9): a leader cut off, or paused, longer than this may
 * have been replaced, and answers from a store that is behind.
 */
export const LEASE_MS = 2000;

/**
 * The key of the marker a view of a replicated stream writes when it falls short of the stream's
 * last sequence, `$KV.<bucket>._freshness` ({@link endMarker}).
 */
export const MARKER_KEY = "_freshness";

/** What one freshness probe found. */
export interface LastSequence {
  /** A stream sequence at or above every write acknowledged before the probe was sent. */
  readonly sequence: number;
  /** When the probe was sent (ms since the epoch). */
  readonly askedAt: number;
  /** The last sequence the view had applied when the probe was sent. */
  readonly heldAtAsk: number;
}

/** A freshness probe of one view: see {@link lastSequenceProbe}. */
export type Probe = () => Promise<LastSequence>;

/**
 * Whether the stream holds no message after the given stream sequence, asked within `timeoutMs`
 * ({@link PROBE_TIMEOUT_MS} by default).
 */
export type NothingAfter = (sequence: number, timeoutMs?: number) => Promise<boolean>;

/** A stream info as the server answers it, what a probe reads of it. */
interface InfoAnswer {
  readonly error?: { readonly code?: number; readonly description?: string };
  readonly state?: { readonly last_seq: number };
  readonly cluster?: {
    readonly leader?: string;
    readonly replicas?: readonly { readonly name: string; readonly active: number; readonly offline?: boolean }[];
  };
}

/**
 * The freshness probe of stream `KV_<bucket>` (docs/verb.md §4.6) for a view whose last applied
 * sequence `applied()` reads, asked with the connection's {@link requesterOf} within
 * {@link PROBE_TIMEOUT_MS} in all (its one or two requests share it), storing nothing and
 * proposing nothing to the stream:
 * - with one replica, the one server: nothing after what the view applied (`nothingAfter`),
 *   else the stream's last sequence (`$JS.API.STREAM.INFO.KV_<bucket>`);
 * - with more, the stream's info as its leader answers it, counted only when the leader heard
 *   from a quorum of the stream's servers within {@link LEASE_MS} (a leader cut off from its
 *   quorum still believes it leads for 10 to 20 s, and answers from a store that is behind).
 * Rejects when no answer comes in time (`TIMEOUT`), nobody answers (code `503`), the stream has
 * no leader, its leader heard from no quorum lately, or the answer is an error (its words).
 */
export function lastSequenceProbe(
  nc: NatsConnection,
  bucket: string,
  replicas: number,
  nothingAfter: NothingAfter,
  applied: () => number,
): Probe {
  const info = leaderInfo(nc, bucket, replicas);
  return async () => {
    const askedAt = Date.now();
    const due = performance.now() + PROBE_TIMEOUT_MS;
    const heldAtAsk = applied();
    if (replicas === 1 && (await nothingAfter(heldAtAsk, PROBE_TIMEOUT_MS))) return { sequence: heldAtAsk, askedAt, heldAtAsk };
    // The info gets what is left of the probe's time.
    return { sequence: await info(LEASE_MS, Math.max(1, due - performance.now())), askedAt, heldAtAsk };
  };
}

/** A stream's leader answered, and heard from no quorum of its servers within the time asked. */
class NotHeardLately extends Error {}

/**
 * The last sequence of stream `KV_<bucket>` from its info (`$JS.API.STREAM.INFO.KV_<bucket>`),
 * asked with the connection's {@link requesterOf} within `timeoutMs` ({@link PROBE_TIMEOUT_MS}
 * by default); with more than one replica, counted only from a leader that heard from a quorum
 * of the stream's servers within `withinMs`. Rejects naming the stream otherwise, or with the
 * server's words (a `TIMEOUT` when no answer came in time).
 */
function leaderInfo(nc: NatsConnection, bucket: string, replicas: number): (withinMs: number, timeoutMs?: number) => Promise<number> {
  const stream = `KV_${bucket}`;
  const ask = requesterOf(nc);
  return async (withinMs, timeoutMs = PROBE_TIMEOUT_MS) => {
    const answer = (await ask(`$JS.API.STREAM.INFO.${stream}`, "", undefined, timeoutMs)).json() as InfoAnswer;
    if (answer.state === undefined) throw new Error(`stream ${stream}: ${answer.error?.description ?? "no state in its info"}`);
    if (replicas === 1) return answer.state.last_seq;
    const { leader, replicas: peers = [] } = answer.cluster ?? {};
    if (!leader) throw new Error(`stream ${stream} has no leader`);
    const heard = peers.filter((p) => p.offline !== true && p.active <= withinMs * 1e6).length;
    if (2 * (heard + 1) <= peers.length + 1) {
      throw new NotHeardLately(
        `the leader of stream ${stream}, ${leader}, heard from no quorum of its servers within ${withinMs / 1000} s: it may be cut off`,
      );
    }
    return answer.state.last_seq;
  };
}

/** A stream's message as its leader holds it: its sequence, its subject and when it was stored (RFC 3339, to the nanosecond). */
export interface StoredMessage {
  readonly sequence: number;
  readonly subject: string;
  readonly time: string;
}

/** The first message of a stream from a sequence on: see {@link messageFromProbe}. */
export type MessageFrom = (sequence: number, timeoutMs?: number) => Promise<StoredMessage | null>;

/**
 * The first message of stream `KV_<bucket>` at or after a sequence, as its leader holds it (the
 * stream API's get, `$JS.API.STREAM.MSG.GET.KV_<bucket>`, of the first message of `$KV.<bucket>.>`
 * from there), asked with the connection's {@link requesterOf} within `timeoutMs`
 * ({@link PROBE_TIMEOUT_MS} by default): `null` when it holds none from there on (404). Rejects
 * with the server's words, or a `TIMEOUT`.
 */
export function messageFromProbe(nc: NatsConnection, bucket: string): MessageFrom {
  const stream = `KV_${bucket}`;
  const request = firstFrom(bucket);
  const ask = requesterOf(nc);
  return async (sequence, timeoutMs = PROBE_TIMEOUT_MS) => {
    const answer = (await ask(`$JS.API.STREAM.MSG.GET.${stream}`, request(sequence), undefined, timeoutMs)).json() as {
      readonly error?: { readonly code?: number; readonly description?: string };
      readonly message?: { readonly seq: number; readonly subject: string; readonly time: string };
    };
    if (answer.error?.code === 404) return null;
    if (answer.message === undefined) throw new Error(`stream ${stream}: ${answer.error?.description ?? "no message in its answer"}`);
    return { sequence: answer.message.seq, subject: answer.message.subject, time: answer.message.time };
  };
}

/**
 * How lately the leader of a replicated stream must have heard from a quorum of its servers,
 * asked right before, for the set to write a marker to it ({@link endMarker}), in milliseconds:
 * a publish a leader cut off takes stays on its replica in place of an acknowledged write once
 * the cut heals (nats-server 2.9, docs/runtime.md §6.14), and a view short of its stream is most
 * often one whose watch a fresh cut stopped.
 */
export const MARKER_LEASE_MS = 300;

/**
 * How long the leader is asked again, every {@link MARKER_LEASE_STEP_MS}, until it heard from a
 * quorum within {@link MARKER_LEASE_MS}, in milliseconds (a read's deadline may end it sooner):
 * on a stream nobody writes to, a leader hears from its followers once a second, and up to 2 s
 * after a write (nats-server 2.9), so one asked once heard from them within 0.3 s about one time
 * in three, or less. A leader cut off from its quorum never does.
 */
export const MARKER_LEASE_WAIT_MS = 2000;

/** How often the leader is asked again within {@link MARKER_LEASE_WAIT_MS}, in milliseconds. */
export const MARKER_LEASE_STEP_MS = 100;

/**
 * Asks whether stream `KV_<bucket>` holds no message after a sequence: a direct get
 * (`$JS.API.DIRECT.GET.KV_<bucket>`) of the first message of `$KV.<bucket>.>` after it, or,
 * when `config` does not allow direct gets or has replicas, the stream API's get
 * (`$JS.API.STREAM.MSG.GET.KV_<bucket>`, the leader's answer). Both answer 404 when there is
 * none. Each request times out after its `timeoutMs` ({@link PROBE_TIMEOUT_MS} by default); the
 * probe rejects when its request fails (a `TIMEOUT` then). Asked with the connection's
 * {@link requesterOf}: no Error made per request, answered or not.
 */
export function nothingAfterProbe(
  nc: NatsConnection,
  bucket: string,
  config: Pick<StreamConfig, "allow_direct" | "num_replicas">,
): NothingAfter {
  const stream = `KV_${bucket}`;
  // A replicated stream's followers answer direct gets too, and may lag: ask its leader.
  const direct = config.allow_direct === true && config.num_replicas === 1;
  const request = firstFrom(bucket);
  const ask = requesterOf(nc);
  return async (sequence, timeoutMs = PROBE_TIMEOUT_MS) => {
    if (direct) return (await ask(`$JS.API.DIRECT.GET.${stream}`, request(sequence + 1), undefined, timeoutMs)).headers?.code === 404;
    const reply = await ask(`$JS.API.STREAM.MSG.GET.${stream}`, request(sequence + 1), undefined, timeoutMs);
    return (reply.json() as { error?: { code?: number } }).error?.code === 404;
  };
}

/** The request of a get of the first message of `$KV.<bucket>.>` at or after a sequence. */
function firstFrom(bucket: string): (sequence: number) => string {
  const next = JSON.stringify({ next_by_subj: `$KV.${bucket}.>` }).slice(1);
  return (sequence) => `{"seq":${sequence},${next}`;
}

/**
 * Writes a delete marker of `$KV.<bucket>.`{@link MARKER_KEY} whose value tells it apart (the
 * key's one message, replacing the one before) and resolves with that value once the stream
 * acknowledged it through its quorum, within {@link PROBE_TIMEOUT_MS}: a view that receives it
 * holds every write acknowledged before. For a view of a replicated stream short of the stream's
 * last sequence, where no server's get can tell whether its last messages were removed (a purge,
 * an age limit). Written only then, never before every read, and only once the stream's leader,
 * asked right before, heard from a quorum within {@link MARKER_LEASE_MS} (asked again every
 * {@link MARKER_LEASE_STEP_MS} for up to {@link MARKER_LEASE_WAIT_MS} until it has): nats-server
 * 2.9 keeps, on a leader cut off from its quorum, whatever it was sent meanwhile, in place of
 * acknowledged writes, once the cut heals. Rejects naming why the leader was not asked to, or as
 * the connection's {@link publisherOf} does.
 */
export function endMarker(nc: NatsConnection, bucket: string, replicas: number): () => Promise<string> {
  const subject = `$KV.${bucket}.${MARKER_KEY}`;
  const publish = publisherOf(nc);
  const info = leaderInfo(nc, bucket, replicas);
  const id = randomUUID();
  let made = 0;
  /** Resolves once the leader heard from a quorum within {@link MARKER_LEASE_MS}; rejects as the last asking did. */
  const leased = async () => {
    const until = performance.now() + MARKER_LEASE_WAIT_MS;
    for (;;) {
      try {
        return await info(MARKER_LEASE_MS);
      } catch (err) {
        if (!(err instanceof NotHeardLately)) throw err;
        if (performance.now() + MARKER_LEASE_STEP_MS > until) {
          throw new Error(`${err.message} (asked every ${MARKER_LEASE_STEP_MS / 1000} s for ${MARKER_LEASE_WAIT_MS / 1000} s)`);
        }
        await sleep(MARKER_LEASE_STEP_MS);
      }
    }
  };
  return async () => {
    await leased();
    const h = headers();
    h.set("KV-Operation", "DEL");
    const marker = `${id}.${++made}`;
    await publish(subject, marker, h, PROBE_TIMEOUT_MS);
    return marker;
  };
}
