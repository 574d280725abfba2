/**
 * The runtime's records in its own buckets: the last scheduled run of each function and the
 * events each refused (`<seat>_runtime`), and the claims of scheduled runs (`<seat>_claims`),
 * all shared by every replica of the set (docs/buckets.md §2.5).
 */
import { z } from "zod";
import { RevisionConflict } from "./errors.ts";
import { keyedSerial } from "./serial.ts";
import type { ReadBucket, RefusedEvents, Run, RuntimeRecords, WriteBucket } from "./types.ts";

/** The runtime's side of its records: what it writes, besides what functions read. */
export interface Recorder extends Omit<RuntimeRecords, "store"> {
  /** Records a successful scheduled run of `fn` (key `ran.<fn>`). */
  ran(fn: string, run: Run): Promise<void>;
  /**
   * Counts one refused event of `fn` (key `refused.<fn>`, compare-and-set, so replicas add up).
   * With where it was `delivered` from a stream, an event counted already (delivered again) is
   * not counted twice ({@link Delivered}); a bare stream sequence is checked against every
   * stream's. Resolves to how many counted ranges were forgotten to keep the record within
   * {@link MAX_COUNTED_RANGES} (0 but for a message left unacknowledged very long).
   */
  refused(fn: string, last: NonNullable<RefusedEvents["last"]>, delivered?: Delivered | number): Promise<number>;
  /**
   * Claims the run of `fn` scheduled at `scheduledAt` for this replica: `true` when no replica
   * had (a create of `<fn>.<ms>` in the claims bucket), `false` when one had.
   */
  claim(fn: string, scheduledAt: Date): Promise<boolean>;
}

const decoder = new TextDecoder();

/**
 * Where a refused event was delivered from: its stream (its name on the server, and when it was
 * made: a stream made anew numbers its messages from 1 again), its stream sequence, and the
 * durable consumer's acknowledgement floor as the server last said it to this replica. Every
 * message at or below the floor was acknowledged, so handled already: it is never delivered
 * again, but by a durable made again from below its floor, and is not counted again then. A
 * floor lower than the truth only keeps more; a higher one would forget sequences that can
 * still come: it must be the server's `ack_floor`, never one replica's own acknowledgements
 * (replicas share the durable).
 */
export interface Delivered {
  readonly stream: string;
  readonly created: string;
  readonly sequence: number;
  readonly ackFloor: number;
}

/** Stream sequences `[from, to]`, both included: ascending, apart (neither overlapping nor touching). */
type Ranges = [number, number][];
const streamSequence = z.number().int().min(0);
/**
 * What a record remembers of one stream's counted refusals: the stream's creation time, the
 * highest acknowledgement floor given (every message at or below it was handled: counted if
 * refused), and the sequences counted above it, as ranges.
 */
const countedStream = z.object({
  created: z.string(),
  floor: streamSequence,
  ranges: z.array(z.tuple([streamSequence, streamSequence])),
});
const refusedRecord = z.object({
  count: z.number().int().min(0),
  last: z.object({ subject: z.string(), reason: z.string(), at: z.string() }).optional(),
  /** By stream name on the server (`""`: sequences given without their stream), what was counted. */
  counted: z.record(z.string(), countedStream).optional(),
  /** Before: the stream sequences of the last 256 counted, read as counted ranges of the next stream written. */
  recent: z.array(streamSequence).optional(),
});
type RefusedRecord = z.infer<typeof refusedRecord>;
type CountedStream = z.infer<typeof countedStream>;
/**
 * The most ranges a record keeps per stream: some 40 KiB of JSON with sequences of 7 digits.
 * Ranges pile up only above the floor, which one message left unacknowledged holds back (a
 * handler faulting on it for ever), and only where refusals and other events alternate; beyond
 * this, the oldest are forgotten, with a warning: those events are counted again if delivered
 * again.
 */
export const MAX_COUNTED_RANGES = 2048;
const runRecord = z.object({ at: z.iso.datetime(), trigger: z.enum(["cron", "start"]) });

