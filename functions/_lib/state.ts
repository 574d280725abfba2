/**
 * Provisioning state (docs/state.md §7): for every module of every node, whether its provisioning
 * happened and why not, from the views of the assignments, needs, applied, registry and failing
 * buckets. Every comparison is on the times the server stored the writes (`created`).
 */
import { z } from "zod";
import { createRequire } from "node:module";
import type { Entry, KeyRecord, Snapshot } from "../../runtime/index.ts";
import { decodeKey, TOKEN } from "../../contract/keys.ts";
import { appliedIndex, appliedOf } from "./applied.ts";
import { keeping, type Changes } from "./keeping.ts";
import { cutText, failingOf } from "./follower.ts";
import { heldIn, holdersIndex, rotationConfig, rotationsIn, rotationStates, type StaleHolder } from "./rotation.ts";

// Required, not imported: a CommonJS module whose default export tsx and vitest unwrap differently.
const { default: BTree } = createRequire(import.meta.url)("sorted-btree") as typeof import("sorted-btree");

/** The states of a module (docs/state.md §7.3), in the order counts are said. */
export const STATES = ["unassigned", "never-ran", "pending", "failed", "declares-nothing", "applied"] as const;
export type State = (typeof STATES)[number];
/** The condition types (docs/state.md §7.4). */
export const CONDITIONS = [
  "Late",
  "Unanswerable",
  "ProviderFailing",
  "ProviderNotAssigned",
  "ProviderNotReady",
  "Stale",
  "OutOfShape",
] as const;
export type ConditionType = (typeof CONDITIONS)[number];

/** `provisioning` of `wrangler-free.config.ts` (docs/state.md §7): how long never-ran or pending may last before it is Late. */
export const provisioningConfig = z
  .object({
    provisioning: z.strictObject({ graceSeconds: z.number().int().min(1).default(600) }).default({ graceSeconds: 600 }),
  })
  .extend(rotationConfig.shape);

/** A condition of a module, the Kubernetes condition's shape: `reason` one CamelCase word, `message` a sentence, `since` when it began. */
export interface Condition {
  readonly type: ConditionType;
  readonly reason: string;
  readonly message: string;
  readonly since: string;
}

/** One module of one node (docs/state.md §7.5). */
export interface ModuleState {
  readonly key: string;
  readonly node: string;
  readonly module: string;
  readonly state: State;
  readonly since: string;
  readonly assigned: boolean;
  /** How many needs it has. */
  readonly needs: number;
  /** When its applied record was written, or `null`. */
  readonly appliedAt: string | null;
  readonly error?: string;
  readonly conditions: readonly Condition[];
}

export const conditionSchema = z.object({ type: z.enum(CONDITIONS), reason: z.string(), message: z.string(), since: z.string() });
export const moduleStateSchema = z.object({
  key: z.string(),
  node: z.string(),
  module: z.string(),
  state: z.enum(STATES),
  since: z.string(),
  assigned: z.boolean(),
  needs: z.number().int(),
  appliedAt: z.string().nullable(),
  error: z.string().optional(),
  conditions: z.array(conditionSchema),
}) satisfies z.ZodType<ModuleState>;

/** The views the state is made of, as snapshots (one freshness check each). */
export interface StateInputs {
  readonly assignments: Snapshot;
  readonly needs: Snapshot;
  readonly applied: Snapshot;
  readonly registry: Snapshot;
  readonly failing: Snapshot;
  readonly rotations: Snapshot;
}

/** A module as the model keeps it: its state without `Late`, which depends on the time asked. */
export interface Kept {
  readonly base: ModuleState;
  /** When it becomes Late (ms since the epoch): never-ran or pending only. */
  readonly lateAt: number | null;
  /** Whether it counts against the mesh whatever the time (a state or a condition besides Late and Stale). */
  readonly against: boolean;
  /** Its holders stale for a rotation (docs/rotation.md §8.3), each with when it passes the rotation's grace (ms since the epoch). */
  readonly stale: readonly (StaleHolder & { readonly staleAt: number })[];
}

/** Modules by key `<node>.<module>`, in key order (a B+ tree). */
export type Modules = Pick<ModuleTree, "get" | "has" | "size" | "keys" | "values" | "entries">;
type ModuleTree = InstanceType<typeof BTree<string, Kept>>;

/** Every module's state of one set of snapshots, and the keys that name no module. Never changed once made. */
export interface Model {
  /** Every module, by key. */
  readonly modules: Modules;
  /** The modules that count against the mesh, or may come to without a write (never-ran or pending: Late once their grace passes; holding a stale holder), by key. */
  readonly watched: Modules;
  /** Keys that name no module, by `<bucket>:<key>`. */
  readonly outOfShape: readonly { key: string; reason: string }[];
  readonly counts: Readonly<Record<State, number>>;
  /** Modules carrying each condition, Late and Stale left out (they depend on the time asked). */
  readonly conditions: Readonly<Record<ConditionType, number>>;
  /** Stale holders, within their grace or past it. */
  readonly staleHolders: number;
}

