/**
 * Bucket handles over nats.js's key-value API: reads that list a bucket with one ordered consumer
 * per filter (asked again when the server does not answer), and compare-and-set writes whose
 * lost race is a `RevisionConflict`. The storage layer's lowest part (docs/runtime.md §6).
 */
import {
  headers,
  MsgHdrsImpl,
  type JetStreamClient,
  type NatsConnection,
  type KV,
  type KvEntry,
  type KvWatchOptions,
  type QueuedIterator,
} from "nats";
import { RevisionConflict } from "./errors.ts";
import { STREAM_NOT_FOUND } from "./jetstream.ts";
import { publisherOf } from "./publisher.ts";
import type { Entry, KeyRecord, ListOptions, ReadBucket, WriteBucket } from "./types.ts";

const WRONG_LAST_SEQUENCE = 10071;

/**
 * The longest key or key filter a handle sends, in bytes: it travels in a NATS subject, and a
 * protocol line over 4 KiB makes the server close the connection every function shares.
 */
export const MAX_KEY_BYTES = 2048;

/** `key` itself; throws when it is longer than {@link MAX_KEY_BYTES}. */
export function checkedKey(bucket: string, key: string): string {
  const bytes = Buffer.byteLength(key);
  if (bytes > MAX_KEY_BYTES) {
    throw new Error(`${bucket}: a key or filter of ${bytes} bytes is longer than ${MAX_KEY_BYTES}`);
  }
  return key;
}

/**
 * The server's time of an entry in nanoseconds since the epoch: from the watched message's
 * `timestampNanos`, or a stored message's RFC 3339 time with its fraction; else its `created`.
 */
export function nanosOf(entry: KvEntry): number {
  const sm = (entry as { sm?: { info?: { timestampNanos?: number }; timestamp?: string } }).sm;
  if (typeof sm?.info?.timestampNanos === "number") return sm.info.timestampNanos;
  if (typeof sm?.timestamp === "string") return nanosOfTime(sm.timestamp);
  return entry.created.getTime() * 1e6;
}

/**
 * When `entry` was stored, in whole milliseconds, as a direct get of it says (its time cut to the
 * millisecond). A watch's entry carries its time in nanoseconds in its reply subject, which
 * nats.js reads as a Number: past 2^53 that is not exact, and lands on the next millisecond now
 * and then. Read from the subject's digits, it is exact.
 */
export function createdMsOf(entry: KvEntry): number {
  const reply = (entry as { sm?: { reply?: string } }).sm?.reply;
  if (reply !== undefined) {
    const tokens = reply.split(".");
    const nanos = tokens[tokens.length === 9 ? 7 : 9];
    if (nanos !== undefined && nanos.length > 6 && /^\d+$/.test(nanos)) return Number(nanos.slice(0, -6));
  }
  return entry.created.getTime();
}

/** An RFC 3339 time with up to nine digits of fraction, in nanoseconds since the epoch. */
export function nanosOfTime(time: string): number {
  const fraction = /\.(\d+)/.exec(time)?.[1] ?? "";
  const ms = Date.parse(time);
  return ms * 1e6 + Number(fraction.padEnd(9, "0").slice(3, 9));
}

/**
 * Whether a record's `KV-Operation` deletes its key: `DEL` or `PURGE` only, as nats.js's and the
 * server's own reads take it. A value written with another (or none) is a value, never dropped.
 */
export const deletes = (operation: string | undefined): boolean => operation === "DEL" || operation === "PURGE";

function recordOf(entry: KvEntry | null): KeyRecord | null {
  if (entry === null) return null;
  const { key, value, revision, created } = entry;
  return { key, value, revision, created, createdNanos: nanosOf(entry), deleted: deletes(entry.operation) };
}

function live(entry: KvEntry | null): Entry | null {
  if (entry === null || deletes(entry.operation)) return null;
  return { key: entry.key, value: entry.value, revision: entry.revision, created: entry.created, createdNanos: nanosOf(entry) };
}

