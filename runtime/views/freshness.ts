/**
 * Freshness of a live view: whether it holds every write acknowledged before a read
 * (docs/verb.md §4.6). It asks the stream's leader for the stream's last sequence (with replicas,
 * only from a leader that heard from a quorum of its stream lately) and waits up to
 * {@link CATCH_UP_MS} for the view to reach it, all of it within a read's {@link READ_DEADLINE_MS}.
 * Concurrent reads share these requests. It knows sequences only, nothing of the view's store.
 */
import { setTimeout as sleep } from "node:timers/promises";
import type { Logger } from "pino";
import { PROBE_TIMEOUT_MS, type LastSequence, type NothingAfter, type Probe } from "./probes.ts";

/**
 * How long a read waits for the view to reach the stream's last sequence before it gives up on
 * the view, in milliseconds. Only a stream whose last message was removed by hand (a stream
 * purge, an age limit) or a watch that stopped delivering keeps a view from reaching it.
 */
export const CATCH_UP_MS = 500;

/**
 * How long a view that holds more than its stream's leader said it stored waits for the leader to
 * hold what the view holds before it calls the stream gone back, in milliseconds, asking every
 * {@link AHEAD_STEP_MS}: nats-server stores a committed message on the leader in a goroutine of
 * its own, and a follower, where the view's watch may read, may store it first (docs/verb.md §4.6).
 */
export const AHEAD_MS = 250;

/** How often a view ahead of its stream's leader asks again within {@link AHEAD_MS}, in milliseconds. */
export const AHEAD_STEP_MS = 25;

/**
 * How long a read of a view may take in all, from its call until it answers or is refused, in
 * milliseconds (docs/verb.md §4.6, "The deadline"): the probe's {@link PROBE_TIMEOUT_MS} and the
 * catch-up's {@link CATCH_UP_MS}, what a check takes at most while the server answers (a view
 * ahead of its leader asks it for up to {@link AHEAD_MS} more, within the same deadline). A read
 * whose check is still out then (the server hung, a probe it joined stuck) is not current, saying
 * why; with one replica a read from the server is given up then too. `GET /readyz` says the
 * same within a second (docs/verb.md §4.6.2).
 */
export const READ_DEADLINE_MS = PROBE_TIMEOUT_MS + CATCH_UP_MS;

/** What {@link beforeDue} gives when the deadline came first. */
export const LATE: unique symbol = Symbol("late");

/**
 * `promise`'s value, or {@link LATE} once `performance.now()` reaches `due`; `promise` as it is
 * without `due`. Rejects as `promise` does, when it does before `due`. What is given up goes on
 * (a request in flight, a probe others share); its outcome is dropped.
 */
export function beforeDue<T>(promise: Promise<T>, due: number | undefined): Promise<T | typeof LATE> {
  if (due === undefined) return promise;
  return new Promise((resolve, reject) => {
    const timer = setTimeout(resolve, Math.max(0, due - performance.now()), LATE);
    promise.then(
      (value) => {
        clearTimeout(timer);
        resolve(value);
      },
      (err: unknown) => {
        clearTimeout(timer);
        reject(err);
      },
    );
  });
}

/** Whether a view holds every write acknowledged before it was asked, and when not, why. */
export type Freshness =
  | { readonly current: true }
  | {
      readonly current: false;
      /** A sentence for a person: what could not be confirmed, and why. */
      readonly why: string;
    };

