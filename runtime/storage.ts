/**
 * The set's storage as functions reach it: the buckets asserted ({@link assertBuckets}), a read
 * or write handle of each, a live view of each bucket some function views, and the runtime's
 * records (docs/runtime.md §6.4).
 */
import { randomUUID } from "node:crypto";
import type { JetStreamManager, NatsConnection } from "nats";
import type { Logger } from "pino";
import { assertBuckets, CLAIMS, RECORDS } from "./assert.ts";
import { advisorySubject, streamGone } from "./jetstream.ts";
import { nanosOfTime, readBucket, writeBucket } from "./buckets.ts";
import { claimsBucket, recordsBucket, type Config } from "./config.ts";
import { recorder, type Recorder } from "./records.ts";
import { goneBucket, remaker } from "./remake.ts";
import type { ClockSample } from "./server-clock.ts";
import type { ReadBucket, ViewBucket, WriteBucket } from "./types.ts";
import { loadProgress, openView, type LiveView, type ProgressOptions } from "./views/index.ts";

/** The opened buckets of the config, as the functions reach them. */
export interface Storage {
  /** A read handle of the config's bucket `name`. */
  read(name: string): ReadBucket;
  /** A write handle of the config's bucket `name`. */
  write(name: string): WriteBucket;
  /** The live view of `name`; without one (opened for one function), a handle reading the server both ways. */
  view(name: string): ViewBucket;
  /** The runtime's records (`<seat>_runtime`) and claims (`<seat>_claims`). */
  readonly records: Recorder;
  /**
   * Asserts the buckets again (after the connection came back: the server may have come back with
   * an empty store); creates what is missing, empties nothing. Throws as {@link assertBuckets}.
   */
  reassert(): Promise<void>;
  /** A write of the runtime's key `clock` and the server's time of it (docs/runtime.md §6.15). */
  clockSample(): Promise<ClockSample>;
  /** Why reads cannot be served from memory now: views that cannot be confirmed current, and why (docs/verb.md §4.6.2). */
  notReady(): string[];
  /** Calls `listener` each time buckets were made again (found deleted behind the set, or lost by the server). */
  onMadeAgain(listener: () => void): void;
  /** The set is stopping: buckets found gone are no longer made again; reads go on. */
  stopping(): void;
  /** Stops the live views, and making buckets again. */
  close(): void;
}

/** The key of the runtime's bucket written to read the server's time (docs/runtime.md §6.15). */
export const CLOCK_KEY = "clock";

/** A bucket read from the server both ways, where no live view is kept: each snapshot is a new one. */
function serverView(server: ReadBucket): ViewBucket {
  let made = 0;
  const view = randomUUID();
  const snapshot = () => ({ stamp: `${view}.server.${++made}`, reads: server, changedSince: () => undefined });
  return { ...server, local: server, confirmedAt: () => new Date(), snapshot: async () => snapshot(), localSnapshot: snapshot };
}

/**
 * Asserts the buckets ({@link assertBuckets}) and opens a live view ({@link openView}) of each
 * of `viewed` (config names) and of the runtime's records (`<seat>_runtime`), all at once,
 * waiting until each has loaded its bucket and checked once whether it is current (a check that
 * fails leaves it not ready, see {@link Storage.notReady}); a load longer than a second says its progress
 * (`progress`, see {@link loadProgress}; docs/runtime.md §6.5.1). `refusers` are the functions
 * whose refused events the records read (see {@link recorder}). Throws, having stopped the views
 * it opened, when a bucket or a view cannot be opened.
 */
