/**
 * Live views of buckets: {@link openView} keeps a bucket in memory from one watch and answers
 * reads from it once it is proven to hold every write acknowledged before them; otherwise from
 * the server when the bucket has one replica, and not at all (a 503 saying why) when it has more.
 * It wires a generation (generation.ts: the store one watch fills, store.ts), freshness
 * (freshness.ts: whether the store is current, from the requests of probes.ts) and resync
 * (resync.ts: loading the bucket again when it is not).
 */
import { randomUUID } from "node:crypto";
import type { NatsConnection } from "nats";
import type { Logger } from "pino";
import { checkedKey, nanosOfTime, watchWaits } from "../buckets.ts";
import type { Entry, KeyRecord, ListOptions, ReadBucket, ViewBucket } from "../types.ts";
import { ServiceError } from "../errors.ts";
import { beforeDue, catchUp, LATE, READ_DEADLINE_MS, type Freshness, type SameAfter } from "./freshness.ts";
import { coalesced } from "../serial.ts";
import { endMarker, lastSequenceProbe, MARKER_KEY, messageFromProbe, nothingAfterProbe, type MessageFrom } from "./probes.ts";
import { appliedAt, changedAfter, collect, startGeneration, type Generation } from "./generation.ts";
import type { RecordStore } from "./store.ts";
import type { Progress } from "./progress.ts";
import { RESYNC_MS, resyncing } from "./resync.ts";

export { CATCH_UP_MS, READ_DEADLINE_MS, type Freshness } from "./freshness.ts";
export { LEASE_MS, MARKER_KEY, PROBE_TIMEOUT_MS } from "./probes.ts";
export { CHANGES_KEPT, MARKER_VALUE_BYTES } from "./generation.ts";
export { RESYNC_MS } from "./resync.ts";
export { loadProgress, type Progress, type ProgressOptions, type ProgressStream } from "./progress.ts";

/** A live view and how to stop it. */
export interface LiveView extends ViewBucket {
  /** Resolves when the view holds the bucket as it was when the view was opened. */
  readonly loaded: Promise<void>;
  /** The stream sequence of the last record the view applied. */
  readonly sequence: () => number;
  /** Asks the stream's leader whether the view is current now, as a read does (docs/verb.md §4.6); never rejects. */
  check(): Promise<Freshness>;
  /**
   * Why the view cannot be confirmed current now (loading its bucket again, behind its stream,
   * its stream's leader not answering, not checked yet); none when its latest check found it
   * current (docs/verb.md §4.6.2).
   */
  trouble(): string | undefined;
  /**
   * The server's advisories of its stream (docs/operations.md §13.4): `deleted`, said at once and
   * made again as {@link openView}'s `remake` says; `created` (made again, by the set or by hand),
   * loaded again at once, what it held no longer read as fresh.
   */
  advised(what: "created" | "deleted"): void;
  /** Stops the watch and the checks; reads go to the server from then on. */
  stop(): void;
}

const decoder = new TextDecoder();

/** How often a view not read lately checks that it is current, in milliseconds (docs/verb.md §4.6.2). */
export const CHECK_EVERY_MS = 1000;

/**
 * How long a view behind its stream may hold no more before its watch counts as stuck (its
 * consumer on a server cut off, or behind) and the bucket is loaded again, in milliseconds.
 */
export const STUCK_MS = 2000;

/** How many of the leader's messages a view ahead of it compares with its own at most, in one asking ({@link sameAfterOf}). */
export const AHEAD_GETS = 16;

/**
 * Compares the messages stream `KV_<bucket>`'s leader holds after a sequence (`messageFrom`)
 * with those the view's load in hand (`generation()`) applied, key and time (to within a
 * microsecond), up to {@link AHEAD_GETS} of them; a message the view did not apply (removed on its
 * server before its watch came to it, a key written again) is passed over (freshness.ts `SameAfter`).
 */
