/**
 * Read handles of the config's streams (`access.streams`, docs/runtime.md §6.4): a stream's
 * messages got one by one by sequence from its leader (`$JS.API.STREAM.MSG.GET.<stream>`), newest
 * first. No consumer is made: the seat is granted the stream's info and gets only
 * (docs/runtime.md §6.7).
 */
import type { NatsConnection } from "nats";
import { ServiceError } from "./errors.ts";
import { subjectMatches } from "./subjects.ts";
import { READ_DEADLINE_MS } from "./views/index.ts";

/** One stored message of a stream. */
export interface StreamMessage {
  readonly seq: number;
  readonly subject: string;
  readonly data: Uint8Array;
  /** When the server stored it. */
  readonly time: Date;
}

/** What `ctx.streams.<name>` holds: a stream's messages, read by sequence. */
export interface ReadStream {
  /** The stream's name on the server. */
  readonly stream: string;
  /** Its first and last sequences and how many messages it holds; all 0 when it does not exist (yet). */
  info(): Promise<{ readonly firstSeq: number; readonly lastSeq: number; readonly messages: number }>;
  /** The message of sequence `seq`, or `null` when the stream holds none there (deleted, aged out). */
  get(seq: number): Promise<StreamMessage | null>;
  /**
   * The stream's messages newest first: those below sequence `before` (all without it), stored
   * at or after `since` (all without it), whose subject `subject` matches (a subject with
   * wildcards; all without it). Read {@link GETS} at a time; where none of those matches, the
   * next one below is looked for by the server's gets of the next match from a sequence, over
   * windows doubling back from there, then halving: a few dozen requests past a million others.
   */
  newest(options?: { readonly before?: number; readonly since?: Date; readonly subject?: string }): AsyncGenerator<StreamMessage>;
}

/** Gets asked at once while walking a stream. */
export const GETS = 64;
/**
 * How long each request of a read waits for its answer, in milliseconds: a read's deadline
 * (docs/verb.md §4.6), so a read in flight when the server stops answering ends with a 503
 * within it.
 */
const TIMEOUT_MS = READ_DEADLINE_MS;

type GetAnswer = {
  error?: { code?: number; description?: string };
  message?: { subject: string; seq: number; data?: string; time: string };
};
type InfoAnswer = { error?: { code?: number; description?: string }; state?: { first_seq: number; last_seq: number; messages: number } };

/**
 * The read handle of the server's stream `stream`, over `nc`. A get the server refuses otherwise
 * than "no message" throws a 500; each request is refused at once with a 503 while `unreachable()`
 * says why NATS cannot be reached.
 */
export function readStream(nc: NatsConnection, stream: string, unreachable: () => string | undefined = () => undefined): ReadStream {
  const ask = async <T>(subject: string, body: unknown): Promise<T> => {
    const away = unreachable();
    if (away !== undefined) throw new ServiceError(503, away);
    return (await nc.request(subject, JSON.stringify(body), { timeout: TIMEOUT_MS })).json() as T;
  };
  const info = async () => {
    const answer = await ask<InfoAnswer>(`$JS.API.STREAM.INFO.${stream}`, {});
    if (answer.error?.code === 404) return { firstSeq: 0, lastSeq: 0, messages: 0 };
    if (answer.state === undefined) throw new ServiceError(500, `stream ${stream}: ${answer.error?.description ?? "no state in its info"}`);
    return { firstSeq: answer.state.first_seq, lastSeq: answer.state.last_seq, messages: answer.state.messages };
  };
  /** The message of `seq`, or with `filter` the first at or after `seq` whose subject it matches; `null` when none. */
  const get = async (seq: number, filter?: string): Promise<StreamMessage | null> => {
    const answer = await ask<GetAnswer>(`$JS.API.STREAM.MSG.GET.${stream}`, filter === undefined ? { seq } : { seq, next_by_subj: filter });
    if (answer.error?.code === 404) return null;
    if (answer.message === undefined)
      throw new ServiceError(500, `stream ${stream}: ${answer.error?.description ?? "no message in the answer"}`);
    const { subject, data, time } = answer.message;
    return {
      seq: answer.message.seq,
      subject,
      data: data === undefined ? new Uint8Array() : new Uint8Array(Buffer.from(data, "base64")),
      time: new Date(time),
    };
  };
  /** The last message at or below `top` (and at or above `first`) whose subject `subject` matches, or `null`. */
  const lastMatching = async (top: number, first: number, subject: string): Promise<StreamMessage | null> => {
    // Back from `top` over windows doubling in size until one holds a match.
    let found: StreamMessage | null = null;
    for (let span = GETS, high = top; found === null; span *= 2) {
      if (high < first) return null;
      const low = Math.max(first, high - span + 1);
      const next = await get(low, subject);
      if (next !== null && next.seq <= high) found = next;
      else high = low - 1;
    }
    // Then the last match of that window: the first match from halfway up, while there is one.
    let { seq: a } = found;
    for (let b = top; a < b;) {
      const mid = a + Math.ceil((b - a) / 2);
      const next = await get(mid, subject);
      if (next !== null && next.seq <= b) {
        found = next;
        a = next.seq;
      } else b = mid - 1;
    }
    return found;
  };
  async function* newest(options: { before?: number; since?: Date; subject?: string } = {}): AsyncGenerator<StreamMessage> {
    const { firstSeq, lastSeq } = await info();
    if (lastSeq === 0) return;
    const { subject } = options;
    let top = Math.min(lastSeq, (options.before ?? lastSeq + 1) - 1);
    const since = options.since?.getTime();
    while (top >= firstSeq) {
      const low = Math.max(firstSeq, top - GETS + 1);
      const seqs = Array.from({ length: top - low + 1 }, (_, i) => top - i);
      const got = await Promise.all(seqs.map((seq) => get(seq)));
      let matched = false;
      for (const message of got) {
        if (message === null || (subject !== undefined && !subjectMatches(subject, message.subject))) continue;
        // Stored times grow with the sequence: the first older than `since` ends the walk.
        if (since !== undefined && message.time.getTime() < since) return;
        matched = true;
        yield message;
      }
      top = low - 1;
      if (matched || subject === undefined || top < firstSeq) continue;
      // None matched here: the next match below may be far, looked for rather than walked to.
      const next = await lastMatching(top, firstSeq, subject);
      if (next === null) return;
      top = next.seq;
    }
  }
  return Object.freeze({ stream, info, get: (seq: number) => get(seq), newest });
}
