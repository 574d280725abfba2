/**
 * One generation of a live view: one load of a bucket, from a watch of every key (last values,
 * then updates) into a {@link RecordStore} (store.ts), delete markers included. It knows the last
 * stream sequence it applied and how to find the records matching key filters in key order.
 * Nothing here asks the server whether the store is current: that is freshness.ts.
 */
import type { KV, KvEntry, QueuedIterator } from "nats";
import type { Logger } from "pino";
import { createdMsOf, deletes, filterList, nanosOf, watchOf } from "../buckets.ts";
import type { ListOptions } from "../types.ts";
import { subjectMatches } from "../subjects.ts";
import { RecordStore } from "./store.ts";

/**
 * The largest value of a delete marker a view keeps, in bytes: a longer one (a node may write
 * any) is read from the server when asked for, so what nobody reads takes no memory.
 */
export const MARKER_VALUE_BYTES = 4096;

/** One load of a bucket: its records by key, the last sequence applied, the watch feeding them. */
export interface Generation {
  /** The records by key, in JavaScript string order. */
  readonly store: RecordStore;
  /** The stream sequence of the last record applied; 0 before the first. */
  applied: number;
  /**
   * The stream sequence up to which the store holds each key's newest record as of then: `applied`
   * while the watch delivers every message in turn; held back when it skipped some (a message
   * already removed when the watch came to it, a key written again since: the watch catching up
   * after a load or a restart of its consumer), until it delivers one with nothing pending after it.
   */
  held: number;
  readonly watch: QueuedIterator<KvEntry>;
  /** Resolves when the store holds the bucket as it was when the watch started. */
  readonly loaded: Promise<void>;
  /** The keys applied, by stream sequence, for {@link changedAfter}. */
  readonly log: ChangeLog;
  /** The last {@link LATEST_KEPT} records applied, for {@link appliedAt}. */
  readonly latest: Latest;
}

/** How many of the latest records applied a generation knows the key and time of ({@link appliedAt}). */
export const LATEST_KEPT = 1024;

/** The latest records applied, each in the slot of its stream sequence modulo {@link LATEST_KEPT}. */
export interface Latest {
  readonly sequences: Float64Array;
  readonly nanos: Float64Array;
  readonly keys: string[];
}

/**
 * How many of the latest records a generation remembers the keys of, at least: a reader asking
 * what changed since longer ago reads the whole view again. Twice as many at most are kept
 * (16 bytes each), then the older half is dropped.
 */
export const CHANGES_KEPT = 65_536;

/** The keys of the records applied after sequence `from`, with their sequences, ascending. */
export interface ChangeLog {
  from: number;
  readonly sequences: number[];
  readonly keys: string[];
}

/**
 * The keys of the records `generation` applied after stream sequence `sequence`, each once;
 * `undefined` when its log no longer reaches back that far.
 */
export function changedAfter(generation: Generation, sequence: number): string[] | undefined {
  const { log } = generation;
  if (sequence < log.from) return undefined;
  let lo = 0;
  let hi = log.sequences.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (log.sequences[mid]! <= sequence) lo = mid + 1;
    else hi = mid;
  }
  return lo === log.keys.length ? [] : [...new Set(log.keys.slice(lo))];
}

/**
 * The key and the time (ns since the epoch) of the record `generation` applied at stream sequence
 * `sequence`; `undefined` when it applied none there, or {@link LATEST_KEPT} or more records since.
 */
export function appliedAt(generation: Generation, sequence: number): { readonly key: string; readonly nanos: number } | undefined {
  const { sequences, nanos, keys } = generation.latest;
  const slot = sequence % LATEST_KEPT;
  return sequence > 0 && sequences[slot] === sequence ? { key: keys[slot]!, nanos: nanos[slot]! } : undefined;
}

/**
 * Starts a generation: a watch of every key of the bucket behind `kv` (`$KV.<bucket>.>`, last
 * values then updates, its creation waited for `waits`, see {@link watchOf}) applied to a new store. `applied` is called after each record is
 * applied, with the entry; `ended` once when the watch ends (stopped, or failed: then logged as "view stopped"),
 * and `loaded` rejects when it ends before it held the bucket.
 * Throws `cannot watch bucket <bucket>: …` when the watch cannot be created.
 */
export async function startGeneration(
  kv: KV,
  bucket: string,
  log: Logger,
  on: { applied: (generation: Generation, entry: KvEntry) => void; ended: (generation: Generation) => void },
  waits?: readonly number[],
): Promise<Generation> {
  let loadedFn!: () => void;
  let endedFn!: (err: Error) => void;
  const loaded = new Promise<void>((resolve, reject) => {
    loadedFn = resolve;
    endedFn = reject;
  });
  // Said to whoever waits for it; nobody may.
  loaded.catch(() => {});
  let watch: QueuedIterator<KvEntry>;
  try {
    watch = await watchOf(kv, { key: ">", initializedFn: () => loadedFn() }, waits);
  } catch (err) {
    throw new Error(`cannot watch bucket ${bucket}: ${(err as Error).message}`, { cause: err });
  }
  const generation: Generation = {
    store: new RecordStore(),
    applied: 0,
    held: 0,
    watch,
    loaded,
    log: { from: 0, sequences: [], keys: [] },
    latest: { sequences: new Float64Array(LATEST_KEPT), nanos: new Float64Array(LATEST_KEPT), keys: new Array<string>(LATEST_KEPT) },
  };
  void (async () => {
    for await (const entry of watch) {
      if (!applyEntry(generation, entry)) {
        log.warn(
          { bucket, key: entry.key, revision: entry.revision, held: generation.store.revisionOf(entry.key) },
          "an older record of the key came again; kept the newer",
        );
        continue;
      }
      on.applied(generation, entry);
    }
  })()
    .catch((err: unknown) => log.error({ bucket, err }, "view stopped"))
    .finally(() => {
      // A watch that ends before it held the bucket (the stream deleted meanwhile) never will.
      endedFn(new Error(`the watch of bucket ${bucket} ended before it held the bucket`));
      on.ended(generation);
    });
  return generation;
}