/** Waiting for a view to catch up with its stream. */
export interface CatchUp {
  /**
   * Whether the view holds every write acknowledged before the call, and why not when it does
   * not or cannot be told: `unavailable()` says so, the probe failed, the stream went back, or
   * the view did not reach the probe's sequence within {@link CATCH_UP_MS} while the stream
   * holds more after what it applied. A view holding more than the leader said it stored is gone
   * back only when the leader holds another message than the view there, or does not come to hold
   * what the view holds within {@link AHEAD_MS} (`sameAfter`). With `due` (a `performance.now()` time: a
   * read's, see {@link READ_DEADLINE_MS}) it answers by then at the latest: a probe still out is not current,
   * `the server did not answer within <READ_DEADLINE_MS> ms`, and a view still short of the
   * stream's last sequence is behind. Never rejects.
   */
  caughtUp(due?: number): Promise<Freshness>;
  /**
   * When the view was last proven to hold every write acknowledged before: the time the probe
   * that proved it was sent; `null` before any, or when the load in hand no longer holds
   * what was proven (see {@link CatchUp.adopted}).
   */
  confirmedAt(): Date | null;
  /** The latest finished check: its answer and when it finished (ms since the epoch); none before the first. */
  latest(): { readonly freshness: Freshness; readonly at: number } | undefined;
  /** The view now holds every record up to stream sequence `sequence`: the reads waiting for no more go on. */
  reached(sequence: number): void;
  /** The view received a freshness marker (its value) at stream sequence `sequence`. */
  marked(marker: string, sequence: number): void;
  /** Every waiting read gives up: not current, for `why`. */
  release(why: string): void;
  /**
   * The view now reads from another load: what was proven holds of it only when it is the same
   * stream (`sameStream`) and has applied at least the sequence that was proven.
   */
  adopted(applied: number, sameStream: boolean): void;
}

/**
 * What a view short of the stream's last sequence does next: with one replica, ask its one
 * server whether anything follows what it applied (`nothingAfter`); with more, write an
 * marker (probes.ts `endMarker`) and wait to receive it (`mark`).
 */
export type Tail = { readonly nothingAfter: NothingAfter } | { readonly mark: () => Promise<string> };

/**
 * Whether the messages the stream's leader holds after sequence `after` are those the view
 * applied (their subject and time): `same` once the view applied one at or after `upTo`, every one
 * the view applied before it being the same; `none` while the leader holds none that far yet, or
 * one the view has not applied yet; `other` when one differs. Each request is given `timeoutMs`;
 * rejects when the leader does not answer.
 */
export type SameAfter = (after: number, upTo: number, timeoutMs: number) => Promise<"same" | "none" | "other">;

/**
 * Catching up with the stream: {@link CatchUp.caughtUp} asks `probe` (a coalesced
 * `lastSequenceProbe` of probes.ts) and, when the view has not applied that far (`applied()`), waits
 * for {@link CatchUp.reached}; still short after {@link CATCH_UP_MS}, does what `tail` says.
 * `wentBack` is told when the stream's last sequence is below what the view had applied (made
 * anew, a store come back with less) and the leader holds other messages than the view there, or
 * does not come to hold what the view holds within {@link AHEAD_MS} (`sameAfter`); `stuck` when
 * the view is behind. Failures and timeouts are logged as warnings with `bucket`.
 */
