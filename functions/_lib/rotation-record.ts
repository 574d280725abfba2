/**
 * A rotation's record (docs/rotation.md §8.2, §8.6): the config of rotations, the value the
 * rotations bucket keeps per `<provider>.<provision>` (or one holder's), read back, kept and
 * acknowledged by compare-and-set. The rules of who is stale are ./rotation.ts.
 */
import { z } from "zod";
import { formatIssues, keyedSerial, RevisionConflict, type Entry, type ReadBucket, type WriteBucket } from "../../runtime/index.ts";
import { TOKEN } from "../../contract/keys.ts";
import { compareTimes, rfc3339 } from "../../contract/times.ts";
import type { RotatedEvent } from "../../contract/events.ts";

/** `rotation` of `wrangler-free.config.ts` (docs/rotation.md §8.4). */
export const rotationConfig = z.object({
  rotation: z
    .strictObject({
      /** How long a holder may stay stale before it counts against the mesh, in seconds. */
      graceSeconds: z.number().int().min(1).default(300),
      /** For how long after a rotation nodes still stale are noticed again, in minutes. */
      renoticeMinutes: z.number().int().min(0).default(60),
      /** How often nodes still stale are noticed again, in seconds. */
      renoticeEverySeconds: z.number().int().min(1).default(60),
      /** How often a release the provider has not acknowledged is published again, in seconds. */
      releaseEverySeconds: z.number().int().min(1).default(10),
    })
    .default({ graceSeconds: 300, renoticeMinutes: 60, renoticeEverySeconds: 60, releaseEverySeconds: 10 }),
});
export type RotationConfig = z.output<typeof rotationConfig>["rotation"];

/** What the rotations bucket keeps per key (docs/rotation.md §8.2). */
export const rotationValue = z.object({
  revision: z.string(),
  at: rfc3339,
  /**
   * When the server stored the event, to the nanosecond (nine digits of fraction; a record of an
   * earlier version has three): what holders' applied records are compared with.
   */
  arrivedAt: z.iso.datetime(),
  noticedAt: z.iso.datetime().nullable().default(null),
  notices: z.number().int().min(0).default(0),
  /** The nodes noticed of this rotation so far. */
  noticedNodes: z.array(z.string()).default([]),
  /**
   * The stale holders' modules noticed and still stale, `<node>.<module>`: one not among them is
   * noticed at once. Absent in a record of an earlier version, which kept the nodes alone; `null`
   * when they were too many for the record to fit in one message, the nodes noticed standing for
   * them (docs/rotation.md §8.5).
   */
  noticedModules: z.array(z.string()).nullable().optional(),
  /** When the release was first published (docs/rotation.md §8.6). */
  releasedAt: z.iso.datetime().nullable().default(null),
  /** When the release was last published, and how often it was. */
  releaseSentAt: z.iso.datetime().nullable().default(null),
  releases: z.number().int().min(0).default(0),
  /** When the provider's acknowledgement of the release was stored (the server's time). */
  acknowledgedAt: z.iso.datetime().nullable().default(null),
});
export type RotationValue = z.output<typeof rotationValue>;

/** A kept rotation: its key's fields and its value. */
export interface Rotation extends RotationValue {
  readonly key: string;
  readonly provider: string;
  readonly provision: string;
  readonly machine?: string;
  readonly consumer?: string;
  /** The record's revision, for compare-and-set. */
  readonly record: number;
}

/** The key of a rotation: `<provider>.<provision>`, or `<provider>.<provision>.<machine>.<consumer>` for one holder. */
export const rotationKey = (provider: string, e: { provision: string; machine?: string; consumer?: string }) =>
  e.machine === undefined ? `${provider}.${e.provision}` : `${provider}.${e.provision}.${e.machine}.${e.consumer}`;

const decoder = new TextDecoder("utf-8", { fatal: true });

/** A rotations bucket entry as a rotation, or why it is none. */
export function rotationOf(entry: Entry): Rotation | { key: string; reason: string } {
  const tokens = entry.key.split(".");
  if ((tokens.length !== 2 && tokens.length !== 4) || tokens.some((t) => !TOKEN.test(t))) {
    return { key: entry.key, reason: "rotations keys are <provider>.<provision>[.<machine>.<consumer>]" };
  }
  let json: unknown;
  try {
    json = JSON.parse(decoder.decode(entry.value));
  } catch (err) {
    return { key: entry.key, reason: `value is not JSON: ${(err as Error).message}` };
  }
  const value = rotationValue.safeParse(json);
  if (!value.success) return { key: entry.key, reason: `value is not a rotation: ${formatIssues(value.error.issues)}` };
  const [provider, provision, machine, consumer] = tokens as [string, string, string?, string?];
  return {
    key: entry.key,
    provider,
    provision,
    ...(machine === undefined ? {} : { machine, consumer }),
    ...value.data,
    record: entry.revision,
  };
}

