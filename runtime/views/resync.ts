/**
 * Resync of a live view: every {@link RESYNC_MS} it compares the view with its stream (the
 * stream's creation time and last sequence, the number of keys against the number of subjects),
 * and when they disagree, or when asked (the view's watch ended, the connection came back), loads
 * the bucket again, switching to the new load once it is complete. A stream deleted and made
 * again and messages removed without a delete marker (a purge, an age limit) are noticed this
 * way; no watch reports them. A store come back with less is the freshness probe's to notice
 * (its last sequence below what the view applied, freshness.ts).
 */
import type { JetStreamManager } from "nats";
import type { Logger } from "pino";
import { errCode, STREAM_NOT_FOUND } from "../jetstream.ts";
import { goneBucket } from "../remake.ts";

/** How often a view compares itself with its stream, in milliseconds. */
export const RESYNC_MS = 5_000;

/** What a resync uses of one load of the bucket (a generation of the view). */
export interface Load {
  /** The stream sequence of the last record applied. */
  readonly applied: number;
  /** The records held; `size` is the number of keys, delete markers included. */
  readonly store: { readonly size: number };
  /** Resolves when the load holds the bucket as it was when it started. */
  readonly loaded: Promise<void>;
  readonly watch: { stop(): void };
}

/** A running resync. */
export interface Resync {
  /** Whether the view cannot be trusted until a new load is complete: reads should go to the server meanwhile. */
  reloading(): boolean;
  /**
   * Loads the bucket again now, and again every {@link RESYNC_MS} until a load completes.
   * `trusted`: the load in hand may still serve meanwhile (the connection came back); else
   * reads go to the server until the new load is adopted (the load in hand ended or is wrong).
   */
  now(why: string, trusted: boolean): void;
  /** Why the view cannot load its bucket: the stream does not exist (deleted behind the set); none otherwise. */
  missing(): string | undefined;
  /**
   * The stream was deleted (the server's advisory said so): said by {@link Resync.missing} at once,
   * made again by `remake`, then loaded.
   */
  gone(): void;
  /** Stops the periodic comparison and the watch of a load under way. */
  stop(): void;
}

/**
 * Starts the resync of a view, whose stream was created at `created` (the stream info's): every
 * `every` ms, compares the view with its stream, and loads the bucket again (`load`, then
 * `adopt` once it is complete, saying whether the stream is still the one loaded before, and
 * stopping the load it replaces) when
 * - the stream is not the one the view loaded: created at another time (deleted and made again);
 * - the view holds another number of keys than the stream has subjects: messages were removed
 *   without a marker (a purge, an age limit), or, on nats-server 2.9.10, a filtered purge moved
 *   the watch past messages it had not delivered;
 * - or {@link Resync.now} asked for it.
 * A stream found missing (the bucket deleted behind the set) is said by {@link Resync.missing}
 * and made again by `remake` (the buckets asserted again), then loaded at once.
 * A round that fails (the server away) is logged and tried again at the next.
 */
