import type { WriteBucket } from "./buckets.ts";
import { RevisionConflict } from "./buckets.ts";
import type { Refused, Run, RuntimeRecords } from "./define.ts";

/** The runtime's own bucket of a seat: its records, shared by every replica of the set. */
export const recordsBucket = (seat: string): string => `${seat}_runtime`;

/** The runtime's side of its records: what it writes, besides what functions read. */
export interface Recorder extends RuntimeRecords {
  /** Records a successful scheduled run of `fn` (key `ran.<fn>`). */
  ran(fn: string, run: Run): Promise<void>;
  /** Counts one refused event of `fn` (key `refused.<fn>`, compare-and-set, so replicas add up). */
  refused(fn: string, last: NonNullable<Refused["last"]>): Promise<void>;
}

const decoder = new TextDecoder();
const json = (value: Uint8Array): unknown => JSON.parse(decoder.decode(value));

/** Records over the runtime's bucket `<seat>_runtime`; keys `ran.<function>`, `refused.<function>`. */
export function recorder(bucket: WriteBucket): Recorder {
  return {
    async ran(fn, run) {
      await bucket.put(`ran.${fn}`, JSON.stringify({ at: run.at.toISOString(), trigger: run.trigger }));
    },
    async refused(fn, last) {
      const key = `refused.${fn}`;
      for (let attempt = 0; ; attempt++) {
        const kept = await bucket.get(key);
        const count = kept === null ? 1 : (json(kept.value) as Refused).count + 1;
        const value = JSON.stringify({ count, last });
        try {
          await (kept === null ? bucket.create(key, value) : bucket.update(key, value, kept.revision));
          return;
        } catch (err) {
          if (!(err instanceof RevisionConflict) || attempt === 20) throw err;
        }
      }
    },
    async lastRun(name) {
      const kept = await bucket.get(`ran.${name}`);
      if (kept === null) return null;
      const { at, trigger } = json(kept.value) as { at: string; trigger: Run["trigger"] };
      return { at: new Date(at), trigger };
    },
    async refusedEvents() {
      const byFunction: Record<string, Refused> = {};
      let count = 0;
      for (const entry of await bucket.list("refused.*")) {
        const refused = json(entry.value) as Refused;
        byFunction[entry.key.slice("refused.".length)] = refused;
        count += refused.count;
      }
      return { count, byFunction };
    },
  };
}