/** `ranges` sorted and merged where they overlap or touch: as written here, from a record written by hand, or from `recent`. */
function normalized(ranges: readonly (readonly [number, number])[]): Ranges {
  const sorted = ranges.filter(([from, to]) => from <= to).toSorted((a, b) => a[0] - b[0]);
  const merged: Ranges = [];
  for (const [from, to] of sorted) {
    const tail = merged.at(-1);
    if (tail !== undefined && from <= tail[1] + 1) tail[1] = Math.max(tail[1], to);
    else merged.push([from, to]);
  }
  return merged;
}

/** The index of the first range of `ranges` ending at or after `seq` (`ranges.length` when none). */
function firstEndingFrom(ranges: Ranges, seq: number): number {
  let lo = 0;
  let hi = ranges.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (ranges[mid]![1] < seq) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/** Whether `seq` was counted for a stream: at or below its floor, or in its ranges. */
function holds(counted: CountedStream, seq: number): boolean {
  if (seq <= counted.floor) return true;
  const range = counted.ranges[firstEndingFrom(counted.ranges, seq)];
  return range !== undefined && range[0] <= seq;
}

/** `ranges` with `seq` (not in them) added, merged with the ranges it touches. */
function withSequence(ranges: Ranges, seq: number): Ranges {
  const i = firstEndingFrom(ranges, seq - 1);
  const before = ranges.slice(0, i);
  const touching = ranges.slice(i).filter(([from]) => from <= seq + 1);
  const after = ranges.slice(i + touching.length);
  return [...before, [Math.min(seq, ...touching.map(([from]) => from)), Math.max(seq, ...touching.map(([, to]) => to))], ...after];
}

/** `ranges` above `floor` only: what can still be delivered again. */
function above(ranges: Ranges, floor: number): Ranges {
  return ranges.filter(([, to]) => to > floor).map(([from, to]) => [Math.max(from, floor + 1), to]);
}

/** Whether creation time `a` is later than `b`; `true` when either is not a time. */
function later(a: string, b: string): boolean {
  const [ta, tb] = [Date.parse(a), Date.parse(b)];
  return Number.isNaN(ta) || Number.isNaN(tb) || ta > tb;
}

/**
 * What a record remembers once `seq` is counted for `stream` made at `created` with floor
 * `floor`: the stream's ranges pruned at the floor and the newest {@link MAX_COUNTED_RANGES}
 * kept, and how many older ones were forgotten for it. `before` is what the record held for
 * the stream (the sequences of an earlier record's `recent` when it held nothing).
 */
function remember(
  before: CountedStream | undefined,
  created: string,
  floor: number,
  seq: number,
): { kept: CountedStream; forgotten: number } {
  const ranges = withSequence(above(before?.ranges ?? [], floor), seq);
  const forgotten = Math.max(0, ranges.length - MAX_COUNTED_RANGES);
  return { kept: { created, floor, ranges: ranges.slice(forgotten) }, forgotten };
}

/**
 * What a record keeps besides its count once the refusal `delivered` describes is counted, and
 * how many ranges were forgotten for it; `undefined` when it was counted already. A stream
 * whose creation time is not the one remembered was made anew: its earlier sequences are
 * another stream's, forgotten (and a refusal delivered from the older one, gone with its
 * durable, is counted without being remembered). A record of before, with `recent`, has those
 * sequences taken as counted for the next stream it counts for.
 */
function counting(
  record: RefusedRecord | undefined,
  delivered: Delivered | number | undefined,
): { counted?: Record<string, CountedStream>; recent?: number[]; forgotten: number } | undefined {
  const counted = { ...record?.counted };
  const asBefore = { ...(Object.keys(counted).length > 0 ? { counted } : {}), ...(record?.recent ? { recent: record.recent } : {}) };
  if (delivered === undefined) return { ...asBefore, forgotten: 0 };
  const fromRecent: CountedStream | undefined =
    record?.recent === undefined ? undefined : { created: "", floor: 0, ranges: record.recent.map((s): [number, number] => [s, s]) };
  const tidy = (c: CountedStream): CountedStream => ({ ...c, ranges: normalized(c.ranges) });
  if (typeof delivered === "number") {
    // A sequence without its stream (a caller of its own, a test): held against every stream's.
    const known = [...Object.values(counted), ...(fromRecent ? [fromRecent] : [])];
    if (known.some((c) => holds(tidy(c), delivered))) return undefined;
    const before = counted[""] ?? fromRecent;
    const { kept, forgotten } = remember(before && tidy(before), "", before?.floor ?? 0, delivered);
    return { counted: { ...counted, "": kept }, forgotten };
  }
  const { stream, created, sequence: seq, ackFloor } = delivered;
  const was = counted[stream];
  if (was !== undefined && was.created !== created && !later(created, was.created)) return { ...asBefore, forgotten: 0 };
  const found = was === undefined ? fromRecent : was.created === created ? was : undefined;
  const before = found && tidy(found);
  const floor = Math.max(before?.floor ?? 0, ackFloor);
  if (holds({ created, floor, ranges: before?.ranges ?? [] }, seq)) return undefined;
  const { kept, forgotten } = remember(before, created, floor, seq);
  return { counted: { ...counted, [stream]: kept }, forgotten };
}

/** A record's value read with `schema`; `undefined` when it is not that (written by hand, damaged). */
function read<T>(schema: z.ZodType<T>, value: Uint8Array): T | undefined {
  try {
    const parsed = schema.safeParse(JSON.parse(decoder.decode(value)));
    return parsed.success ? parsed.data : undefined;
  } catch {
    return undefined;
  }
}

/**
 * Records over the runtime's bucket `<seat>_runtime`; keys `ran.<function>`, `refused.<function>`.
 * A record that cannot be read counts as none (and is overwritten by the next one), so a damaged
 * record never stops a function that reads the records. Claims go to `claims`
 * (`<seat>_claims`). With `refusers` (the functions that take events), refusals are read
 * with one get of each function's key rather than a listing of the bucket. What functions read
 * (`lastRun`, `refusedEvents`) is read from `held` (a live view of the bucket, as fresh as the
 * server), the counts' own compare-and-set from the bucket.
 */
export function recorder(bucket: WriteBucket, claims: WriteBucket, refusers?: readonly string[], held: ReadBucket = bucket): Recorder {
  // One count at a time per function: racing compare-and-set writes on a replicated stream may
  // all succeed on nats-server before 2.9.21 (nats-server#4320).
  const oneAtATime = keyedSerial();
  const countRefused = async (fn: string, last: NonNullable<RefusedEvents["last"]>, delivered?: Delivered | number): Promise<number> => {
    const key = `refused.${fn}`;
    for (let attempt = 0; ; attempt++) {
      const kept = await bucket.get(key);
      const record = kept === null ? undefined : read(refusedRecord, kept.value);
      const next = counting(record, delivered);
      if (next === undefined) return 0;
      const { forgotten, ...remembered } = next;
      const value = JSON.stringify({ count: (record?.count ?? 0) + 1, last, ...remembered });
      try {
        await (kept === null ? bucket.create(key, value) : bucket.update(key, value, kept.revision));
        return forgotten;
      } catch (err) {
        if (!(err instanceof RevisionConflict) || attempt === 20) throw err;
      }
    }
  };
  return {
    async claim(fn, scheduledAt) {
      try {
        await claims.create(`${fn}.${scheduledAt.getTime()}`, scheduledAt.toISOString());
        return true;
      } catch (err) {
        if (err instanceof RevisionConflict) return false;
        throw err;
      }
    },
    async ran(fn, run) {
      await bucket.put(`ran.${fn}`, JSON.stringify({ at: run.at.toISOString(), trigger: run.trigger }));
    },
    refused: (fn, last, delivered) => oneAtATime(`refused.${fn}`, () => countRefused(fn, last, delivered)),
    async lastRun(name) {
      const kept = await held.get(`ran.${name}`);
      const run = kept === null ? undefined : read(runRecord, kept.value);
      return run === undefined ? null : { at: new Date(run.at), trigger: run.trigger };
    },
    async refusedEvents() {
      const byFunction: Record<string, RefusedEvents> = {};
      let count = 0;
      // The set's own functions that take events: one get each; without them, every record.
      const entries =
        refusers === undefined
          ? await held.list("refused.*")
          : (await Promise.all(refusers.map((fn) => held.get(`refused.${fn}`)))).filter((e) => e !== null);
      for (const entry of entries) {
        // What the runtime remembers to count once is its own.
        const { count: counted, last } = read(refusedRecord, entry.value) ?? { count: 0 };
        byFunction[entry.key.slice("refused.".length)] = last === undefined ? { count: counted } : { count: counted, last };
        count += counted;
      }
      return { count, byFunction };
    },
  };
}