// Values are UTF-8 JSON: bytes that are not UTF-8 are said, never read as U+FFFD.
const decoder = new TextDecoder("utf-8", { fatal: true });
/** The longest `error` and condition message kept, in characters; a longer one is cut and marked with `…`. */
export const MAX_TEXT = 1024;
const cut = (text: string) => cutText(text, MAX_TEXT);
/** At most this many needs are named in one condition's message; the rest are counted. */
const NAMED = 10;
/** What a need's value says of its provider: its module name, or why it is out of shape. */
type NeedValue = { readonly provider?: string; readonly bad?: string };
const NONE: NeedValue = Object.freeze({});
// Read each time a module is gathered: the model keeps nothing per need.
function needValueOf(entry: Entry): NeedValue {
  let read = NONE;
  try {
    const value: unknown = JSON.parse(decoder.decode(entry.value));
    if (typeof value === "object" && value !== null && "provider" in value) {
      const provider = (value as { provider: unknown }).provider;
      read =
        typeof provider === "string" && TOKEN.test(provider)
          ? { provider }
          : { bad: `value's provider ${JSON.stringify(provider)} is not one token (a module's name)` };
    }
  } catch (err) {
    read = { bad: `value is not JSON: ${(err as Error).message}` };
  }
  return read;
}

interface Gathered {
  assignment?: KeyRecord;
  needs: { key: string; kind: string; name: string; created: Date; nanos: number; value: NeedValue }[];
  applied?: { created: Date; nanos: number; error?: string };
  outOfShape: { key: string; reason: string; at: Date }[];
}

/** Why an assignment's value is not JSON; null when it is. */
function assignmentProblem(record: KeyRecord): string | null {
  try {
    JSON.parse(decoder.decode(record.value));
    return null;
  } catch (err) {
    return `assignment value is not JSON: ${(err as Error).message}`;
  }
}

const iso = (d: Date) => d.toISOString();
const plural = (n: number, one: string, many = `${one}s`) => `${n} ${n === 1 ? one : many}`;

/** `node.module` of a key, when its first two tokens are tokens. */
function moduleOfKey(key: string): string | undefined {
  const [node, module] = key.split(".");
  return node !== undefined && module !== undefined && TOKEN.test(node) && TOKEN.test(module) ? `${node}.${module}` : undefined;
}

/** The state of one gathered module (docs/state.md §7.3), and when it began. */
function stateOf(g: Gathered): { state: State; since: Date } {
  const assigned = g.assignment !== undefined && !g.assignment.deleted;
  // By the server's nanoseconds: a need and an applied record of one millisecond are told apart.
  const first = (needs: Gathered["needs"]) => needs.reduce((a, b) => (b.nanos < a.nanos ? b : a)).created;
  if (!assigned) {
    if (g.assignment?.deleted) return { state: "unassigned", since: g.assignment.created };
    const records = [...g.needs, ...(g.applied === undefined ? [] : [g.applied])];
    return { state: "unassigned", since: records.reduce((a, b) => (b.nanos > a.nanos ? b : a)).created };
  }
  if (g.applied === undefined) {
    if (g.needs.length === 0) return { state: "never-ran", since: g.assignment!.created };
    return { state: "pending", since: first(g.needs) };
  }
  const after = g.needs.filter((n) => n.nanos > g.applied!.nanos);
  if (after.length > 0) return { state: "pending", since: first(after) };
  if (g.applied.error !== undefined) return { state: "failed", since: g.applied.created };
  return { state: g.needs.length === 0 ? "declares-nothing" : "applied", since: g.applied.created };
}

/** The needs a message names: at most {@link NAMED}, the rest counted. */
const names = (needs: readonly { kind: string; name: string }[]) =>
  needs
    .slice(0, NAMED)
    .map((n) => `${n.kind}.${n.name}`)
    .join(", ") + (needs.length > NAMED ? ` and ${needs.length - NAMED} more` : "");
/** At most {@link NAMED} parts of a message, the rest counted. */
const joined = (items: readonly string[]) =>
  cut(items.slice(0, NAMED).join("; ") + (items.length > NAMED ? `; and ${items.length - NAMED} more` : ""));
const earliest = (dates: readonly Date[]) => new Date(Math.min(...dates.map((d) => d.getTime())));

/** Records of the three buckets a module is made of, gathered by module; keys naming none apart. */
interface Gatherings {
  readonly byModule: Map<string, Gathered>;
  /** Keys out of shape said in the answer, by the module their first two tokens name (an assignment key with more than two). */
  readonly top: Map<string, { key: string; reason: string }[]>;
  /** Keys out of shape whose first two tokens are not tokens, by `<bucket>:<key>`. */
  readonly loose: Map<string, { key: string; reason: string }>;
}

