/**
 * One generation of a live view: one load of a bucket, from a watch of every key (last values,
 * then updates) into a B+ tree by key, delete markers included. It knows the last stream
 * sequence it applied, which delete markers it kept without their value, and how to find the
 * records matching key filters in key order. Nothing here asks the server whether the tree is
 * current: that is freshness.ts.
 */
import { createRequire } from "node:module";
import type { KV, KvEntry, QueuedIterator } from "nats";
import type { Logger } from "pino";
import { filterList, nanosOf, watchOf } from "../buckets.ts";
import type { KeyRecord, ListOptions } from "../types.ts";
import { subjectMatches } from "../subjects.ts";

// Required, not imported: a CommonJS module whose default export tsx and vitest unwrap differently.
const { default: BTree } = createRequire(import.meta.url)("sorted-btree") as typeof import("sorted-btree");

/**
 * The largest value of a delete marker a view keeps, in bytes: a longer one (a node may write
 * any) is read from the server when asked for, so what nobody reads takes no memory.
 */
export const MARKER_VALUE_BYTES = 4096;

/** The records of a bucket by key, in JavaScript string order. */
export type KeyTree = InstanceType<typeof BTree<string, KeyRecord>>;

/** One load of a bucket: its records by key, the last sequence applied, the watch feeding them. */
export interface Generation {
  readonly tree: KeyTree;
  /** The stream sequence of the last record applied; 0 before the first. */
  applied: number;
  readonly watch: QueuedIterator<KvEntry>;
  /** Resolves when the tree holds the bucket as it was when the watch started. */
  readonly loaded: Promise<void>;
  /** Delete markers whose value was longer than {@link MARKER_VALUE_BYTES}, kept empty. */
  readonly cut: WeakSet<KeyRecord>;
  /** The keys applied, by stream sequence, for {@link changedAfter}. */
  readonly log: ChangeLog;
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

const EMPTY = new Uint8Array(0);
const byKey = (a: KeyRecord, b: KeyRecord) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0);

/**
 * Starts a generation: a watch of every key of the bucket behind `kv` (`$KV.<bucket>.>`, last
 * values then updates) applied to a new tree. `applied` is called after each record is
 * applied; `ended` once when the watch ends (stopped, or failed: then logged as "view stopped").
 * Throws `cannot watch bucket <bucket>: …` when the watch cannot be created.
 */
export async function startGeneration(
  kv: KV,
  bucket: string,
  log: Logger,
  on: { applied: (generation: Generation) => void; ended: (generation: Generation) => void },
): Promise<Generation> {
  let loadedFn!: () => void;
  const loaded = new Promise<void>((resolve) => (loadedFn = resolve));
  let watch: QueuedIterator<KvEntry>;
  try {
    watch = await watchOf(kv, { key: ">", initializedFn: () => loadedFn() });
  } catch (err) {
    throw new Error(`cannot watch bucket ${bucket}: ${(err as Error).message}`, { cause: err });
  }
  const generation: Generation = {
    tree: new BTree<string, KeyRecord>(),
    applied: 0,
    watch,
    loaded,
    cut: new WeakSet(),
    log: { from: 0, sequences: [], keys: [] },
  };
  void (async () => {
    for await (const entry of watch) {
      applyEntry(generation, entry);
      on.applied(generation);
    }
  })()
    .catch((err: unknown) => log.error({ bucket, err }, "view stopped"))
    .finally(() => on.ended(generation));
  return generation;
}

/**
 * Applies one watched entry: its record replaces the key's in the tree (a delete or purge as a
 * marker, its value cut when longer than {@link MARKER_VALUE_BYTES}), `applied` moves up to its
 * revision, and its key is logged.
 */
export function applyEntry(generation: Generation, entry: KvEntry): void {
  const deleted = entry.operation !== "PUT";
  const kept = !deleted || entry.value.length <= MARKER_VALUE_BYTES;
  const record: KeyRecord = {
    key: entry.key,
    // A copy: the message's bytes may be a view into a larger read buffer.
    value: kept ? entry.value.slice() : EMPTY,
    revision: entry.revision,
    created: entry.created,
    createdNanos: nanosOf(entry),
    deleted,
  };
  if (!kept) generation.cut.add(record);
  generation.tree.set(record.key, record);
  if (entry.revision <= generation.applied) return;
  generation.applied = entry.revision;
  const { log } = generation;
  log.sequences.push(entry.revision);
  log.keys.push(entry.key);
  if (log.keys.length >= 2 * CHANGES_KEPT) {
    log.from = log.sequences[CHANGES_KEPT - 1]!;
    log.sequences.splice(0, CHANGES_KEPT);
    log.keys.splice(0, CHANGES_KEPT);
  }
}

/** The literal tokens of `filter` before its first wildcard, joined; `undefined` for a key. */
function literalPrefix(filter: string): string | undefined {
  const tokens = filter.split(".");
  const first = tokens.findIndex((t) => t === "*" || t === ">");
  return first === -1 ? undefined : tokens.slice(0, first).join(".");
}

/** The records of `tree` matching `filter` (a key, or a subject with `*`/`>`), in key order, after `after`. */
export function* matching(tree: KeyTree, filter: string, after: string | undefined): Generator<KeyRecord> {
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

/**
 * Up to `options.limit` records of `tree` matching any of `filters`, after `options.after`, in
 * key order; deleted ones only when `deleted`. Throws, as {@link filterList} does, on a filter
 * longer than `MAX_KEY_BYTES`.
 */
export function collect(
  tree: KeyTree,
  bucket: string,
  filters: string | readonly string[],
  options: ListOptions,
  deleted: boolean,
): KeyRecord[] {
  const all = filterList(bucket, filters);
  const limit = options.limit ?? Infinity;
  const found = new Map<string, KeyRecord>();
  for (const filter of all) {
    let taken = 0;
    for (const record of matching(tree, filter, options.after)) {
      if (taken >= limit) break;
      if (!deleted && record.deleted) continue;
      found.set(record.key, record);
      taken++;
    }
  }
  const sorted = all.length === 1 ? [...found.values()] : [...found.values()].sort(byKey);
  return sorted.length > limit ? sorted.slice(0, limit) : sorted;
}
