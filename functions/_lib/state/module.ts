/**
 * One module's state (docs/state.md §7.3, §7.4): its state from its gathered records, what the
 * keeper holds of it between updates (its parts), and the module tracked in the model, its
 * conditions made from its parts and from what the keeper knows of other modules and buckets.
 */
import type { Check } from "../checks.ts";
import { DEFAULT_CHECK_REASON } from "../../../contract/events.ts";
import {
  checkFailingCondition,
  revisionMismatchCondition,
  outOfShapeCondition,
  providerFailingCondition,
  providerNotAssignedCondition,
  providerNotReadyCondition,
  unanswerableCondition,
  type FailingProvider,
  type ProviderNeed,
} from "./conditions.ts";
import type { GatheredModule } from "./gather.ts";
import type { Condition, ModuleState, OutOfShapeKey, State, TimedStaleHolder, TrackedModule } from "./vocabulary.ts";

/** The state of one gathered module (docs/state.md §7.3), and when it began. */
function stateOfGathered(g: GatheredModule): { state: State; since: Date } {
  const assigned = g.assignment !== undefined && !g.assignment.deleted;
  // By the server's nanoseconds: a need and an applied record of one millisecond are told apart.
  const firstWritten = (needs: GatheredModule["needs"]) => needs.reduce((a, b) => (b.nanos < a.nanos ? b : a)).created;
  if (!assigned) {
    if (g.assignment?.deleted) return { state: "unassigned", since: g.assignment.created };
    const records = [...g.needs, ...(g.applied === undefined ? [] : [g.applied])];
    return { state: "unassigned", since: records.reduce((a, b) => (b.nanos > a.nanos ? b : a)).created };
  }
  if (g.applied === undefined) {
    if (g.needs.length === 0) return { state: "never-ran", since: g.assignment!.created };
    return { state: "pending", since: firstWritten(g.needs) };
  }
  const after = g.needs.filter((n) => n.nanos > g.applied!.nanos);
  if (after.length > 0) return { state: "pending", since: firstWritten(after) };
  if (g.applied.error !== undefined) return { state: "failed", since: g.applied.created };
  return { state: g.needs.length === 0 ? "declares-nothing" : "applied", since: g.applied.created };
}

/** What the model keeps of a module between updates: all its conditions but those of other modules' or buckets' making. */
export interface ModuleParts {
  /** Assigned, or with needs or an applied record (an assignment's delete marker alone is none). */
  readonly listed: boolean;
  /** The keys out of shape it puts in the answer's `outOfShape` (all of its own when it is not listed). */
  readonly answerOutOfShape: readonly OutOfShapeKey[];
  /** Its state without conditions (`listed` only). */
  readonly base?: Omit<ModuleState, "conditions" | "presence" | "checks">;
  readonly since?: Date;
  readonly unanswerable?: Condition | undefined;
  readonly outOfShape?: Condition | undefined;
  readonly providerNeeds: readonly ProviderNeed[];
  /** Its applied record's `revisions` and when it was written, when it has some. */
  readonly revisions?: { readonly of: Readonly<Record<string, string>>; readonly at: Date };
}

/** A module's {@link ModuleParts} from its gathered records, with the kinds some domain answers. */
export function modulePartsOf(
  key: string,
  g: GatheredModule | undefined,
  answerOutOfShape: readonly OutOfShapeKey[],
  kinds: ReadonlySet<string>,
): ModuleParts {
  const listed =
    g !== undefined && ((g.assignment !== undefined && !g.assignment.deleted) || g.needs.length > 0 || g.applied !== undefined);
  if (!listed) {
    const own = (g?.outOfShape ?? []).map(({ key, reason }) => ({ key, reason }));
    return { listed, answerOutOfShape: [...answerOutOfShape, ...own], providerNeeds: [] };
  }
  const [node, module] = key.split(".") as [string, string];
  const { state, since } = stateOfGathered(g);
  return {
    listed,
    answerOutOfShape,
    base: {
      key,
      node,
      module,
      state,
      since: since.toISOString(),
      assigned: g.assignment !== undefined && !g.assignment.deleted,
      needs: g.needs.length,
      appliedAt: g.applied === undefined ? null : g.applied.created.toISOString(),
      ...(g.applied?.error === undefined ? {} : { error: g.applied.error }),
    },
    since,
    unanswerable: unanswerableCondition(g.needs.filter((n) => !kinds.has(n.kind))),
    outOfShape: outOfShapeCondition(g.outOfShape),
    ...(g.applied?.revisions === undefined ? {} : { revisions: { of: g.applied.revisions, at: g.applied.created } }),
    providerNeeds: g.needs.flatMap((n) =>
      n.value.provider === undefined ? [] : [{ kind: n.kind, name: n.name, provider: n.value.provider, created: n.created }],
    ),
  };
}

