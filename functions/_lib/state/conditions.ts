/**
 * The conditions of a module (docs/state.md §7.4), one builder each: the only place each
 * condition's reason, message and `since` are made. A builder given nothing to say of returns
 * `undefined`. Which needs, providers or holders a condition is about is decided by its caller.
 */
import { cutText } from "../../../contract/text.ts";
import { plural } from "../text.ts";
import type { Condition, ConditionType, ModuleState, TimedStaleHolder } from "./vocabulary.ts";

/** The longest `error` and condition message kept, in characters; a longer one is cut and marked with `…`. */
export const MAX_TEXT = 1024;
/** At most this many needs (or nodes) are named in one condition's message; the rest are counted. */
const MAX_NAMED = 10;

/** A need naming its provider module (docs/state.md §7.2), for the provider conditions. */
export interface ProviderNeed {
  readonly kind: string;
  readonly name: string;
  readonly provider: string;
  /** When the need was written. */
  readonly created: Date;
}

/** A provider that says it fails a module (docs/failing.md §5): its word, since when (RFC 3339). */
export interface FailingProvider {
  readonly provider: string;
  readonly word: string;
  readonly since: string;
}

/** The earliest of `dates`, ISO 8601 in UTC. */
const earliest = (dates: readonly Date[]) => new Date(Math.min(...dates.map((d) => d.getTime()))).toISOString();
/** The needs a message names: at most {@link MAX_NAMED}, the rest counted. */
const needNames = (needs: readonly { kind: string; name: string }[]) =>
  needs
    .slice(0, MAX_NAMED)
    .map((n) => `${n.kind}.${n.name}`)
    .join(", ") + (needs.length > MAX_NAMED ? ` and ${needs.length - MAX_NAMED} more` : "");
/** A condition whose message is `parts`: at most {@link MAX_NAMED} of them, the rest counted, cut to {@link MAX_TEXT}. */
const conditionOf = (type: ConditionType, reason: string, parts: readonly string[], since: string): Condition => ({
  type,
  reason,
  message: cutText(
    parts.slice(0, MAX_NAMED).join("; ") + (parts.length > MAX_NAMED ? `; and ${parts.length - MAX_NAMED} more` : ""),
    MAX_TEXT,
  ),
  since,
});

/** `Late`: never-ran or pending past `graceSeconds`; `lateAt` in ms since the epoch. */
export function lateCondition(module: Omit<ModuleState, "presence" | "checks">, lateAt: number, graceSeconds: number): Condition {
  const waiting =
    module.state === "never-ran"
      ? "no applied record and no needs"
      : module.appliedAt === null
        ? `${plural(module.needs, "need")} and no applied record`
        : "needs written after the last applied record";
  return {
    type: "Late",
    reason: module.state === "never-ran" ? "NeverRan" : "Pending",
    message: `${module.state} for longer than ${graceSeconds} s: ${waiting}`,
    since: new Date(lateAt).toISOString(),
  };
}

/** `Unanswerable`: needs whose kind no registry key answers, named by kind. */
export function unanswerableCondition(needs: readonly { kind: string; name: string; created: Date }[]): Condition | undefined {
  if (needs.length === 0) return undefined;
  const byKind = new Map<string, (typeof needs)[number][]>();
  for (const n of needs) byKind.set(n.kind, [...(byKind.get(n.kind) ?? []), n]);
  const parts = [...byKind].map(([kind, ns]) => `no domain answers kind ${kind} (${ns.length === 1 ? "need" : "needs"} ${needNames(ns)})`);
  return conditionOf("Unanswerable", "NoDomain", parts, earliest(needs.map((n) => n.created)));
}

/** `ProviderFailing`: the failing triples whose machine and consumer are the module. */
export function providerFailingCondition(failing: readonly FailingProvider[]): Condition | undefined {
  if (failing.length === 0) return undefined;
  const parts = failing.map((f) => `${f.provider} fails it: ${f.word}`);
  return conditionOf("ProviderFailing", "ProviderSaysFailing", parts, failing.map((f) => f.since).sort()[0]!);
}

/** `ProviderNotAssigned`: needs naming a provider module assigned to no node. */
export function providerNotAssignedCondition(needs: readonly ProviderNeed[]): Condition | undefined {
  if (needs.length === 0) return undefined;
  const parts = needs.map((n) => `need ${n.kind}.${n.name} names provider ${n.provider}, assigned to no node`);
  return conditionOf("ProviderNotAssigned", "ProviderNotAssigned", parts, earliest(needs.map((n) => n.created)));
}

/** `ProviderNotReady`: needs naming a provider module that is assigned (to `assignedNodes(provider)`) but ready on none. */
export function providerNotReadyCondition(
  needs: readonly ProviderNeed[],
  assignedNodes: (provider: string) => Iterable<string>,
): Condition | undefined {
  if (needs.length === 0) return undefined;
  const parts = needs.map((n) => {
    // In the order of the modules' keys.
    const assigned = [...assignedNodes(n.provider)].map((node) => `${node}.${n.provider}`).sort();
    const nodes = assigned.slice(0, MAX_NAMED).map((k) => k.slice(0, k.length - n.provider.length - 1));
    return `need ${n.kind}.${n.name} names provider ${n.provider}, assigned to ${nodes.join(", ")}${assigned.length > MAX_NAMED ? ` and ${assigned.length - MAX_NAMED} more` : ""} but applied on none`;
  });
  return conditionOf("ProviderNotReady", "ProviderNotApplied", parts, earliest(needs.map((n) => n.created)));
}

