/**
 * Holders and rotations (docs/rotation.md §8): who holds a provision (the needs naming it), the
 * rotations providers announce, which holders are stale for them, and what is noticed and
 * released. Every comparison of writes is on the server's times.
 */
import { z } from "zod";
import {
  formatIssues,
  keyedSerial,
  nanosOfTime,
  RevisionConflict,
  type Entry,
  type ReadBucket,
  type Snapshot,
  type WriteBucket,
} from "../../runtime/index.ts";
import { appliedIndex } from "./applied.ts";
import { heldIn, holdersIndex, provisionOf, type Held, type Holder } from "./holders.ts";
import { keeping } from "./keeping.ts";
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
   * noticed at once. Absent in a record of an earlier version, which kept the nodes alone.
   */
  noticedModules: z.array(z.string()).optional(),
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

/** Whether a rotation reaches a holder: every holder of its provision, or the one machine and consumer it names. */
export const reaches = (r: Rotation, h: Holder) =>
  r.provision === provisionOf(h.name) && (r.machine === undefined || (r.machine === h.node && r.consumer === h.module));

/**
 * How far apart, in nanoseconds, two of the server's times must be for the set to tell their
 * order: it holds them as doubles (to about 256 ns now), read by more than one path.
 */
export const ORDER_NANOS = 1000;

/**
 * The latest instant, in nanoseconds since the epoch, that a rotation may have arrived at: its
 * `arrivedAt` to the last digit it has, plus {@link ORDER_NANOS} (nine digits; three in a record
 * of an earlier version, which leaves the whole millisecond unknown).
 */
export function arrivedBy(rotation: Rotation): number {
  const digits = /\.(\d+)Z$/.exec(rotation.arrivedAt)?.[1]?.length ?? 0;
  return nanosOfTime(rotation.arrivedAt) + Math.max(ORDER_NANOS, digits >= 9 ? 0 : 10 ** (9 - digits) - 1);
}

/**
 * Whether `held` is stale for `rotation` (docs/rotation.md §8.3): its revisions cannot be read;
 * its revision differs from the rotation's; or, holding no revision of it, its applied record
 * (if any) was not written after the rotation arrived, on the server's nanosecond times: a record
 * whose order with the rotation cannot be told (the same instant, to the digits kept) is stale.
 */
export function isStale(rotation: Rotation, held: Held): boolean {
  if (held.unreadable) return true;
  if (held.revision !== null) return held.revision !== rotation.revision;
  return held.appliedNanos === null || held.appliedNanos <= arrivedBy(rotation);
}

/** The newest (by `at`) of `rotations` that reach `holder`, or none. */
export function newestFor(rotations: readonly Rotation[], holder: Holder): Rotation | undefined {
  let newest: Rotation | undefined;
  for (const r of rotations) if (reaches(r, holder) && (newest === undefined || compareTimes(r.at, newest.at) > 0)) newest = r;
  return newest;
}

/** A rotation as `what=rotations` answers it (docs/rotation.md §8.6). */
export interface RotationState {
  readonly key: string;
  readonly provider: string;
  readonly provision: string;
  readonly machine?: string;
  readonly consumer?: string;
  readonly revision: string;
  readonly at: string;
  readonly arrivedAt: string;
  readonly holders: number;
  readonly caughtUp: number;
  readonly stale: number;
  readonly releasedAt: string | null;
  /** How often the release was published, and when the provider acknowledged it (docs/rotation.md §8.6). */
  readonly releases: number;
  readonly acknowledgedAt: string | null;
}

/** A stale holder, as status lists it (docs/rotation.md §8.3). */
export interface StaleHolder {
  readonly provider: string;
  readonly provision: string;
  readonly node: string;
  readonly module: string;
  readonly key: string;
  /** The revision it should hold. */
  readonly revision: string;
  /** The revision it holds, or `null` when its applied record names none. */
  readonly heldRevision: string | null;
  readonly rotatedAt: string;
  readonly appliedAt: string | null;
}

/**
 * Each rotation's holders (those it reaches), how many are caught up and stale for it, and its
 * stale holders (docs/rotation.md §8.3). A holder is in a rotation's stale list (noticed, in
 * status) only for the newest rotation that reaches it; it holds back a rotation's release while
 * it holds neither that rotation's revision nor that of a newer one reaching it, so no provider
 * is told to revoke what a holder still uses. Indexed by provision and holder, so per-holder
 * rotations of one provision cost what they reach.
 */