/**
 * Gathers records of the assignments (delete markers included), needs and applied buckets by
 * module: the assignment, the needs decoded and their values read, the applied record's fields;
 * a key out of shape is its module's when its first two tokens are tokens.
 */
function gatherings(assignments: readonly KeyRecord[], needs: readonly Entry[], applied: readonly Entry[]): Gatherings {
  const byModule = new Map<string, Gathered>();
  const top = new Map<string, { key: string; reason: string }[]>();
  const loose = new Map<string, { key: string; reason: string }>();
  const at = (key: string) => {
    let g = byModule.get(key);
    if (g === undefined) byModule.set(key, (g = { needs: [], outOfShape: [] }));
    return g;
  };
  /** A key out of shape: the module's when it can be told, the answer's otherwise. */
  const misshapen = (bucket: string, key: string, reason: string, created: Date, module = moduleOfKey(key)) => {
    if (module === undefined) loose.set(`${bucket}:${key}`, { key: `${bucket}:${key}`, reason });
    else at(module).outOfShape.push({ key: `${bucket}:${key}`, reason, at: created });
  };
  for (const record of assignments) {
    const decoded = decodeKey("assignments", record.key);
    if (!decoded.ok) {
      if (record.deleted) continue;
      const found = { key: `assignments:${record.key}`, reason: decoded.reason };
      const module = moduleOfKey(record.key);
      if (module === undefined) loose.set(found.key, found);
      else top.set(module, [...(top.get(module) ?? []), found]);
      continue;
    }
    at(record.key).assignment = record;
    const problem = record.deleted ? null : assignmentProblem(record);
    if (problem !== null) at(record.key).outOfShape.push({ key: `assignments:${record.key}`, reason: problem, at: record.created });
  }
  for (const entry of needs) {
    const decoded = decodeKey("needs", entry.key);
    if (!decoded.ok) {
      misshapen("needs", entry.key, decoded.reason, entry.created);
      continue;
    }
    const { node, module, kind, name } = decoded.fields;
    const value = needValueOf(entry);
    at(`${node}.${module}`).needs.push({ key: entry.key, kind, name, created: entry.created, nanos: entry.createdNanos, value });
    if (value.bad !== undefined) misshapen("needs", entry.key, value.bad, entry.created, `${node}.${module}`);
  }
  for (const entry of applied) {
    const decoded = decodeKey("applied", entry.key);
    if (!decoded.ok) {
      misshapen("applied", entry.key, decoded.reason, entry.created);
      continue;
    }
    const record = appliedOf(entry);
    at(entry.key).applied = {
      created: entry.created,
      nanos: entry.createdNanos,
      ...(record.error === undefined ? {} : { error: record.error }),
    };
    for (const reason of record.bad) misshapen("applied", entry.key, reason, entry.created, entry.key);
  }
  return { byModule, top, loose };
}

/** A need naming its provider, for the provider conditions. */
interface Named {
  readonly kind: string;
  readonly name: string;
  readonly provider: string;
  readonly created: Date;
}

/** What the model keeps of a module between updates: all its conditions but those of other modules' or buckets' making. */
interface Parts {
  /** Assigned, or with needs or an applied record (an assignment's delete marker alone is none). */
  readonly listed: boolean;
  /** The keys out of shape it puts in the answer's `outOfShape` (all of its own when it is not listed). */
  readonly top: readonly { key: string; reason: string }[];
  /** Its state without conditions (`listed` only). */
  readonly base?: Omit<ModuleState, "conditions">;
  readonly since?: Date;
  readonly unanswerable?: Condition;
  readonly outOfShape?: Condition;
  readonly named: readonly Named[];
}