/** `Unconfirmed`: the module's node is unreachable since `since` (ms since the epoch), having last written presence at `lastSeen` (docs/presence.md §16.2). */
export function unconfirmedCondition(node: string, since: number, lastSeen: number): Condition {
  return conditionOf(
    "Unconfirmed",
    "NodeUnreachable",
    [`node ${node} is unreachable: no presence since ${new Date(lastSeen).toISOString()}, so nothing it recorded is confirmed`],
    new Date(since).toISOString(),
  );
}

/**
 * `ProviderUnreachable`: needs naming a provider module every assigned node of which is
 * unreachable, each with the latest time one of them became so (ms since the epoch); the
 * condition began with the first of them (docs/presence.md §16.2).
 */
export function providerUnreachableCondition(
  needs: readonly { kind: string; name: string; provider: string; nodes: readonly string[]; since: number }[],
): Condition | undefined {
  if (needs.length === 0) return undefined;
  const parts = needs.map((n) => {
    const nodes = n.nodes.slice(0, MAX_NAMED).join(", ") + (n.nodes.length > MAX_NAMED ? ` and ${n.nodes.length - MAX_NAMED} more` : "");
    return `need ${n.kind}.${n.name} names provider ${n.provider}, assigned only to unreachable ${n.nodes.length === 1 ? "node" : "nodes"} ${nodes}`;
  });
  return conditionOf(
    "ProviderUnreachable",
    "ProviderNodesUnreachable",
    parts,
    new Date(Math.min(...needs.map((n) => n.since))).toISOString(),
  );
}

/** A holder's revision of a shared credential that no node of its provider module has applied (docs/presence.md §16.6). */
export interface MismatchedRevision {
  readonly need: string;
  readonly provision: string;
  readonly revision: string;
  readonly provider: string;
  /** The provider module's applied revisions of the provision, by node, in node order. */
  readonly providerRevisions: readonly { readonly node: string; readonly revision: string }[];
  /** The later of the holder's and the provider's applied records (ms since the epoch). */
  readonly since: number;
}

/** `RevisionMismatch`: the frozen password, named with both revisions, nodes and modules (docs/presence.md §16.6). */
export function revisionMismatchCondition(node: string, module: string, mismatched: readonly MismatchedRevision[]): Condition | undefined {
  if (mismatched.length === 0) return undefined;
  const parts = mismatched.map((m) => {
    const theirs = m.providerRevisions
      .slice(0, MAX_NAMED)
      .map((p) => `${m.provider} on ${p.node} applied ${m.revision === p.revision ? "the same" : p.revision}`)
      .join(", ");
    return `${module} on ${node} holds ${m.provision} ${m.revision} (need ${m.need}); ${theirs}`;
  });
  return conditionOf("RevisionMismatch", "ProviderHoldsOther", parts, new Date(Math.min(...mismatched.map((m) => m.since))).toISOString());
}

/** A failing check of a module (docs/presence.md §16.5), and whether the module holds the newest rotation of its provision. */
export interface FailingCheck {
  readonly provision: string;
  readonly reason: string;
  readonly message: string | null;
  readonly revision: string | null;
  /** Its streak's start (RFC 3339). */
  readonly since: string;
  /** Whether the revision checked is the newest a rotation of the provision reaching the module named. */
  readonly caughtUp: boolean;
}

/**
 * `CheckFailing`: the module's newest check of each of these provisions is not ok; `reason` the
 * first one's. One of reason `AuthFailed` on a holder caught up with the newest rotation says so:
 * the frozen password (docs/presence.md §16.5).
 */
export function checkFailingCondition(failing: readonly FailingCheck[]): Condition | undefined {
  if (failing.length === 0) return undefined;
  const parts = failing.map(
    (c) =>
      `check of ${c.provision} fails: ${c.reason}${c.message === null ? "" : `: ${c.message}`}` +
      (c.revision === null ? "" : ` (revision ${c.revision})`) +
      (c.caughtUp && c.reason === "AuthFailed" ? "; it holds the newest revision: the provider does not accept it" : ""),
  );
  return conditionOf("CheckFailing", failing[0]!.reason, parts, failing.map((c) => c.since).sort()[0]!);
}

/** `Stale`: holders of a rotated provision not on its new revision past the rotation's grace (docs/rotation.md §8.3). */
export function staleCondition(stale: readonly TimedStaleHolder[]): Condition | undefined {
  if (stale.length === 0) return undefined;
  const parts = stale.map(
    (h) =>
      `${h.provider} rotated ${h.provision} to ${h.revision}; it holds ${h.heldRevision ?? "no revision of it"} (need ${h.key.split(".").slice(2).join(".")})`,
  );
  return conditionOf("Stale", "RotationNotApplied", parts, new Date(Math.min(...stale.map((h) => h.staleAt))).toISOString());
}

/** `OutOfShape`: keys of the module out of their bucket's shape, bad fields of its records, `at` when each was written. */
export function outOfShapeCondition(found: readonly { key: string; reason: string; at: Date }[]): Condition | undefined {
  if (found.length === 0) return undefined;
  const parts = found.map((o) => `${o.key}: ${o.reason}`);
  return conditionOf("OutOfShape", "OutOfShape", parts, earliest(found.map((o) => o.at)));
}