export function resyncing<G extends Load>({
  jsm,
  bucket,
  every,
  log,
  created,
  current,
  stopped,
  nothingAfter,
  load,
  adopt,
  remake,
  assert,
}: {
  jsm: JetStreamManager;
  bucket: string;
  every: number;
  log: Logger;
  created: string;
  current: () => G;
  stopped: () => boolean;
  nothingAfter: (sequence: number) => Promise<boolean>;
  load: () => Promise<G>;
  /** The view reads from `next` from now; `sameStream`: the stream is the one the load in hand was of. */
  adopt: (next: G, sameStream: boolean) => void;
  /** Makes the bucket again when its stream is found missing; resolves once it exists. None: said, never made. */
  remake?: () => Promise<void>;
  /** Holds the bucket against the config, as at the start: rejects when it has other settings. None: not held. */
  assert?: () => Promise<void>;
}): Resync {
  const stream = `KV_${bucket}`;
  let loadedFrom = created;
  let reloading = false;
  let untrusted = false;
  /** Why a reload was asked for and not done yet. */
  let asked: { why: string; trusted: boolean } | undefined;
  let loading: G | undefined;
  /** The stream found missing: said, and made again by `remake`. */
  const gone = goneBucket(bucket, log, remake, "at the next round");
  /** How many times the stream was found gone: a load begun before that reads a stream no longer there. */
  let goneTimes = 0;
  /** The stream found gone (`retried`: made again with other settings, tried again), made again, then loaded. */
  const remade = async (retried = false) => {
    goneTimes++;
    const again = retried ? gone.retry() : gone.gone();
    // A load under way reads the deleted stream, or waits on the new one for ever: it ends here.
    loading?.watch.stop();
    if (!(await again)) return;
    // The bucket made again is another stream: loaded at once, read from the server meanwhile.
    asked = { why: "the bucket was made again", trusted: false };
    untrusted = true;
    tick();
  };

  const reload = async (why: string, trusted: boolean, streamCreated: string) => {
    log.warn({ bucket, why }, "loading the bucket again");
    // The ask this reload answers. One made while it loads is answered by the next reload when
    // it does not trust the load (the stream went back, the watch ended), by this one otherwise.
    const answered = asked;
    reloading = true;
    untrusted = !trusted;
    const generation = current();
    const goneBefore = goneTimes;
    try {
      const next = await load();
      loading = next;
      // Its consumer may have been made on the stream made again, past where it begins: never loaded.
      if (goneTimes !== goneBefore) next.watch.stop();
      await next.loaded;
      if (stopped()) return next.watch.stop();
      adopt(next, streamCreated === loadedFrom);
      loadedFrom = streamCreated;
      if (asked === answered || asked?.trusted) asked = undefined;
      untrusted = asked !== undefined && !asked.trusted;
      generation.watch.stop();
    } finally {
      loading = undefined;
      reloading = false;
    }
  };

  const round = async () => {
    if (stopped() || reloading) return;
    const info = await jsm.streams.info(stream).catch((err: unknown) => {
      if (errCode(err) === STREAM_NOT_FOUND) return undefined;
      throw err;
    });
    if (info === undefined || gone.failed()) return remade(info !== undefined);
    gone.found();
    const { state, created: streamCreated } = info;
    const generation = current();
    const { applied } = generation;
    if (streamCreated !== loadedFrom) {
      // Made again behind the set (its deletion may have come with no advisory): held against the config first.
      const other = await assert?.().then(
        () => undefined,
        (err: unknown) => err,
      );
      if (other !== undefined) return void gone.refused(other);
    }
    if (asked !== undefined) return reload(asked.why, asked.trusted, streamCreated);
    // A last sequence below what the view applied is not taken from here: a leader cut off from
    // its quorum answers stream infos from a store that is behind. The view's freshness probe,
    // which goes through the quorum, says it (freshness.ts).
    if (streamCreated !== loadedFrom) {
      return reload(`the stream is not the one the view loaded (created ${streamCreated}, the view's ${loadedFrom})`, false, streamCreated);
    }
    // nats-server leaves the count out when it is 0.
    const subjects = state.num_subjects ?? (state.messages === 0 ? 0 : undefined);
    if (subjects === undefined) return;
    // The count speaks of the stream up to its last sequence: compare a view holding exactly
    // that, or, when the last message was removed, holding everything there is.
    const comparable =
      applied === state.last_seq ||
      (applied < state.last_seq && (await nothingAfter(applied)) && current() === generation && generation.applied === applied);
    if (!comparable || generation.store.size === subjects) return;
    return reload(`the view holds ${generation.store.size} keys, the stream ${subjects} subjects`, false, streamCreated);
  };
  // One round at a time; a round asked for while one runs follows it.
  let running: Promise<void> | undefined;
  let again = false;
  const tick = (): void => {
    if (running !== undefined) {
      again = true;
      return;
    }
    running = round()
      .catch((err: unknown) => {
        // A view stopped, or a connection closing, while it asked: nothing to compare any more.
        const code = (err as { code?: string }).code;
        if (stopped() || code === "CONNECTION_DRAINING" || code === "CONNECTION_CLOSED") return;
        log.warn({ bucket, err: (err as Error).message }, "cannot compare the view with the stream");
      })
      .finally(() => {
        running = undefined;
        if (again && !stopped()) {
          again = false;
          tick();
        }
      });
  };
  const timer = setInterval(tick, every);
  timer.unref();
  return {
    reloading: () => untrusted && (reloading || asked !== undefined),
    missing: () => gone.missing(),
    gone: () => void remade(),
    now: (why, trusted) => {
      // An untrusted ask is not softened by a trusted one.
      asked = asked !== undefined && !asked.trusted ? asked : { why, trusted };
      if (!trusted) untrusted = true;
      tick();
    },
    stop() {
      clearInterval(timer);
      loading?.watch.stop();
    },
  };
}