/** A module's {@link Parts} from its gathered records, with the kinds some domain answers. */
function partsOf(key: string, g: Gathered | undefined, top: readonly { key: string; reason: string }[], kinds: ReadonlySet<string>): Parts {
  const listed =
    g !== undefined && ((g.assignment !== undefined && !g.assignment.deleted) || g.needs.length > 0 || g.applied !== undefined);
  if (!listed) return { listed, top: [...top, ...(g?.outOfShape ?? []).map(({ key, reason }) => ({ key, reason }))], named: [] };
  const [node, module] = key.split(".") as [string, string];
  const { state, since } = stateOf(g);
  const unanswerable = g.needs.filter((n) => !kinds.has(n.kind));
  const byKind = new Map<string, typeof unanswerable>();
  for (const n of unanswerable) byKind.set(n.kind, [...(byKind.get(n.kind) ?? []), n]);
  return {
    listed,
    top,
    base: {
      key,
      node,
      module,
      state,
      since: iso(since),
      assigned: g.assignment !== undefined && !g.assignment.deleted,
      needs: g.needs.length,
      appliedAt: g.applied === undefined ? null : iso(g.applied.created),
      ...(g.applied?.error === undefined ? {} : { error: g.applied.error }),
    },
    since,
    ...(unanswerable.length === 0
      ? {}
      : {
          unanswerable: {
            type: "Unanswerable",
            reason: "NoDomain",
            message: joined(
              [...byKind].map(([kind, ns]) => `no domain answers kind ${kind} (${ns.length === 1 ? "need" : "needs"} ${names(ns)})`),
            ),
            since: iso(earliest(unanswerable.map((n) => n.created))),
          },
        }),
    ...(g.outOfShape.length === 0
      ? {}
      : {
          outOfShape: {
            type: "OutOfShape",
            reason: "OutOfShape",
            message: joined(g.outOfShape.map((o) => `${o.key}: ${o.reason}`)),
            since: iso(earliest(g.outOfShape.map((o) => o.at))),
          },
        }),
    named: g.needs.flatMap((n) =>
      n.value.provider === undefined ? [] : [{ kind: n.kind, name: n.name, provider: n.value.provider, created: n.created }],
    ),
  };
}

type FailingOfModule = { provider: string; word: string; since: string };
type StaleOfModule = StaleHolder & { staleAt: number };

/** What the model is kept up to date from, besides each module's {@link Parts}. */
interface Keeper {
  readonly graceSeconds: number;
  readonly rotationGraceSeconds: number;
  readonly parts: Map<string, Parts>;
  readonly loose: Map<string, { key: string; reason: string }>;
  kinds: ReadonlySet<string>;
  failing: Map<string, readonly FailingOfModule[]>;
  stale: Map<string, readonly StaleOfModule[]>;
  rotations: number;
  /** Where each module name is assigned and where it is ready (applied or declares nothing), by node. */
  readonly providers: Map<string, { assigned: Set<string>; ready: Set<string> }>;
  /** The modules with a need naming each provider. */
  readonly namers: Map<string, Set<string>>;
  model: Model;
}

/** A listed module's state kept, its conditions made from its parts and what the keeper holds of other modules and buckets. */
function keptOf(parts: Parts, keeper: Keeper, key: string): Kept {
  const base = parts.base!;
  const conditions: Condition[] = [];
  if (parts.unanswerable !== undefined) conditions.push(parts.unanswerable);
  const failed = keeper.failing.get(key) ?? [];
  if (failed.length > 0) {
    conditions.push({
      type: "ProviderFailing",
      reason: "ProviderSaysFailing",
      message: joined(failed.map((f) => `${f.provider} fails it: ${f.word}`)),
      since: failed.map((f) => f.since).sort()[0]!,
    });
  }
  const notAssigned = parts.named.filter((n) => (keeper.providers.get(n.provider)?.assigned.size ?? 0) === 0);
  if (notAssigned.length > 0) {
    conditions.push({
      type: "ProviderNotAssigned",
      reason: "ProviderNotAssigned",
      message: joined(notAssigned.map((n) => `need ${n.kind}.${n.name} names provider ${n.provider}, assigned to no node`)),
      since: iso(earliest(notAssigned.map((n) => n.created))),
    });
  }
  const notReady = parts.named.filter((n) => {
    const p = keeper.providers.get(n.provider);
    return p !== undefined && p.assigned.size > 0 && p.ready.size === 0;
  });
  if (notReady.length > 0) {
    conditions.push({
      type: "ProviderNotReady",
      reason: "ProviderNotApplied",
      message: joined(
        notReady.map((n) => {
          // In the order of the modules' keys.
          const assigned = [...keeper.providers.get(n.provider)!.assigned].map((node) => `${node}.${n.provider}`).sort();
          const nodes = assigned.slice(0, NAMED).map((k) => k.slice(0, k.length - n.provider.length - 1));
          return `need ${n.kind}.${n.name} names provider ${n.provider}, assigned to ${nodes.join(", ")}${assigned.length > NAMED ? ` and ${assigned.length - NAMED} more` : ""} but applied on none`;
        }),
      ),
      since: iso(earliest(notReady.map((n) => n.created))),
    });
  }
  if (parts.outOfShape !== undefined) conditions.push(parts.outOfShape);
  const { state } = base;
  const progressing = state === "never-ran" || state === "pending";
  return {
    base: { ...base, conditions },
    lateAt: progressing ? parts.since!.getTime() + keeper.graceSeconds * 1000 : null,
    against: conditions.length > 0 || !(progressing || state === "applied" || state === "declares-nothing"),
    stale: keeper.stale.get(key) ?? [],
  };
}

/** Whether a module is among {@link Model.watched}. */
const watches = (kept: Kept) => kept.against || kept.lateAt !== null || kept.stale.length > 0;

