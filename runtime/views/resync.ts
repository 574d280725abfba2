/**
 * Resync of a live view: every {@link RESYNC_MS} it compares the number of keys the view holds
 * with the number of subjects of its stream, and when they differ loads the bucket again,
 * switching to the new load once it is complete. Messages removed without a delete marker (a
 * stream purge, a bucket's age limit) are noticed this way; no watch reports them.
 */
import type { JetStreamManager } from "nats";
import type { Logger } from "pino";

/** How often a view checks that it holds as many keys as the stream has subjects, in milliseconds. */
export const RESYNC_MS = 10_000;

/** What a resync uses of one load of the bucket (a generation of the view). */
export interface Load {
  /** The stream sequence of the last record applied. */
  readonly applied: number;
  /** The records held; `size` is the number of keys, delete markers included. */
  readonly tree: { readonly size: number };
  /** Resolves when the load holds the bucket as it was when it started. */
  readonly loaded: Promise<void>;
  readonly watch: { stop(): void };
}

/** A running resync. */
export interface Resync {
  /** Whether a new load is under way: reads should go to the server meanwhile. */
  reloading(): boolean;
  /** Stops the periodic comparison and the watch of a load under way. */
  stop(): void;
}

/**
 * Starts comparing, every `every` ms (an unref'd timer), the load `current()` with stream
 * `KV_<bucket>` (`$JS.API.STREAM.INFO.KV_<bucket>`, and `nothingAfter` when the stream's last
 * message was removed). When they differ, it starts another load with `load()`,
 * waits for it to be loaded, hands it to `adopt` and stops the watch of the previous one. Skips
 * a round while `stopped()` or while a load is under way; a failed round is logged as a warning
 * with `bucket`.
 */
export function resyncing<G extends Load>({
  jsm,
  bucket,
  every,
  log,
  current,
  stopped,
  nothingAfter,
  load,
  adopt,
}: {
  jsm: JetStreamManager;
  bucket: string;
  every: number;
  log: Logger;
  current: () => G;
  stopped: () => boolean;
  nothingAfter: (sequence: number) => Promise<boolean>;
  load: () => Promise<G>;
  adopt: (next: G) => void;
}): Resync {
  const stream = `KV_${bucket}`;
  let reloading = false;
  let loading: G | undefined;
  /**
   * Loads the bucket again when the view holds another number of keys than the stream has
   * subjects: messages were removed without a marker (a purge, an age limit), or, on
   * nats-server 2.9.10, a filtered purge moved the watch past messages it had not delivered.
   */
  const resync = async () => {
    if (stopped() || reloading) return;
    const { state } = await jsm.streams.info(stream);
    const generation = current();
    const { applied } = generation;
    // nats-server leaves the count out when it is 0.
    const subjects = state.num_subjects ?? (state.messages === 0 ? 0 : undefined);
    if (subjects === undefined) return;
    // The count speaks of the stream up to its last sequence: compare a view holding exactly
    // that, or, when the last message was removed, holding everything there is.
    const comparable =
      applied === state.last_seq ||
      (applied < state.last_seq && (await nothingAfter(applied)) && current() === generation && generation.applied === applied);
    if (!comparable || generation.tree.size === subjects) return;
    log.warn({ bucket, held: generation.tree.size, subjects }, "the view and the stream differ; loading the bucket again");
    reloading = true;
    try {
      loading = await load();
      await loading.loaded;
      if (stopped()) return loading.watch.stop();
      adopt(loading);
      generation.watch.stop();
    } finally {
      loading = undefined;
      reloading = false;
    }
  };
  const timer = setInterval(() => {
    resync().catch((err: unknown) => log.warn({ bucket, err: (err as Error).message }, "cannot compare the view with the stream"));
  }, every);
  timer.unref();
  return {
    reloading: () => reloading,
    stop() {
      clearInterval(timer);
      loading?.watch.stop();
    },
  };
}
