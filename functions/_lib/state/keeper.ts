/**
 * The model kept (docs/state.md §7.5): made from the whole of the views once, then kept up to
 * date from the keys changed since (docs/runtime.md §6.12), so a request pays for the modules
 * changed since the last one, not for the size of the mesh. One concept, over 400 lines: the
 * keeper's upkeep (what a change remakes) reads best whole.
 */
import { createRequire } from "node:module";
import type { Entry, KeyRecord } from "../../../runtime/index.ts";
import { decodeKey } from "../../../contract/keys.ts";
import { keeping, type Changes } from "../keeping.ts";
import { byKey, sameJson } from "../text.ts";
import type { FailingProvider } from "./conditions.ts";
import type { Check } from "../checks.ts";
import {
  checksByModule,
  failingByModule,
  gatherByModule,
  moduleOfKey,
  rotatedRevisions,
  staleByModule,
  type GatheredRecords,
} from "./gather.ts";
import { presenceOfEntry } from "./presence.ts";
import {
  isReady,
  isWatched,
  modulePartsOf,
  trackedModuleOf,
  type CrossModuleFacts,
  type ModuleParts,
  type ProviderNodes,
} from "./module.ts";
import {
  zeroConditionCounts,
  zeroCounts,
  type Model,
  type NodePresence,
  type OutOfShapeKey,
  type StateInputs,
  type TimedStaleHolder,
  type TrackedModule,
} from "./vocabulary.ts";

// Required, not imported: a CommonJS module whose default export tsx and vitest unwrap differently.
const { default: BTree } = createRequire(import.meta.url)("sorted-btree") as typeof import("sorted-btree");
type ModuleTree = InstanceType<typeof BTree<string, TrackedModule>>;
type PresenceTree = InstanceType<typeof BTree<string, NodePresence>>;
type NodeTree = InstanceType<typeof BTree<string, number>>;

/** What the model is kept up to date from: each module's {@link ModuleParts}, and what its conditions read of other modules and buckets. */
interface ModelKeeper extends CrossModuleFacts {
  readonly rotationGraceSeconds: number;
  readonly presenceTtlSeconds: number;
  readonly parts: Map<string, ModuleParts>;
  /** Keys out of shape that name no module, by `<bucket>:<key>`. */
  readonly noModuleOutOfShape: Map<string, OutOfShapeKey>;
  /** The registry's kinds: those some domain answers. */
  kinds: ReadonlySet<string>;
  failing: Map<string, readonly FailingProvider[]>;
  stale: Map<string, readonly TimedStaleHolder[]>;
  checks: Map<string, readonly Check[]>;
  rotatedTo: Map<string, string>;
  /** How many rotations are kept. */
  rotations: number;
  readonly providerNodes: Map<string, ProviderNodes>;
  /** The modules with a need naming each provider (its consumers), by provider. */
  readonly consumersByProvider: Map<string, Set<string>>;
  model: Model;
}

/** The keys of `a` and `b` whose values differ (as JSON). */
function differing<V>(a: ReadonlyMap<string, V>, b: ReadonlyMap<string, V>): string[] {
  const keys = new Set([...a.keys(), ...b.keys()]);
  return [...keys].filter((k) => !sameJson(a.get(k), b.get(k)));
}

const EMPTY_MODEL: Model = {
  modules: new BTree<string, TrackedModule>(),
  watched: new BTree<string, TrackedModule>(),
  outOfShape: [],
  counts: zeroCounts(),
  conditions: zeroConditionCounts(),
  staleHolders: 0,
  checks: { ok: 0, failing: 0 },
  keptChecks: new Map(),
  consumers: new BTree<string, TrackedModule>(),
  presence: new BTree<string, NodePresence>(),
  nodes: new BTree<string, number>(),
};

/**
 * Brings `keeper` up to date: `gathered` holds the records of every module to make again (the
 * whole mesh when `keeper` is new), `now` the failing providers and stale holders as they are
 * now, `noModuleChanged` the keys naming no module that changed (`null`: gone); modules naming a
 * provider whose assignments or readiness changed, or whose failing providers or stale holders
 * changed, are made again from their parts; `presence` holds the presence writes changed
 * (`null`: deleted), by node. The model made is a new one; the one before is left as it was.
 */
