/**
 * Requests of one connection whose answers come back on one subscription of the connection's
 * inbox, each matched by the last token of its reply subject, and the JetStream publishes made
 * of them. nats.js makes a request of each publish (its timer, and an error object made and
 * dropped once it is answered); a follower writing one key per event, or a view asking whether
 * it is current before each read, spends a good part of its time on that (docs/runtime.md §6.10).
 */
import { createInbox, ErrorCode, NatsError, type Msg, type MsgHdrs, type NatsConnection } from "nats";

/** Milliseconds a request waits for its answer, as nats.js's JetStream client does by default. */
export const PUBLISH_TIMEOUT_MS = 5000;

/** How often the requests past their time are ended, in milliseconds: a request ends at most this late. */
const SWEEP_MS = 250;

/**
 * Sends `data` on `subject` with `headers` and resolves with the answer. Rejects with a
 * `NatsError`: nobody subscribed to `subject` (no responders) code `503`; no answer within
 * `timeoutMs` ({@link PUBLISH_TIMEOUT_MS} by default) code `TIMEOUT`; a closed connection `CONNECTION_CLOSED`.
 */
export type Request = (subject: string, data: Uint8Array | string, headers?: MsgHdrs, timeoutMs?: number) => Promise<Msg>;

/**
 * Publishes `data` on `subject` (a subject some stream captures) with `headers`, and resolves
 * with the stream sequence the server stored it at. Rejects as nats.js's `js.publish` does: a
 * JetStream API error as a `NatsError` whose `code` is the error's code and `api_error` the
 * error (`err_code` 10071: the expected last sequence was not the key's); no stream for the
 * subject (no responders) code `503`; no acknowledgement within {@link PUBLISH_TIMEOUT_MS} code
 * `TIMEOUT` (`timeoutMs` when given; a publish the server refuses for permissions ends so too); a
 * closed connection `CONNECTION_CLOSED`.
 */
export type Publish = (subject: string, data: Uint8Array | string, headers?: MsgHdrs, timeoutMs?: number) => Promise<number>;

const requesters = new WeakMap<NatsConnection, Request>();
const publishers = new WeakMap<NatsConnection, Publish>();
const decoder = new TextDecoder();

/** The {@link Request} of `nc`, made at its first use: one subscription, one timer sweeping the late ones. */
export function requesterOf(nc: NatsConnection): Request {
  let request = requesters.get(nc);
  if (request !== undefined) return request;
  // The connection's inbox prefix (the seat receives on `_INBOX.<seat>.>` only), as nats.js's own requests use it.
  const prefix = `${createInbox((nc as { options?: { inboxPrefix?: string } }).options?.inboxPrefix)}.`;
  /** By token: when its answer is due at the latest, and how it ends. */
  const waiting = new Map<string, { due: number; resolve: (msg: Msg) => void; reject: (err: Error) => void }>();
  let sent = 0;
  let timer: NodeJS.Timeout | undefined;
  const sweep = () => {
    const now = performance.now();
    for (const [token, w] of waiting) {
      if (w.due > now) continue;
      waiting.delete(token);
      w.reject(NatsError.errorForCode(ErrorCode.Timeout));
    }
    if (waiting.size === 0) {
      clearInterval(timer);
      timer = undefined;
    }
  };
  nc.subscribe(`${prefix}*`, {
    callback: (err, msg) => {
      if (err !== null) return;
      const token = msg.subject.slice(prefix.length);
      const w = waiting.get(token);
      if (w === undefined) return;
      waiting.delete(token);
      if (msg.data.length === 0 && msg.headers?.code === 503) return w.reject(NatsError.errorForCode(ErrorCode.NoResponders));
      w.resolve(msg);
    },
  });
  void nc.closed().then(() => {
    clearInterval(timer);
    for (const w of waiting.values()) w.reject(NatsError.errorForCode(ErrorCode.ConnectionClosed));
    waiting.clear();
  });
  request = (subject, data, headers, timeoutMs = PUBLISH_TIMEOUT_MS) =>
    new Promise<Msg>((resolve, reject) => {
      const token = (++sent).toString(36);
      // Throws when the connection is closed or the payload too large: the promise rejects.
      const reply = `${prefix}${token}`;
      nc.publish(subject, data, headers ? { reply, headers } : { reply });
      waiting.set(token, { due: performance.now() + timeoutMs, resolve, reject });
      timer ??= setInterval(sweep, SWEEP_MS).unref();
    });
  requesters.set(nc, request);
  return request;
}

/** The {@link Publish} of `nc`: its {@link requesterOf}, the answer read as a JetStream acknowledgement. */
export function publisherOf(nc: NatsConnection): Publish {
  let publish = publishers.get(nc);
  if (publish !== undefined) return publish;
  const request = requesterOf(nc);
  publish = async (subject, data, headers, timeoutMs) => {
    const msg = await request(subject, data, headers, timeoutMs);
    let answer: { seq?: unknown; error?: { code: number; err_code?: number; description?: string } };
    try {
      answer = JSON.parse(decoder.decode(msg.data)) as typeof answer;
    } catch (e) {
      throw NatsError.errorForCode(ErrorCode.BadJson, e as Error);
    }
    if (answer.error !== undefined) {
      const { code, description } = answer.error;
      throw Object.assign(new NatsError(description || ErrorCode.Unknown, `${code}`), { api_error: answer.error });
    }
    if (typeof answer.seq !== "number") throw NatsError.errorForCode(ErrorCode.JetStreamInvalidAck);
    return answer.seq;
  };
  publishers.set(nc, publish);
  return publish;
}
