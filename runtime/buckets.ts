import type { KV, KvEntry, QueuedIterator } from "nats";

/** One live key of a bucket: its value as stored, its revision (stream sequence) and write time. */
export interface Entry {
  readonly key: string;
  readonly value: Uint8Array;
  readonly revision: number;
  readonly created: Date;
}

/** A bucket a function declared under `access.reads`: it can be read, never written. */
export interface ReadBucket {
  /** The JetStream key-value bucket behind the handle. */
  readonly bucket: string;
  /** The live value of `key`, or `null` when the key is missing or deleted. */
  get(key: string): Promise<Entry | null>;
  /**
   * Every live key matching any of `filters` (NATS subject wildcards `*` and `>`), in key order.
   * The filtering is done by the server; the read reflects every write acknowledged before it.
   */
  list(filters: string | readonly string[]): Promise<Entry[]>;
}

/** A bucket a function declared under `access.writes`. Writes return the new revision. */
export interface WriteBucket extends ReadBucket {
  /** Writes `key` only if it has no live value. Throws {@link RevisionConflict} otherwise. */
  create(key: string, value: Uint8Array | string): Promise<number>;
  /** Writes `key` only if its revision is still `revision`. Throws {@link RevisionConflict}. */
  update(key: string, value: Uint8Array | string, revision: number): Promise<number>;
  /** Writes `key` unconditionally. */
  put(key: string, value: Uint8Array | string): Promise<number>;
  /**
   * Deletes `key`; with `revision`, only if that is still its revision, else throws
   * {@link RevisionConflict}.
   */
  delete(key: string, options?: { revision?: number }): Promise<void>;
}

/** A compare-and-set write lost: the key changed since the revision it was based on. */
export class RevisionConflict extends Error {
  override readonly name = "RevisionConflict";
  constructor(
    readonly bucket: string,
    readonly key: string,
  ) {
    super(`${bucket}: ${key} changed since it was read`);
  }
}

const WRONG_LAST_SEQUENCE = 10071;

/**
 * The longest key or key filter a handle sends, in bytes: it travels in a NATS subject, and a
 * protocol line over 4 KiB makes the server close the connection every function shares.
 */
export const MAX_KEY_BYTES = 2048;

function checkedKey(bucket: string, key: string): string {
  const bytes = Buffer.byteLength(key);
  if (bytes > MAX_KEY_BYTES) {
    throw new Error(`${bucket}: a key or filter of ${bytes} bytes is longer than ${MAX_KEY_BYTES}`);
  }
  return key;
}

function live(entry: KvEntry | null): Entry | null {
  if (entry === null || entry.operation !== "PUT") return null;
  return { key: entry.key, value: entry.value, revision: entry.revision, created: entry.created };
}

function byKey(a: Entry, b: Entry): number {
  return a.key < b.key ? -1 : a.key > b.key ? 1 : 0;
}

/** Reads the last value of every key matching `filter` with one ordered consumer. */
async function watchOnce(kv: KV, filter: string): Promise<Entry[]> {
  const found: Entry[] = [];
  // nats.js calls initializedFn inside watch() when nothing is pending, before `iterator` is set.
  let initialized = false;
  let iterator: QueuedIterator<KvEntry> | undefined;
  iterator = await kv.watch({
    key: filter,
    initializedFn: () => {
      initialized = true;
      iterator?.stop();
    },
  });
  if (initialized) iterator.stop();
  for await (const entry of iterator) {
    const kept = live(entry);
    if (kept !== null) found.push(kept);
  }
  return found;
}

/** A read handle over an opened key-value bucket. */
export function readBucket(kv: KV, bucket: string): ReadBucket {
  return Object.freeze({
    bucket,
    async get(key: string) {
      return live(await kv.get(checkedKey(bucket, key)));
    },
    async list(filters: string | readonly string[]) {
      const all = (typeof filters === "string" ? [filters] : [...new Set(filters)]).map((f) => checkedKey(bucket, f));
      const parts = await Promise.all(all.map((filter) => watchOnce(kv, filter)));
      const unique = new Map<string, Entry>();
      for (const entry of parts.flat()) unique.set(entry.key, entry);
      return [...unique.values()].sort(byKey);
    },
  });
}

/** A write handle: the reads of {@link readBucket} plus compare-and-set writes. */
export function writeBucket(kv: KV, bucket: string): WriteBucket {
  const conflictOr = async <T>(key: string, write: () => Promise<T>): Promise<T> => {
    checkedKey(bucket, key);
    try {
      return await write();
    } catch (err) {
      const code = (err as { api_error?: { err_code?: number } }).api_error?.err_code;
      if (code === WRONG_LAST_SEQUENCE) throw new RevisionConflict(bucket, key);
      throw err;
    }
  };
  return Object.freeze({
    ...readBucket(kv, bucket),
    create: (key: string, value: Uint8Array | string) => conflictOr(key, () => kv.create(key, value)),
    update: (key: string, value: Uint8Array | string, revision: number) =>
      conflictOr(key, () => kv.update(key, value, revision)),
    put: (key: string, value: Uint8Array | string) => kv.put(checkedKey(bucket, key), value),
    delete: (key: string, options: { revision?: number } = {}) =>
      conflictOr(key, () => kv.delete(key, { previousSeq: options.revision })),
  });
}