const countsOf = () => Object.fromEntries(STATES.map((s) => [s, 0])) as Record<State, number>;
const conditionsOf = () => Object.fromEntries(CONDITIONS.map((c) => [c, 0])) as Record<ConditionType, number>;
const sameJson = (a: unknown, b: unknown) => JSON.stringify(a) === JSON.stringify(b);

/** The failing providers of each module `<machine>.<consumer>` (docs/failing.md §5). */
async function failingByModule(failing: Snapshot): Promise<Map<string, readonly FailingOfModule[]>> {
  const byModule = new Map<string, FailingOfModule[]>();
  for (const f of failingOf(await failing.reads.list(">")).failing) {
    const key = `${f.machine}.${f.consumer}`;
    byModule.set(key, [...(byModule.get(key) ?? []), { provider: f.provider, word: f.word, since: f.since }]);
  }
  return byModule;
}

/** The stale holders of each module (docs/rotation.md §8.3), each with when it passes the rotation's grace. */
async function staleByModule(
  inputs: StateInputs,
  rotationGraceSeconds: number,
): Promise<{ rotations: number; byModule: Map<string, readonly StaleOfModule[]> }> {
  const { rotations } = await rotationsIn(inputs.rotations.reads);
  const byModule = new Map<string, StaleOfModule[]>();
  if (rotations.length === 0) return { rotations: 0, byModule };
  // The indexes are made only once a rotation is kept.
  const [byProvision, appliedByKey] = await Promise.all([holdersIndex(inputs.needs), appliedIndex(inputs.applied)]);
  for (const list of rotationStates(rotations, byProvision, heldIn(appliedByKey)).stale.values()) {
    for (const h of list) {
      const key = `${h.node}.${h.module}`;
      byModule.set(key, [...(byModule.get(key) ?? []), { ...h, staleAt: Date.parse(h.rotatedAt) + rotationGraceSeconds * 1000 }]);
    }
  }
  return { rotations: rotations.length, byModule };
}

/** The keys of `a` and `b` whose values differ (as JSON). */
function differing<V>(a: ReadonlyMap<string, V>, b: ReadonlyMap<string, V>): string[] {
  const keys = new Set([...a.keys(), ...b.keys()]);
  return [...keys].filter((k) => !sameJson(a.get(k), b.get(k)));
}

const EMPTY_MODEL: Model = {
  modules: new BTree<string, Kept>(),
  watched: new BTree<string, Kept>(),
  outOfShape: [],
  counts: countsOf(),
  conditions: conditionsOf(),
  staleHolders: 0,
};

/**
 * Brings `keeper` up to date: `gathered` holds the records of every module to make again (the
 * whole mesh when `keeper` is new), `failing`, `stale` and `loose` what they are now; modules
 * naming a provider whose assignments or readiness changed, or whose failing providers or stale
 * holders changed, are made again from their parts. The model made is a new one; the one
 * before is left as it was.
 */
