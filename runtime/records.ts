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
   * With the event's stream `sequence`, an event counted already (delivered again) is not
   * counted twice, among the last {@link RECENT_REFUSALS} counted.
   */
  refused(fn: string, last: NonNullable<RefusedEvents["last"]>, sequence?: number): Promise<void>;
  /**
   * Claims the run of `fn` scheduled at `scheduledAt` for this replica: `true` when no replica
   * had (a create of `<fn>.<ms>` in the claims bucket), `false` when one had.
   */
  claim(fn: string, scheduledAt: Date): Promise<boolean>;
}

const decoder = new TextDecoder();

const refusedRecord = z.object({
  count: z.number().int().min(0),
  last: z.object({ subject: z.string(), reason: z.string(), at: z.string() }).optional(),
  /** Stream sequences of the last refused events counted. */
  recent: z.array(z.number().int()).optional(),
});
/** How many counted refusals' stream sequences a record remembers, to count a redelivery once. */
export const RECENT_REFUSALS = 256;
const runRecord = z.object({ at: z.iso.datetime(), trigger: z.enum(["cron", "start"]) });

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
  const countRefused = async (fn: string, last: NonNullable<RefusedEvents["last"]>, sequence?: number): Promise<void> => {
    const key = `refused.${fn}`;
    for (let attempt = 0; ; attempt++) {
      const kept = await bucket.get(key);
      const record = kept === null ? undefined : read(refusedRecord, kept.value);
      const recent = record?.recent ?? [];
      if (sequence !== undefined && recent.includes(sequence)) return;
      const count = (record?.count ?? 0) + 1;
      const remembered = sequence === undefined ? recent : [...recent, sequence].slice(-RECENT_REFUSALS);
      const value = JSON.stringify({ count, last, ...(remembered.length > 0 ? { recent: remembered } : {}) });
      try {
        await (kept === null ? bucket.create(key, value) : bucket.update(key, value, kept.revision));
        return;
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
    refused: (fn, last, sequence) => oneAtATime(`refused.${fn}`, () => countRefused(fn, last, sequence)),
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
        const { recent: _, ...refused } = read(refusedRecord, entry.value) ?? { count: 0 };
        byFunction[entry.key.slice("refused.".length)] = refused;
        count += refused.count;
      }
      return { count, byFunction };
    },
  };
}
