/**
 * JetStream's answers as the runtime reads them: the error codes it tells apart (matched by
 * code, never by text), the reason a failed request gives, and asking again while a cluster
 * elects its leaders (docs/buckets.md §2.4).
 */
import { ErrorCode, type JetStreamManager } from "nats";
import pRetry, { AbortError } from "p-retry";
import type { Logger } from "pino";

/** JetStream's error codes (`err_code`, nats-server's errors.json) that the runtime tells apart. */
const CLUSTER_NOT_AVAILABLE = 10008; // "JetStream system temporarily unavailable": no meta leader yet
export const NOT_ENABLED_FOR_ACCOUNT = 10039;
export const NOT_ENABLED = 10076;
export const STREAM_NAME_IN_USE = 10058; // made meanwhile, with another config
export const STREAM_NOT_FOUND = 10059;
export const CONSUMER_NOT_FOUND = 10014;

/** The JetStream error code of a failed API request; `undefined` when the server said none (no answer, no responders). */
export const errCode = (err: unknown): number | undefined => (err as { api_error?: { err_code?: number } }).api_error?.err_code;

/**
 * Whether the server says stream `stream` does not exist (its info answered `STREAM_NOT_FOUND`):
 * `false` when it answers the info, and when the asking fails otherwise (no answer, no
 * responders: nothing is known then). Asks `$JS.API.STREAM.INFO.<stream>` once.
 */
export const streamGone = (jsm: JetStreamManager, stream: string): Promise<boolean> =>
  jsm.streams.info(stream).then(
    () => false,
    (err: unknown) => errCode(err) === STREAM_NOT_FOUND,
  );

/**
 * What a failed JetStream API request says: the server's description when it gave one (nats.js
 * says only `503` for some), else the error's message.
 */
export const reasonOf = (err: unknown): string =>
  (err as { api_error?: { description?: string } }).api_error?.description ?? (err as Error).message;

/**
 * Whether a JetStream API request failed for what passes by itself while a cluster starts or
 * elects a leader: no answer within the request's timeout, no responders, or JetStream
 * "temporarily unavailable" (err_code 10008).
 */
function electing(err: unknown): boolean {
  const { code, api_error } = err as { code?: string; api_error?: unknown };
  if (code === ErrorCode.Timeout) return true;
  if (code === ErrorCode.NoResponders && api_error === undefined) return true;
  return errCode(err) === CLUSTER_NOT_AVAILABLE;
}

/** How long asserting one bucket, stream or durable is tried again while the cluster cannot answer it, in milliseconds. */
export const ASSERT_RETRY_MS = 30_000;

/** How {@link retryElecting} asks again. */
export interface RetryOptions {
  readonly log: Logger;
  /** What is asked (`{ stream }`, `{ stream, durable }`), in each retry's `debug` line. */
  readonly about: Record<string, unknown>;
  /** When to give up, in ms since the epoch: {@link ASSERT_RETRY_MS} from now by default; one given to several requests bounds them all. */
  readonly deadline?: number;
  /** What else passes by itself here (a stream just made, whose group has no leader yet, may be said not found). */
  readonly alsoWhile?: (err: unknown) => boolean;
}

/**
 * Runs `attempt` (a JetStream API request) until it resolves, again after 0.2 s doubling to 2 s
 * (jittered) while it fails as {@link electing} or `alsoWhile` says, until the deadline. Throws
 * any other failure at once, and one past the deadline as `<its message> (still so after <n> s
 * of asking again)`, with its `code` and JetStream error code ({@link errCode}).
 */
export function retryElecting<T>(attempt: () => Promise<T>, options: RetryOptions): Promise<T> {
  const { log, about, deadline = Date.now() + ASSERT_RETRY_MS, alsoWhile = () => false } = options;
  const began = Date.now();
  return pRetry(
    async () => {
      try {
        return await attempt();
      } catch (err) {
        if (!electing(err) && !alsoWhile(err)) throw new AbortError(err as Error);
        if (Date.now() < deadline) throw err;
        const last = `${reasonOf(err)} (still so after ${Math.round((Date.now() - began) / 1000)} s of asking again)`;
        // Its code and JetStream's error code kept, for the caller to tell it apart.
        const kept = { code: (err as { code?: string }).code, api_error: { err_code: errCode(err) } };
        throw new AbortError(Object.assign(new Error(last, { cause: err }), kept));
      }
    },
    {
      retries: 1000,
      minTimeout: 200,
      maxTimeout: 2000,
      randomize: true,
      onFailedAttempt: (err) =>
        log.debug({ ...about, err: reasonOf(err), attempt: err.attemptNumber }, "JetStream cannot answer yet; asking again"),
    },
  );
}

/**
 * How long after a stream or a bucket is found deleted behind the set it is made again, in
 * milliseconds (docs/runtime.md §6.3.2, docs/operations.md §13.4): nats-server 2.9 removes a
 * deleted stream's folder after it answered the delete, so a stream made again at once under the
 * same name may lose its files to that removal, and then holds messages it can give nobody.
 */
export const STREAM_REMADE_AFTER_MS = 2000;

/**
 * The subject of the server's advisory that stream `KV_<bucket>` was made (`created`) or deleted
 * (`deleted`), published in the stream's account.
 */
export const advisorySubject = (what: "created" | "deleted", bucket: string): string =>
  `$JS.EVENT.ADVISORY.STREAM.${what.toUpperCase()}.KV_${bucket}`;
