/**
 * The words and shapes of the provisioning state (docs/state.md §7): the states and condition
 * types, a module's state and its conditions with their schemas, the config, the views the state
 * reads, and the model those views make.
 */
import { z } from "zod";
import type { Snapshot } from "../../../runtime/index.ts";
import type { Check } from "../checks.ts";
import type { StaleHolder } from "../rotation.ts";
import { rotationConfig } from "../rotation-record.ts";

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
  "Unconfirmed",
  "ProviderUnreachable",
  "CheckFailing",
  "RevisionMismatch",
  "Stale",
  "OutOfShape",
] as const;
export type ConditionType = (typeof CONDITIONS)[number];
/** What is said of a node from its presence writes (docs/presence.md §16.1), in the order counts are said. */
export const PRESENCES = ["reachable", "unreachable", "silent"] as const;
export type Presence = (typeof PRESENCES)[number];

/** `provisioning` of `wrangler-free.config.ts` (docs/state.md §7): how long never-ran or pending may last before it is Late. */
export const provisioningConfig = z
  .object({
    provisioning: z.strictObject({ graceSeconds: z.number().int().min(1).default(600) }).default({ graceSeconds: 600 }),
    // docs/presence.md §16.1: how long a node may write no presence before it is unreachable, in seconds.
    presence: z.strictObject({ ttlSeconds: z.number().int().min(1).default(60) }).default({ ttlSeconds: 60 }),
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
  /** What is said of its node's presence at the time asked (docs/presence.md §16.1). */
  readonly presence: Presence;
  /** Its kept checks (docs/presence.md §16.5): how many are ok, failing, and unconfirmed (its node not reachable). */
  readonly checks: { readonly ok: number; readonly failing: number; readonly unconfirmed: number };
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
  presence: z.enum(PRESENCES),
  checks: z.object({ ok: z.number().int(), failing: z.number().int(), unconfirmed: z.number().int() }),
}) satisfies z.ZodType<ModuleState>;

/** The views state reads (docs/state.md §7.1), by their config names: the one list, every other derived from it. */
export const STATE_VIEWS = ["assignments", "needs", "applied", "registry", "failing", "rotations", "presence", "checks"] as const;
export type StateView = (typeof STATE_VIEWS)[number];
/**
 * The views a node's entry (what=nodes, docs/presence.md §16.3) depends on: its presence, and its
 * modules, each listed by an assignment, needs or an applied record (module.ts `listed`).
 */
export const NODE_VIEWS = ["presence", "assignments", "needs", "applied"] as const satisfies readonly StateView[];
/** The views the state is made of, as snapshots (one freshness check each). */
export type StateInputs = { readonly [V in StateView]: Snapshot };

/** A stale holder of a module with when it passes its rotation's grace (ms since the epoch, docs/rotation.md §8.3). */
export type TimedStaleHolder = StaleHolder & { readonly staleAt: number };

/** A need naming a provider module assigned to some node: those nodes, in key order (for `ProviderUnreachable`, docs/presence.md §16.2). */
export interface AssignedProviderNeed {
  readonly kind: string;
  readonly name: string;
  readonly provider: string;
  readonly nodes: readonly string[];
}

/** A module as the model tracks it: its state without what depends on the time asked (`Late`, `Stale`, its node's presence). */
export interface TrackedModule {
  /** Its state and the conditions that do not depend on the time. */
  readonly base: Omit<ModuleState, "presence" | "checks">;
  /** How many of its kept checks are ok and failing. */
  readonly checks: { readonly ok: number; readonly failing: number };
  /** Its needs naming a provider module that is assigned. */
  readonly providerNeeds: readonly AssignedProviderNeed[];
  /** When it becomes Late (ms since the epoch): never-ran or pending only. */
  readonly lateAt: number | null;
  /** Whether it counts against the mesh whatever the time (a state or a condition besides Late and Stale). */
  readonly countsAgainstAnyTime: boolean;
  /** Its holders stale for a rotation, within their grace or past it. */
  readonly stale: readonly TimedStaleHolder[];
}

/** Modules by key `<node>.<module>`, in key order (a B+ tree). */
export type Modules = Pick<import("sorted-btree").default<string, TrackedModule>, "get" | "has" | "size" | "keys" | "values" | "entries">;

/** A node's last presence write (docs/presence.md §16.1): when the server stored it, what it says, and when the node is unreachable without another. */
export interface NodePresence {
  readonly node: string;
  /** When the server stored the last write (its `created`), ms since the epoch. */
  readonly lastSeen: number;
  /** The period the write states, in seconds (`null` when its value is out of shape). */
  readonly everySeconds: number | null;
  readonly client: string | null;
  /** The last write plus the longer of `presence.ttlSeconds` and three times `everySeconds`, ms since the epoch. */
  readonly unreachableAt: number;
}
/** Nodes' presence by node, in key order (a B+ tree). */
export type NodePresences = Pick<
  import("sorted-btree").default<string, NodePresence>,
  "get" | "has" | "size" | "keys" | "values" | "entries"
>;
/** Nodes with a listed module, by node: how many (a B+ tree). */
export type NodeModules = Pick<import("sorted-btree").default<string, number>, "get" | "has" | "size" | "keys" | "values" | "entries">;

/** A key out of its bucket's shape, `<bucket>:<key>`, and why. */
export interface OutOfShapeKey {
  readonly key: string;
  readonly reason: string;
}

/** Every module's state of one set of snapshots, and the keys that name no module. Never changed once made. */
export interface Model {
  /** Every module, by key. */
  readonly modules: Modules;
  /** The modules that count against the mesh, or may come to without a write (never-ran or pending: Late once their grace passes; holding a stale holder), by key. */
  readonly watched: Modules;
  /** Keys that name no module, by `<bucket>:<key>`. */
  readonly outOfShape: readonly OutOfShapeKey[];
  readonly counts: Readonly<Record<State, number>>;
  /** Modules carrying each condition, those that depend on the time asked left out (Late, Stale, Unconfirmed, ProviderUnreachable). */
  readonly conditions: Readonly<Record<ConditionType, number>>;
  /** Stale holders, within their grace or past it. */
  readonly staleHolders: number;
  /** Every kept check, ok and failing, of a module the model lists or not (docs/presence.md §16.5). */
  readonly checks: { readonly ok: number; readonly failing: number };
  /** Every kept check, by module key (`<node>.<module>`), of a module the model lists or not. */
  readonly keptChecks: ReadonlyMap<string, readonly Check[]>;
  /** The modules with a need naming an assigned provider module, by key: those `ProviderUnreachable` may come to. */
  readonly consumers: Modules;
  /** Every node's last presence write, by node. */
  readonly presence: NodePresences;
  /** The nodes with a listed module, by node. */
  readonly nodes: NodeModules;
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

/** A count of zero for each state. */
export const zeroCounts = () => Object.fromEntries(STATES.map((s) => [s, 0])) as Record<State, number>;
/** A count of zero for each condition type. */
export const zeroConditionCounts = () => Object.fromEntries(CONDITIONS.map((c) => [c, 0])) as Record<ConditionType, number>;

/** Provisioning of a status that speaks of no module (narrowed by provider). */
export const NO_PROVISIONING: Provisioning = Object.freeze({
  counts: Object.freeze(zeroCounts()),
  notWell: [],
  omitted: 0,
});
