/**
 * Records of the views gathered by module `<node>.<module>` (docs/state.md §7.1, §7.2): the
 * assignment, needs and applied record of each module with their keys out of shape, the
 * providers failing each module, and each module's stale holders.
 */
import type { Entry, KeyRecord, Snapshot } from "../../../runtime/index.ts";
import { decodeKey, TOKEN } from "../../../contract/keys.ts";
import { appliedIndex, appliedOf } from "../applied.ts";
import { failingOf } from "../follower.ts";
import { heldIn, holdersIndex } from "../holders.ts";
import { rotationStates } from "../rotation.ts";
import { rotationsIn } from "../rotation-record.ts";
import { checksOf, type Check } from "../checks.ts";
import type { FailingProvider } from "./conditions.ts";
import type { OutOfShapeKey, StateInputs, TimedStaleHolder } from "./vocabulary.ts";

// Values are UTF-8 JSON: bytes that are not UTF-8 are said, never read as U+FFFD.
const decoder = new TextDecoder("utf-8", { fatal: true });

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

/** One need of a module as gathered: its key's kind and name, when the server stored it (`created`, and in ns), its value read. */
export interface GatheredNeed {
  readonly key: string;
  readonly kind: string;
  readonly name: string;
  readonly created: Date;
  readonly nanos: number;
  readonly value: NeedValue;
}

