/**
 * JetStream publishes of one connection whose acknowledgements come back on one subscription of
 * the connection's inbox, each matched by the last token of its reply subject. nats.js makes a
 * request of each publish (its timer, and an error object made and dropped once it is answered);
 * a follower writing one key per event spends a good part of its time on that (docs/runtime.md §6.10).
 */
import { createInbox, ErrorCode, NatsError, type MsgHdrs, type NatsConnection } from "nats";

/** Milliseconds a publish waits for its acknowledgement, as nats.js's JetStream client does by default. */
export const PUBLISH_TIMEOUT_MS = 5000;

/**
 * Publishes `data` on `subject` (a subject some stream captures) with `headers`, and resolves
 * with the stream sequence the server stored it at. Rejects as nats.js's `js.publish` does: a
 * JetStream API error as a `NatsError` whose `code` is the error's code and `api_error` the
 * error (`err_code` 10071: the expected last sequence was not the key's); no stream for the
 * subject (no responders) code `503`; no acknowledgement within {@link PUBLISH_TIMEOUT_MS} code
 * `TIMEOUT` (a publish the server refuses for permissions ends so too); a closed connection
 * `CONNECTION_CLOSED`.
 */
export type Publish = (subject: string, data: Uint8Array | string, headers?: MsgHdrs) => Promise<number>;

const publishers = new WeakMap<NatsConnection, Publish>();
const decoder = new TextDecoder();

/** The {@link Publish} of `nc`, made at its first use: one subscription, one timer sweeping the late ones. */
export function publisherOf(nc: NatsConnection): Publish {
  let publish = publishers.get(nc);
  if (publish !== undefined) return publish;
  // The connection's inbox prefix (the seat receives on `_INBOX.<seat>.>` only), as nats.js's own requests use it.
  const prefix = `${createInbox((nc as { options?: { inboxPrefix?: string } }).options?.inboxPrefix)}.`;
  /** By token, in the order sent: when it was sent, and how it ends. */
  const waiting = new Map<string, { at: number; resolve: (seq: number) => void; reject: (err: Error) => void }>();
  let sent = 0;
  let timer: NodeJS.Timeout | undefined;
  const sweep = () => {
    const late = performance.now() - PUBLISH_TIMEOUT_MS;
    for (const [token, w] of waiting) {
      if (w.at > late) break;
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
      let answer: { seq?: unknown; error?: { code: number; err_code?: number; description?: string } };
      try {
        answer = JSON.parse(decoder.decode(msg.data)) as typeof answer;
      } catch (e) {
        return w.reject(NatsError.errorForCode(ErrorCode.BadJson, e as Error));
      }
      if (answer.error !== undefined) {
        const { code, description } = answer.error;
        return w.reject(Object.assign(new NatsError(description || ErrorCode.Unknown, `${code}`), { api_error: answer.error }));
      }
      if (typeof answer.seq !== "number") return w.reject(NatsError.errorForCode(ErrorCode.JetStreamInvalidAck));
      w.resolve(answer.seq);
    },
  });
  void nc.closed().then(() => {
    clearInterval(timer);
    for (const w of waiting.values()) w.reject(NatsError.errorForCode(ErrorCode.ConnectionClosed));
    waiting.clear();
  });
  publish = (subject, data, headers) =>
    new Promise<number>((resolve, reject) => {
      const token = (++sent).toString(36);
      // Throws when the connection is closed or the payload too large: the promise rejects.
      nc.publish(subject, data, { reply: `${prefix}${token}`, ...(headers ? { headers } : {}) });
      waiting.set(token, { at: performance.now(), resolve, reject });
      timer ??= setInterval(sweep, 500).unref();
    });
  publishers.set(nc, publish);
  return publish;
}
