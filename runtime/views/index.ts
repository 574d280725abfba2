/**
 * Live views of buckets: {@link openView} keeps a bucket in memory from one watch and answers
 * reads from it once it holds every write acknowledged before them, from the server otherwise.
 * It wires a generation (generation.ts: the store one watch fills, store.ts), freshness
 * (freshness.ts: whether the store is current) and resync (resync.ts: loading the bucket again when it is not).
 */
import { randomUUID } from "node:crypto";
import type { NatsConnection } from "nats";
import type { Logger } from "pino";
import { checkedKey, watchWaits } from "../buckets.ts";
import type { Entry, KeyRecord, ListOptions, ReadBucket, ViewBucket } from "../types.ts";
import { catchUp, nothingAfterProbe, targetSequence } from "./freshness.ts";
import { changedAfter, collect, startGeneration, type Generation } from "./generation.ts";
import type { RecordStore } from "./store.ts";
import type { Progress } from "./progress.ts";
import { RESYNC_MS, resyncing } from "./resync.ts";

export { CATCH_UP_MS } from "./freshness.ts";
export { CHANGES_KEPT, MARKER_VALUE_BYTES } from "./generation.ts";
export { RESYNC_MS } from "./resync.ts";
export { loadProgress, type Progress, type ProgressOptions, type ProgressStream } from "./progress.ts";

/** A live view and how to stop it. */
export interface LiveView extends ViewBucket {
  /** Resolves when the view holds the bucket as it was when the view was opened. */
  readonly loaded: Promise<void>;
  /** The stream sequence of the last record the view applied. */
  readonly sequence: () => number;
  /** Why the view cannot serve from memory now (it is loading its bucket again); none when it can. */
  trouble(): string | undefined;
  /** Stops the watch; reads go to the server from then on. */
  stop(): void;
}

/**
 * Opens a live view of `bucket` (stream `KV_<bucket>`) on `nc`: one long-lived watch of
 * every key (`$KV.<bucket>.>`, last values then updates) kept compactly by key (store.ts), delete
 * markers included (their values only up to {@link MARKER_VALUE_BYTES}). Every read first
 * makes sure the view holds every write acknowledged before it was asked (docs/verb.md §4), as
 * `server`'s reads do: a direct get (`$JS.API.DIRECT.GET.KV_<bucket>`) of the first message
 * after the last one the view applied finds none (`$JS.API.STREAM.MSG.GET.KV_<bucket>`, its
 * leader's answer, when the stream does not allow direct gets or has replicas), or else the view waits for the stream's last
 * sequence (`$JS.API.STREAM.INFO.KV_<bucket>`). Concurrent reads share these requests. Reads that would wait longer than
 * {@link CATCH_UP_MS}, or that cannot tell, go to `server`. Messages removed without a marker
 * (a stream purge, a bucket's age limit) are noticed within {@link RESYNC_MS}, when the view
 * holds another number of keys than the stream has subjects: it loads the bucket again,
 * reading from `server` meanwhile. Keys are in JavaScript string order, as `server` sorts them.
 * `progress` is told of the first load: the stream's subjects at the start of the load (its
 * number of keys, from the same stream info) and the keys the view holds (docs/runtime.md §6.5.1).
 */