function applyChanges(
  keeper: ModelKeeper,
  gathered: GatheredRecords,
  regathered: Iterable<string>,
  now: {
    failing?: Map<string, readonly FailingProvider[]>;
    stale?: { rotations: number; byModule: Map<string, readonly TimedStaleHolder[]> };
    checks?: Map<string, readonly Check[]>;
    rotatedTo?: Map<string, string>;
  },
  noModuleChanged: ReadonlyMap<string, OutOfShapeKey | null>,
  presenceChanged: ReadonlyMap<string, NodePresence | null> = new Map(),
): Model {
  const before = keeper.model;
  const modules = (before.modules as ModuleTree).clone();
  const watched = (before.watched as ModuleTree).clone();
  const consumers = (before.consumers as ModuleTree).clone();
  const nodes = (before.nodes as NodeTree).clone();
  let presence = before.presence as PresenceTree;
  if (presenceChanged.size > 0) {
    presence = presence.clone();
    for (const [node, p] of presenceChanged) {
      if (p === null) presence.delete(node);
      else presence.set(node, p);
    }
  }
  /** Counts a listed module of `key`'s node in or out. */
  const countNode = (key: string, by: 1 | -1) => {
    const node = key.slice(0, key.indexOf("."));
    const n = (nodes.get(node) ?? 0) + by;
    if (n === 0) nodes.delete(node);
    else nodes.set(node, n);
  };
  const counts = { ...before.counts };
  const conditions = { ...before.conditions };
  let { staleHolders } = before;
  let checks = before.checks;
  const remake = new Set<string>();
  if (now.checks !== undefined) {
    for (const key of differing(keeper.checks, now.checks)) remake.add(key);
    keeper.checks = now.checks;
    // Counted from every kept check, as what=checks and the alerts see them: a module the model does not list has checks too.
    const counted = { ok: 0, failing: 0 };
    for (const list of now.checks.values()) for (const c of list) counted[c.ok ? "ok" : "failing"]++;
    checks = counted;
  }
  if (now.rotatedTo !== undefined) {
    // What a failing check says depends on the newest revision of its provision.
    if (!sameJson([...keeper.rotatedTo], [...now.rotatedTo])) {
      for (const [key, list] of keeper.checks) if (list.some((c) => !c.ok)) remake.add(key);
    }
    keeper.rotatedTo = now.rotatedTo;
  }
  if (now.failing !== undefined) {
    for (const key of differing(keeper.failing, now.failing)) remake.add(key);
    keeper.failing = now.failing;
  }
  if (now.stale !== undefined) {
    for (const key of differing(keeper.stale, now.stale.byModule)) remake.add(key);
    keeper.stale = now.stale.byModule;
    keeper.rotations = now.stale.rotations;
  }
  let answerOutOfShapeChanged = noModuleChanged.size > 0;
  for (const [key, found] of noModuleChanged) {
    if (found === null) keeper.noModuleOutOfShape.delete(key);
    else keeper.noModuleOutOfShape.set(key, found);
  }
  // Each module gathered again: its parts, and what it adds to the providers.
  const changedProviders = new Set<string>();
  for (const key of regathered) {
    remake.add(key);
    const old = keeper.parts.get(key);
    const next = modulePartsOf(key, gathered.byModule.get(key), gathered.answerOutOfShape.get(key) ?? [], keeper.kinds);
    if (old?.answerOutOfShape.length || next.answerOutOfShape.length) answerOutOfShapeChanged = true;
    if (next.listed || next.answerOutOfShape.length > 0) keeper.parts.set(key, next);
    else keeper.parts.delete(key);
    const [node, module] = key.split(".") as [string, string];
    const was = { assigned: old?.base?.assigned === true, ready: old?.base !== undefined && isReady(old.base) };
    const is = { assigned: next.base?.assigned === true, ready: next.base !== undefined && isReady(next.base) };
    // Its applied revisions where it is assigned: what its consumers' RevisionMismatch compares with.
    const revisionsWere = was.assigned ? old?.revisions : undefined;
    const revisionsAre = is.assigned ? next.revisions : undefined;
    if (was.assigned !== is.assigned || (was.assigned && was.ready !== is.ready) || !sameJson(revisionsWere, revisionsAre)) {
      let p = keeper.providerNodes.get(module);
      if (p === undefined) keeper.providerNodes.set(module, (p = { assigned: new Set(), ready: new Set(), revisions: new Map() }));
      p.assigned.delete(node);
      p.ready.delete(node);
      p.revisions.delete(node);
      if (is.assigned) p.assigned.add(node);
      if (is.assigned && is.ready) p.ready.add(node);
      if (revisionsAre !== undefined) p.revisions.set(node, revisionsAre);
      if (p.assigned.size === 0) keeper.providerNodes.delete(module);
      changedProviders.add(module);
    }
    for (const n of old?.providerNeeds ?? []) keeper.consumersByProvider.get(n.provider)?.delete(key);
    for (const n of next.providerNeeds) {
      let consumers = keeper.consumersByProvider.get(n.provider);
      if (consumers === undefined) keeper.consumersByProvider.set(n.provider, (consumers = new Set()));
      consumers.add(key);
    }
  }
  for (const provider of changedProviders) for (const key of keeper.consumersByProvider.get(provider) ?? []) remake.add(key);
  for (const [provider, consumers] of keeper.consumersByProvider) if (consumers.size === 0) keeper.consumersByProvider.delete(provider);

  for (const key of remake) {
    const old = modules.get(key);
    if (old !== undefined) {
      counts[old.base.state]--;
      for (const c of old.base.conditions) conditions[c.type]--;
      staleHolders -= old.stale.length;
      watched.delete(key);
      consumers.delete(key);
      countNode(key, -1);
    }
    const p = keeper.parts.get(key);
    if (p === undefined || !p.listed) {
      modules.delete(key);
      continue;
    }
    const tracked = trackedModuleOf(key, p, keeper);
    modules.set(key, tracked);
    countNode(key, 1);
    counts[tracked.base.state]++;
    for (const c of tracked.base.conditions) conditions[c.type]++;
    staleHolders += tracked.stale.length;
    if (isWatched(tracked)) watched.set(key, tracked);
    if (tracked.providerNeeds.length > 0) consumers.set(key, tracked);
  }
  const outOfShape = !answerOutOfShapeChanged
    ? before.outOfShape
    : [...keeper.noModuleOutOfShape.values(), ...[...keeper.parts.values()].flatMap((p) => p.answerOutOfShape)].sort(byKey);
  keeper.model = {
    modules,
    watched,
    outOfShape,
    counts,
    conditions,
    staleHolders,
    checks,
    keptChecks: keeper.checks,
    consumers,
    presence,
    nodes,
  };
  return keeper.model;
}

