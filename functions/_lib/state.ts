/**
 * Provisioning state (docs/state.md §7): for every module of every node, whether its provisioning
 * happened and why not, from the views of the assignments, needs, applied, registry and failing
 * buckets. Every comparison is on the times the server stored the writes (`created`).
 */
import { z } from "zod";
import type { Entry, KeyRecord, Snapshot } from "../../runtime/index.ts";
import { decodeKey, TOKEN } from "./keys.ts";
import { failingOf } from "./follower.ts";

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
export const provisioningConfig = z.object({
  provisioning: z.strictObject({ graceSeconds: z.number().int().min(1).default(600) }).default({ graceSeconds: 600 }),
});

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
}

/** A module as the model keeps it: its state without `Late`, which depends on the time asked. */
export interface Kept {
  readonly base: ModuleState;
  /** When it becomes Late (ms since the epoch): never-ran or pending only. */
  readonly lateAt: number | null;
  /** Whether it counts against the mesh whatever the time (a state or a condition besides Late). */
  readonly against: boolean;
}

/** Every module's state of one set of snapshots, in key order, and the keys that name no module. */
export interface Model {
  readonly modules: readonly Kept[];
  readonly outOfShape: readonly { key: string; reason: string }[];
  readonly counts: Readonly<Record<State, number>>;
  /** Keys of {@link Model.modules} by index, for narrowing by node. */
  readonly keys: readonly string[];
}

const decoder = new TextDecoder();
/** What a need's value says of its provider: its module name, or why it is out of shape. */
type NeedValue = { readonly provider?: string; readonly bad?: string };
const NONE: NeedValue = Object.freeze({});
// One reading per stored entry: a live view hands out the same entry until its key changes.
const needValues = new WeakMap<Entry, NeedValue>();

function needValueOf(entry: Entry): NeedValue {
  let read = needValues.get(entry);
  if (read !== undefined) return read;
  read = NONE;
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
  needValues.set(entry, read);
  return read;
}

/** The fields of an applied record this project reads (docs/state.md §7.2); a field of the wrong type is read as absent and said. */
function appliedOf(entry: Entry): { error?: string; revisions?: Record<string, string>; bad: string[] } {
  let value: unknown;
  try {
    value = JSON.parse(decoder.decode(entry.value));
  } catch (err) {
    return { bad: [`applied value is not JSON: ${(err as Error).message}`] };
  }
  if (typeof value !== "object" || value === null || Array.isArray(value)) return { bad: ["applied value is not a JSON object"] };
  const { error, revisions } = value as { error?: unknown; revisions?: unknown };
  const bad: string[] = [];
  const read: { error?: string; revisions?: Record<string, string> } = {};
  if (error !== undefined) {
    if (typeof error === "string") read.error = error;
    else bad.push("applied record's error is not a string");
  }
  if (revisions !== undefined) {
    const ok =
      typeof revisions === "object" &&
      revisions !== null &&
      !Array.isArray(revisions) &&
      Object.values(revisions).every((r) => typeof r === "string");
    if (ok) read.revisions = revisions as Record<string, string>;
    else bad.push("applied record's revisions is not an object of strings");
  }
  return { ...read, bad };
}

interface Gathered {
  assignment?: KeyRecord;
  needs: { key: string; kind: string; name: string; created: Date; value: NeedValue }[];
  applied?: { created: Date; error?: string };
  outOfShape: { key: string; reason: string; at: Date }[];
}

const iso = (d: Date) => d.toISOString();
const plural = (n: number, one: string, many = `${one}s`) => `${n} ${n === 1 ? one : many}`;

/** `node.module` of a key out of its bucket's shape, when its first two tokens are tokens. */
function moduleOfKey(key: string): string | undefined {
  const [node, module] = key.split(".");
  return node !== undefined && module !== undefined && TOKEN.test(node) && TOKEN.test(module) ? `${node}.${module}` : undefined;
}