export function rotationStates(
  rotations: readonly Rotation[],
  byProvision: ReadonlyMap<string, readonly Holder[]>,
  heldBy: (holder: Holder, provision: string) => Held,
): { states: RotationState[]; stale: Map<string, StaleHolder[]> } {
  // Rotations by provision: those reaching every holder, and those of one holder by `node.module`.
  const wide = new Map<string, Rotation[]>();
  const narrow = new Map<string, Map<string, Rotation[]>>();
  for (const r of rotations) {
    if (r.machine === undefined) {
      let list = wide.get(r.provision);
      if (list === undefined) wide.set(r.provision, (list = []));
      list.push(r);
    } else {
      let byHolder = narrow.get(r.provision);
      if (byHolder === undefined) narrow.set(r.provision, (byHolder = new Map()));
      const at = `${r.machine}.${r.consumer}`;
      let list = byHolder.get(at);
      if (list === undefined) byHolder.set(at, (list = []));
      list.push(r);
    }
  }
  // Holders by provision and `node.module`.
  const holdersAt = new Map<string, Map<string, Holder[]>>();
  const holdersOf = (provision: string) => {
    let found = holdersAt.get(provision);
    if (found === undefined) {
      found = new Map();
      for (const h of byProvision.get(provision) ?? []) {
        const at = `${h.node}.${h.module}`;
        let list = found.get(at);
        if (list === undefined) found.set(at, (list = []));
        list.push(h);
      }
      holdersAt.set(provision, found);
    }
    return found;
  };
  const reaching = (h: Holder, provision: string) => [
    ...(wide.get(provision) ?? []),
    ...(narrow.get(provision)?.get(`${h.node}.${h.module}`) ?? []),
  ];

  const stale = new Map<string, StaleHolder[]>();
  const states = rotations.map((r) => {
    const holders =
      r.machine === undefined ? (byProvision.get(r.provision) ?? []) : (holdersOf(r.provision).get(`${r.machine}.${r.consumer}`) ?? []);
    let holding = 0;
    const list: StaleHolder[] = [];
    for (const h of holders) {
      const held = heldBy(h, r.provision);
      if (!isStale(r, held)) continue;
      const others = reaching(h, r.provision);
      // Moved on to a newer rotation's revision: past this one.
      if (others.some((n) => n !== r && compareTimes(n.at, r.at) > 0 && !isStale(n, held))) continue;
      holding++;
      if (newestFor(others, h) !== r) continue;
      list.push({
        provider: r.provider,
        provision: r.provision,
        node: h.node,
        module: h.module,
        key: h.key,
        revision: r.revision,
        heldRevision: held.revision,
        rotatedAt: r.arrivedAt,
        appliedAt: held.appliedAt?.toISOString() ?? null,
      });
    }
    stale.set(r.key, list);
    return {
      key: r.key,
      provider: r.provider,
      provision: r.provision,
      ...(r.machine === undefined ? {} : { machine: r.machine, consumer: r.consumer }),
      revision: r.revision,
      at: r.at,
      arrivedAt: r.arrivedAt,
      holders: holders.length,
      caughtUp: holders.length - holding,
      stale: holding,
      releasedAt: r.releasedAt,
      releases: r.releases,
      acknowledgedAt: r.acknowledgedAt,
    };
  });
  return { states, stale };
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

type RotationInputs = { rotations: Snapshot; needs: Snapshot; applied: Snapshot };
/** The kept rotations of `inputs`, their states and stale holders (docs/rotation.md §8.3). */
async function rotationsOf({ rotations, needs, applied }: RotationInputs) {
  const { rotations: kept } = await rotationsIn(rotations.reads);
  if (kept.length === 0) return { kept, states: [], stale: new Map<string, StaleHolder[]>() };
  return { kept, ...rotationStates(kept, await holdersIndex(needs), heldIn(await appliedIndex(applied))) };
}
// Made again only when a view changed: asked every second, it costs nothing while none did.
const rotationsKept = keeping(rotationsOf, (_kept, inputs: RotationInputs) => rotationsOf(inputs));

/**
 * The kept rotations (in key order), each one's state and its stale holders by rotation key, from
 * snapshots of the rotations, needs and applied buckets; the same value while none changed.
 */
export const rotationsNow = (
  rotations: Snapshot,
  needs: Snapshot,
  applied: Snapshot,
): Promise<{ kept: Rotation[]; states: RotationState[]; stale: Map<string, StaleHolder[]> }> =>
  rotationsKept({ rotations, needs, applied });