export async function openStorage(
  nc: NatsConnection,
  config: Config,
  log: Logger,
  viewed: readonly string[],
  refusers?: readonly string[],
  progressOptions?: ProgressOptions,
): Promise<Storage> {
  const kvs = await assertBuckets(nc, config, log);
  const js = nc.jetstream();
  const read = (name: string) => readBucket(kvs.get(name)!, config.buckets[name]!.bucket, nc);
  const views = new Map<string, LiveView>();
  let jsm: JetStreamManager | undefined;
  // The runtime's records as the functions read them (`ctx.runtime`): from a live view, one
  // freshness check for all of them rather than a get each; its own writes read the server.
  const recordsRead = readBucket(kvs.get(RECORDS)!, recordsBucket(config.seat), nc);
  let recordsView: LiveView | undefined;
  const progress = loadProgress(log, progressOptions);
  // Buckets deleted behind the set (`nats kv rm`), found by their views, by the server's
  // advisories, or (the claims bucket, which no view reads) by a claim no stream answers, are made
  // again as at the start (docs/operations.md §13.4).
  const remakes = remaker((only, created) => assertBuckets(nc, config, log, { only, created }), log);
  // What a view does with its bucket found gone (made again), or found made again behind the set
  // (held against the config, as at the start).
  const keptBy = (bucket: string) => ({
    progress,
    remake: () => remakes.remake(bucket),
    assert: async () => void (await assertBuckets(nc, config, log, { only: [bucket] })),
  });
  const claimsName = claimsBucket(config.seat);
  // Not ready while the claims bucket is missing: no scheduled run can be claimed.
  const claimsGone = goneBucket(claimsName, log, () => remakes.remake(claimsName), "at the next claim");
  const claimsWrites = writeBucket(kvs.get(CLAIMS)!, js, claimsName);
  const claims: WriteBucket = {
    ...claimsWrites,
    create: (key, value) => {
      if (claimsGone.failed()) void claimsGone.retry();
      return claimsWrites.create(key, value).catch(async (err: unknown) => {
        if (await streamGone((jsm ??= await nc.jetstreamManager({ checkAPI: false })), `KV_${claimsName}`)) void claimsGone.gone();
        throw err;
      });
    },
  };
  try {
    await Promise.all([
      ...[...new Set(viewed)].map(async (name) => {
        const bucket = config.buckets[name]!.bucket;
        const view = await openView(nc, bucket, read(name), log, keptBy(bucket));
        views.set(name, view);
        await view.loaded;
        await view.check();
      }),
      (async () => {
        recordsView = await openView(nc, recordsBucket(config.seat), recordsRead, log, keptBy(recordsBucket(config.seat)));
        await recordsView.loaded;
        await recordsView.check();
      })(),
    ]);
  } catch (err) {
    remakes.stop();
    for (const view of views.values()) view.stop();
    recordsView?.stop();
    throw err;
  } finally {
    progress.stop();
  }
  // The server says at once when a bucket's stream is deleted or made (docs/operations.md §13.4).
  const advised = new Map<string, (what: "created" | "deleted") => void>([
    ...[...views].map(([name, view]) => [config.buckets[name]!.bucket, view.advised] as const),
    [recordsBucket(config.seat), recordsView!.advised],
    // The claims bucket made by hand after it could not be made again: asserted again.
    [
      claimsName,
      (what: "created" | "deleted") => void (what === "deleted" ? claimsGone.gone() : claimsGone.failed() && claimsGone.retry()),
    ],
  ]);
  const advisories = [...advised].flatMap(([bucket, to]) =>
    (["created", "deleted"] as const).map((what) =>
      nc.subscribe(advisorySubject(what, bucket), { callback: (err) => void (err === null && to(what)) }),
    ),
  );
  return {
    read,
    write: (name) => writeBucket(kvs.get(name)!, js, config.buckets[name]!.bucket, nc),
    view: (name) => views.get(name) ?? serverView(read(name)),
    records: recorder(writeBucket(kvs.get(RECORDS)!, js, recordsBucket(config.seat)), claims, refusers, recordsView!),
    reassert: remakes.reassert,
    onMadeAgain: remakes.onMadeAgain,
    stopping: remakes.stop,
    async clockSample() {
      const sentAt = Date.now();
      const seq = await kvs.get(RECORDS)!.put(CLOCK_KEY, "");
      const ackedAt = Date.now();
      // The stream leader's stored time, by sequence (a direct get may be answered by a replica behind).
      const stored = await (jsm ??= await nc.jetstreamManager({ checkAPI: false })).streams.getMessage(`KV_${recordsBucket(config.seat)}`, {
        seq,
      });
      return { sentAt, ackedAt, storedAt: nanosOfTime(stored.timestamp) / 1e6 };
    },
    notReady: () => [...views.values(), recordsView!].flatMap((view) => view.trouble() ?? []).concat(claimsGone.missing() ?? []),
    close: () => {
      remakes.stop();
      for (const sub of advisories) sub.unsubscribe();
      for (const view of views.values()) view.stop();
      recordsView!.stop();
    },
  };
}