function sameAfterOf(bucket: string, messageFrom: MessageFrom, generation: () => Generation): SameAfter {
  const prefix = `$KV.${bucket}.`;
  return async (after, upTo, timeoutMs) => {
    let from = after + 1;
    for (let asked = 0; asked < AHEAD_GETS; asked++) {
      const theirs = await messageFrom(from, timeoutMs);
      const load = generation();
      if (theirs === null || theirs.sequence > load.applied) return "none";
      const mine = appliedAt(load, theirs.sequence);
      if (mine !== undefined) {
        // Times read from a subject's digits and from a string land within a microsecond of each other.
        if (theirs.subject !== prefix + mine.key || Math.abs(nanosOfTime(theirs.time) - mine.nanos) >= 1000) return "other";
        if (theirs.sequence >= upTo) return "same";
      }
      from = theirs.sequence + 1;
    }
    return "other";
  };
}

/**
 * Opens a live view of `bucket` (stream `KV_<bucket>`) on `nc`: one long-lived watch of
 * every key (`$KV.<bucket>.>`, last values then updates) kept compactly by key (store.ts), delete
 * markers included (their values only up to {@link MARKER_VALUE_BYTES}). Every read first
 * makes sure the view holds every write acknowledged before it was asked (docs/verb.md §4.6):
 * the stream's last sequence ({@link lastSequenceProbe}: with replicas, from a leader that heard
 * from a quorum of its stream within {@link LEASE_MS}), which the view waits up to
 * {@link CATCH_UP_MS} to reach; short of it, with one replica a direct get of the next message
 * after the view's last tells whether the stream's last messages were removed, with more the
 * view writes a marker and waits as long to receive it ({@link endMarker}).
 * Concurrent reads share these requests. A read that cannot be proven current goes to `server`
 * when the stream has one replica (its one server is current), and is refused with a
 * `ServiceError` 503 saying why when it has more (a follower may lag, a leader cut off from its
 * quorum may not know it). Every read answers or is refused with a 503 saying why within
 * {@link READ_DEADLINE_MS} of its call, and the reads of a snapshot within that of the
 * snapshot's, what they ask the server too (with one replica; the value of a delete marker not
 * kept), however long the server does not answer. A view not read for
 * {@link CHECK_EVERY_MS} checks itself, so {@link LiveView.trouble} says when it cannot be
 * confirmed. A view behind its stream whose held sequence ({@link Generation.held}) moves up
 * no more for {@link STUCK_MS} loads the bucket again (its watch's consumer may be on a server
 * cut off, or behind), the load in hand serving meanwhile. Messages removed without a marker (a stream purge, a bucket's age limit) are noticed
 * within {@link RESYNC_MS}, when the view holds another number of keys than the stream has
 * subjects: it loads the bucket again, reads not answered from memory meanwhile. Keys are in
 * JavaScript string order, as `server` sorts them. `progress` is told of the first load: the
 * stream's subjects at the start of the load (its number of keys, from the same stream info) and
 * the keys the view holds (docs/runtime.md §6.5.1). A bucket whose stream is found missing (deleted
 * behind the set) is said by {@link LiveView.trouble}, its fresh reads refused with a 503 at
 * once, and made again by `remake`, then loaded; one found made again (by hand) is first held
 * against the config by `assert`, and said, not loaded, when it has other settings
 * (docs/operations.md §13.4).
 */