function byKey(a: Entry, b: Entry): number {
  return a.key < b.key ? -1 : a.key > b.key ? 1 : 0;
}

/**
 * Milliseconds the creation of a watch's consumer is waited for, ask after ask, before it is
 * asked again: short first (a server that is down never answers), longer then (a large bucket
 * takes the server seconds).
 */
export const WATCH_WAITS_MS = [2000, 4000, 8000, 8000] as const;

/**
 * Microseconds a message of the stream adds to each wait of {@link WATCH_WAITS_MS}: nats-server
 * 2.9.10 takes about 4.6 µs a message of the stream to make a consumer delivering the last
 * message of each subject (4.6 s for 1,000,000, docs/scale.md §11.1); twice that is waited.
 */
export const WATCH_WAIT_US_A_MESSAGE = 10;

/** The waits of {@link WATCH_WAITS_MS} for a watch of a stream of `messages` messages, in milliseconds. */
export const watchWaits = (messages: number): number[] =>
  WATCH_WAITS_MS.map((ms) => ms + Math.ceil((messages * WATCH_WAIT_US_A_MESSAGE) / 1000));

/**
 * `kv.watch(options)`, asked again (waiting `waits`, {@link WATCH_WAITS_MS} by default, each
 * cut short by `kv`'s JetStream timeout) when the server does not answer in time: nats-server before 2.11 may place the ephemeral consumer of a replicated
 * stream on a server that is down, whose creation then never answers (nats-server#7165). A
 * watch made by a late answer to an abandoned ask is stopped, and its `initializedFn` not
 * called. Throws what the server answers, or when no ask was answered.
 */
export async function watchOf(
  kv: KV,
  options: KvWatchOptions,
  waits: readonly number[] = WATCH_WAITS_MS,
): Promise<QueuedIterator<KvEntry>> {
  for (let attempt = 1; ; attempt++) {
    const waitMs = waits[attempt - 1]!;
    let abandoned = false;
    let initialized = false;
    const asked = kv.watch({
      ...options,
      initializedFn: () => {
        if (abandoned) return;
        initialized = true;
        options.initializedFn?.();
      },
    });
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<undefined>((resolve) => (timer = setTimeout(resolve, waitMs, undefined)));
    // nats.js's own timeout (5 s) is no answer either.
    const answer = await Promise.race([asked, late])
      .catch((err: { code?: string }) => {
        if (err.code !== "TIMEOUT") throw err;
        return undefined;
      })
      .finally(() => clearTimeout(timer));
    // Initialized means the consumer exists: its answer is on its way.
    if (answer !== undefined || initialized) return answer ?? (await asked);
    abandoned = true;
    void asked.then(
      (watch) => watch.stop(),
      () => {},
    );
    if (attempt === waits.length) {
      const total = waits.reduce((a, b) => a + b, 0);
      throw new Error(`no answer from the server to the creation of a watch, ${waits.length} times in ${total / 1000} s`);
    }
  }
}

/** Reads the last record of every key matching `filter` with one ordered consumer. */
async function watchOnce(kv: KV, filter: string, deleted: boolean): Promise<KeyRecord[]> {
  const found: KeyRecord[] = [];
  // nats.js calls initializedFn inside watch() when nothing is pending, before `iterator` is set.
  let initialized = false;
  let iterator: QueuedIterator<KvEntry> | undefined;
  iterator = await watchOf(kv, {
    key: filter,
    initializedFn: () => {
      initialized = true;
      iterator?.stop();
    },
  });
  if (initialized) iterator.stop();
  for await (const entry of iterator) {
    const kept = recordOf(entry)!;
    if (deleted || !kept.deleted) found.push(kept);
  }
  return found;
}