/**
 * Applies one watched entry: its record replaces the key's in the store (a delete or purge as a
 * marker, its value cut when longer than {@link MARKER_VALUE_BYTES}), `applied` moves up to its
 * revision, `held` with it when no message was skipped or none is pending (see
 * {@link Generation.held}), and its key is logged (its time too, among the {@link LATEST_KEPT}
 * latest). A record older than the key's is not applied:
 * `false`.
 */
export function applyEntry(generation: Generation, entry: KvEntry): boolean {
  // A record older than the one the key holds (delivered again, late) never replaces it.
  if ((generation.store.revisionOf(entry.key) ?? 0) > entry.revision) return false;
  const deleted = deletes(entry.operation);
  const createdNanos = nanosOf(entry);
  generation.store.set({
    key: entry.key,
    value: entry.value,
    revision: entry.revision,
    createdMs: createdMsOf(entry),
    createdNanos,
    deleted,
    cut: deleted && entry.value.length > MARKER_VALUE_BYTES,
  });
  const { latest } = generation;
  const slot = entry.revision % LATEST_KEPT;
  // A record delivered late never takes the slot of a newer one.
  if (entry.revision >= latest.sequences[slot]!) {
    latest.sequences[slot] = entry.revision;
    latest.nanos[slot] = createdNanos;
    latest.keys[slot] = entry.key;
  }
  if (entry.revision <= generation.applied) return true;
  // A message skipped may have been a write of a key whose newer write is still to come: what is
  // held is known again once nothing is pending after a delivered message.
  const skipped = entry.revision > generation.applied + 1;
  generation.applied = entry.revision;
  if (entry.delta === 0 || (!skipped && generation.held === generation.applied - 1)) generation.held = entry.revision;
  const { log } = generation;
  log.sequences.push(entry.revision);
  log.keys.push(entry.key);
  if (log.keys.length >= 2 * CHANGES_KEPT) {
    log.from = log.sequences[CHANGES_KEPT - 1]!;
    log.sequences.splice(0, CHANGES_KEPT);
    log.keys.splice(0, CHANGES_KEPT);
  }
  return true;
}

/** The literal tokens of `filter` before its first wildcard, joined; `undefined` for a key. */
function literalPrefix(filter: string): string | undefined {
  const tokens = filter.split(".");
  const first = tokens.findIndex((t) => t === "*" || t === ">");
  return first === -1 ? undefined : tokens.slice(0, first).join(".");
}

/** The slots of `store` matching `filter` (a key, or a subject with `*`/`>`), in key order, after `after`. */
export function* matching(store: RecordStore, filter: string, after: string | undefined): Generator<number> {
  const prefix = literalPrefix(filter);
  if (prefix === undefined) {
    const slot = store.slotOf(filter);
    if (slot !== undefined && (after === undefined || filter > after)) yield slot;
    return;
  }
  const begin = prefix === "" ? "" : `${prefix}.`;
  // `<prefix>.>` matches every key under the prefix: no need to match each.
  const everyKey = filter.slice(begin.length) === ">";
  const from = after !== undefined && after > begin ? after : begin;
  for (const [key, slot] of store.entries(from)) {
    if (!key.startsWith(begin)) return;
    if (key === after) continue;
    if (everyKey || subjectMatches(filter, key)) yield slot;
  }
}

/**
 * The slots of up to `options.limit` records of `store` matching any of `filters`, after
 * `options.after`, in key order; deleted ones only when `deleted`. Throws, as
 * {@link filterList} does, on a filter longer than `MAX_KEY_BYTES`.
 */
export function collect(
  store: RecordStore,
  bucket: string,
  filters: string | readonly string[],
  options: ListOptions,
  deleted: boolean,
): number[] {
  const all = filterList(bucket, filters);
  const limit = options.limit ?? Infinity;
  if (all.length === 1) {
    const found: number[] = [];
    for (const slot of matching(store, all[0]!, options.after)) {
      if (found.length >= limit) break;
      if (deleted || !store.deleted(slot)) found.push(slot);
    }
    return found;
  }
  const found = new Set<number>();
  for (const filter of all) {
    let taken = 0;
    for (const slot of matching(store, filter, options.after)) {
      if (taken >= limit) break;
      if (!deleted && store.deleted(slot)) continue;
      found.add(slot);
      taken++;
    }
  }
  const sorted = [...found].sort((a, b) => {
    const [x, y] = [store.keyOf(a), store.keyOf(b)];
    return x < y ? -1 : x > y ? 1 : 0;
  });
  return sorted.length > limit ? sorted.slice(0, limit) : sorted;
}
