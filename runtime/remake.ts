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
   * Makes `bucket` again, with every other found gone meanwhile, {@link STREAM_REMADE_AFTER_MS}
   * after the last of them was found gone. Resolves once they were asserted; rejects as
   * {@link AssertBuckets} does.
   */
  remake(bucket: string): Promise<void>;
  /** Asserts every bucket again now (the connection came back: the server may have lost them). Rejects as {@link AssertBuckets} does. */
  reassert(): Promise<void>;
  /** Calls `listener` each time buckets were made again, by {@link Remaker.remake} or {@link Remaker.reassert}. */
  onMadeAgain(listener: () => void): void;
}

/**
 * The remaker of a set's buckets over `assert`, logging each bucket made again at info. nats-server
 * 2.9 removes a deleted stream's folder after it answered the delete: a stream made again at once
 * loses its files, and so the wait (docs/runtime.md §6.3.2).
 */
export function remaker(assert: AssertBuckets, log: Logger): Remaker {
  const madeAgain = new Set<() => void>();
  const assertAgain = async (only?: readonly string[]) => {
    let made = 0;
    await assert(only, (bucket) => {
      log.info({ bucket }, "bucket made again");
      made++;
    });
    if (made > 0) for (const listener of madeAgain) listener();
  };
  const toRemake = new Set<string>();
  let lastGoneAt = 0;
  let remaking: Promise<void> | undefined;
  return {
    remake(bucket) {
      toRemake.add(bucket);
      lastGoneAt = performance.now();
      return (remaking ??= (async () => {
        for (;;) {
          for (let wait = STREAM_REMADE_AFTER_MS; wait > 0; wait = lastGoneAt + STREAM_REMADE_AFTER_MS - performance.now())
            await sleep(wait);
          const buckets = [...toRemake];
          if (buckets.length === 0) return;
          toRemake.clear();
          await assertAgain(buckets);
        }
      })().finally(() => (remaking = undefined)));
    },
    reassert: () => assertAgain(),
    onMadeAgain: (listener) => void madeAgain.add(listener),
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
}

/**
 * The being gone of `bucket`, made again by `remake` (none: said, never made), a failure logged
 * saying when it is tried again (`retried`: "at the next round").
 */
export function goneBucket(bucket: string, log: Logger, remake: (() => Promise<void>) | undefined, retried: string): GoneBucket {
  let missing: string | undefined;
  let failed = false;
  let under: Promise<boolean> | undefined;
  const once = async (found: boolean) => {
    if (found || missing === undefined) {
      if (missing === undefined) log.warn({ bucket }, "bucket gone; making it again");
      missing = `bucket ${bucket} does not exist on the server (deleted behind the set): ${remake ? "making it again" : "nothing is read from it"}`;
    }
    if (remake === undefined) return false;
    try {
      await remake();
    } catch (err) {
      const reason = reasonOf(err);
      const said = `bucket ${bucket} was deleted behind the set and cannot be made again: ${reason}`;
      // Said at warn once while the reason stays the same (it is tried again often), at debug after.
      log[said === missing ? "debug" : "warn"]({ bucket, err: reason }, `bucket not made again; trying again ${retried}`);
      missing = said;
      failed = true;
      return false;
    }
    failed = false;
    missing = undefined;
    return true;
  };
  return {
    gone: () => (under ??= once(true).finally(() => (under = undefined))),
    retry: () => (under ??= once(false).finally(() => (under = undefined))),
    missing: () => missing,
    failed: () => failed,
    found() {
      missing = undefined;
      failed = false;
    },
  };
}