/**
 * The live records of a read, as the view keeps them: read as records (not entries), so making
 * the model makes no object per key, and what is derived per record is kept by the record itself.
 */
const liveRecords = async (records: Promise<KeyRecord[]>) => (await records).filter((r) => !r.deleted);

/** How many modules are gathered at once when the model is made whole. */
const MODULES_A_BATCH = 1000;

/**
 * The presence writes of `entries` (deleted ones `null`) by node, and the keys among them out of
 * shape by `presence:<key>` (`null`: in shape again): what {@link applyChanges} takes.
 */
function presenceChanges(
  entries: readonly (Entry | { key: string; deleted: true })[],
  ttlSeconds: number,
): { changed: Map<string, NodePresence | null>; outOfShape: Map<string, OutOfShapeKey | null> } {
  const changed = new Map<string, NodePresence | null>();
  const outOfShape = new Map<string, OutOfShapeKey | null>();
  for (const entry of entries) {
    if ("deleted" in entry && entry.deleted) {
      changed.set(entry.key, null);
      outOfShape.set(`presence:${entry.key}`, null);
      continue;
    }
    const read = presenceOfEntry(entry as Entry, ttlSeconds);
    if (read.presence !== undefined) changed.set(entry.key, read.presence);
    outOfShape.set(`presence:${entry.key}`, read.bad ?? null);
  }
  return { changed, outOfShape };
}

