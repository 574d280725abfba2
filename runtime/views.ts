import { createRequire } from "node:module";
import type { KV, KvEntry, NatsConnection, QueuedIterator } from "nats";
import type { Logger } from "pino";
import { checkedKey, filterList, watchOf } from "./buckets.ts";
import type { Entry, KeyRecord, ListOptions, ReadBucket, ViewBucket } from "./types.ts";
import { subjectMatches } from "./subjects.ts";

// Required, not imported: a CommonJS module whose default export tsx and vitest unwrap differently.
const { default: BTree } = createRequire(import.meta.url)("sorted-btree") as typeof import("sorted-btree");

/**
 * How long a read waits for the view to reach the stream's last sequence before it reads from
 * the server instead, in milliseconds. Only a stream whose last message was removed by hand
 * (a stream purge) keeps a view from reaching it.
 */
export const CATCH_UP_MS = 500;

/** A live view and how to stop it. */
export interface LiveView extends ViewBucket {
  /** Resolves when the view holds the bucket as it was when the view was opened. */
  readonly loaded: Promise<void>;
  /** The stream sequence of the last record the view applied. */
  readonly sequence: () => number;
  /** Stops the watch; reads go to the server from then on. */
  stop(): void;
}

/**
 * Coalesces an asking of the server: a caller gets the answer of a request sent after it
 * called, and callers that arrive while one request is out share the next one, so at most two
 * are ever out.
 */
function coalesced(read: () => Promise<number>): () => Promise<number> {
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

/** How often a view checks that it holds as many keys as the stream has subjects, in milliseconds. */
export const RESYNC_MS = 10_000;

/**
 * The largest value of a delete marker a view keeps, in bytes: a longer one (a node may write
 * any) is read from the server when asked for, so what nobody reads takes no memory.
 */
export const MARKER_VALUE_BYTES = 4096;

const EMPTY = new Uint8Array(0);
const byKey = (a: KeyRecord, b: KeyRecord) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0);

/** One load of a bucket: its records by key, the last sequence applied, the watch feeding them. */
interface Generation {
  readonly tree: InstanceType<typeof BTree<string, KeyRecord>>;
  applied: number;
  readonly watch: QueuedIterator<KvEntry>;
  readonly loaded: Promise<void>;
}

/**
 * Opens a live view of the bucket behind `kv` (stream `KV_<bucket>`): one long-lived watch of
 * every key (`$KV.<bucket>.>`, last values then updates) kept in a B+ tree by key, delete
 * markers included (their values only up to {@link MARKER_VALUE_BYTES}). Every read first
 * makes sure the view holds every write acknowledged before it was asked (SPEC §4), as
 * `server`'s reads do: a direct get (`$JS.API.DIRECT.GET.KV_<bucket>`) of the first message
 * after the last one the view applied finds none (`$JS.API.STREAM.MSG.GET.KV_<bucket>`, its
 * leader's answer, when the stream does not allow direct gets or has replicas), or else the view waits for the stream's last
 * sequence (`$JS.API.STREAM.INFO.KV_<bucket>`). Concurrent reads share these requests. Reads that would wait longer than
 * {@link CATCH_UP_MS}, or that cannot tell, go to `server`. Messages removed without a marker
 * (a stream purge, a bucket's age limit) are noticed within {@link RESYNC_MS}, when the view
 * holds another number of keys than the stream has subjects: it loads the bucket again,
 * reading from `server` meanwhile. Keys are in JavaScript string order, as `server` sorts them.
 */
