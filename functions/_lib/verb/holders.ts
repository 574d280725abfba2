/**
 * The holders and rotations `what`s (docs/rotation.md §8.1, §8.6): derived from the needs,
 * applied and rotations views, not from one bucket's keys.
 */
import { appliedIndex } from "../applied.ts";
import { heldIn, holdersIndex } from "../holders.ts";
import { isStale, newestFor, rotationStates } from "../rotation.ts";
import { rotationsIn } from "../rotation-record.ts";
import type { BaseRequest } from "./fields.ts";
import type { PageItem, PageSource } from "./page.ts";
import type { Asked } from "./answerer.ts";
import { oldestConfirmed } from "../state/current.ts";

/** A holder as `what=holders` answers it (docs/rotation.md §8.1). */
export interface HolderEntry {
  readonly key: string;
  readonly node: string;
  readonly module: string;
  readonly kind: string;
  readonly name: string;
  readonly revision: string | null;
  readonly appliedAt: string | null;
  readonly stale: boolean;
}

/**
 * The holders by provision, what each holds, and the kept rotations: what both `what`s are made
 * of; with `stale`, from the views as held, and since when all three are known current.
 */
async function derived({ ctx, request }: Asked<BaseRequest>) {
  const views = [ctx.views.needs, ctx.views.applied, ctx.views.rotations] as const;
  // Read before what the views hold: what they hold is at least as new.
  const confirmedAt = request.stale ? oldestConfirmed(views.map((v) => v.confirmedAt())) : undefined;
  const take = (v: (typeof views)[number]) => (request.stale ? v.localSnapshot() : v.snapshot());
  const [needs, applied, rotationsSnapshot] = await Promise.all([take(views[0]), take(views[1]), take(views[2])]);
  const [byProvision, appliedByKey, { rotations, outOfShape }] = await Promise.all([
    holdersIndex(needs),
    appliedIndex(applied),
    rotationsIn(rotationsSnapshot.reads),
  ]);
  return { byProvision, heldBy: heldIn(appliedByKey), rotations, outOfShape, ...(confirmedAt === undefined ? {} : { confirmedAt }) };
}

/** Items sorted by key, those after the cursor's only. */
const after = (items: PageItem[], key: string | undefined) => (key === undefined ? items : items.filter((item) => item.key > key));

/** The holders of the request's provision, narrowed by node and kind, each with what it holds and whether it is stale. */
export async function holderItems(asked: Asked<BaseRequest>): Promise<PageSource> {
  const { request } = asked;
  const { byProvision, heldBy, rotations, confirmedAt } = await derived(asked);
  const provision = request.provision!;
  const ofProvision = rotations.filter((r) => r.provision === provision);
  const items = (byProvision.get(provision) ?? [])
    .filter((h) => (request.node === undefined || h.node === request.node) && (request.kind === undefined || h.kind === request.kind))
    .map((h) => {
      const holding = heldBy(h, provision);
      const newest = newestFor(ofProvision, h);
      const entry: HolderEntry = {
        ...h,
        revision: holding.revision,
        appliedAt: holding.appliedAt?.toISOString() ?? null,
        stale: newest !== undefined && isStale(newest, holding),
      };
      return { key: h.key, text: JSON.stringify(entry) };
    });
  return { items: after(items, asked.cursors.after), ...(confirmedAt === undefined ? {} : { confirmedAt }) };
}

/** The kept rotations, narrowed by provider and provision, each with its holders counted; the records out of shape. */
export async function rotationItems(asked: Asked<BaseRequest>): Promise<PageSource> {
  const { request } = asked;
  const { byProvision, heldBy, rotations, outOfShape, confirmedAt } = await derived(asked);
  const { states } = rotationStates(rotations, byProvision, heldBy);
  const items = states
    .filter(
      (r) =>
        (request.provider === undefined || r.provider === request.provider) &&
        (request.provision === undefined || r.provision === request.provision),
    )
    .map((r) => ({ key: r.key, text: JSON.stringify(r) }));
  return { items: after(items, asked.cursors.after), outOfShape, ...(confirmedAt === undefined ? {} : { confirmedAt }) };
}