/** The state of one gathered module (docs/state.md §7.3), and when it began. */
function stateOf(g: Gathered): { state: State; since: Date } {
  const assigned = g.assignment !== undefined && !g.assignment.deleted;
  if (!assigned) {
    const newest = Math.max(...g.needs.map((n) => n.created.getTime()), g.applied?.created.getTime() ?? -Infinity);
    return { state: "unassigned", since: g.assignment?.deleted ? g.assignment.created : new Date(newest) };
  }
  if (g.applied === undefined) {
    if (g.needs.length === 0) return { state: "never-ran", since: g.assignment!.created };
    return { state: "pending", since: new Date(Math.min(...g.needs.map((n) => n.created.getTime()))) };
  }
  const after = g.needs.filter((n) => n.created > g.applied!.created);
  if (after.length > 0) return { state: "pending", since: new Date(Math.min(...after.map((n) => n.created.getTime()))) };
  if (g.applied.error !== undefined) return { state: "failed", since: g.applied.created };
  return { state: g.needs.length === 0 ? "declares-nothing" : "applied", since: g.applied.created };
}

const names = (needs: readonly { kind: string; name: string }[]) => needs.map((n) => `${n.kind}.${n.name}`).join(", ");
const earliest = (dates: readonly Date[]) => new Date(Math.min(...dates.map((d) => d.getTime())));

/**
 * Every module's state (docs/state.md §7) of `inputs`, `Late` left out (see {@link answerOf}).
 * Keys of the assignments, needs and applied buckets whose node and module cannot be told are
 * in `outOfShape`; those that can, and bad fields of values, are the module's `OutOfShape`.
 */