export async function openView(
  nc: NatsConnection,
  kv: KV,
  bucket: string,
  server: ReadBucket,
  log: Logger,
  { resyncMs = RESYNC_MS }: { resyncMs?: number } = {},
): Promise<LiveView> {
  const stream = `KV_${bucket}`;
  const jsm = await nc.jetstreamManager();
  // A replicated stream's followers answer direct gets too, and may lag: ask its leader.
  const { config: streamConfig } = await jsm.streams.info(stream);
  const direct = streamConfig.allow_direct === true && streamConfig.num_replicas === 1;
  let stopped = false;
  const waiters = new Set<{ target: number; done: (reached: boolean) => void }>();
  /** Delete markers whose value the view did not keep. */
  const cut = new WeakSet<KeyRecord>();

  const start = async (): Promise<Generation> => {
    let loadedFn!: () => void;
    const loaded = new Promise<void>((resolve) => (loadedFn = resolve));
    let watch: QueuedIterator<KvEntry>;
    try {
      watch = await watchOf(kv, { key: ">", initializedFn: () => loadedFn() });
    } catch (err) {
      throw new Error(`cannot watch bucket ${bucket}: ${(err as Error).message}`);
    }
    const generation: Generation = { tree: new BTree<string, KeyRecord>(), applied: 0, watch, loaded };
    void (async () => {
      for await (const entry of watch) apply(generation, entry);
    })()
      .catch((err: unknown) => log.error({ bucket, err }, "view stopped"))
      .finally(() => {
        if (current !== generation) return;
        stopped = true;
        for (const waiter of waiters) waiter.done(false);
      });
    return generation;
  };

  const apply = (generation: Generation, entry: KvEntry) => {
    const deleted = entry.operation !== "PUT";
    const kept = !deleted || entry.value.length <= MARKER_VALUE_BYTES;
    const record: KeyRecord = {
      key: entry.key,
      // A copy: the message's bytes may be a view into a larger read buffer.
      value: kept ? entry.value.slice() : EMPTY,
      revision: entry.revision,
      created: entry.created,
      deleted,
    };
    if (!kept) cut.add(record);
    generation.tree.set(record.key, record);
    if (entry.revision > generation.applied) generation.applied = entry.revision;
    if (generation === current && waiters.size > 0) {
      for (const waiter of waiters) if (waiter.target <= generation.applied) waiter.done(true);
    }
  };

  let current: Generation | undefined;
  current = await start();
  const first = current;
  let reloading = false;

  const next = JSON.stringify({ next_by_subj: `$KV.${bucket}.>` }).slice(1);
  /**
   * Whether the stream holds no message after `sequence`: a direct get of the first one after it,
   * or, on a stream without direct gets, the stream API's get (both 404 when there is none).
   */
  const nothingAfter = async (sequence: number): Promise<boolean> => {
    const request = `{"seq":${sequence + 1},${next}`;
    if (direct) return (await nc.request(`$JS.API.DIRECT.GET.${stream}`, request, { timeout: 5000 })).headers?.code === 404;
    const reply = await nc.request(`$JS.API.STREAM.MSG.GET.${stream}`, request, { timeout: 5000 });
    return (reply.json() as { error?: { code?: number } }).error?.code === 404;
  };
  /** The stream sequence the view must reach to hold every write acknowledged before the call. */
  const target = coalesced(async () => {
    const held = current!.applied;
    if (await nothingAfter(held)) return held;
    return (await jsm.streams.info(stream)).state.last_seq;
  });

  /** Whether the view holds every write acknowledged before the call; `false` when that cannot be told. */
  const caughtUp = async (): Promise<boolean> => {
    if (stopped || reloading) return false;
    let wanted: number;
    try {
      wanted = await target();
    } catch (err) {
      log.warn({ bucket, err }, "cannot tell whether the view is current; reading from the server");
      return false;
    }
    if (wanted <= current!.applied) return true;
    return new Promise<boolean>((resolve) => {
      const waiter = {
        target: wanted,
        done: (reached: boolean) => {
          clearTimeout(timer);
          waiters.delete(waiter);
          resolve(reached);
        },
      };
      const timer = setTimeout(() => {
        log.warn({ bucket, applied: current!.applied, target: wanted }, "view behind the stream; reading from the server");
        waiter.done(false);
      }, CATCH_UP_MS);
      waiters.add(waiter);
    });
  };

  let loading: Generation | undefined;
  /**
   * Loads the bucket again when the view holds another number of keys than the stream has
   * subjects: messages were removed without a marker (a purge, an age limit), or, on
   * nats-server 2.9.10, a filtered purge moved the watch past messages it had not delivered.
   */
  const resync = async () => {
    if (stopped || reloading) return;
    const { state } = await jsm.streams.info(stream);
    const generation = current!;
    const { applied } = generation;
    // nats-server leaves the count out when it is 0.
    const subjects = state.num_subjects ?? (state.messages === 0 ? 0 : undefined);
    if (subjects === undefined) return;
    // The count speaks of the stream up to its last sequence: compare a view holding exactly
    // that, or, when the last message was removed, holding everything there is.
    const comparable =
      applied === state.last_seq ||
      (applied < state.last_seq && (await nothingAfter(applied)) && current === generation && generation.applied === applied);
    if (!comparable || generation.tree.size === subjects) return;
    log.warn({ bucket, held: generation.tree.size, subjects }, "the view and the stream differ; loading the bucket again");
    reloading = true;
    try {
      loading = await start();
      await loading.loaded;
      if (stopped) return loading.watch.stop();
      current = loading;
      generation.watch.stop();
      for (const waiter of waiters) if (waiter.target <= loading.applied) waiter.done(true);
    } finally {
      loading = undefined;
      reloading = false;
    }
  };
  const timer = setInterval(() => {
    resync().catch((err: unknown) => log.warn({ bucket, err: (err as Error).message }, "cannot compare the view with the stream"));
  }, resyncMs);
  timer.unref();

  /** The records of the tree matching `filter`, in key order, after `after`. */
  function* matching(filter: string, after: string | undefined): Generator<KeyRecord> {
    const { tree } = current!;
    const prefix = literalPrefix(filter);
    if (prefix === undefined) {
      const record = tree.get(filter);
      if (record !== undefined && (after === undefined || record.key > after)) yield record;
      return;
    }
    const begin = prefix === "" ? "" : `${prefix}.`;
    // `<prefix>.>` matches every key under the prefix: no need to match each.
    const everyKey = filter.slice(begin.length) === ">";
    const from = after !== undefined && after > begin ? after : begin;
    for (const [key, record] of tree.entries(from)) {
      if (!key.startsWith(begin)) return;
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
    const sorted = all.length === 1 ? [...found.values()] : [...found.values()].sort(byKey);
    return sorted.length > limit ? sorted.slice(0, limit) : sorted;
  };

  /** A record as read: a delete marker whose value the view did not keep, read from the server. */
  const whole = async (record: KeyRecord): Promise<KeyRecord | null> => (cut.has(record) ? server.last(record.key) : record);

  // One entry object per record, so a key read again unchanged is the same object (callers may
  // keep what they derive from it).
  const entries = new WeakMap<KeyRecord, Entry>();
  const live = (record: KeyRecord): Entry => {
    let entry = entries.get(record);
    if (entry === undefined) {
      const { deleted: _, ...rest } = record;
      entry = rest;
      entries.set(record, entry);
    }
    return entry;
  };

  const local: ReadBucket = Object.freeze({
    bucket,
    async get(key: string) {
      const record = current!.tree.get(checkedKey(bucket, key));
      return record === undefined || record.deleted ? null : live(record);
    },
    async last(key: string) {
      const record = current!.tree.get(checkedKey(bucket, key));
      return record === undefined ? null : whole(record);
    },
    list: async (filters: string | readonly string[], options: ListOptions = {}) => collect(filters, options, false).map(live),
    async records(filters: string | readonly string[], options: ListOptions = {}) {
      const found = collect(filters, options, true);
      if (!found.some((record) => cut.has(record))) return found;
      return (await Promise.all(found.map(whole))).filter((record): record is KeyRecord => record !== null);
    },
  });

  return {
    bucket,
    loaded: first.loaded,
    local,
    sequence: () => current!.applied,
    stop: () => {
      stopped = true;
      clearInterval(timer);
      current!.watch.stop();
      loading?.watch.stop();
    },
    get: async (key) => ((await caughtUp()) ? local : server).get(key),
    last: async (key) => ((await caughtUp()) ? local : server).last(key),
    list: async (filters, options) => ((await caughtUp()) ? local : server).list(filters, options),
    records: async (filters, options) => ((await caughtUp()) ? local : server).records(filters, options),
  };
}