/** The records of one module in the assignments, needs and applied buckets. */
export interface GatheredModule {
  /** Its assignment, or the delete marker that removed it. */
  assignment?: KeyRecord;
  needs: GatheredNeed[];
  /** Its applied record: when stored (`created`, and in ns), its `error` and `revisions`. */
  applied?: { created: Date; nanos: number; error?: string; revisions?: Readonly<Record<string, string>> };
  /** Its keys out of shape, `at` when each was written. */
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

/** `node.module` of a key, when its first two tokens are tokens. */
export function moduleOfKey(key: string): string | undefined {
  const [node, module] = key.split(".");
  return node !== undefined && module !== undefined && TOKEN.test(node) && TOKEN.test(module) ? `${node}.${module}` : undefined;
}

/** Records of the three buckets a module is made of, gathered by module; keys naming none apart. */
export interface GatheredRecords {
  readonly byModule: Map<string, GatheredModule>;
  /** Keys out of shape the answer's `outOfShape` says, by the module their first two tokens name (an assignment key with more than two). */
  readonly answerOutOfShape: Map<string, OutOfShapeKey[]>;
  /** Keys out of shape whose first two tokens are not tokens (they name no module), by `<bucket>:<key>`. */
  readonly noModuleOutOfShape: Map<string, OutOfShapeKey>;
}

/**
 * Gathers records of the assignments (delete markers included), needs and applied buckets by
 * module: the assignment, the needs decoded and their values read, the applied record's fields;
 * a key out of shape is its module's when its first two tokens are tokens.
 */
export function gatherByModule(assignments: readonly KeyRecord[], needs: readonly Entry[], applied: readonly Entry[]): GatheredRecords {
  const byModule = new Map<string, GatheredModule>();
  const answerOutOfShape = new Map<string, OutOfShapeKey[]>();
  const noModuleOutOfShape = new Map<string, OutOfShapeKey>();
  const gatheredAt = (key: string) => {
    let g = byModule.get(key);
    if (g === undefined) byModule.set(key, (g = { needs: [], outOfShape: [] }));
    return g;
  };
  /** A key out of shape: the module's when it can be told, the answer's otherwise. */
  const addOutOfShape = (bucket: string, key: string, reason: string, created: Date, module = moduleOfKey(key)) => {
    if (module === undefined) noModuleOutOfShape.set(`${bucket}:${key}`, { key: `${bucket}:${key}`, reason });
    else gatheredAt(module).outOfShape.push({ key: `${bucket}:${key}`, reason, at: created });
  };
  for (const record of assignments) {
    const decoded = decodeKey("assignments", record.key);
    if (!decoded.ok) {
      if (record.deleted) continue;
      const found = { key: `assignments:${record.key}`, reason: decoded.reason };
      const module = moduleOfKey(record.key);
      if (module === undefined) noModuleOutOfShape.set(found.key, found);
      else answerOutOfShape.set(module, [...(answerOutOfShape.get(module) ?? []), found]);
      continue;
    }
    gatheredAt(record.key).assignment = record;
    const problem = record.deleted ? null : assignmentProblem(record);
    if (problem !== null) gatheredAt(record.key).outOfShape.push({ key: `assignments:${record.key}`, reason: problem, at: record.created });
  }
  for (const entry of needs) {
    const decoded = decodeKey("needs", entry.key);
    if (!decoded.ok) {
      addOutOfShape("needs", entry.key, decoded.reason, entry.created);
      continue;
    }
    const { node, module, kind, name } = decoded.fields;
    const value = needValueOf(entry);
    gatheredAt(`${node}.${module}`).needs.push({ key: entry.key, kind, name, created: entry.created, nanos: entry.createdNanos, value });
    if (value.bad !== undefined) addOutOfShape("needs", entry.key, value.bad, entry.created, `${node}.${module}`);
  }
  for (const entry of applied) {
    const decoded = decodeKey("applied", entry.key);
    if (!decoded.ok) {
      addOutOfShape("applied", entry.key, decoded.reason, entry.created);
      continue;
    }
    const record = appliedOf(entry);
    gatheredAt(entry.key).applied = {
      created: entry.created,
      nanos: entry.createdNanos,
      ...(record.error === undefined ? {} : { error: record.error }),
      ...(record.revisions === undefined ? {} : { revisions: record.revisions }),
    };
    for (const reason of record.bad) addOutOfShape("applied", entry.key, reason, entry.created, entry.key);
  }
  return { byModule, answerOutOfShape, noModuleOutOfShape };
}

/** The failing providers of each module `<machine>.<consumer>` (docs/failing.md §5). */
export async function failingByModule(failing: Snapshot): Promise<Map<string, readonly FailingProvider[]>> {
  const byModule = new Map<string, FailingProvider[]>();
  for (const f of failingOf(await failing.reads.list(">")).failing) {
    const key = `${f.machine}.${f.consumer}`;
    byModule.set(key, [...(byModule.get(key) ?? []), { provider: f.provider, word: f.word, since: f.since }]);
  }
  return byModule;
}

/** The stale holders of each module (docs/rotation.md §8.3), each with when it passes the rotation's grace; and how many rotations are kept. */
export async function staleByModule(
  inputs: StateInputs,
  rotationGraceSeconds: number,
): Promise<{ rotations: number; byModule: Map<string, readonly TimedStaleHolder[]> }> {
  const { rotations } = await rotationsIn(inputs.rotations.reads);
  const byModule = new Map<string, TimedStaleHolder[]>();
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

/** The kept checks of each module `<node>.<module>` (docs/presence.md §16.5), in provision order. */
export async function checksByModule(checks: Snapshot): Promise<Map<string, readonly Check[]>> {
  const byModule = new Map<string, Check[]>();
  for (const c of checksOf(await checks.reads.list(">")).checks) {
    const key = `${c.node}.${c.module}`;
    byModule.set(key, [...(byModule.get(key) ?? []), c]);
  }
  return byModule;
}

/**
 * The revision of the newest rotation reaching each holder (docs/rotation.md §8.2): by
 * `<provision>` for a rotation of every holder, and by `<provision> <node>.<module>` for one of
 * a single holder's.
 */
export async function rotatedRevisions(rotations: Snapshot): Promise<Map<string, string>> {
  const newest = new Map<string, string>();
  for (const r of (await rotationsIn(rotations.reads)).rotations) {
    newest.set(r.machine === undefined ? r.provision : `${r.provision} ${r.machine}.${r.consumer}`, r.revision);
  }
  return newest;
}