/** `filters` as a list without repeats; throws when one is longer than {@link MAX_KEY_BYTES}. */
export function filterList(bucket: string, filters: string | readonly string[]): string[] {
  return (typeof filters === "string" ? [filters] : [...new Set(filters)]).map((f) => checkedKey(bucket, f));
}

/** Milliseconds a watch's records are waited for before the stream's gets are asked too (see {@link scan}). */
export const SCAN_AFTER_MS = 2000;

/**
 * The last records of every key matching `filter`, got one by one from the stream (its leader's
 * get of the next message of the filter's subjects, `$JS.API.STREAM.MSG.GET.KV_<bucket>`): no
 * consumer, so no server is asked to place one. One request per record: for when a watch's
 * consumer cannot be made in time (nats-server before 2.11 may place it on a server that is down,
 * nats-server#7165).
 */
export async function scan(nc: NatsConnection, bucket: string, filter: string, deleted: boolean): Promise<KeyRecord[]> {
  const prefix = `$KV.${bucket}.`;
  const found = new Map<string, KeyRecord>();
  for (let seq = 1; ;) {
    const reply = await nc.request(`$JS.API.STREAM.MSG.GET.KV_${bucket}`, JSON.stringify({ seq, next_by_subj: `${prefix}${filter}` }), {
      timeout: 5000,
    });
    const answer = reply.json() as {
      error?: { code?: number; err_code?: number; description?: string };
      message?: { subject: string; seq: number; hdrs?: string; data?: string; time: string };
    };
    // No message after `seq`: the end. Not the stream missing (its bucket deleted), also a 404.
    if (answer.error?.code === 404 && answer.error.err_code !== STREAM_NOT_FOUND) break;
    if (answer.message === undefined) throw new Error(`${bucket}: ${answer.error?.description ?? "no message in the stream's answer"}`);
    const { subject, seq: at, hdrs, data, time } = answer.message;
    // Read as nats.js reads a watch's: the header by its exact name, its whole value.
    const operation =
      hdrs === undefined ? undefined : MsgHdrsImpl.decode(new Uint8Array(Buffer.from(hdrs, "base64"))).get("KV-Operation") || undefined;
    const key = subject.slice(prefix.length);
    const value = data === undefined ? new Uint8Array() : new Uint8Array(Buffer.from(data, "base64"));
    found.set(key, {
      key,
      value,
      revision: at,
      created: new Date(time),
      createdNanos: nanosOfTime(time),
      deleted: deletes(operation),
    });
    seq = at + 1;
  }
  return [...found.values()].filter((record) => deleted || !record.deleted);
}

/**
 * The last records of one filter: a watch's, or, when it has given none within
 * {@link SCAN_AFTER_MS} and `nc` is given, the stream's gets ({@link scan}), whichever ends first.
 */
async function readOne(kv: KV, nc: NatsConnection | undefined, bucket: string, filter: string, deleted: boolean): Promise<KeyRecord[]> {
  const watched = watchOnce(kv, filter, deleted);
  if (nc === undefined) return watched;
  let timer: NodeJS.Timeout | undefined;
  const scanned = new Promise<KeyRecord[]>((resolve, reject) => {
    timer = setTimeout(() => scan(nc, bucket, filter, deleted).then(resolve, reject), SCAN_AFTER_MS);
  });
  watched.catch(() => {});
  scanned.catch(() => {});
  try {
    return await Promise.any([watched, scanned]);
  } catch (err) {
    throw (err as AggregateError).errors?.[0] ?? err;
  } finally {
    clearTimeout(timer);
  }
}

/** The last records of every key matching any of `filters`, in key order, narrowed by `options`. */
async function read(
  kv: KV,
  nc: NatsConnection | undefined,
  bucket: string,
  filters: string | readonly string[],
  deleted: boolean,
  options: ListOptions = {},
): Promise<KeyRecord[]> {
  const parts = await Promise.all(filterList(bucket, filters).map((filter) => readOne(kv, nc, bucket, filter, deleted)));
  const unique = new Map<string, KeyRecord>();
  for (const entry of parts.flat()) if (options.after === undefined || entry.key > options.after) unique.set(entry.key, entry);
  return [...unique.values()].sort(byKey).slice(0, options.limit ?? Infinity);
}

