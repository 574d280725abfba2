/**
 * Queries of a model at a time asked (docs/state.md §7.5): a module's state with what depends on
 * the time added (`Late` and `Stale` once their graces have passed, its node's presence,
 * `Unconfirmed` and `ProviderUnreachable`, docs/presence.md §16.2), the modules narrowed by node
 * and module, what status says of provisioning, the stale holders and the modules by condition.
 */
import type { StaleHolder } from "../rotation.ts";
import { lateCondition, providerUnreachableCondition, staleCondition, unconfirmedCondition } from "./conditions.ts";
import { presenceAt, unreachableNodes } from "./presence.ts";
import {
  zeroCounts,
  type Condition,
  type ConditionType,
  type Model,
  type Modules,
  type ModuleState,
  type NodePresence,
  type Presence,
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

/** The needs of a module naming a provider module whose every assigned node is unreachable at `now`, each with when the last of them became so. */
function unreachableProviderNeeds(model: Model, m: TrackedModule, now: Date) {
  const found: (TrackedModule["providerNeeds"][number] & { since: number })[] = [];
  for (const need of m.providerNeeds) {
    let since = 0;
    for (const node of need.nodes) {
      const p = presenceAt(model.presence, node, now);
      if (p.since === null) {
        since = -1;
        break;
      }
      since = Math.max(since, p.since);
    }
    if (since > 0) found.push({ ...need, since });
  }
  return found;
}

/** A module's checks with how many are unconfirmed: all of them while its node is not reachable (docs/presence.md §16.5). */
const checksAt = (m: TrackedModule, presence: Presence): ModuleState["checks"] => ({
  ...m.checks,
  unconfirmed: presence === "reachable" ? 0 : m.checks.ok + m.checks.failing,
});

// A module's state with no condition of the time asked, by the tracked module (the model keeps
// the same object while the module is unchanged): the last made, while its node's presence is the same.
const plainStates = new WeakMap<TrackedModule, ModuleState>();

/** A module's state with none of the conditions of the time asked, at its node's `presence`. */
function plainStateOf(m: TrackedModule, presence: Presence): ModuleState {
  let made = plainStates.get(m);
  if (made?.presence !== presence) plainStates.set(m, (made = { ...m.base, presence, checks: checksAt(m, presence) }));
  return made;
}

/**
 * A module of `model` at `now`: `Late` added once its grace (`graceSeconds`) has passed, `Stale`
 * once a stale holder's has, its node's presence, `Unconfirmed` while its node is unreachable
 * and `ProviderUnreachable` while every node of a provider it names is (docs/presence.md §16.2).
 * With none of these conditions, its `conditions` are the tracked module's own (the same array).
 */
export function stateAt(model: Model, m: TrackedModule, now: Date, graceSeconds: number): ModuleState {
  const late = isLateAt(m, now) ? lateCondition(m.base, m.lateAt!, graceSeconds) : undefined;
  const stale = m.stale.length === 0 ? undefined : staleCondition(staleHoldersAt(m, now));
  const presence = presenceAt(model.presence, m.base.node, now);
  const unconfirmed =
    presence.since === null ? undefined : unconfirmedCondition(m.base.node, presence.since, model.presence.get(m.base.node)!.lastSeen);
  const providerUnreachable =
    m.providerNeeds.length === 0 ? undefined : providerUnreachableCondition(unreachableProviderNeeds(model, m, now));
  const added = [late, unconfirmed, providerUnreachable, stale];
  if (added.every((c) => c === undefined)) return plainStateOf(m, presence.presence);
  const some = (c: Condition | undefined): Condition[] => (c === undefined ? [] : [c]);
  return {
    ...m.base,
    conditions: [...some(late), ...m.base.conditions, ...some(unconfirmed), ...some(providerUnreachable), ...some(stale)],
    presence: presence.presence,
    checks: checksAt(m, presence.presence),
  };
}

/** Whether a module is `Unconfirmed` at `now`: its node is unreachable. */
const isUnconfirmedAt = (model: Model, m: TrackedModule, now: Date) => presenceAt(model.presence, m.base.node, now).since !== null;
/** Whether a module is `ProviderUnreachable` at `now`. */
const isProviderUnreachableAt = (model: Model, m: TrackedModule, now: Date) =>
  m.providerNeeds.length > 0 && unreachableProviderNeeds(model, m, now).length > 0;

/** Whether a module counts against the mesh at `now` (docs/state.md §7.4): not well, and not progressing within its grace. */
export const countsAgainstAt = (model: Model, m: TrackedModule, now: Date) =>
  m.countsAgainstAnyTime ||
  isLateAt(m, now) ||
  isStaleAt(m, now) ||
  isUnconfirmedAt(model, m, now) ||
  isProviderUnreachableAt(model, m, now);

/**
 * The modules that may count against the mesh at `now` (docs/state.md §7.5): the watched ones,
 * those of unreachable nodes, and the consumers of a provider whose every node is unreachable;
 * in key order.
 */
function* mayCountAgainst(model: Model, now: Date): Generator<TrackedModule> {
  const unreachable = [...unreachableNodes(model.presence, now)];
  if (unreachable.length === 0) {
    yield* model.watched.values();
    return;
  }
  const more = new Map<string, TrackedModule>();
  for (const p of unreachable) for (const m of modulesOf(model.modules, { node: p.node })) more.set(m.base.key, m);
  for (const m of model.consumers.values()) if (isProviderUnreachableAt(model, m, now)) more.set(m.base.key, m);
  for (const m of model.watched.values()) more.set(m.base.key, m);
  yield* [...more.keys()].sort().map((k) => more.get(k)!);
}

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
  for (const tracked of narrowed ? modulesOf(model.modules, narrowing) : mayCountAgainst(model, now)) {
    if (narrowed) (counts as Record<State, number>)[tracked.base.state]++;
    if (countsAgainstAt(model, tracked, now)) notWell.push(stateAt(model, tracked, now, graceSeconds));
  }
  return { counts, notWell, omitted: 0 };
}

