import { createRequire } from "node:module";
import type { JetStreamManager, KV, KvEntry, QueuedIterator } from "nats";
import type { Logger } from "pino";
import { checkedKey, filterList, type Entry, type KeyRecord, type ListOptions, type ReadBucket } from "./buckets.ts";
import { subjectMatches } from "./subjects.ts";

// Required, not imported: a CommonJS module whose default export tsx and vitest unwrap differently.
const { default: BTree } = createRequire(import.meta.url)("sorted-btree") as typeof import("sorted-btree");

/**
 * How long a read waits for the view to reach the stream's last sequence before it reads from
 * the server instead, in milliseconds. Only a stream whose last message was removed by hand
 * (a stream purge) keeps a view from reaching it.
 */
export const CATCH_UP_MS = 2000;

/** A live view: a {@link ReadBucket} answered from memory, and how to stop it. */
export interface LiveView extends ReadBucket {
  /** Resolves when the view holds the bucket as it was when the view was opened. */
  readonly loaded: Promise<void>;
  /** The stream sequence of the last record the view applied. */
  readonly sequence: () => number;
  /** Stops the watch; reads go to the server from then on. */
  stop(): void;
}

/**
 * A coalescing reader of a stream's last sequence: a caller gets a sequence read by a request
 * sent after it called, and callers that arrive while one request is out share the next one, so
 * at most two are ever out.
 */
function lastSequenceReader(read: () => Promise<number>): () => Promise<number> {
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

/** The literal tokens of `filter` before its first wildcard, joined; `undefined` for a key. */
function literalPrefix(filter: string): string | undefined {
  const tokens = filter.split(".");
  const first = tokens.findIndex((t) => t === "*" || t === ">");
  return first === -1 ? undefined : tokens.slice(0, first).join(".");
}

/**
 * Opens a live view of the bucket behind `kv` (stream `KV_<bucket>`): one long-lived watch of
 * every key (`$KV.<bucket>.>`, last values then updates) kept in a B+ tree by key, delete
 * markers included. Every read first waits until the view has applied the stream's last
 * sequence, read with `$JS.API.STREAM.INFO.KV_<bucket>` after the read was asked (concurrent
 * reads share one request), so it reflects every write acknowledged before it (SPEC §4), like
 * `server`'s reads; reads that would wait longer than {@link CATCH_UP_MS} go to `server`.
 * Keys are in JavaScript string order, as `server` sorts them.
 */
export async function openView(
  kv: KV,
  jsm: JetStreamManager,
  bucket: string,
  server: ReadBucket,
  log: Logger,
): Promise<LiveView> {
  const stream = `KV_${bucket}`;
  const tree = new BTree<string, KeyRecord>();
  let applied = 0;
  let stopped = false;
  const waiters = new Set<{ target: number; done: (reached: boolean) => void }>();

  let loadedFn!: () => void;
  const loaded = new Promise<void>((resolve) => (loadedFn = resolve));

  const apply = (entry: KvEntry) => {
    const deleted = entry.operation !== "PUT";
    const record: KeyRecord = {
      key: entry.key,
      // A copy: the message's bytes may be a view into a larger read buffer.
      value: entry.value.slice(),
      revision: entry.revision,
      created: entry.created,
      deleted,
    };
    tree.set(record.key, record);
    if (entry.revision > applied) applied = entry.revision;
    if (waiters.size > 0) {
      for (const waiter of waiters) if (waiter.target <= applied) waiter.done(true);
    }
  };

  let watch: QueuedIterator<KvEntry>;
  try {
    watch = await kv.watch({ key: ">", initializedFn: () => loadedFn() });
  } catch (err) {
    throw new Error(`cannot watch bucket ${bucket}: ${(err as Error).message}`);
  }
  void (async () => {
    for await (const entry of watch) apply(entry);
  })()
    .catch((err: unknown) => log.error({ bucket, err }, "view stopped"))
    .finally(() => {
      stopped = true;
      for (const waiter of waiters) waiter.done(false);
    });

  const lastSequence = lastSequenceReader(async () => (await jsm.streams.info(stream)).state.last_seq);

  /** Whether the view holds every write acknowledged before the call. */
  const caughtUp = async (): Promise<boolean> => {
    if (stopped) return false;
    const target = await lastSequence();
    if (target <= applied) return true;
    return new Promise<boolean>((resolve) => {
      const waiter = {
        target,
        done: (reached: boolean) => {
          clearTimeout(timer);
          waiters.delete(waiter);
          resolve(reached);
        },
      };
      const timer = setTimeout(() => {
        log.warn({ bucket, applied, target }, "view behind the stream; reading from the server");
        waiter.done(false);
      }, CATCH_UP_MS);
      waiters.add(waiter);
    });
  };

  /** The records of the tree matching `filter`, in key order, after `after`. */
  function* matching(filter: string, after: string | undefined): Generator<KeyRecord> {
    const prefix = literalPrefix(filter);
    if (prefix === undefined) {
      const record = tree.get(filter);
      if (record !== undefined && (after === undefined || record.key > after)) yield record;
      return;
    }
    const start = prefix === "" ? "" : `${prefix}.`;
    // `<prefix>.>` matches every key under the prefix: no need to match each.
    const everyKey = filter.slice(start.length) === ">";
    const from = after !== undefined && after > start ? after : start;
    for (const [key, record] of tree.entries(from)) {
      if (!key.startsWith(start)) return;
      if (key === after) continue;
      if (everyKey || subjectMatches(filter, key)) yield record;
    }
  }

  /** Up to `limit` records matching any of `filters`, deleted ones only when `deleted`. */
  const collect = (filters: string | readonly string[], options: ListOptions, deleted: boolean): KeyRecord[] => {
    const all = filterList(bucket, filters);
    const limit = options.limit ?? Infinity;
    const found = new Map<string, KeyRecord>();
    for (const filter of all) {
      let taken = 0;
      for (const record of matching(filter, options.after)) {
        if (taken >= limit) break;
        if (!deleted && record.deleted) continue;
        found.set(record.key, record);
        taken++;
      }
    }
    const sorted = all.length === 1 ? [...found.values()] : [...found.values()].sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0));
    return sorted.length > limit ? sorted.slice(0, limit) : sorted;
  };

  const live = ({ deleted: _, ...entry }: KeyRecord): Entry => entry;

  return {
    bucket,
    loaded,
    sequence: () => applied,
    stop: () => {
      stopped = true;
      watch.stop();
    },
    async get(key) {
      checkedKey(bucket, key);
      if (!(await caughtUp())) return server.get(key);
      const record = tree.get(key);
      return record === undefined || record.deleted ? null : live(record);
    },
    async last(key) {
      checkedKey(bucket, key);
      if (!(await caughtUp())) return server.last(key);
      return tree.get(key) ?? null;
    },
    async list(filters, options = {}) {
      if (!(await caughtUp())) return server.list(filters, options);
      return collect(filters, options, false).map(live);
    },
    async records(filters, options = {}) {
      if (!(await caughtUp())) return server.records(filters, options);
      return collect(filters, options, true);
    },
  };
}