export async function modelOf(inputs: StateInputs, graceSeconds: number): Promise<Model> {
  const [assignments, needs, applied, registry, failing] = await Promise.all([
    inputs.assignments.reads.records(">"),
    inputs.needs.reads.list(">"),
    inputs.applied.reads.list(">"),
    inputs.registry.reads.list(">"),
    inputs.failing.reads.list(">"),
  ]);
  const kinds = new Set(registry.map((e) => e.key));
  const failingByModule = new Map<string, { provider: string; word: string; since: string }[]>();
  for (const f of failingOf(failing).failing) {
    const key = `${f.machine}.${f.consumer}`;
    failingByModule.set(key, [...(failingByModule.get(key) ?? []), f]);
  }
  const outOfShape: { key: string; reason: string }[] = [];
  const gathered = new Map<string, Gathered>();
  const at = (key: string) => {
    let g = gathered.get(key);
    if (g === undefined) gathered.set(key, (g = { needs: [], outOfShape: [] }));
    return g;
  };
  /** A key out of shape: the module's when it can be told, the answer's otherwise. */
  const misshapen = (bucket: string, key: string, reason: string, created: Date, module = moduleOfKey(key)) => {
    if (module === undefined) outOfShape.push({ key: `${bucket}:${key}`, reason });
    else at(module).outOfShape.push({ key: `${bucket}:${key}`, reason, at: created });
  };

  for (const record of assignments) {
    const decoded = decodeKey("assignments", record.key);
    if (!decoded.ok) {
      if (!record.deleted) outOfShape.push({ key: `assignments:${record.key}`, reason: decoded.reason });
      continue;
    }
    at(record.key).assignment = record;
    if (!record.deleted) {
      try {
        JSON.parse(decoder.decode(record.value));
      } catch (err) {
        const reason = `assignment value is not JSON: ${(err as Error).message}`;
        outOfShape.push({ key: `assignments:${record.key}`, reason });
        at(record.key).outOfShape.push({ key: `assignments:${record.key}`, reason, at: record.created });
      }
    }
  }
  for (const entry of needs) {
    const decoded = decodeKey("needs", entry.key);
    if (!decoded.ok) {
      misshapen("needs", entry.key, decoded.reason, entry.created);
      continue;
    }
    const { node, module, kind, name } = decoded.fields;
    const value = needValueOf(entry);
    at(`${node}.${module}`).needs.push({ key: entry.key, kind, name, created: entry.created, value });
    if (value.bad !== undefined) misshapen("needs", entry.key, value.bad, entry.created, `${node}.${module}`);
  }
  for (const entry of applied) {
    const decoded = decodeKey("applied", entry.key);
    if (!decoded.ok) {
      misshapen("applied", entry.key, decoded.reason, entry.created);
      continue;
    }
    const record = appliedOf(entry);
    at(entry.key).applied = { created: entry.created, ...(record.error === undefined ? {} : { error: record.error }) };
    for (const reason of record.bad) misshapen("applied", entry.key, reason, entry.created, entry.key);
  }

  // Modules: assigned, or with needs or an applied record (an assignment's delete marker alone is none).
  const keys = [...gathered.keys()]
    .filter((key) => {
      const g = gathered.get(key)!;
      return (g.assignment !== undefined && !g.assignment.deleted) || g.needs.length > 0 || g.applied !== undefined;
    })
    .sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
  const states = new Map(keys.map((key) => [key, stateOf(gathered.get(key)!)]));
  // Where each module name is assigned, and where it is ready, for the needs naming it as their provider.
  const providers = new Map<string, { assigned: string[]; ready: boolean }>();
  for (const key of keys) {
    const g = gathered.get(key)!;
    if (g.assignment === undefined || g.assignment.deleted) continue;
    const [node, module] = key.split(".") as [string, string];
    const p = providers.get(module) ?? { assigned: [], ready: false };
    p.assigned.push(node);
    const { state } = states.get(key)!;
    if (state === "applied" || state === "declares-nothing") p.ready = true;
    providers.set(module, p);
  }

  const counts = Object.fromEntries(STATES.map((s) => [s, 0])) as Record<State, number>;
  const modules = keys.map((key): Kept => {
    const g = gathered.get(key)!;
    const [node, module] = key.split(".") as [string, string];
    const { state, since } = states.get(key)!;
    counts[state]++;
    const conditions: Condition[] = [];
    const unanswerable = g.needs.filter((n) => !kinds.has(n.kind));
    if (unanswerable.length > 0) {
      const byKind = new Map<string, typeof unanswerable>();
      for (const n of unanswerable) byKind.set(n.kind, [...(byKind.get(n.kind) ?? []), n]);
      conditions.push({
        type: "Unanswerable",
        reason: "NoDomain",
        message: [...byKind]
          .map(([kind, ns]) => `no domain answers kind ${kind} (${ns.length === 1 ? "need" : "needs"} ${names(ns)})`)
          .join("; "),
        since: iso(earliest(unanswerable.map((n) => n.created))),
      });
    }
    const failed = failingByModule.get(key) ?? [];
    if (failed.length > 0) {
      conditions.push({
        type: "ProviderFailing",
        reason: "ProviderSaysFailing",
        message: failed.map((f) => `${f.provider} fails it: ${f.word}`).join("; "),
        since: failed.map((f) => f.since).sort()[0]!,
      });
    }
    const named = g.needs.filter((n) => n.value.provider !== undefined);
    const notAssigned = named.filter((n) => providers.get(n.value.provider!) === undefined);
    if (notAssigned.length > 0) {
      conditions.push({
        type: "ProviderNotAssigned",
        reason: "ProviderNotAssigned",
        message: notAssigned.map((n) => `need ${n.kind}.${n.name} names provider ${n.value.provider}, assigned to no node`).join("; "),
        since: iso(earliest(notAssigned.map((n) => n.created))),
      });
    }
    const notReady = named.filter((n) => {
      const p = providers.get(n.value.provider!);
      return p !== undefined && !p.ready;
    });
    if (notReady.length > 0) {
      conditions.push({
        type: "ProviderNotReady",
        reason: "ProviderNotApplied",
        message: notReady
          .map((n) => {
            const p = providers.get(n.value.provider!)!;
            return `need ${n.kind}.${n.name} names provider ${n.value.provider}, assigned to ${p.assigned.join(", ")} but applied on none`;
          })
          .join("; "),
        since: iso(earliest(notReady.map((n) => n.created))),
      });
    }
    if (g.outOfShape.length > 0) {
      conditions.push({
        type: "OutOfShape",
        reason: "OutOfShape",
        message: g.outOfShape.map((o) => `${o.key}: ${o.reason}`).join("; "),
        since: iso(earliest(g.outOfShape.map((o) => o.at))),
      });
    }
    const base: ModuleState = {
      key,
      node,
      module,
      state,
      since: iso(since),
      assigned: g.assignment !== undefined && !g.assignment.deleted,
      needs: g.needs.length,
      appliedAt: g.applied === undefined ? null : iso(g.applied.created),
      ...(g.applied?.error === undefined ? {} : { error: g.applied.error }),
      conditions,
    };
    const progressing = state === "never-ran" || state === "pending";
    return {
      base,
      lateAt: progressing ? since.getTime() + graceSeconds * 1000 : null,
      against: conditions.length > 0 || !(progressing || state === "applied" || state === "declares-nothing"),
    };
  });
  return { modules, outOfShape, counts, keys };
}