function apply(
  keeper: Keeper,
  gathered: Gatherings,
  regathered: Iterable<string>,
  now: {
    failing?: Map<string, readonly FailingOfModule[]>;
    stale?: { rotations: number; byModule: Map<string, readonly StaleOfModule[]> };
  },
  looseChanged: ReadonlyMap<string, { key: string; reason: string } | null>,
): Model {
  const before = keeper.model;
  const modules = (before.modules as ModuleTree).clone();
  const watched = (before.watched as ModuleTree).clone();
  const counts = { ...before.counts };
  const conditions = { ...before.conditions };
  let { staleHolders } = before;
  const remake = new Set<string>();
  if (now.failing !== undefined) {
    for (const key of differing(keeper.failing, now.failing)) remake.add(key);
    keeper.failing = now.failing;
  }
  if (now.stale !== undefined) {
    for (const key of differing(keeper.stale, now.stale.byModule)) remake.add(key);
    keeper.stale = now.stale.byModule;
    keeper.rotations = now.stale.rotations;
  }
  let topChanged = looseChanged.size > 0;
  for (const [key, found] of looseChanged) {
    if (found === null) keeper.loose.delete(key);
    else keeper.loose.set(key, found);
  }
  // Each module gathered again: its parts, and what it adds to the providers.
  const changedProviders = new Set<string>();
  for (const key of regathered) {
    remake.add(key);
    const old = keeper.parts.get(key);
    const next = partsOf(key, gathered.byModule.get(key), gathered.top.get(key) ?? [], keeper.kinds);
    if (old?.top.length || next.top.length) topChanged = true;
    if (next.listed || next.top.length > 0) keeper.parts.set(key, next);
    else keeper.parts.delete(key);
    const [node, module] = key.split(".") as [string, string];
    const was = { assigned: old?.base?.assigned === true, ready: old?.base !== undefined && isReady(old.base) };
    const is = { assigned: next.base?.assigned === true, ready: next.base !== undefined && isReady(next.base) };
    if (was.assigned !== is.assigned || (was.assigned && was.ready !== is.ready)) {
      let p = keeper.providers.get(module);
      if (p === undefined) keeper.providers.set(module, (p = { assigned: new Set(), ready: new Set() }));
      p.assigned.delete(node);
      p.ready.delete(node);
      if (is.assigned) p.assigned.add(node);
      if (is.assigned && is.ready) p.ready.add(node);
      if (p.assigned.size === 0) keeper.providers.delete(module);
      changedProviders.add(module);
    }
    for (const n of old?.named ?? []) keeper.namers.get(n.provider)?.delete(key);
    for (const n of next.named) {
      let namers = keeper.namers.get(n.provider);
      if (namers === undefined) keeper.namers.set(n.provider, (namers = new Set()));
      namers.add(key);
    }
  }
  for (const provider of changedProviders) for (const key of keeper.namers.get(provider) ?? []) remake.add(key);
  for (const [provider, namers] of keeper.namers) if (namers.size === 0) keeper.namers.delete(provider);

  for (const key of remake) {
    const old = modules.get(key);
    if (old !== undefined) {
      counts[old.base.state]--;
      for (const c of old.base.conditions) conditions[c.type]--;
      staleHolders -= old.stale.length;
      watched.delete(key);
    }
    const p = keeper.parts.get(key);
    if (p === undefined || !p.listed) {
      modules.delete(key);
      continue;
    }
    const kept = keptOf(p, keeper, key);
    modules.set(key, kept);
    counts[kept.base.state]++;
    for (const c of kept.base.conditions) conditions[c.type]++;
    staleHolders += kept.stale.length;
    if (watches(kept)) watched.set(key, kept);
  }
  const outOfShape = !topChanged
    ? before.outOfShape
    : [...keeper.loose.values(), ...[...keeper.parts.values()].flatMap((p) => p.top)].sort((a, b) =>
        a.key < b.key ? -1 : a.key > b.key ? 1 : 0,
      );
  keeper.model = { modules, watched, outOfShape, counts, conditions, staleHolders };
  return keeper.model;
}

const isReady = (base: { state: State }) => base.state === "applied" || base.state === "declares-nothing";

/**
 * The live records of a read, as the view keeps them: read as records (not entries), so making
 * the model makes no object per key, and what is derived per record is kept by the record itself.
 */
const live = async (records: Promise<KeyRecord[]>) => (await records).filter((r) => !r.deleted);

/** A new keeper, its model made from the whole of every view. */
async function made(inputs: StateInputs, graceSeconds: number, rotationGraceSeconds: number): Promise<Keeper> {
  const [assignments, needs, applied, registry, failing, stale] = await Promise.all([
    inputs.assignments.reads.records(">"),
    live(inputs.needs.reads.records(">")),
    live(inputs.applied.reads.records(">")),
    inputs.registry.reads.list(">"),
    failingByModule(inputs.failing),
    staleByModule(inputs, rotationGraceSeconds),
  ]);
  const keeper: Keeper = {
    graceSeconds,
    rotationGraceSeconds,
    parts: new Map(),
    loose: new Map(),
    kinds: new Set(registry.map((e) => e.key)),
    failing: new Map(),
    stale: new Map(),
    rotations: 0,
    providers: new Map(),
    namers: new Map(),
    model: EMPTY_MODEL,
  };
  // A batch of modules at a time: what is gathered of one is garbage before the next is, so
  // making the model of a large mesh does not grow the heap by all its needs at once.
  const batches: { assignments: KeyRecord[]; needs: KeyRecord[]; applied: KeyRecord[] }[] = [];
  const batchOf = new Map<string, number>();
  const into = (bucket: "assignments" | "needs" | "applied", records: readonly KeyRecord[]) => {
    for (const record of records) {
      const module = moduleOfKey(record.key) ?? "";
      let batch = batchOf.get(module);
      if (batch === undefined) batchOf.set(module, (batch = Math.floor(batchOf.size / MODULES_A_BATCH)));
      (batches[batch] ??= { assignments: [], needs: [], applied: [] })[bucket].push(record);
    }
  };
  into("assignments", assignments);
  into("needs", needs);
  into("applied", applied);
  batchOf.clear();
  let first = true;
  for (const batch of batches.length === 0 ? [{ assignments: [], needs: [], applied: [] }] : batches) {
    const gathered = gatherings(batch.assignments, batch.needs, batch.applied);
    const regathered = new Set([...gathered.byModule.keys(), ...gathered.top.keys()]);
    apply(keeper, gathered, regathered, first ? { failing, stale } : {}, gathered.loose);
    first = false;
    // Requests in hand go on between batches.
    await new Promise((resolve) => setImmediate(resolve));
  }
  return keeper;
}

