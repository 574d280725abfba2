import { z } from "zod";
import {
  badInput,
  formatIssues,
  RevisionConflict,
  type KeyRecord,
  type ReadBucket,
  type TriggerInfo,
  type WriteBucket,
} from "../../runtime/index.ts";
import { decodeKey, filtersFor, MAX_TOKEN, TOKEN, token } from "./keys.ts";

/** The status verb's subject (SPEC §5). */
export const STATUS = "mesh-provisioner.status";
/** The function whose last scheduled run is the registry's `compiledAt`. */
export const COMPILE_FUNCTION = "registry-compile";
/** The longest failing word kept, in characters; a longer one is cut, never refused. */
export const MAX_WORD = 1024;

const FRACTION = /^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)$/;

/**
 * An RFC 3339 time as nanoseconds since the epoch, so events of one millisecond still order
 * by their full fraction. `at` must have passed {@link rfc3339}.
 */
export function instant(at: string): bigint {
  const [, seconds, fraction = "", zone] = FRACTION.exec(at.toUpperCase())!;
  return BigInt(Date.parse(`${seconds}${zone}`)) * 1_000_000n + BigInt(fraction.padEnd(9, "0").slice(0, 9));
}

/** An RFC 3339 time with its offset (`2026-11-29T18:00:00Z`, `…T19:00:00.5+01:00`). */
export const rfc3339 = z
  .string()
  .refine(
    (s) => z.iso.datetime({ offset: true }).safeParse(s.toUpperCase()).success && FRACTION.test(s.toUpperCase()) && !Number.isNaN(Date.parse(s)),
    "must be an RFC 3339 time with an offset, e.g. 2026-11-29T18:00:00Z",
  );

const triple = { machine: token, consumer: token, at: rfc3339 };

/**
 * `<provider>.provisioner.failing` (SPEC §5): `{ machine, consumer, word, at }`. Fields beyond
 * these are ignored, so a provider that says more still raises its failing.
 */
export const failingEvent = z.object({ ...triple, word: z.string().min(1, "must say what fails") });
/** `<provider>.provisioner.recovered` (SPEC §5): `{ machine, consumer, at }`; a `word` is ignored. */
export const recoveredEvent = z.object(triple);
export type FailingEvent = z.output<typeof failingEvent>;
export type RecoveredEvent = z.output<typeof recoveredEvent>;

/**
 * The provider an event came from: the first token of its subject
 * (`<provider>.provisioner.failing`). Throws a 400 when the run has no subject or that token
 * is not a token (SPEC §2).
 */
export function providerOf(trigger: TriggerInfo): string {
  if (trigger.kind !== "event") throw badInput("the provider is the first token of the event's subject, and this run has none");
  const { subject } = trigger;
  const provider = subject.slice(0, subject.indexOf("."));
  if (!TOKEN.test(provider) || provider.length > MAX_TOKEN) {
    throw badInput(`subject ${subject}: the provider "${provider.slice(0, 64)}" is not one token (A-Z a-z 0-9 - _ / =)`);
  }
  return provider;
}

/** A word as kept: at most {@link MAX_WORD} characters, a longer one cut and marked with `…`. */
export function keptWord(word: string): string {
  const chars = [...word];
  return chars.length <= MAX_WORD ? word : `${chars.slice(0, MAX_WORD - 1).join("")}…`;
}

/** The value of a failing triple's key: its newest word, its streak's first and newest times. */
const failingValue = z.strictObject({ word: z.string(), since: rfc3339, at: rfc3339 });
/** What a recovery leaves in the delete marker of the key: when, and since when it had failed. */
const recoveredValue = z.strictObject({ recovered: rfc3339, since: rfc3339.optional() });

/** What the bucket keeps for one triple, read from its last record. */
export type Kept =
  | { readonly state: "failing"; readonly revision: number; readonly word: string; readonly since: string; readonly at: string }
  | { readonly state: "recovered"; readonly revision: number; readonly at: string; readonly since?: string }
  | { readonly state: "none"; readonly revision: number };

const decoder = new TextDecoder();
function parsed<T>(schema: z.ZodType<T>, value: Uint8Array): T | undefined {
  try {
    const result = schema.safeParse(JSON.parse(decoder.decode(value)));
    return result.success ? result.data : undefined;
  } catch {
    return undefined;
  }
}

/**
 * Reads a triple's last record: a live value is a failing, a delete marker holding a
 * recovery is a recovered (remembered so older events cannot raise it again), anything else
 * (never written, deleted by hand, unreadable) is none, at the record's revision.
 */
export function keptOf(record: KeyRecord | null): Kept {
  if (record === null) return { state: "none", revision: 0 };
  if (!record.deleted) {
    const value = parsed(failingValue, record.value);
    return value === undefined ? { state: "none", revision: record.revision } : { state: "failing", revision: record.revision, ...value };
  }
  const value = parsed(recoveredValue, record.value);
  return value === undefined
    ? { state: "none", revision: record.revision }
    : { state: "recovered", revision: record.revision, at: value.recovered, ...(value.since ? { since: value.since } : {}) };
}

/** What one event did to the state. */
export type Change = "raised" | "updated" | "recovered" | "remembered" | "older";

/** The key of a triple in the failing bucket (SPEC §2): `<provider>.<machine>.<consumer>`. */
export const failingKey = (provider: string, machine: string, consumer: string) => `${provider}.${machine}.${consumer}`;