const oneAtATime = keyedSerial();

/** What the bucket keeps of a rotation: its value without its key's fields and record revision. */
export function valueOf(r: Rotation): RotationValue {
  const { key: _k, provider: _p, provision: _v, machine: _m, consumer: _c, record: _r, ...value } = r;
  return value;
}

/**
 * Changes the rotation record `key` by compare-and-set, one change at a time per key in this
 * process: `decide` is given the kept rotation (`undefined` when there is none, or it is out of
 * shape) and says the outcome alone (nothing written) or with the value to write; it is asked
 * again on a conflict. Resolves with the outcome; throws what the bucket throws otherwise.
 */
async function changeRotation<O extends string>(
  bucket: WriteBucket,
  key: string,
  decide: (was: Rotation | undefined) => O | { outcome: O; value: RotationValue },
): Promise<O> {
  return oneAtATime(`${bucket.bucket}/${key}`, async () => {
    for (let attempt = 0; ; attempt++) {
      const kept = await bucket.get(key);
      const was = kept === null ? undefined : rotationOf(kept);
      const decided = decide(was !== undefined && "record" in was ? was : undefined);
      if (typeof decided === "string") return decided;
      try {
        if (kept === null) await bucket.create(key, JSON.stringify(decided.value));
        else await bucket.update(key, JSON.stringify(decided.value), kept.revision);
        return decided.outcome;
      } catch (err) {
        if (!(err instanceof RevisionConflict) || attempt === 100) throw err;
      }
    }
  });
}

/** A time in nanoseconds since the epoch as RFC 3339 in UTC with nine digits of fraction. */
export function timeOfNanos(nanos: number): string {
  const ms = Math.floor(nanos / 1e6);
  const below = Math.min(999_999, Math.max(0, Math.round(nanos - ms * 1e6)));
  return `${new Date(ms).toISOString().slice(0, -1)}${String(below).padStart(6, "0")}Z`;
}

/**
 * Keeps `event` of `provider` in the rotations bucket if it is newer (by `at`) than what is kept
 * for its key and names another revision (docs/rotation.md §8.2), with `arrivedAt` the server's
 * time of the event (nanoseconds since the epoch); the notices and release start again. A
 * revision announced again (a provider re-announcing at boot) changes nothing: one release per
 * provision and revision. Compare-and-set, decided again on a conflict. Says whether it was kept,
 * older, or the revision kept already.
 */
export function keepRotation(
  bucket: WriteBucket,
  provider: string,
  event: RotatedEvent,
  arrivedNanos: number,
): Promise<"kept" | "older" | "same"> {
  return changeRotation(bucket, rotationKey(provider, event), (was) => {
    if (was !== undefined) {
      if (was.revision === event.revision) return "same";
      if (compareTimes(event.at, was.at) <= 0) return "older";
    }
    return {
      outcome: "kept",
      value: {
        revision: event.revision,
        at: event.at,
        arrivedAt: timeOfNanos(arrivedNanos),
        noticedAt: null,
        notices: 0,
        noticedNodes: [],
        noticedModules: [],
        releasedAt: null,
        releaseSentAt: null,
        releases: 0,
        acknowledgedAt: null,
      },
    };
  });
}

/**
 * Writes `acknowledgedAt` (the server's time of the acknowledgement) in the rotation `event`
 * names, so its release is published no more (docs/rotation.md §8.6); also when the release is
 * not recorded yet (it is published, then recorded). Compare-and-set, decided again on a
 * conflict. Says what it did: `acknowledged`; `again` when it was already; `unknown` when the
 * kept rotation of that key holds another revision, or there is none (nothing changes).
 */
export function acknowledgeRelease(
  bucket: WriteBucket,
  provider: string,
  event: RotatedEvent,
  storedAt: Date,
): Promise<"acknowledged" | "again" | "unknown"> {
  return changeRotation(bucket, rotationKey(provider, event), (was) => {
    // Before `releasedAt` is written too: the release is published first, then recorded.
    if (was === undefined || was.revision !== event.revision) return "unknown";
    if (was.acknowledgedAt !== null) return "again";
    return { outcome: "acknowledged", value: { ...valueOf(was), acknowledgedAt: storedAt.toISOString() } };
  });
}

/** The kept rotations of a snapshot of the rotations bucket, and its keys out of shape. */
export async function rotationsIn(reads: ReadBucket): Promise<{ rotations: Rotation[]; outOfShape: { key: string; reason: string }[] }> {
  const rotations: Rotation[] = [];
  const outOfShape: { key: string; reason: string }[] = [];
  for (const entry of await reads.list(">")) {
    const r = rotationOf(entry);
    if ("record" in r) rotations.push(r);
    else outOfShape.push(r);
  }
  return { rotations, outOfShape };
}
