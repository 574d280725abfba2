/**
 * Buckets deleted behind the set (`nats kv rm`): each one found gone is said at once (a warning,
 * and why it cannot be read: {@link GoneBucket.missing}) and made again as at the start, those
 * alone, {@link STREAM_REMADE_AFTER_MS} after the last deletion known (docs/operations.md §13.4).
 */
import { setTimeout as sleep } from "node:timers/promises";
import type { Logger } from "pino";
import { reasonOf, STREAM_REMADE_AFTER_MS } from "./jetstream.ts";

/**
 * Asserts the buckets as at the start: `only` those named (bucket names), every one without it,
 * telling `created` of each one it created. Rejects as the assertion does (a bucket that exists
 * with other settings than the config, the server away).
 */
export type AssertBuckets = (only: readonly string[] | undefined, created: (bucket: string) => void) => Promise<unknown>;

/** Makes buckets again: see {@link remaker}. */
export interface Remaker {
  /**
   * Makes `bucket` again {@link STREAM_REMADE_AFTER_MS} after the last bucket was found gone
   * (with the others found gone meanwhile, each asserted on its own: one that exists with other
   * settings holds no other back). Resolves once it was asserted; rejects as {@link AssertBuckets}
   * does; after {@link Remaker.stop}, never settles.
   */
  remake(bucket: string): Promise<void>;
  /** Asserts every bucket again now (the connection came back: the server may have lost them). Rejects as {@link AssertBuckets} does. */
  reassert(): Promise<void>;
  /** Calls `listener` each time buckets were made again, by {@link Remaker.remake} or {@link Remaker.reassert}. */
  onMadeAgain(listener: () => void): void;
  /** Makes nothing more: the set is stopping. */
  stop(): void;
}

/**
 * The remaker of a set's buckets over `assert`, logging each bucket made again at info. nats-server
 * 2.9 removes a deleted stream's folder after it answered the delete: a stream made again at once
 * loses its files, and so the wait (docs/runtime.md §6.3.2).
 */
export function remaker(assert: AssertBuckets, log: Logger): Remaker {
  const madeAgain = new Set<() => void>();
  /** Asserts `only` (every bucket without it); resolves with how many it created. */
  const asserted = async (only?: readonly string[]) => {
    let made = 0;
    await assert(only, (bucket) => {
      log.info({ bucket }, "bucket made again");
      made++;
    });
    return made;
  };
  const told = (made: number) => {
    if (made > 0) for (const listener of madeAgain) listener();
  };
  /** The callers waiting for each bucket to be made again. */
  const waiting = new Map<string, { resolve: () => void; reject: (err: unknown) => void }[]>();
  let lastGoneAt = 0;
  let remaking: Promise<void> | undefined;
  let stopped = false;
  const remakeAll = async () => {
    for (;;) {
      for (
        let wait = lastGoneAt + STREAM_REMADE_AFTER_MS - performance.now();
        wait > 0;
        wait = lastGoneAt + STREAM_REMADE_AFTER_MS - performance.now()
      )
        await sleep(wait, undefined, { ref: false });
      if (stopped || waiting.size === 0) {
        // Cleared here, not later: a remake() from now on starts the loop again.
        remaking = undefined;
        return;
      }
      const batch = [...waiting];
      waiting.clear();
      const made = await Promise.all(
        batch.map(async ([bucket, callers]) => {
          try {
            const n = await asserted([bucket]);
            for (const c of callers) c.resolve();
            return n;
          } catch (err) {
            if (!stopped) for (const c of callers) c.reject(err);
            return 0;
          }
        }),
      );
      told(made.reduce((a, b) => a + b, 0));
    }
  };
  return {
    remake: (bucket) =>
      new Promise<void>((resolve, reject) => {
        if (stopped) return;
        const callers = waiting.get(bucket) ?? [];
        waiting.set(bucket, [...callers, { resolve, reject }]);
        lastGoneAt = performance.now();
        remaking ??= remakeAll();
      }),
    reassert: async () => told(await asserted()),
    onMadeAgain: (listener) => void madeAgain.add(listener),
    stop() {
      stopped = true;
      waiting.clear();
    },
  };
}

/** One bucket found gone, as its view or its one user sees it: see {@link goneBucket}. */
export interface GoneBucket {
  /**
   * The bucket was found gone: said at once (a warning, the first time while it lasts, and
   * {@link GoneBucket.missing}), then made again; calls meanwhile share the one under way.
   * Resolves whether it was made again (never rejects).
   */
  gone(): Promise<boolean>;
  /** Tries again to make it, after it {@link GoneBucket.failed}: as {@link GoneBucket.gone}, what is said kept meanwhile. */
  retry(): Promise<boolean>;
  /** Why the bucket cannot be read now: gone, or gone and not made again (the assertion's words); none otherwise. */
  missing(): string | undefined;
  /** Whether the last making again failed: it is to be tried again. */
  failed(): boolean;
  /** The bucket was found there (its stream info read): no longer missing. */
  found(): void;
  /** The bucket was found made again with other settings than the config (`err`, the assertion's): said as a making again that failed, tried again so. */
  refused(err: unknown): void;
}

/**
 * The being gone of `bucket`, made again by `remake` (none: said, never made), a failure logged
 * saying when it is tried again (`retried`: "at the next round").
 */
export function goneBucket(bucket: string, log: Logger, remake: (() => Promise<void>) | undefined, retried: string): GoneBucket {
  let missing: string | undefined;
  let failed = false;
  let under: Promise<boolean> | undefined;
  const sayGone = () => {
    if (missing === undefined) log.warn({ bucket }, "bucket gone; making it again");
    missing = `bucket ${bucket} does not exist on the server (deleted behind the set): ${remake ? "making it again" : "nothing is read from it"}`;
  };
  const refused = (err: unknown) => {
    const reason = reasonOf(err);
    const said = `bucket ${bucket} was deleted behind the set and cannot be made again: ${reason}`;
    // Said at warn once while the reason stays the same (it is tried again often), at debug after.
    log[said === missing ? "debug" : "warn"]({ bucket, err: reason }, `bucket not made again; trying again ${retried}`);
    missing = said;
    failed = true;
  };
  const once = async () => {
    if (remake === undefined) return false;
    try {
      await remake();
    } catch (err) {
      refused(err);
      return false;
    }
    failed = false;
    missing = undefined;
    return true;
  };
  const run = () => (under ??= once().finally(() => (under = undefined)));
  return {
    gone() {
      sayGone();
      return run();
    },
    retry: () => {
      if (missing === undefined) sayGone();
      return run();
    },
    missing: () => missing,
    failed: () => failed,
    found() {
      missing = undefined;
      failed = false;
    },
    refused,
  };
}