/**
 * Applies one event to the failing bucket (SPEC §5), newest wins by `at`:
 * - an event no newer than what is kept for its triple changes nothing (`older`; the same
 *   event delivered twice is one of these);
 * - a failing writes `{ word, since, at }`, keeping `since` while the triple was already failing
 *   (`updated`), else starting the streak at `at` (`raised`);
 * - a recovered deletes the key, its delete marker keeping `{ recovered, since }` so that an
 *   older failing arriving later does not raise it again (`recovered`, or `remembered` when
 *   nothing was failing).
 * Every write is compare-and-set on the key's last revision, read again on a conflict, so
 * replicas applying events of one triple at once never lose one.
 */
export async function applyEvent(
  bucket: WriteBucket,
  provider: string,
  event: { kind: "failing"; event: FailingEvent } | { kind: "recovered"; event: RecoveredEvent },
): Promise<Change> {
  const { machine, consumer, at } = event.event;
  const key = failingKey(provider, machine, consumer);
  for (let attempt = 0; ; attempt++) {
    const kept = keptOf(await bucket.last(key));
    if (kept.state !== "none" && instant(at) <= instant(kept.at)) return "older";
    try {
      if (event.kind === "failing") {
        const since = kept.state === "failing" ? kept.since : at;
        await bucket.update(key, JSON.stringify({ word: keptWord(event.event.word), since, at }), kept.revision);
        return kept.state === "failing" ? "updated" : "raised";
      }
      const since = kept.state === "failing" || kept.state === "recovered" ? kept.since : undefined;
      await bucket.delete(key, { revision: kept.revision, value: JSON.stringify({ recovered: at, ...(since ? { since } : {}) }) });
      return kept.state === "failing" ? "recovered" : "remembered";
    } catch (err) {
      if (!(err instanceof RevisionConflict) || attempt === 50) throw err;
    }
  }
}

/** The narrowing of status: each a token, like the verb's (SPEC §4). */
export const statusRequest = z.strictObject({
  provider: token.optional(),
  machine: token.optional(),
  consumer: token.optional(),
});
export type StatusRequest = z.output<typeof statusRequest>;

/** One failing triple of status. */
export interface Failing {
  readonly provider: string;
  readonly machine: string;
  readonly consumer: string;
  readonly word: string;
  readonly since: string;
  readonly at: string;
}

/** The status answer (SPEC §5). */
export interface Status {
  /** True only when nothing the narrowing reaches is failing. */
  readonly well: boolean;
  /** Sorted by provider, machine, consumer. */
  readonly failing: Failing[];
  /** Keys of the failing bucket that are no triple or hold no failing value: failing all the same. */
  readonly outOfShape: { key: string; reason: string }[];
  /** Failing triples left out because the answer would not fit in one reply. */
  readonly omitted: number;
  readonly registry: { readonly kinds: string[]; readonly compiledAt: string | null };
  /** Events the follower refused (not JSON, or not an event), since the bucket was made. */
  readonly rejectedEvents: number;
}

const order = (a: string, b: string) => (a < b ? -1 : a > b ? 1 : 0);
const byTriple = (a: Failing, b: Failing) =>
  order(a.provider, b.provider) || order(a.machine, b.machine) || order(a.consumer, b.consumer);

/** The failing triples and out-of-shape keys among the live keys of the failing bucket. */
export function failingOf(entries: readonly { key: string; value: Uint8Array }[]): Pick<Status, "failing" | "outOfShape"> {
  const failing: Failing[] = [];
  const outOfShape: { key: string; reason: string }[] = [];
  for (const { key, value } of entries) {
    const decoded = decodeKey("failing", key);
    if (!decoded.ok) {
      outOfShape.push({ key, reason: decoded.reason });
      continue;
    }
    let json: unknown;
    try {
      json = JSON.parse(decoder.decode(value));
    } catch (err) {
      outOfShape.push({ key, reason: `value is not JSON: ${(err as Error).message}` });
      continue;
    }
    const checked = failingValue.safeParse(json);
    if (!checked.success) outOfShape.push({ key, reason: `value is not { word, since, at }: ${formatIssues(checked.error.issues)}` });
    else failing.push({ ...decoded.fields, ...checked.data });
  }
  return { failing: failing.sort(byTriple), outOfShape };
}

/** Bytes kept free in a reply beyond the answer's own JSON. */
const HEADROOM = 1024;

/**
 * Status (SPEC §5) of what `request` narrows to, from the failing and registry buckets and
 * the runtime's count of refused events. `well` is false while any reached key is failing or
 * out of shape. When the answer would not fit in `maxPayload`, the last failing triples are
 * left out and counted in `omitted`.
 */
export async function readStatus(
  request: StatusRequest,
  buckets: { failing: ReadBucket; registry: ReadBucket },
  runtime: { lastRun(name: string): Promise<{ at: Date } | null>; refusedEvents(): Promise<{ count: number }> },
  maxPayload: number,
): Promise<Status> {
  const [entries, kinds, compiled, refused] = await Promise.all([
    buckets.failing.list(filtersFor("failing", request)),
    buckets.registry.list(">"),
    runtime.lastRun(COMPILE_FUNCTION),
    runtime.refusedEvents(),
  ]);
  const { failing, outOfShape } = failingOf(entries);
  const status: Status = {
    well: failing.length === 0 && outOfShape.length === 0,
    failing,
    outOfShape,
    omitted: 0,
    registry: { kinds: kinds.map((e) => e.key), compiledAt: compiled?.at.toISOString() ?? null },
    rejectedEvents: refused.count,
  };
  let size = Buffer.byteLength(JSON.stringify(status));
  let kept = failing.length;
  while (size > maxPayload - HEADROOM && kept > 0) size -= Buffer.byteLength(JSON.stringify(failing[--kept])) + 1;
  return kept === failing.length ? status : { ...status, failing: failing.slice(0, kept), omitted: failing.length - kept };
}