/** How many modules of `model` count against the mesh at `now` (docs/state.md §7.6): status is not well while any do. */
export function notWellCount(model: Model, now: Date): number {
  let notWell = 0;
  for (const tracked of mayCountAgainst(model, now)) if (countsAgainstAt(model, tracked, now)) notWell++;
  return notWell;
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

/** Modules carrying each condition at `now`, those that depend on the time included. */
export function conditionsAt(model: Model, now: Date): Record<ConditionType, number> {
  const counted = { ...model.conditions };
  for (const tracked of mayCountAgainst(model, now)) {
    if (isLateAt(tracked, now)) counted.Late++;
    if (isStaleAt(tracked, now)) counted.Stale++;
    if (isUnconfirmedAt(model, tracked, now)) counted.Unconfirmed++;
    if (isProviderUnreachableAt(model, tracked, now)) counted.ProviderUnreachable++;
  }
  return counted;
}

/** A module's state at `now` by its key `<node>.<module>`, or `undefined` when the model has no such module. */
export function moduleStateAt(model: Model, key: string, now: Date, graceSeconds: number): ModuleState | undefined {
  const tracked = model.modules.get(key);
  return tracked === undefined ? undefined : stateAt(model, tracked, now, graceSeconds);
}

/** A node as `what=nodes` answers it (docs/presence.md §16.3). */
export interface NodeEntry {
  /** The node's name, as every entry of the verb has its key. */
  readonly key: string;
  readonly node: string;
  readonly presence: Presence;
  /** When it became unreachable, or `null`. */
  readonly since: string | null;
  /** Its last presence write, or `null` (silent). */
  readonly lastSeen: string | null;
  readonly everySeconds: number | null;
  readonly client: string | null;
  /** How many of its modules the state lists. */
  readonly modules: number;
}

/**
 * The nodes of `model` at `now` in key order (docs/presence.md §16.3): every node with a listed
 * module or a presence write, from the first after `after` (exclusive), `node` alone when given.
 */
export function* nodesAt(model: Model, now: Date, narrowing: { node?: string; after?: string } = {}): Generator<NodeEntry> {
  const { node, after } = narrowing;
  if (node !== undefined && after !== undefined && after >= node) return;
  const from = node ?? (after === undefined ? undefined : `${after}\u0000`);
  const listed = model.nodes.keys(from)[Symbol.iterator]();
  const present = model.presence.keys(from)[Symbol.iterator]();
  let a = listed.next();
  let b = present.next();
  while (!a.done || !b.done) {
    const name = b.done || (!a.done && a.value <= b.value) ? a.value! : b.value!;
    if (!a.done && a.value === name) a = listed.next();
    if (!b.done && b.value === name) b = present.next();
    if (node !== undefined && name !== node) return;
    const p = model.presence.get(name);
    const at = presenceAt(model.presence, name, now);
    yield {
      key: name,
      node: name,
      presence: at.presence,
      since: at.since === null ? null : new Date(at.since).toISOString(),
      lastSeen: p === undefined ? null : new Date(p.lastSeen).toISOString(),
      everySeconds: p?.everySeconds ?? null,
      client: p?.client ?? null,
      modules: model.nodes.get(name) ?? 0,
    };
  }
}

/** What status says of the nodes (docs/presence.md §16.3): how many are in each presence, and the unreachable ones. */
export interface NodesStatus {
  readonly counts: Readonly<Record<Presence, number>>;
  readonly unreachable: readonly { readonly node: string; readonly since: string; readonly lastSeen: string }[];
}

/** The nodes of `model` at `now` as status says them, `node` alone when given. */
export function nodesStatusOf(model: Model, now: Date, narrowing: { node?: string } = {}): NodesStatus {
  const counts: Record<Presence, number> = { reachable: 0, unreachable: 0, silent: 0 };
  const unreachable: { node: string; since: string; lastSeen: string }[] = [];
  const said = (p: NodePresence) => ({
    node: p.node,
    since: new Date(p.unreachableAt).toISOString(),
    lastSeen: new Date(p.lastSeen).toISOString(),
  });
  if (narrowing.node !== undefined) {
    for (const n of nodesAt(model, now, narrowing)) {
      counts[n.presence]++;
      if (n.presence === "unreachable") unreachable.push({ node: n.node, since: n.since!, lastSeen: n.lastSeen! });
    }
    return { counts, unreachable };
  }
  // Unnarrowed, nothing is made per node but for the unreachable ones.
  const t = now.getTime();
  for (const p of model.presence.values()) {
    if (t < p.unreachableAt) counts.reachable++;
    else unreachable.push(said(p));
  }
  counts.unreachable = unreachable.length;
  for (const node of model.nodes.keys()) if (!model.presence.has(node)) counts.silent++;
  return { counts, unreachable };
}

/**
 * How many kept checks fail (docs/presence.md §16.5), of the modules on `node` named `module`
 * when given, whether the model lists the module or not.
 */
export function failingChecksOf(model: Model, narrowing: { node?: string; module?: string } = {}): number {
  if (narrowing.node === undefined && narrowing.module === undefined) return model.checks.failing;
  let failing = 0;
  for (const [key, list] of model.keptChecks) {
    const dot = key.indexOf(".");
    if (narrowing.node !== undefined && key.slice(0, dot) !== narrowing.node) continue;
    if (narrowing.module !== undefined && key.slice(dot + 1) !== narrowing.module) continue;
    for (const c of list) if (!c.ok) failing++;
  }
  return failing;
}

/** How many kept checks are unconfirmed at `now`: those of a node that is not reachable (docs/presence.md §16.5). */
export function unconfirmedChecksOf(model: Model, now: Date): number {
  let unconfirmed = 0;
  for (const [key, list] of model.keptChecks) {
    if (presenceAt(model.presence, key.slice(0, key.indexOf(".")), now).presence !== "reachable") unconfirmed += list.length;
  }
  return unconfirmed;
}