export function catchUp({
  bucket,
  applied,
  probe,
  tail,
  sameAfter,
  unavailable,
  wentBack,
  stuck,
  log,
}: {
  bucket: string;
  applied: () => number;
  probe: Probe;
  tail: Tail;
  sameAfter: SameAfter;
  /** Why the view cannot be read now, or none. */
  unavailable: () => string | undefined;
  wentBack: (why: string) => void;
  stuck: (why: string) => void;
  log: Logger;
}): CatchUp {
  /** Reads waiting for the view to reach `target`: told `true`, or why they give up (a timeout: `false`). */
  const waiters = new Set<{ target: number; done: (reached: true | false | string) => void }>();
  /** Reads waiting for a marker: told the sequence the view received it at, or why they give up. */
  const markerWaiters = new Map<string, Set<(at: number | false | string) => void>>();
  /** The markers the view received lately, with their sequences: one may come before its acknowledgement. */
  const received = new Map<string, number>();
  /** What was last proven: the sequence the view held, and when the probe proving it was sent. */
  let proven: { sequence: number; at: number } | undefined;
  let latest: { freshness: Freshness; at: number } | undefined;
  const settle = (freshness: Freshness) => {
    latest = { freshness, at: Date.now() };
    return freshness;
  };
  /** Said at warn once while it lasts (every read of a view that cannot be confirmed meets it), at debug after. */
  let warned: string | undefined;
  const warn = (fields: Record<string, unknown>, msg: string) => {
    const said = `${msg} ${String(fields.err ?? "")}`;
    log[said === warned ? "debug" : "warn"]({ bucket, ...fields }, msg);
    warned = said;
  };
  const confirm = (found: LastSequence, how: string): Freshness => {
    if (log.isLevelEnabled("debug"))
      log.debug({ bucket, sequence: found.sequence, held: applied(), askedAt: found.askedAt, how }, "view current");
    if (warned !== undefined) log.info({ bucket }, "view current again");
    warned = undefined;
    if (proven === undefined || found.askedAt >= proven.at) proven = { sequence: found.sequence, at: found.askedAt };
    return settle({ current: true });
  };
  const behind = (found: LastSequence, also = ""): Freshness => {
    const why = `the view of bucket ${bucket} is behind its stream: it applied sequence ${applied()}, the stream's leader has ${found.sequence}${also}`;
    warn({ held: applied(), target: found.sequence }, "view behind the stream");
    stuck(why);
    return settle({ current: false, why });
  };
  /** {@link CATCH_UP_MS}, or what is left until `due` when less. */
  const waitMs = (due: number | undefined) =>
    due === undefined ? CATCH_UP_MS : Math.max(0, Math.min(CATCH_UP_MS, due - performance.now()));
  /** Waits up to {@link CATCH_UP_MS} for the view to reach `target`, and not past `due`. */
  const reaching = (target: number, due: number | undefined) =>
    new Promise<true | false | string>((resolve) => {
      const waiter = {
        target,
        done: (reached: true | false | string) => {
          clearTimeout(timer);
          waiters.delete(waiter);
          resolve(reached);
        },
      };
      const timer = setTimeout(() => waiter.done(false), waitMs(due));
      waiters.add(waiter);
    });
  const receiving = (marker: string, due: number | undefined) =>
    new Promise<number | false | string>((resolve) => {
      const waiting = markerWaiters.get(marker) ?? new Set();
      markerWaiters.set(marker, waiting);
      const done = (at: number | false | string) => {
        clearTimeout(timer);
        waiting.delete(done);
        if (waiting.size === 0) markerWaiters.delete(marker);
        resolve(at);
      };
      const timer = setTimeout(() => done(false), waitMs(due));
      waiting.add(done);
    });
  /** What `behind` adds when a read's deadline ended the wait. */
  const ranOut = `, and it did not catch up within ${READ_DEADLINE_MS} ms`;
  /** Current after all when the view reached `found` meanwhile (its watch lagged); behind otherwise, saying `also`. */
  const reachedLateOr = (found: LastSequence, also: string): Freshness =>
    found.sequence <= applied() ? confirm(found, "reached late") : behind(found, also);
  /** A view short of `found`: its stream's last messages may have been removed, or its watch lags. */
  const short = async (found: LastSequence, due: number | undefined): Promise<Freshness> => {
    if (due !== undefined && performance.now() >= due) return reachedLateOr(found, ranOut);
    if ("nothingAfter" in tail) {
      const held = applied();
      const removed = await beforeDue(tail.nothingAfter(held), due).catch((err: Error) => {
        warn({ err: err.message }, "cannot tell whether the view is current");
        return false;
      });
      if (removed === true) return confirm({ ...found, sequence: held }, "nothing after");
      return reachedLateOr(found, removed === LATE ? ranOut : "");
    }
    let marker: string | typeof LATE;
    try {
      marker = await beforeDue(tail.mark(), due);
    } catch (err) {
      return reachedLateOr(found, ` (its marker was not written: ${(err as Error).message})`);
    }
    if (marker === LATE) return reachedLateOr(found, ranOut);
    const at = received.get(marker) ?? (await receiving(marker, due));
    // Received, and held: every message before it delivered in turn, or none pending after it.
    if (typeof at === "number" && (at <= applied() || (await reaching(at, due)) === true)) {
      return confirm({ ...found, sequence: Math.max(at, found.sequence) }, `marker at ${at}`);
    }
    if (typeof at === "string") return settle({ current: false, why: at });
    return reachedLateOr(found, due !== undefined && performance.now() >= due ? ranOut : ", and its marker did not come");
  };
  /** The probe's answer by `due`, or why there is none (settled). */
  const ask = async (due: number | undefined): Promise<LastSequence | Freshness> => {
    try {
      const answered = await beforeDue(probe(), due);
      if (answered !== LATE) return answered;
      warn({ err: `no answer within ${READ_DEADLINE_MS} ms` }, "cannot tell whether the view is current");
      return settle({ current: false, why: `the server did not answer within ${READ_DEADLINE_MS} ms` });
    } catch (err) {
      const { code, message } = err as { code?: string; message: string };
      const why =
        code === "TIMEOUT"
          ? `the leader of stream KV_${bucket} did not answer within ${PROBE_TIMEOUT_MS / 1000} s`
          : code === "503"
            ? `no server answers for stream KV_${bucket}`
            : message;
      warn({ err: message }, "cannot tell whether the view is current");
      return settle({ current: false, why });
    }
  };
  /** The checks of a view ahead of its leader under way, by what the leader said and what the view held: reads share them. */
  const aheadChecks = new Map<string, Promise<boolean | string>>();
  /**
   * Whether the leader comes to hold, within {@link AHEAD_MS}, what the view held after `after`
   * up to `upTo` (a follower stored it first): `true`; `false` when it holds another message, or
   * not that far in time; why, when it could not be asked. Never rejects.
   */
  const leaderHolds = (after: number, upTo: number): Promise<boolean | string> => {
    const key = `${after}:${upTo}`;
    let check = aheadChecks.get(key);
    if (check === undefined) {
      check = holding(after, upTo).finally(() => aheadChecks.delete(key));
      aheadChecks.set(key, check);
    }
    return check;
  };
  const holding = async (after: number, upTo: number): Promise<boolean | string> => {
    const end = performance.now() + AHEAD_MS;
    for (;;) {
      let held: Awaited<ReturnType<SameAfter>>;
      try {
        held = await sameAfter(after, upTo, PROBE_TIMEOUT_MS);
      } catch (err) {
        return `the leader of stream KV_${bucket} could not be asked what it holds after sequence ${after}: ${(err as Error).message}`;
      }
      if (held !== "none") return held === "same";
      const left = end - performance.now();
      if (left <= 0) return false;
      await sleep(Math.min(AHEAD_STEP_MS, left));
    }
  };
  return {
    confirmedAt: () => (proven === undefined ? null : new Date(proven.at)),
    latest: () => latest,
    async caughtUp(due) {
      const away = unavailable();
      if (away !== undefined) return settle({ current: false, why: away });
      let found = await ask(due);
      if ("current" in found) return found;
      if (found.heldAtAsk > found.sequence) {
        const first = found;
        const holds = await beforeDue(leaderHolds(first.sequence, first.heldAtAsk), due);
        if (holds === LATE) {
          const why = `the view of bucket ${bucket} holds more than its stream's leader said it stored, and the leader did not come to hold it within ${READ_DEADLINE_MS} ms`;
          return settle({ current: false, why });
        }
        if (typeof holds === "string") {
          warn({ err: holds }, "cannot tell whether the view is current");
          return settle({ current: false, why: holds });
        }
        if (holds) {
          log.debug(
            { bucket, held: first.heldAtAsk, sequence: first.sequence },
            "the view held messages its stream's leader had not stored yet",
          );
          found = await ask(due);
          if ("current" in found) return found;
        }
        if (found.sequence < first.heldAtAsk) {
          const why = `stream KV_${bucket} went back: its last sequence is ${found.sequence}, the view had applied ${first.heldAtAsk}`;
          wentBack(why);
          return settle({ current: false, why });
        }
      }
      if (found.sequence <= applied()) return confirm(found, "held");
      const reached = await reaching(found.sequence, due);
      if (reached === true) return confirm(found, "reached");
      if (typeof reached === "string") return settle({ current: false, why: reached });
      return short(found, due);
    },
    reached(sequence) {
      if (waiters.size === 0) return;
      for (const waiter of waiters) if (waiter.target <= sequence) waiter.done(true);
    },
    marked(marker, sequence) {
      received.set(marker, sequence);
      if (received.size > 256) received.delete(received.keys().next().value!);
      for (const done of markerWaiters.get(marker) ?? []) done(sequence);
    },
    release(why) {
      for (const waiter of waiters) waiter.done(why);
      for (const waiting of markerWaiters.values()) for (const done of waiting) done(why);
    },
    adopted(held, sameStream) {
      if (!sameStream || (proven !== undefined && held < proven.sequence)) proven = undefined;
    },
  };
}
