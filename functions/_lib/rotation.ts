/**
 * The rules of rotations (docs/rotation.md §8): which rotation reaches which holder, which holders
 * are stale for them, and each rotation's state. Every comparison of writes is on the server's
 * times. A rotation's record in its bucket is ./rotation-record.ts.
 */
import { nanosOfTime, type Snapshot } from "../../runtime/index.ts";
import { appliedIndex } from "./applied.ts";
import { heldIn, holdersIndex, provisionOf, type Held, type Holder } from "./holders.ts";
import { keeping } from "./keeping.ts";
import { compareTimes } from "../../contract/times.ts";
import { rotationsIn, type Rotation } from "./rotation-record.ts";

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