/** How many modules are gathered at once when the model is made whole. */
const MODULES_A_BATCH = 1000;

/**
 * `keeper` brought up to date with the keys changed since (docs/runtime.md §6.12): each module a
 * changed key of the assignments, needs or applied bucket names gathered again from the views
 * (its assignment, `<node>.<module>.>` of each bucket), the failing providers read again when the
 * failing bucket changed, the stale holders when a rotation is kept and the rotations, needs or
 * applied changed. A changed registry makes the whole model again.
 */
async function updated(keeper: Keeper, inputs: StateInputs, changes: Changes<StateInputs>): Promise<Keeper> {
  if (changes.registry.length > 0) {
    const kinds = new Set((await inputs.registry.reads.list(">")).map((e) => e.key));
    if (kinds.size !== keeper.kinds.size || [...kinds].some((k) => !keeper.kinds.has(k))) {
      return made(inputs, keeper.graceSeconds, keeper.rotationGraceSeconds);
    }
  }
  const regather = new Set<string>();
  const loose: [bucket: "assignments" | "needs" | "applied", key: string][] = [];
  for (const bucket of ["assignments", "needs", "applied"] as const) {
    for (const key of changes[bucket]) {
      const module = moduleOfKey(key);
      if (module === undefined) loose.push([bucket, key]);
      else regather.add(module);
    }
  }
  const staleChanged = changes.rotations.length > 0 || (keeper.rotations > 0 && (changes.needs.length > 0 || changes.applied.length > 0));
  const [records, looseFound, failing, stale] = await Promise.all([
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
      loose.map(async ([bucket, key]) => {
        const reads = inputs[bucket].reads;
        const record = bucket === "assignments" ? await reads.last(key) : await reads.get(key);
        return [bucket, key, record === null || ("deleted" in record && record.deleted) ? null : record] as const;
      }),
    ),
    changes.failing.length > 0 ? failingByModule(inputs.failing) : undefined,
    staleChanged ? staleByModule(inputs, keeper.rotationGraceSeconds) : undefined,
  ]);
  const gathered = gatherings(
    records.flatMap((r) => r.assignments),
    records.flatMap((r) => r.needs),
    records.flatMap((r) => r.applied),
  );
  const looseChanged = new Map<string, { key: string; reason: string } | null>();
  for (const [bucket, key, record] of looseFound) {
    const decoded = decodeKey(bucket, key);
    looseChanged.set(`${bucket}:${key}`, record === null || decoded.ok ? null : { key: `${bucket}:${key}`, reason: decoded.reason });
  }
  apply(
    keeper,
    gathered,
    regather,
    { ...(failing === undefined ? {} : { failing }), ...(stale === undefined ? {} : { stale }) },
    looseChanged,
  );
  return keeper;
}

// The model kept: made once from the whole of the views, then updated from what changed.
const kept = keeping(
  (inputs: StateInputs, graces: { graceSeconds: number; rotationGraceSeconds: number }) =>
    made(inputs, graces.graceSeconds, graces.rotationGraceSeconds),
  updated,
);

/** The holders of a module stale past their rotation's grace at `now`. */
export const staleAt = (kept: Kept, now: Date) => kept.stale.filter((h) => now.getTime() >= h.staleAt);

/** A module's state at `now`: `Late` added once its grace has passed, `Stale` once a stale holder's has. */
export function stateAt(kept: Kept, now: Date, graceSeconds: number): ModuleState {
  const late = kept.lateAt !== null && now.getTime() >= kept.lateAt;
  const stale = kept.stale.length === 0 ? [] : staleAt(kept, now);
  if (!late && stale.length === 0) return kept.base;
  const { base } = kept;
  const waiting = base.state === "never-ran" ? "no applied record and no needs" : pendingWords(base);
  return {
    ...base,
    conditions: [
      ...(late
        ? [
            {
              type: "Late" as const,
              reason: base.state === "never-ran" ? "NeverRan" : "Pending",
              message: `${base.state} for longer than ${graceSeconds} s: ${waiting}`,
              since: new Date(kept.lateAt!).toISOString(),
            },
          ]
        : []),
      ...base.conditions,
      ...(stale.length === 0
        ? []
        : [
            {
              type: "Stale" as const,
              reason: "RotationNotApplied",
              message: joined(
                stale.map(
                  (h) =>
                    `${h.provider} rotated ${h.provision} to ${h.revision}; it holds ${h.heldRevision ?? "no revision of it"} (need ${h.key.split(".").slice(2).join(".")})`,
                ),
              ),
              since: new Date(Math.min(...stale.map((h) => h.staleAt))).toISOString(),
            },
          ]),
    ],
  };
}

const pendingWords = (m: ModuleState) =>
  m.appliedAt === null ? `${plural(m.needs, "need")} and no applied record` : "needs written after the last applied record";

