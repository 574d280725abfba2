/**
 * Queries of a model at a time asked (docs/state.md §7.5): a module's state with `Late` and
 * `Stale` added once their graces have passed, the modules narrowed by node and module, what
 * status says of provisioning, the stale holders and the modules by condition.
 */
import type { StaleHolder } from "../rotation.ts";
import { lateCondition, staleCondition } from "./conditions.ts";
import {
  zeroCounts,
  type ConditionType,
  type Model,
  type Modules,
  type ModuleState,
  type Provisioning,
  type State,
  type TrackedModule,
} from "./vocabulary.ts";

/** The holders of a module stale past their rotation's grace at `now`. */
export const staleHoldersAt = (m: TrackedModule, now: Date) => m.stale.filter((h) => now.getTime() >= h.staleAt);
/** Whether a module is Late at `now`: never-ran or pending past its grace. */
const isLateAt = (m: TrackedModule, now: Date) => m.lateAt !== null && now.getTime() >= m.lateAt;
/** Whether a module holds a holder stale past its rotation's grace at `now`. */
const isStaleAt = (m: TrackedModule, now: Date) => m.stale.some((h) => now.getTime() >= h.staleAt);

/** A module's state at `now`: `Late` added once its grace (`graceSeconds`) has passed, `Stale` once a stale holder's has. */
export function stateAt(m: TrackedModule, now: Date, graceSeconds: number): ModuleState {
  const late = isLateAt(m, now) ? lateCondition(m.base, m.lateAt!, graceSeconds) : undefined;
  const stale = m.stale.length === 0 ? undefined : staleCondition(staleHoldersAt(m, now));
  if (late === undefined && stale === undefined) return m.base;
  return {
    ...m.base,
    conditions: [...(late === undefined ? [] : [late]), ...m.base.conditions, ...(stale === undefined ? [] : [stale])],
  };
}

/** Whether a module counts against the mesh at `now` (docs/state.md §7.4): not well, and not progressing within its grace. */
export const countsAgainstAt = (m: TrackedModule, now: Date) => m.countsAgainstAnyTime || isLateAt(m, now) || isStaleAt(m, now);

/**
 * The modules of `modules` in key order, from the first after `after` (exclusive) on `node`,
 * and named `module` (each when given): a node's modules are one range of keys; a module's name
 * alone is looked for among every module.
 */
export function* modulesOf(modules: Modules, narrowing: { node?: string; module?: string; after?: string } = {}): Generator<TrackedModule> {
  const { node, module, after } = narrowing;
  const begin = node === undefined ? "" : `${node}.`;
  const from = after !== undefined && after > begin ? `${after}\u0000` : begin;
  for (const tracked of modules.values(from)) {
    if (node !== undefined && !tracked.base.key.startsWith(begin)) return;
    if (module !== undefined && tracked.base.module !== module) continue;
    yield tracked;
  }
}

/**
 * Provisioning of the modules of `model` on `node` and named `module` (each when given), at
 * `now`. Not narrowed, it reads only the modules watched (docs/state.md §7.5).
 */
export function provisioningOf(
  model: Model,
  now: Date,
  graceSeconds: number,
  narrowing: { node?: string; module?: string } = {},
): Provisioning {
  const narrowed = narrowing.node !== undefined || narrowing.module !== undefined;
  const counts = narrowed ? zeroCounts() : model.counts;
  const notWell: ModuleState[] = [];
  for (const tracked of modulesOf(narrowed ? model.modules : model.watched, narrowing)) {
    if (narrowed) (counts as Record<State, number>)[tracked.base.state]++;
    if (countsAgainstAt(tracked, now)) notWell.push(stateAt(tracked, now, graceSeconds));
  }
  return { counts, notWell, omitted: 0 };
}

/** The holders stale past their rotation's grace at `now` (docs/rotation.md §8.3), narrowed as status is. */
export function staleHoldersOf(
  model: Model,
  now: Date,
  narrowing: { provider?: string; node?: string; module?: string } = {},
): StaleHolder[] {
  const found: StaleHolder[] = [];
  for (const tracked of model.watched.values()) {
    if (tracked.stale.length === 0) continue;
    for (const { staleAt: _, ...h } of staleHoldersAt(tracked, now)) {
      if (narrowing.provider !== undefined && h.provider !== narrowing.provider) continue;
      if (narrowing.node !== undefined && h.node !== narrowing.node) continue;
      if (narrowing.module !== undefined && h.module !== narrowing.module) continue;
      found.push(h);
    }
  }
  return found;
}

/** Modules carrying each condition at `now`, Late and Stale included. */
export function conditionsAt(model: Model, now: Date): Record<ConditionType, number> {
  const counted = { ...model.conditions };
  for (const tracked of model.watched.values()) {
    if (isLateAt(tracked, now)) counted.Late++;
    if (isStaleAt(tracked, now)) counted.Stale++;
  }
  return counted;
}

/** A module's state at `now` by its key `<node>.<module>`, or `undefined` when the model has no such module. */
export function moduleStateAt(model: Model, key: string, now: Date, graceSeconds: number): ModuleState | undefined {
  const tracked = model.modules.get(key);
  return tracked === undefined ? undefined : stateAt(tracked, now, graceSeconds);
}
