import { z } from "zod";
import {
  badInput,
  formatIssues,
  keyedSerial,
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

const PARTS = /^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)$/;

/** A time's whole seconds since the epoch and its fraction's digits, trailing zeros dropped. */
function parts(at: string): { seconds: number; fraction: string } {
  const [, whole, fraction = "", zone] = PARTS.exec(at.toUpperCase())!;
  return { seconds: Date.parse(`${whole}${zone}`) / 1000, fraction: fraction.replace(/0+$/, "") };
}

/**
 * Orders two RFC 3339 times by the instant they name, whatever their offsets, to the last digit
 * of their fractions: negative when `a` is earlier, 0 when they are the same instant. Both must
 * have passed {@link rfc3339}.
 */
export function compareTimes(a: string, b: string): number {
  const x = parts(a);
  const y = parts(b);
  if (x.seconds !== y.seconds) return x.seconds < y.seconds ? -1 : 1;
  const width = Math.max(x.fraction.length, y.fraction.length);
  const [p, q] = [x.fraction.padEnd(width, "0"), y.fraction.padEnd(width, "0")];
  return p < q ? -1 : p > q ? 1 : 0;
}

/** Whether a time string names an instant in the years 0000 to 9999 once in UTC. */
function inRange(at: string): boolean {
  const ms = Date.parse(at);
  return !Number.isNaN(ms) && /^\d{4}-/.test(new Date(ms).toISOString());
}

/**
 * An RFC 3339 time with its offset (`2026-11-29T18:00:00Z`, `…T19:00:00.5+01:00`), naming an
 * instant of the years 0000 to 9999 in UTC (so it can be written back as RFC 3339).
 */
const isoDatetime = z.iso.datetime({ offset: true });