/** Where a provider module is assigned, and where it is ready (applied or declares nothing): node names. */
export interface ProviderNodes {
  readonly assigned: Set<string>;
  readonly ready: Set<string>;
  /** Its applied `revisions` on each node where it is assigned and has some, by node. */
  readonly revisions: Map<string, { readonly of: Readonly<Record<string, string>>; readonly at: Date }>;
}

/** What the keeper knows of other modules and buckets that a module's state depends on. */
export interface CrossModuleFacts {
  readonly graceSeconds: number;
  /** The failing providers of each module, by key. */
  readonly failing: ReadonlyMap<string, readonly FailingProvider[]>;
  /** The stale holders of each module, by key. */
  readonly stale: ReadonlyMap<string, readonly TimedStaleHolder[]>;
  /** Where each module name is assigned and ready, by module name. */
  readonly providerNodes: ReadonlyMap<string, ProviderNodes>;
  /** The kept checks of each module, by key (docs/presence.md §16.5). */
  readonly checks: ReadonlyMap<string, readonly Check[]>;
  /** The newest rotated revision by provision, and by `<provision> <node>.<module>` for one holder's ({@link rotatedRevisions}). */
  readonly rotatedTo: ReadonlyMap<string, string>;
}

/** Whether a module is ready as a provider: applied, or declares nothing. */
export const isReady = (base: { state: State }) => base.state === "applied" || base.state === "declares-nothing";

/** A listed module as the model tracks it, its conditions made from its parts and from `facts`. */
export function trackedModuleOf(key: string, parts: ModuleParts, facts: CrossModuleFacts): TrackedModule {
  const base = parts.base!;
  const notAssigned = parts.providerNeeds.filter((n) => (facts.providerNodes.get(n.provider)?.assigned.size ?? 0) === 0);
  const notReady = parts.providerNeeds.filter((n) => {
    const p = facts.providerNodes.get(n.provider);
    return p !== undefined && p.assigned.size > 0 && p.ready.size === 0;
  });
  // The frozen password (docs/presence.md §16.6): a revision of a shared credential no node of its provider applied.
  const mismatched = parts.providerNeeds.flatMap((n) => {
    const provision = n.name.split("/")[0]!;
    const held = parts.revisions?.of[provision];
    const theirs = [...(facts.providerNodes.get(n.provider)?.revisions ?? [])]
      .filter(([, r]) => r.of[provision] !== undefined)
      .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
    if (held === undefined || theirs.length === 0 || theirs.some(([, r]) => r.of[provision] === held)) return [];
    const latest = Math.max(...theirs.map(([, r]) => r.at.getTime()));
    return [
      {
        need: `${n.kind}.${n.name}`,
        provision,
        revision: held,
        provider: n.provider,
        providerRevisions: theirs.map(([node, r]) => ({ node, revision: r.of[provision]! })),
        since: Math.max(latest, parts.revisions!.at.getTime()),
      },
    ];
  });
  const checks = facts.checks.get(key) ?? [];
  const failingChecks = checks
    .filter((c) => !c.ok)
    .map((c) => {
      const newest = facts.rotatedTo.get(`${c.provision} ${key}`) ?? facts.rotatedTo.get(c.provision);
      return {
        provision: c.provision,
        reason: c.reason ?? DEFAULT_CHECK_REASON,
        message: c.message,
        revision: c.revision,
        since: c.since,
        caughtUp: newest !== undefined && c.revision === newest,
      };
    });
  const conditions = [
    parts.unanswerable,
    providerFailingCondition(facts.failing.get(key) ?? []),
    providerNotAssignedCondition(notAssigned),
    providerNotReadyCondition(notReady, (provider) => facts.providerNodes.get(provider)!.assigned),
    revisionMismatchCondition(base.node, base.module, mismatched),
    checkFailingCondition(failingChecks),
    parts.outOfShape,
  ].filter((c): c is Condition => c !== undefined);
  const { state } = base;
  const progressing = state === "never-ran" || state === "pending";
  const providerNeeds = parts.providerNeeds.flatMap(({ kind, name, provider }) => {
    const assigned = facts.providerNodes.get(provider)?.assigned;
    return assigned === undefined || assigned.size === 0 ? [] : [{ kind, name, provider, nodes: [...assigned].sort() }];
  });
  return {
    base: { ...base, conditions },
    checks: { ok: checks.length - failingChecks.length, failing: failingChecks.length },
    providerNeeds,
    lateAt: progressing ? parts.since!.getTime() + facts.graceSeconds * 1000 : null,
    countsAgainstAnyTime: conditions.length > 0 || !(progressing || isReady(base)),
    stale: facts.stale.get(key) ?? [],
  };
}

/** Whether a module is among the model's `watched`: it counts against the mesh, or may come to without a write. */
export const isWatched = (m: TrackedModule) => m.countsAgainstAnyTime || m.lateAt !== null || m.stale.length > 0;