/**
 * A read handle over an opened key-value bucket. With `nc` (the connection it was opened on), a listing whose watch gives nothing
 * within {@link SCAN_AFTER_MS} is also read by the stream's gets ({@link scan}).
 */
export function readBucket(kv: KV, bucket: string, nc?: NatsConnection): ReadBucket {
  return Object.freeze({
    bucket,
    async get(key: string) {
      return live(await kv.get(checkedKey(bucket, key)));
    },
    async list(filters: string | readonly string[], options?: ListOptions) {
      return (await read(kv, nc, bucket, filters, false, options)).map(({ deleted: _, ...entry }) => entry);
    },
    async last(key: string) {
      return recordOf(await kv.get(checkedKey(bucket, key)));
    },
    records: (filters: string | readonly string[], options?: ListOptions) => read(kv, nc, bucket, filters, true, options),
  });
}

/** A key as nats.js's KV takes it: tokens of `A-Z a-z 0-9 - _ / =` between dots. Throws `invalid key: <key>` otherwise. */
function validKey(key: string): string {
  if (key.startsWith(".") || key.endsWith(".") || !/^[-/=.\w]+$/.test(key)) throw new Error(`invalid key: ${key}`);
  return key;
}

/**
 * A write handle: the reads of {@link readBucket} plus compare-and-set writes. With `nc` (the
 * connection `kv` was opened on), `update` and `delete` are published through the connection's
 * {@link publisherOf}, their acknowledgements awaited on one subscription rather than a request each.
 */
export function writeBucket(kv: KV, js: JetStreamClient, bucket: string, nc?: NatsConnection): WriteBucket {
  const publish = nc === undefined ? undefined : publisherOf(nc);
  // Every compare-and-set write's key checked here, as nats.js's KV would: some are published raw.
  const conflictOr = async <T>(key: string, write: () => Promise<T>): Promise<T> => {
    validKey(checkedKey(bucket, key));
    try {
      return await write();
    } catch (err) {
      const code = (err as { api_error?: { err_code?: number } }).api_error?.err_code;
      if (code === WRONG_LAST_SEQUENCE) throw new RevisionConflict(bucket, key, { cause: err });
      throw err;
    }
  };
  return Object.freeze({
    ...readBucket(kv, bucket, nc),
    create: (key: string, value: Uint8Array | string) => conflictOr(key, () => kv.create(key, value)),
    update: (key: string, value: Uint8Array | string, revision: number) =>
      conflictOr(key, async () => {
        if (publish === undefined) return kv.put(key, value, { previousSeq: revision });
        const h = headers();
        h.set("Nats-Expected-Last-Subject-Sequence", `${revision}`);
        return publish(`$KV.${bucket}.${key}`, value, h);
      }),
    put: (key: string, value: Uint8Array | string) => kv.put(checkedKey(bucket, key), value),
    // A KV delete is a message with `KV-Operation: DEL` (ADR-8); written here so it can carry a value.
    delete: (key: string, options: { revision?: number; value?: Uint8Array | string } = {}) =>
      conflictOr(key, async () => {
        const h = headers();
        h.set("KV-Operation", "DEL");
        const value = options.value ?? new Uint8Array();
        if (publish !== undefined) {
          if (options.revision !== undefined) h.set("Nats-Expected-Last-Subject-Sequence", `${options.revision}`);
          return publish(`$KV.${bucket}.${key}`, value, h);
        }
        const expect = options.revision === undefined ? {} : { lastSubjectSequence: options.revision };
        return (await js.publish(`$KV.${bucket}.${key}`, value, { headers: h, expect })).seq;
      }),
  });
}
