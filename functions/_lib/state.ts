/**
 * Provisioning state (docs/state.md §7): for every module of every node, whether its provisioning
 * happened and why not, from the views of the assignments, needs, applied, registry and failing
 * buckets. Every comparison is on the times the server stored the writes (`created`).
 */
import { z } from "zod";
import type { Entry, KeyRecord, Snapshot } from "../../runtime/index.ts";
import { decodeKey, TOKEN } from "./keys.ts";
import { appliedOf } from "./applied.ts";
import { cutText, failingOf } from "./follower.ts";
import { heldIn, holdersIndex, rotationConfig, rotationsIn, rotationStates, type StaleHolder } from "./rotation.ts";

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

/** Every module's state of one set of snapshots, in key order, and the keys that name no module. */
export interface Model {
  readonly modules: readonly Kept[];
  readonly outOfShape: readonly { key: string; reason: string }[];
  readonly counts: Readonly<Record<State, number>>;
  /** Keys of {@link Model.modules} by index, for narrowing by node. */
  readonly keys: readonly string[];
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

interface Gathered {
  assignment?: KeyRecord;
  needs: { key: string; kind: string; name: string; created: Date; nanos: number; value: NeedValue }[];
  applied?: { created: Date; nanos: number; error?: string };
  outOfShape: { key: string; reason: string; at: Date }[];
}

// Whether an assignment's value is JSON, once per stored record.
const assignmentValues = new WeakMap<KeyRecord, string | null>();
function assignmentProblem(record: KeyRecord): string | null {
  let problem = assignmentValues.get(record);
  if (problem === undefined) {
    try {
      JSON.parse(decoder.decode(record.value));
      problem = null;
    } catch (err) {
      problem = `assignment value is not JSON: ${(err as Error).message}`;
    }
    assignmentValues.set(record, problem);
  }
  return problem;
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
const parts = (items: readonly string[]) =>
  cut(items.slice(0, NAMED).join("; ") + (items.length > NAMED ? `; and ${items.length - NAMED} more` : ""));
const earliest = (dates: readonly Date[]) => new Date(Math.min(...dates.map((d) => d.getTime())));

/**
 * Every module's state (docs/state.md §7) of `inputs`, `Late` left out (see {@link answerOf}).
 * Keys of the assignments, needs and applied buckets whose node and module cannot be told are
 * in `outOfShape`; those that can, and bad fields of values, are the module's `OutOfShape`.
 */
export async function modelOf(inputs: StateInputs, graceSeconds: number, rotationGraceSeconds = 300): Promise<Model> {
  const [assignments, needs, applied, registry, failing, { rotations }] = await Promise.all([
    inputs.assignments.reads.records(">"),
    inputs.needs.reads.list(">"),
    inputs.applied.reads.list(">"),
    inputs.registry.reads.list(">"),
    inputs.failing.reads.list(">"),
    rotationsIn(inputs.rotations.reads),
  ]);
  // Stale holders by module, from the rotations kept (docs/rotation.md §8.3).
  const staleByModule = new Map<string, (StaleHolder & { staleAt: number })[]>();
  if (rotations.length > 0) {
    // The holders' index is made only once a rotation is kept.
    const byProvision = await holdersIndex(inputs.needs);
    const appliedByKey = new Map(applied.map((e) => [e.key, e] as const));
    for (const list of rotationStates(rotations, byProvision, heldIn(appliedByKey)).stale.values()) {
      for (const h of list) {
        const key = `${h.node}.${h.module}`;
        staleByModule.set(key, [
          ...(staleByModule.get(key) ?? []),
          { ...h, staleAt: Date.parse(h.rotatedAt) + rotationGraceSeconds * 1000 },
        ]);
      }
    }
  }
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

  // Modules: assigned, or with needs or an applied record (an assignment's delete marker alone is none).
  const keys = [...gathered.keys()]
    .filter((key) => {
      const g = gathered.get(key)!;
      return (g.assignment !== undefined && !g.assignment.deleted) || g.needs.length > 0 || g.applied !== undefined;
    })
    .sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
  // Keys out of shape whose module is no module (no assignment, need or applied record): said in the answer.
  const listed = new Set(keys);
  for (const [key, g] of gathered) {
    if (listed.has(key)) continue;
    for (const o of g.outOfShape) outOfShape.push({ key: o.key, reason: o.reason });
  }
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
        message: parts(
          [...byKind].map(([kind, ns]) => `no domain answers kind ${kind} (${ns.length === 1 ? "need" : "needs"} ${names(ns)})`),
        ),
        since: iso(earliest(unanswerable.map((n) => n.created))),
      });
    }
    const failed = failingByModule.get(key) ?? [];
    if (failed.length > 0) {
      conditions.push({
        type: "ProviderFailing",
        reason: "ProviderSaysFailing",
        message: parts(failed.map((f) => `${f.provider} fails it: ${f.word}`)),
        since: failed.map((f) => f.since).sort()[0]!,
      });
    }
    const named = g.needs.filter((n) => n.value.provider !== undefined);
    const notAssigned = named.filter((n) => providers.get(n.value.provider!) === undefined);
    if (notAssigned.length > 0) {
      conditions.push({
        type: "ProviderNotAssigned",
        reason: "ProviderNotAssigned",
        message: parts(notAssigned.map((n) => `need ${n.kind}.${n.name} names provider ${n.value.provider}, assigned to no node`)),
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
        message: parts(
          notReady.map((n) => {
            const p = providers.get(n.value.provider!)!;
            return `need ${n.kind}.${n.name} names provider ${n.value.provider}, assigned to ${p.assigned.slice(0, NAMED).join(", ")}${p.assigned.length > NAMED ? ` and ${p.assigned.length - NAMED} more` : ""} but applied on none`;
          }),
        ),
        since: iso(earliest(notReady.map((n) => n.created))),
      });
    }
    if (g.outOfShape.length > 0) {
      conditions.push({
        type: "OutOfShape",
        reason: "OutOfShape",
        message: parts(g.outOfShape.map((o) => `${o.key}: ${o.reason}`)),
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
      stale: staleByModule.get(key) ?? [],
    };
  });
  return { modules, outOfShape, counts, keys };
}

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
              message: parts(
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

// The last model made, by the stamps of its snapshots: asked again unchanged, it is not made again.
let last: { stamp: string; model: Promise<Model> } | undefined;

/**
 * The model of the views' snapshots now (each view checked current once, docs/verb.md §4.6), made
 * again only when one of them changed since the last one.
 */
export function currentModel(inputs: StateInputs, graceSeconds: number, rotationGraceSeconds = 300): Promise<Model> {
  const stamp = [
    graceSeconds,
    rotationGraceSeconds,
    inputs.rotations.stamp,
    inputs.assignments.stamp,
    inputs.needs.stamp,
    inputs.applied.stamp,
    inputs.registry.stamp,
    inputs.failing.stamp,
  ].join("|");
  if (last?.stamp !== stamp) {
    const model = modelOf(inputs, graceSeconds, rotationGraceSeconds);
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
  const names = ["assignments", "needs", "applied", "registry", "failing", "rotations"] as const;
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

/** The holders stale past their rotation's grace at `now` (docs/rotation.md §8.3), narrowed as status is. */
export function staleHoldersOf(
  model: Model,
  now: Date,
  narrowing: { provider?: string; node?: string; module?: string } = {},
): StaleHolder[] {
  const found: StaleHolder[] = [];
  for (const kept of model.modules) {
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

/** Every stale holder of `model`, within its grace or past it. */
export const staleCount = (model: Model) => model.modules.reduce((n, kept) => n + kept.stale.length, 0);