export async function openView(
  nc: NatsConnection,
  bucket: string,
  server: ReadBucket,
  log: Logger,
  { resyncMs = RESYNC_MS, progress }: { resyncMs?: number; progress?: Progress } = {},
): Promise<LiveView> {
  const jsm = await nc.jetstreamManager();
  const { config: streamConfig, created, state } = await jsm.streams.info(`KV_${bucket}`);
  // A large stream takes the server seconds to make the watch's consumer: waited for longer,
  // on a handle whose JetStream timeout does not cut the wait short.
  const waits = watchWaits(state.messages);
  const watchKv = await nc.jetstream({ timeout: Math.max(...waits) }).views.kv(bucket, { bindOnly: true });
  const nothingAfter = nothingAfterProbe(nc, bucket, streamConfig);
  let stopped = false;
  let current: Generation | undefined;
  const applied = () => current!.applied;
  const fresh = catchUp({
    bucket,
    applied,
    target: targetSequence(jsm, bucket, applied, nothingAfter),
    // `resync` is set before any read can ask.
    unavailable: () => stopped || resync.reloading(),
    log,
  });

  const start = () =>
    startGeneration(
      watchKv,
      bucket,
      log,
      {
        applied: (generation) => {
          if (generation === current) fresh.reached(generation.applied);
        },
        // A watch that ends by itself (its consumer could not be made again: the stream gone, a
        // server back with an empty store) is replaced by a new load, the server read meanwhile.
        ended: (generation) => {
          if (current !== generation || stopped) return;
          fresh.release();
          resync.now("the view's watch ended", false);
        },
      },
      waits,
    );
  current = await start();
  const first = current;
  if (progress !== undefined) {
    // nats-server leaves the count of subjects out when it is 0.
    const done = progress.track({
      bucket,
      of: state.num_subjects ?? (state.messages === 0 ? 0 : state.messages),
      loaded: () => first.store.size,
    });
    void first.loaded.then(done);
  }

  const resync = resyncing({
    jsm,
    bucket,
    every: resyncMs,
    log,
    created,
    current: () => current!,
    stopped: () => stopped,
    nothingAfter,
    load: start,
    adopt: (next) => {
      current = next;
      fresh.reached(next.applied);
    },
  });

  // When the connection comes back, the watch's consumer may be on a server that is gone: a new
  // load makes it again at once, the load in hand serving meanwhile.
  void (async () => {
    for await (const status of nc.status()) {
      if (stopped) return;
      if (status.type === "reconnect") resync.now("the connection came back", true);
    }
  })().catch(() => {});

  /** The record of `slot`, made as read: a delete marker whose value the view did not keep, read from the server. */
  const whole = async (generation: Generation, slot: number): Promise<KeyRecord | null> =>
    generation.store.cut(slot) ? server.last(generation.store.keyOf(slot)) : generation.store.record(slot);
  const live = (store: RecordStore, slot: number): Entry => {
    const { deleted: _, ...entry } = store.record(slot);
    return entry;
  };

  const local: ReadBucket = Object.freeze({
    bucket,
    async get(key: string) {
      const { store } = current!;
      const slot = store.slotOf(checkedKey(bucket, key));
      return slot === undefined || store.deleted(slot) ? null : live(store, slot);
    },
    async last(key: string) {
      const generation = current!;
      const slot = generation.store.slotOf(checkedKey(bucket, key));
      return slot === undefined ? null : whole(generation, slot);
    },
    list: async (filters: string | readonly string[], options: ListOptions = {}) => {
      const { store } = current!;
      return collect(store, bucket, filters, options, false).map((slot) => live(store, slot));
    },
    async records(filters: string | readonly string[], options: ListOptions = {}) {
      const generation = current!;
      const { store } = generation;
      const found = collect(store, bucket, filters, options, true);
      if (!found.some((slot) => store.cut(slot))) return found.map((slot) => store.record(slot));
      return (await Promise.all(found.map((slot) => whole(generation, slot)))).filter((record): record is KeyRecord => record !== null);
    },
  });

  // Each load of the bucket has its number: a stamp is this view's, the load's and the last
  // sequence it applied, so no two views (of two servers in one process) give the same.
  const view = randomUUID();
  const loads = new WeakMap<Generation, number>();
  let loadsMade = 0;
  const stampOf = (generation: Generation) => {
    let n = loads.get(generation);
    if (n === undefined) loads.set(generation, (n = ++loadsMade));
    return `${view}.${n}.${generation.applied}`;
  };
  let serverReads = 0;
  /** The keys changed since `stamp`, when it names the load in hand (docs/runtime.md §6.12). */
  const changedSince = (stamp: string) => {
    const generation = current!;
    const [id, load, sequence] = stamp.split(".");
    if (id !== view || load !== String(loads.get(generation)) || sequence === undefined) return undefined;
    return changedAfter(generation, Number(sequence));
  };
  const localSnapshot = () => ({ stamp: stampOf(current!), reads: local, changedSince });
  return {
    bucket,
    loaded: first.loaded,
    local,
    snapshot: async () =>
      (await fresh.caughtUp())
        ? localSnapshot()
        : { stamp: `${view}.server.${++serverReads}`, reads: server, changedSince: () => undefined },
    localSnapshot,
    sequence: () => current!.applied,
    confirmedAt: () => fresh.confirmedAt(),
    trouble: () => (resync.reloading() ? `the view of bucket ${bucket} is loading it again; reads go to the server meanwhile` : undefined),
    stop: () => {
      stopped = true;
      resync.stop();
      current!.watch.stop();
    },
    get: async (key) => ((await fresh.caughtUp()) ? local : server).get(key),
    last: async (key) => ((await fresh.caughtUp()) ? local : server).last(key),
    list: async (filters, options) => ((await fresh.caughtUp()) ? local : server).list(filters, options),
    records: async (filters, options) => ((await fresh.caughtUp()) ? local : server).records(filters, options),
  };
}