/** Whether a module counts against the mesh at `now` (docs/state.md §7.4): not well, and not progressing within its grace. */
export const countsAgainst = (kept: Kept, now: Date) =>
  kept.against || (kept.lateAt !== null && now.getTime() >= kept.lateAt) || kept.stale.some((h) => now.getTime() >= h.staleAt);

/** The model of `inputs` made from the whole of each view, kept nowhere: what {@link currentModel} keeps up to date. */
export const modelOf = async (inputs: StateInputs, graceSeconds: number, rotationGraceSeconds = 300): Promise<Model> =>
  (await made(inputs, graceSeconds, rotationGraceSeconds)).model;

/**
 * The model of the views' snapshots now (each view checked current once, docs/verb.md §4.6):
 * made from the whole of the views once, then kept up to date from the keys changed since
 * (docs/state.md §7.5), so a request after a change pays for the modules it touched.
 */
export async function currentModel(inputs: StateInputs, graceSeconds: number, rotationGraceSeconds = 300): Promise<Model> {
  return (await kept(inputs, { graceSeconds, rotationGraceSeconds })).model;
}

/** The views state reads (docs/state.md §7.1), by their config names. */
export const STATE_VIEWS = [
  "assignments",
  "needs",
  "applied",
  "registry",
  "failing",
  "rotations",
] as const satisfies readonly (keyof StateInputs)[];

/** The snapshots of the views state reads ({@link STATE_VIEWS}), fresh (one check each) or, with `stale`, as held. */
export async function snapshotsOf(
  views: Readonly<Record<keyof StateInputs, { snapshot(): Promise<Snapshot>; localSnapshot(): Snapshot }>>,
  stale = false,
): Promise<StateInputs> {
  const taken = await Promise.all(STATE_VIEWS.map((name) => (stale ? views[name].localSnapshot() : views[name].snapshot())));
  return Object.fromEntries(STATE_VIEWS.map((name, i) => [name, taken[i]!])) as unknown as StateInputs;
}

/** What status says of provisioning (docs/state.md §7.5): modules by state, and those that count against the mesh. */
export interface Provisioning {
  readonly counts: Readonly<Record<State, number>>;
  /** Modules that count against the mesh at the time asked, in key order. */
  readonly notWell: readonly ModuleState[];
  /** How many of `notWell` were left out to fit one reply. */
  readonly omitted: number;
}

export const provisioningSchema = z.object({
  counts: z.object(Object.fromEntries(STATES.map((s) => [s, z.number().int()])) as Record<State, z.ZodNumber>),
  notWell: z.array(moduleStateSchema),
  omitted: z.number().int(),
}) satisfies z.ZodType<Provisioning>;

/**
 * The modules of `model` in key order, from the first at or after `after` (exclusive) on
 * `node`, and named `module` (each when given): a node's modules are one range of keys; a
 * module's name alone is looked for among every module.
 */
export function* modulesOf(modules: Modules, narrowing: { node?: string; module?: string; after?: string } = {}): Generator<Kept> {
  const { node, module, after } = narrowing;
  const begin = node === undefined ? "" : `${node}.`;
  const from = after !== undefined && after > begin ? `${after}\u0000` : begin;
  for (const kept of modules.values(from)) {
    if (node !== undefined && !kept.base.key.startsWith(begin)) return;
    if (module !== undefined && kept.base.module !== module) continue;
    yield kept;
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
  const counts = narrowed ? countsOf() : model.counts;
  const notWell: ModuleState[] = [];
  for (const kept of modulesOf(narrowed ? model.modules : model.watched, narrowing)) {
    if (narrowed) (counts as Record<State, number>)[kept.base.state]++;
    if (countsAgainst(kept, now)) notWell.push(stateAt(kept, now, graceSeconds));
  }
  return { counts, notWell, omitted: 0 };
}

/** Provisioning of a status that speaks of no module (narrowed by provider). */
export const NO_PROVISIONING: Provisioning = Object.freeze({
  counts: Object.freeze(Object.fromEntries(STATES.map((s) => [s, 0])) as Record<State, number>),
  notWell: [],
  omitted: 0,
});

/** The holders stale past their rotation's grace at `now` (docs/rotation.md §8.3), narrowed as status is. */
export function staleHoldersOf(
  model: Model,
  now: Date,
  narrowing: { provider?: string; node?: string; module?: string } = {},
): StaleHolder[] {
  const found: StaleHolder[] = [];
  for (const kept of model.watched.values()) {
    if (kept.stale.length === 0) continue;
    for (const { staleAt: _, ...h } of staleAt(kept, now)) {
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
  for (const kept of model.watched.values()) {
    if (kept.lateAt !== null && now.getTime() >= kept.lateAt) counted.Late++;
    if (kept.stale.some((h) => now.getTime() >= h.staleAt)) counted.Stale++;
  }
  return counted;
}