export const rfc3339 = z
  .string()
  .max(64, "must be an RFC 3339 time of at most 64 characters")
  .refine(
    (s) => PARTS.test(s.toUpperCase()) && isoDatetime.safeParse(s.toUpperCase()).success && inRange(s),
    "must be an RFC 3339 time with an offset, of the years 0000 to 9999 in UTC, e.g. 2026-11-29T18:00:00Z",
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

/** How far ahead of this server's clock an event's `at` may be, in milliseconds. */
export const MAX_AHEAD_MS = 5 * 60 * 1000;

/**
 * Refuses (400) an event stamped more than {@link MAX_AHEAD_MS} after `now`: kept, it would
 * win over every true event until that time came, so a provider's wrong clock is said instead.
 */
export function notAhead(at: string, now: Date): void {
  const ahead = Date.parse(at) - now.getTime();
  if (ahead > MAX_AHEAD_MS) {
    throw badInput(`at: ${at} is ${Math.round(ahead / 60_000)} minutes ahead of this server's clock; is the provider's clock right?`);
  }
}

/** What one event did to the state. */
export type Change = "raised" | "updated" | "restarted" | "recovered" | "remembered" | "older";

/** The key of a triple in the failing bucket (SPEC §2): `<provider>.<machine>.<consumer>`. */
export const failingKey = (provider: string, machine: string, consumer: string) => `${provider}.${machine}.${consumer}`;

type Event = { kind: "failing"; event: FailingEvent } | { kind: "recovered"; event: RecoveredEvent };
type Write = { put: { word: string; since: string; at: string } } | { recover: { recovered: string; since?: string } };

/**
 * What an event does to what is kept for its triple (SPEC §5), newest wins by `at`:
 * - a failing newer than what is kept writes its word and `at`, keeping `since` while the
 *   triple was failing (`updated`), else starting the streak at its `at` (`raised`);
 * - a recovered newer than the kept failing removes it (`recovered`); newer than a recovery or
 *   nothing, it is remembered (`remembered`), so a failing older than it arriving later does
 *   not raise the triple again;
 * - a recovered between the kept failing's `since` and `at` ended that streak: a failing came
 *   after it, so the streak now starts at the kept `at` (`restarted`). The failings between the
 *   recovery and `at` are not remembered, so `since` may be later than the true first of them;
 * - anything else is older or the same and changes nothing (`older`): the same event twice is
 *   one of these. A failing and a recovered of the same instant: the failing wins.
 */
export function decide(kept: Kept, event: Event): { change: Change; write?: Write } {
  const { at } = event.event;
  if (event.kind === "failing") {
    if (kept.state === "failing") {
      if (compareTimes(at, kept.at) <= 0) return { change: "older" };
      return { change: "updated", write: { put: { word: keptWord(event.event.word), since: kept.since, at } } };
    }
    if (kept.state === "recovered" && compareTimes(at, kept.at) < 0) return { change: "older" };
    return { change: "raised", write: { put: { word: keptWord(event.event.word), since: at, at } } };
  }
  if (kept.state === "failing") {
    if (compareTimes(at, kept.at) > 0) return { change: "recovered", write: { recover: { recovered: at, since: kept.since } } };
    if (compareTimes(at, kept.since) > 0 && compareTimes(at, kept.at) < 0) {
      return { change: "restarted", write: { put: { word: kept.word, since: kept.at, at: kept.at } } };
    }
    return { change: "older" };
  }
  if (kept.state === "recovered" && compareTimes(at, kept.at) <= 0) return { change: "older" };
  const since = kept.state === "recovered" ? kept.since : undefined;
  return { change: "remembered", write: { recover: { recovered: at, ...(since ? { since } : {}) } } };
}

/** Compare-and-set rounds one event may lose before it is a fault. */
const MAX_ATTEMPTS = 500;

/**
 * Applies one event of `provider` to the failing bucket as {@link decide} says: a failing's
 * `{ word, since, at }` is the key's value; a recovery deletes the key, its delete marker
 * keeping `{ recovered, since }`. Every write is compare-and-set on the key's last revision,
 * decided again on a conflict, so replicas (or concurrent runs) applying events of one triple at
 * once never lose one. What is kept is first read from `held` (a live view's local reads, which
 * may lag: a stale revision only makes the write fail), after a conflict from the bucket.
 */
export async function applyEvent(bucket: WriteBucket, provider: string, event: Event, held: ReadBucket = bucket): Promise<Change> {
  const { machine, consumer } = event.event;
  const key = failingKey(provider, machine, consumer);
  return oneAtATime(`${bucket.bucket}/${key}`, () => applyTo(bucket, key, event, held));
}

/**
 * The events of one triple this process applies go one at a time: nats-server before 2.9.21
 * does not check a replicated stream's expected revision atomically (nats-server#4320), so
 * racing compare-and-set writes could all succeed.
 */
const oneAtATime = keyedSerial();

async function applyTo(bucket: WriteBucket, key: string, event: Event, held: ReadBucket): Promise<Change> {
  for (let attempt = 0; ; attempt++) {
    const kept = keptOf(await (attempt === 0 ? held : bucket).last(key));
    const { change, write } = decide(kept, event);
    try {
      if (write !== undefined && "put" in write) await bucket.update(key, JSON.stringify(write.put), kept.revision);
      if (write !== undefined && "recover" in write) await bucket.delete(key, { revision: kept.revision, value: JSON.stringify(write.recover) });
      return change;
    } catch (err) {
      // Each conflict means another write won: some run always progresses.
      if (!(err instanceof RevisionConflict) || attempt === MAX_ATTEMPTS) throw err;
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
  /** Keys left out (out of shape first, then failing triples) because the answer would not fit in one reply. */
  readonly omitted: number;
  readonly registry: { readonly kinds: string[]; readonly compiledAt: string | null };
  /** Events the follower refused (not JSON, or not an event), since the bucket was made. */
  readonly rejectedEvents: number;
}

const outOfShapeItem = z.object({ key: z.string(), reason: z.string() });

/** The status answer as a schema, for the service's description of it ($SRV.INFO). */
export const statusAnswer = z.object({
  well: z.boolean(),
  failing: z.array(z.object({ provider: z.string(), machine: z.string(), consumer: z.string(), word: z.string(), since: z.string(), at: z.string() })),
  outOfShape: z.array(outOfShapeItem),
  omitted: z.number().int(),
  registry: z.object({ kinds: z.array(z.string()), compiledAt: z.string().nullable() }),
  rejectedEvents: z.number().int(),
}) satisfies z.ZodType<Status>;

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

/** How many failing triples the failing bucket holds (its live keys in shape), and how many keys are out of shape (SPEC §5). */
export async function countFailing(failing: ReadBucket): Promise<{ failing: number; outOfShape: number }> {
  const found = failingOf(await failing.list(">"));
  return { failing: found.failing.length, outOfShape: found.outOfShape.length };
}

/** Bytes kept free in a reply beyond the answer's own JSON. */
const HEADROOM = 1024;

/**
 * Status (SPEC §5) of what `request` narrows to, from the failing and registry buckets and
 * the runtime's count of refused events. `well` is false while any reached key is failing or
 * out of shape. When the answer would not fit in `maxPayload`, out-of-shape keys and then the
 * last failing triples are left out, and counted in `omitted`.
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
  return fitted(status, maxPayload - HEADROOM);
}

/** `status` cut to `budget` bytes of JSON: out-of-shape keys go first, then failing triples from the end. */
function fitted(status: Status, budget: number): Status {
  const itemBytes = (item: unknown) => Buffer.byteLength(JSON.stringify(item)) + 1;
  let size = Buffer.byteLength(JSON.stringify(status)) + 16; // room for a larger `omitted`
  const outOfShape = [...status.outOfShape];
  const failing = [...status.failing];
  while (size > budget && outOfShape.length > 0) size -= itemBytes(outOfShape.pop());
  while (size > budget && failing.length > 0) size -= itemBytes(failing.pop());
  const omitted = status.failing.length - failing.length + status.outOfShape.length - outOfShape.length;
  return omitted === 0 ? status : { ...status, failing, outOfShape, omitted };
}