/** A new keeper, its model made from the whole of every view. */
async function makeKeeper(
  inputs: StateInputs,
  graceSeconds: number,
  rotationGraceSeconds: number,
  presenceTtlSeconds: number,
): Promise<ModelKeeper> {
  const [assignments, needs, applied, registry, failing, stale, presenceEntries, checks, rotatedTo] = await Promise.all([
    inputs.assignments.reads.records(">"),
    liveRecords(inputs.needs.reads.records(">")),
    liveRecords(inputs.applied.reads.records(">")),
    inputs.registry.reads.list(">"),
    failingByModule(inputs.failing),
    staleByModule(inputs, rotationGraceSeconds),
    inputs.presence.reads.list(">"),
    checksByModule(inputs.checks),
    rotatedRevisions(inputs.rotations),
  ]);
  const keeper: ModelKeeper = {
    graceSeconds,
    rotationGraceSeconds,
    presenceTtlSeconds,
    parts: new Map(),
    noModuleOutOfShape: new Map(),
    kinds: new Set(registry.map((e) => e.key)),
    failing: new Map(),
    stale: new Map(),
    checks: new Map(),
    rotatedTo: new Map(),
    rotations: 0,
    providerNodes: new Map(),
    consumersByProvider: new Map(),
    model: EMPTY_MODEL,
  };
  // A batch of modules at a time: what is gathered of one is garbage before the next is, so
  // making the model of a large mesh does not grow the heap by all its needs at once.
  const batches: { assignments: KeyRecord[]; needs: KeyRecord[]; applied: KeyRecord[] }[] = [];
  const batchOf = new Map<string, number>();
  const addToBatches = (bucket: "assignments" | "needs" | "applied", records: readonly KeyRecord[]) => {
    for (const record of records) {
      const module = moduleOfKey(record.key) ?? "";
      let batch = batchOf.get(module);
      if (batch === undefined) batchOf.set(module, (batch = Math.floor(batchOf.size / MODULES_A_BATCH)));
      (batches[batch] ??= { assignments: [], needs: [], applied: [] })[bucket].push(record);
    }
  };
  addToBatches("assignments", assignments);
  addToBatches("needs", needs);
  addToBatches("applied", applied);
  batchOf.clear();
  const presence = presenceChanges(presenceEntries, presenceTtlSeconds);
  let first = true;
  for (const batch of batches.length === 0 ? [{ assignments: [], needs: [], applied: [] }] : batches) {
    const gathered = gatherByModule(batch.assignments, batch.needs, batch.applied);
    const regathered = new Set([...gathered.byModule.keys(), ...gathered.answerOutOfShape.keys()]);
    const noModule = first ? new Map([...gathered.noModuleOutOfShape, ...presence.outOfShape]) : gathered.noModuleOutOfShape;
    applyChanges(
      keeper,
      gathered,
      regathered,
      first ? { failing, stale, checks, rotatedTo } : {},
      noModule,
      first ? presence.changed : undefined,
    );
    first = false;
    // Requests in hand go on between batches.
    await new Promise((resolve) => setImmediate(resolve));
  }
  return keeper;
}

/**
 * `keeper` brought up to date with the keys changed since (docs/runtime.md §6.12): each module a
 * changed key of the assignments, needs or applied bucket names gathered again from the views
 * (its assignment, `<node>.<module>.>` of each bucket), the failing providers read again when the
 * failing bucket changed, the stale holders when a rotation is kept and the rotations, needs or
 * applied changed. A changed registry makes the whole model again.
 */