/** A module's state at `now`: `Late` added once its grace has passed. */
export function stateAt(kept: Kept, now: Date, graceSeconds: number): ModuleState {
  if (kept.lateAt === null || now.getTime() < kept.lateAt) return kept.base;
  const { base } = kept;
  const waiting = base.state === "never-ran" ? "no applied record and no needs" : pendingWords(base);
  return {
    ...base,
    conditions: [
      {
        type: "Late",
        reason: base.state === "never-ran" ? "NeverRan" : "Pending",
        message: `${base.state} for longer than ${graceSeconds} s: ${waiting}`,
        since: new Date(kept.lateAt).toISOString(),
      },
      ...base.conditions,
    ],
  };
}

const pendingWords = (m: ModuleState) =>
  m.appliedAt === null ? `${plural(m.needs, "need")} and no applied record` : "needs written after the last applied record";

/** Whether a module counts against the mesh at `now` (docs/state.md §7.4): not well, and not progressing within its grace. */
export const countsAgainst = (kept: Kept, now: Date) => kept.against || (kept.lateAt !== null && now.getTime() >= kept.lateAt);

// The last model made, by the stamps of its snapshots: asked again unchanged, it is not made again.
let last: { stamp: string; model: Promise<Model> } | undefined;

/**
 * The model of the views' snapshots now (each view checked current once, docs/verb.md §4.6), made
 * again only when one of them changed since the last one.
 */
export function currentModel(inputs: StateInputs, graceSeconds: number): Promise<Model> {
  const stamp = [
    graceSeconds,
    inputs.assignments.stamp,
    inputs.needs.stamp,
    inputs.applied.stamp,
    inputs.registry.stamp,
    inputs.failing.stamp,
  ].join("|");
  if (last?.stamp !== stamp) {
    const model = modelOf(inputs, graceSeconds);
    last = { stamp, model };
    model.catch(() => {
      if (last?.model === model) last = undefined;
    });
  }
  return last.model;
}

/** The snapshots of the five views state reads, fresh (one check each) or, with `stale`, as held. */
export async function snapshotsOf(
  views: Readonly<Record<keyof StateInputs, { snapshot(): Promise<Snapshot>; localSnapshot(): Snapshot }>>,
  stale = false,
): Promise<StateInputs> {
  const names = ["assignments", "needs", "applied", "registry", "failing"] as const;
  const taken = await Promise.all(names.map((name) => (stale ? views[name].localSnapshot() : views[name].snapshot())));
  return Object.fromEntries(names.map((name, i) => [name, taken[i]!])) as unknown as StateInputs;
}

/** The index of the first module of `model` whose key is at or after `key` (the keys are sorted). */
export function firstAtOrAfter(model: Model, key: string): number {
  let lo = 0;
  let hi = model.keys.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (model.keys[mid]! < key) lo = mid + 1;
    else hi = mid;
  }
  return lo;
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

/** Provisioning of the modules of `model` on `node` and named `module` (each when given), at `now`. */
export function provisioningOf(
  model: Model,
  now: Date,
  graceSeconds: number,
  narrowing: { node?: string; module?: string } = {},
): Provisioning {
  const { node, module } = narrowing;
  const narrowed = node === undefined && module === undefined;
  const counts = narrowed ? model.counts : (Object.fromEntries(STATES.map((s) => [s, 0])) as Record<State, number>);
  const notWell: ModuleState[] = [];
  const from = node === undefined ? 0 : firstAtOrAfter(model, `${node}.`);
  for (let i = from; i < model.modules.length; i++) {
    const kept = model.modules[i]!;
    if (node !== undefined && kept.base.node !== node) break;
    if (module !== undefined && kept.base.module !== module) continue;
    if (!narrowed) (counts as Record<State, number>)[kept.base.state]++;
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
