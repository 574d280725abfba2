/**
 * The model of a function's views now (docs/state.md §7.5): the one way status, its metrics,
 * alerts, the page and the verb read the module states from their `ctx`.
 */
import type { ViewBucket } from "../../../runtime/index.ts";
import { currentModel } from "./keeper.ts";
import { STATE_VIEWS, type Model, type NODE_VIEWS, type StateInputs, type StateView } from "./vocabulary.ts";

/** What reading the state needs of a view. */
type StateViewBucket = Pick<ViewBucket, "snapshot" | "localSnapshot" | "confirmedAt">;

/** What reading the state needs of a function's `ctx`: the views of {@link STATE_VIEWS}, and the graces in seconds. */
export interface StateContext {
  readonly views: Readonly<Record<StateView, StateViewBucket>>;
  readonly config: {
    readonly provisioning: { readonly graceSeconds: number };
    readonly rotation: { readonly graceSeconds: number };
    readonly presence: { readonly ttlSeconds: number };
  };
}

/**
 * The snapshots of the views state reads ({@link STATE_VIEWS}): those of `fresh` (all by
 * default) checked current once each, the others, or all with `stale`, as held.
 */
export async function snapshotsOf(
  views: Readonly<Record<StateView, Pick<StateViewBucket, "snapshot" | "localSnapshot">>>,
  stale = false,
  fresh: readonly StateView[] = STATE_VIEWS,
): Promise<StateInputs> {
  const taken = await Promise.all(
    STATE_VIEWS.map((name) => (stale || !fresh.includes(name) ? views[name].localSnapshot() : views[name].snapshot())),
  );
  return Object.fromEntries(STATE_VIEWS.map((name, i) => [name, taken[i]!])) as unknown as StateInputs;
}

/**
 * The model of `ctx`'s views now ({@link currentModel}), and the snapshots it was made of: each
 * view checked current once, or with `stale` as held (docs/verb.md §4.6.1). With `stale`,
 * `confirmedAt` is the oldest of the views' last confirmations, read before what they hold
 * (`null` when one was never confirmed); without, `undefined`. With `fresh`, only those views are
 * checked (and their confirmations read), the others read as held: for an answer that depends on
 * them alone (what=nodes, {@link NODE_VIEWS}).
 */
export async function readModel(
  ctx: StateContext,
  { stale = false, fresh = STATE_VIEWS }: { stale?: boolean; fresh?: readonly StateView[] } = {},
): Promise<{ inputs: StateInputs; model: Model; confirmedAt: Date | null | undefined }> {
  const confirmations = stale ? fresh.map((v) => ctx.views[v].confirmedAt()) : undefined;
  const inputs = await snapshotsOf(ctx.views, stale, fresh);
  const model = await currentModel(
    inputs,
    ctx.config.provisioning.graceSeconds,
    ctx.config.rotation.graceSeconds,
    ctx.config.presence.ttlSeconds,
  );
  return { inputs, model, confirmedAt: confirmations === undefined ? undefined : oldestConfirmed(confirmations) };
}

/** The oldest of views' last confirmations (docs/verb.md §4.6.1): `null` when one was never confirmed. */
export function oldestConfirmed(confirmations: readonly (Date | null)[]): Date | null {
  return confirmations.includes(null) ? null : new Date(Math.min(...confirmations.map((d) => d!.getTime())));
}