export async function openView(
  nc: NatsConnection,
  bucket: string,
  server: ReadBucket,
  log: Logger,
  {
    resyncMs = RESYNC_MS,
    progress,
    remake,
    assert,
  }: { resyncMs?: number; progress?: Progress; remake?: () => Promise<void>; assert?: () => Promise<void> } = {},
): Promise<LiveView> {
  const jsm = await nc.jetstreamManager();
  const { config: streamConfig, created, state } = await jsm.streams.info(`KV_${bucket}`);
  // A large stream takes the server seconds to make the watch's consumer: waited for longer,
  // on a handle whose JetStream timeout does not cut the wait short.
  const waits = watchWaits(state.messages);
  const watchKv = await nc.jetstream({ timeout: Math.max(...waits) }).views.kv(bucket, { bindOnly: true });
  const nothingAfter = nothingAfterProbe(nc, bucket, streamConfig);
  // With one replica the server's reads are the stream's own: a read the view cannot serve goes there.
  const oneReplica = streamConfig.num_replicas === 1;
  let stopped = false;
  let current: Generation | undefined;
  /** When what the load in hand holds last moved up (`performance.now()`), and to what. */
  let heldSince = performance.now();
  let heldBefore = 0;
  // What freshness compares: the sequence up to which the view holds each key's newest record.
  const held = () => current!.held;
  const fresh = catchUp({
    bucket,
    applied: held,
    probe: coalesced(lastSequenceProbe(nc, bucket, streamConfig.num_replicas, nothingAfter, held)),
    tail: oneReplica ? { nothingAfter } : { mark: coalesced(endMarker(nc, bucket, streamConfig.num_replicas)) },
    sameAfter: sameAfterOf(bucket, messageFromProbe(nc, bucket), () => current!),
    // `resync` is set before any read can ask.
    unavailable: () =>
      stopped
        ? `the view of bucket ${bucket} is stopped`
        : (resync.missing() ?? (resync.reloading() ? `the view of bucket ${bucket} is loading it again` : undefined)),
    wentBack: (why) => resync.now(why, false),
    stuck: (why) => {
      if (performance.now() - heldSince >= STUCK_MS) resync.now(`${why}, and held no more for ${STUCK_MS / 1000} s`, true);
    },
    log,
  });

  const start = () =>
    startGeneration(
      watchKv,
      bucket,
      log,
      {
        applied: (generation, entry) => {
          if (generation !== current) return;
          if (generation.held !== heldBefore) {
            heldBefore = generation.held;
            heldSince = performance.now();
          }
          if (entry.key === MARKER_KEY) fresh.marked(decoder.decode(entry.value), entry.revision);
          fresh.reached(generation.held);
        },
        // A watch that ends by itself (its consumer could not be made again: the stream gone, a
        // server back with an empty store) is replaced by a new load, the server read meanwhile.
        ended: (generation) => {
          if (current !== generation || stopped) return;
          fresh.release(`the watch of bucket ${bucket} ended`);
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
    first.loaded.then(done, () => {});
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
    remake,
    assert,
    adopt: (next, sameStream) => {
      current = next;
      heldBefore = next.held;
      heldSince = performance.now();
      fresh.adopted(next.held, sameStream);
      fresh.reached(next.held);
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

  // A view nobody read lately checks itself, so its trouble is said without a read.
  let checking = false;
  const check = async (): Promise<Freshness> => {
    checking = true;
    try {
      return await fresh.caughtUp();
    } finally {
      checking = false;
    }
  };
  const checks = setInterval(() => {
    const latest = fresh.latest();
    if (stopped || checking || (latest !== undefined && Date.now() - latest.at < CHECK_EVERY_MS)) return;
    void check();
  }, CHECK_EVERY_MS / 4);
  checks.unref();

  /** `read`'s answer, or a `ServiceError` 503 saying `why()` when it has none by `due` (`performance.now()`). */
  const byDue = async <T>(read: Promise<T>, due: number, why: () => string): Promise<T> => {
    const answer = await beforeDue(read, due);
    if (answer === LATE) throw new ServiceError(503, why());
    return answer;
  };
  /**
   * The record of `slot`, made as read: a delete marker whose value the view did not keep, read
   * from the server by `due` (a refusal after).
   */
  const whole = async (generation: Generation, slot: number, due: number): Promise<KeyRecord | null> => {
    if (!generation.store.cut(slot)) return generation.store.record(slot);
    const key = generation.store.keyOf(slot);
    return byDue(
      server.last(key),
      due,
      () =>
        `cannot read the delete marker of key ${key} of bucket ${bucket}: the server gave no answer within the read's ${READ_DEADLINE_MS} ms`,
    );
  };
  const live = (store: RecordStore, slot: number): Entry => {
    const { deleted: _, ...entry } = store.record(slot);
    return entry;
  };

  /**
   * Reads of what the view holds, the same object for every read: what is read from the server
   * (a delete marker's value) by {@link READ_DEADLINE_MS} from each call.
   */
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
      return slot === undefined ? null : whole(generation, slot, performance.now() + READ_DEADLINE_MS);
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
      const by = performance.now() + READ_DEADLINE_MS;
      return (await Promise.all(found.map((slot) => whole(generation, slot, by)))).filter((record): record is KeyRecord => record !== null);
    },
  });
  /**
   * The server's reads by `due`, for a view that could not be proven current (`why`): one that
   * has not answered by then is refused with a 503 naming both.
   */
  const serverReads = (due: number, why: string): ReadBucket => {
    const late = () =>
      `cannot confirm that the view of bucket ${bucket} is current: ${why}; read from the server instead, which gave no answer within the read's ${READ_DEADLINE_MS} ms`;
    return Object.freeze({
      bucket,
      get: (key: string) => byDue(server.get(key), due, late),
      last: (key: string) => byDue(server.last(key), due, late),
      list: (filters: string | readonly string[], options?: ListOptions) => byDue(server.list(filters, options), due, late),
      records: (filters: string | readonly string[], options?: ListOptions) => byDue(server.records(filters, options), due, late),
    });
  };

  // Each load of the bucket has its number: a stamp is this view's, the load's and the last
  // sequence it applied, so no two views (of two servers in one process) give the same.
  const view = randomUUID();
  const loads = new WeakMap<Generation, number>();
  let loadsMade = 0;
  // The last stamp made, given again while nothing was applied since: most reads find none.
  let stamped: { generation: Generation; applied: number; stamp: string } | undefined;
  const stampOf = (generation: Generation) => {
    if (stamped !== undefined && stamped.generation === generation && stamped.applied === generation.applied) return stamped.stamp;
    let n = loads.get(generation);
    if (n === undefined) loads.set(generation, (n = ++loadsMade));
    stamped = { generation, applied: generation.applied, stamp: `${view}.${n}.${generation.applied}` };
    return stamped.stamp;
  };
  let serverSnapshots = 0;
  /** The keys changed since `stamp`, when it names the load in hand (docs/runtime.md §6.12). */
  const changedSince = (stamp: string) => {
    const generation = current!;
    const [id, load, sequence] = stamp.split(".");
    if (id !== view || load !== String(loads.get(generation)) || sequence === undefined) return undefined;
    return changedAfter(generation, Number(sequence));
  };
  const localSnapshot = () => ({ stamp: stampOf(current!), reads: local, changedSince });
  /**
   * The reads of a fresh answer: from memory once the view is proven current (the view's own
   * reads); else, with one replica and time left, from the server, each by
   * {@link READ_DEADLINE_MS} from now; else a `ServiceError` 503 saying why (docs/verb.md §4.6).
   */
  const freshReads = async (): Promise<{ readonly reads: ReadBucket; readonly held: boolean }> => {
    const due = performance.now() + READ_DEADLINE_MS;
    // Nothing to ask the server of a bucket it does not have.
    const missing = resync.missing();
    if (missing !== undefined) throw new ServiceError(503, `cannot confirm that the view of bucket ${bucket} is current: ${missing}`);
    const freshness = await fresh.caughtUp(due);
    if (freshness.current) return { reads: local, held: true };
    if (oneReplica && performance.now() < due) return { reads: serverReads(due, freshness.why), held: false };
    throw new ServiceError(503, `cannot confirm that the view of bucket ${bucket} is current: ${freshness.why}`);
  };
  const trouble = () => {
    const missing = resync.missing();
    if (missing !== undefined) return missing;
    if (resync.reloading()) {
      return `the view of bucket ${bucket} is loading it again; ${oneReplica ? "reads go to the server" : "fresh reads are refused"} meanwhile`;
    }
    const latest = fresh.latest();
    if (latest === undefined) return `the view of bucket ${bucket} has not been confirmed current yet`;
    return latest.freshness.current ? undefined : latest.freshness.why;
  };
  return {
    bucket,
    loaded: first.loaded,
    local,
    snapshot: async () => {
      const { reads, held } = await freshReads();
      return held
        ? { stamp: stampOf(current!), reads, changedSince }
        : { stamp: `${view}.server.${++serverSnapshots}`, reads, changedSince: () => undefined };
    },
    localSnapshot,
    sequence: () => current!.applied,
    confirmedAt: () => fresh.confirmedAt(),
    check,
    trouble,
    advised: (what) => {
      if (stopped) return;
      if (what === "deleted") resync.gone();
      else resync.now("its stream was made again", false);
    },
    stop: () => {
      stopped = true;
      clearInterval(checks);
      resync.stop();
      current!.watch.stop();
    },
    get: async (key) => (await freshReads()).reads.get(key),
    last: async (key) => (await freshReads()).reads.last(key),
    list: async (filters, options) => (await freshReads()).reads.list(filters, options),
    records: async (filters, options) => (await freshReads()).reads.records(filters, options),
  };
}