async function updateKeeper(keeper: ModelKeeper, inputs: StateInputs, changes: Changes<StateInputs>): Promise<ModelKeeper> {
  if (changes.registry.length > 0) {
    const kinds = new Set((await inputs.registry.reads.list(">")).map((e) => e.key));
    if (kinds.size !== keeper.kinds.size || [...kinds].some((k) => !keeper.kinds.has(k))) {
      return makeKeeper(inputs, keeper.graceSeconds, keeper.rotationGraceSeconds, keeper.presenceTtlSeconds);
    }
  }
  const regather = new Set<string>();
  const noModuleKeys: [bucket: "assignments" | "needs" | "applied", key: string][] = [];
  for (const bucket of ["assignments", "needs", "applied"] as const) {
    for (const key of changes[bucket]) {
      const module = moduleOfKey(key);
      if (module === undefined) noModuleKeys.push([bucket, key]);
      else regather.add(module);
    }
  }
  const staleChanged = changes.rotations.length > 0 || (keeper.rotations > 0 && (changes.needs.length > 0 || changes.applied.length > 0));
  const [records, noModuleRecords, failing, stale, presenceRead, checks, rotatedTo] = await Promise.all([
    Promise.all(
      [...regather].map(async (module) => {
        const [assignment, assignmentsUnder, need, needsUnder, applied, appliedUnder] = await Promise.all([
          inputs.assignments.reads.last(module),
          inputs.assignments.reads.records(`${module}.>`),
          inputs.needs.reads.last(module),
          inputs.needs.reads.records(`${module}.>`),
          inputs.applied.reads.last(module),
          inputs.applied.reads.records(`${module}.>`),
        ]);
        return {
          assignments: assignment === null ? assignmentsUnder : [assignment, ...assignmentsUnder],
          needs: [...(need === null ? [] : [need]), ...needsUnder].filter((r) => !r.deleted),
          applied: [...(applied === null ? [] : [applied]), ...appliedUnder].filter((r) => !r.deleted),
        };
      }),
    ),
    Promise.all(
      noModuleKeys.map(async ([bucket, key]) => {
        const reads = inputs[bucket].reads;
        const record = bucket === "assignments" ? await reads.last(key) : await reads.get(key);
        return [bucket, key, record === null || ("deleted" in record && record.deleted) ? null : record] as const;
      }),
    ),
    changes.failing.length > 0 ? failingByModule(inputs.failing) : undefined,
    staleChanged ? staleByModule(inputs, keeper.rotationGraceSeconds) : undefined,
    Promise.all(changes.presence.map(async (key) => (await inputs.presence.reads.get(key)) ?? { key, deleted: true as const })),
    changes.checks.length > 0 ? checksByModule(inputs.checks) : undefined,
    changes.rotations.length > 0 ? rotatedRevisions(inputs.rotations) : undefined,
  ]);
  const presence = presenceChanges(presenceRead, keeper.presenceTtlSeconds);
  const gathered = gatherByModule(
    records.flatMap((r) => r.assignments),
    records.flatMap((r) => r.needs),
    records.flatMap((r) => r.applied),
  );
  const noModuleChanged = new Map<string, OutOfShapeKey | null>();
  for (const [bucket, key, record] of noModuleRecords) {
    const decoded = decodeKey(bucket, key);
    noModuleChanged.set(`${bucket}:${key}`, record === null || decoded.ok ? null : { key: `${bucket}:${key}`, reason: decoded.reason });
  }
  for (const [key, found] of presence.outOfShape) noModuleChanged.set(key, found);
  applyChanges(
    keeper,
    gathered,
    regather,
    {
      ...(failing === undefined ? {} : { failing }),
      ...(stale === undefined ? {} : { stale }),
      ...(checks === undefined ? {} : { checks }),
      ...(rotatedTo === undefined ? {} : { rotatedTo }),
    },
    noModuleChanged,
    presence.changed,
  );
  return keeper;
}

// The keeper of the last views asked: made once from the whole of the views, then updated from what changed.
const modelCache = keeping(
  (inputs: StateInputs, graces: { graceSeconds: number; rotationGraceSeconds: number; presenceTtlSeconds: number }) =>
    makeKeeper(inputs, graces.graceSeconds, graces.rotationGraceSeconds, graces.presenceTtlSeconds),
  updateKeeper,
);

/** The model of `inputs` made from the whole of each view, kept nowhere: what {@link currentModel} keeps up to date. */
export const modelOf = async (
  inputs: StateInputs,
  graceSeconds: number,
  rotationGraceSeconds = 300,
  presenceTtlSeconds = 60,
): Promise<Model> => (await makeKeeper(inputs, graceSeconds, rotationGraceSeconds, presenceTtlSeconds)).model;

/**
 * The model of the views' snapshots now (each view checked current once, docs/verb.md §4.6):
 * made from the whole of the views once, then kept up to date from the keys changed since
 * (docs/state.md §7.5), so a request after a change pays for the modules it touched.
 * `graceSeconds`, `rotationGraceSeconds` and `presenceTtlSeconds` in seconds.
 */
export async function currentModel(
  inputs: StateInputs,
  graceSeconds: number,
  rotationGraceSeconds = 300,
  presenceTtlSeconds = 60,
): Promise<Model> {
  return (await modelCache(inputs, { graceSeconds, rotationGraceSeconds, presenceTtlSeconds })).model;
}
