import { LRUCache } from "lru-cache";
import { z } from "zod";
import {
  badInput,
  keyedSerial,
  RevisionConflict,
  type KeyRecord,
  type ReadBucket,
  type TriggerInfo,
  type WriteBucket,
} from "../../runtime/index.ts";
import { MAX_TOKEN, TOKEN } from "../../contract/keys.ts";
import { compareTimes, rfc3339 } from "../../contract/times.ts";
import { MAX_WORD, type FailingEvent, type RecoveredEvent } from "../../contract/events.ts";
import { cutText } from "../../contract/text.ts";
import { compareText } from "./text.ts";
import { jsonOf, valuesOf } from "./values.ts";

/** The config's stream the providers' events are kept in, followed by durable consumers (docs/failing.md §5.4). */
export const EVENTS_STREAM = "events";

/**
 * The provider an event came from: the first token of its subject
 * (`<provider>.provisioner.failing`). Throws a 400 when the run has no subject or that token
 * is not a token (docs/buckets.md §2).
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
export const keptWord = (word: string): string => cutText(word, MAX_WORD);

/**
 * The value of a failing triple's key in the failing bucket (docs/buckets.md §2): its newest word, its
 * streak's first and newest times (RFC 3339).
 */
export const failingValue = z.strictObject({ word: z.string(), since: rfc3339, at: rfc3339 });
/** What a recovery leaves in the delete marker of the key: when, and since when it had failed. */
const recoveredValue = z.strictObject({ recovered: rfc3339, since: z.optional(rfc3339) });

/** What the bucket keeps for one triple, read from its last record. */
export type Kept =
  | { readonly state: "failing"; readonly revision: number; readonly word: string; readonly since: string; readonly at: string }
  | { readonly state: "recovered"; readonly revision: number; readonly at: string; readonly since?: string }
  | { readonly state: "none"; readonly revision: number };

/**
 * Reads a triple's last record: a live value is a failing, a delete marker holding a
 * recovery is a recovered (remembered so older events cannot raise it again), anything else
 * (never written, deleted by hand, unreadable) is none, at the record's revision.
 */
export function keptOf(record: KeyRecord | null): Kept {
  if (record === null) return { state: "none", revision: 0 };
  if (!record.deleted) {
    const value = jsonOf(failingValue, record.value);
    return value === undefined ? { state: "none", revision: record.revision } : { state: "failing", revision: record.revision, ...value };
  }
  const value = jsonOf(recoveredValue, record.value);
  return value === undefined
    ? { state: "none", revision: record.revision }
    : { state: "recovered", revision: record.revision, at: value.recovered, ...(value.since ? { since: value.since } : {}) };
}

/** How far ahead of the server's clock an event's `at` may be, in milliseconds. */
export const MAX_AHEAD_MS = 5 * 60 * 1000;

/**
 * Refuses (400) an event stamped more than {@link MAX_AHEAD_MS} after `storedAt`, the server's
 * time of the message in hand (docs/failing.md §5.3): kept, it would win over every true event
 * until that time came, so a provider's wrong clock is said instead. Judged on the server's time
 * alone, so a refusal is about the sender's clock, never the set's.
 */
export function notAhead(at: string, storedAt: Date): void {
  const why = aheadOf(at, storedAt);
  if (why !== undefined) throw badInput(why);
}

/** Why an event stamped `at` and stored at `storedAt` is refused as ahead ({@link notAhead}), or nothing. */
export function aheadOf(at: string, storedAt: Date): string | undefined {
  const ahead = Date.parse(at) - storedAt.getTime();
  if (ahead <= MAX_AHEAD_MS) return undefined;
  return `at: ${at} is ${Math.round(ahead / 60_000)} minutes ahead of the server's time of the event; is the provider's clock right?`;
}

/**
 * When the server stored the event in hand (docs/failing.md §5.3), as a date and in nanoseconds
 * since the epoch; a 400 for a run that is no stored event.
 */
export function storedOf(trigger: TriggerInfo): { at: Date; nanos: number } {
  if (trigger.kind !== "event" || trigger.storedAt === undefined) throw badInput("an event is followed from the events stream");
  return { at: trigger.storedAt, nanos: trigger.storedNanos ?? trigger.storedAt.getTime() * 1e6 };
}

/** What one event did to the state. */
export type Change = "raised" | "updated" | "restarted" | "recovered" | "remembered" | "older";

/** The key of a triple in the failing bucket (docs/buckets.md §2): `<provider>.<machine>.<consumer>`. */
export const failingKey = (provider: string, machine: string, consumer: string) => `${provider}.${machine}.${consumer}`;

type Event = { kind: "failing"; event: FailingEvent } | { kind: "recovered"; event: RecoveredEvent };
type Write = { put: { word: string; since: string; at: string } } | { recover: { recovered: string; since?: string } };

/**
 * What an event does to what is kept for its triple (docs/failing.md §5), newest wins by `at`:
 * - a failing newer than what is kept writes its word and `at`, keeping `since` while the
 *   triple was failing (`updated`), else starting the streak at its `at` (`raised`);
 * - a recovered newer than the kept failing removes it (`recovered`); newer than a recovery or
 *   nothing, it is remembered (`remembered`), so a failing older than it arriving later does
 *   not raise the triple again;
 * - a recovered after the kept failing's `since` and not after its `at` ended that streak: a
 *   failing came after it (or at its instant), so the streak now starts at the kept `at` (`restarted`). The failings between the
 *   recovery and `at` are not remembered, so `since` may be later than the true first of them;
 * - anything else is older or the same and changes nothing (`older`): the same event twice is
 *   one of these. A failing and a recovered of the same instant: the failing wins, and its streak
 *   starts at that instant, whichever of the two arrived first.
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
    // A recovery at the very instant of the kept failing ends the streak before it: the failing of
    // that instant starts one of its own, as it does when the recovery arrives first.
    if (compareTimes(at, kept.since) > 0 && compareTimes(at, kept.at) <= 0) {
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
 * may lag: a stale revision only makes the write fail), after a conflict from the bucket; a
 * record this process wrote itself is known without parsing it again.
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

/**
 * What this process last wrote to a key (by `<bucket>/<key>`): the record's bytes and revision,
 * and what they keep. A record read with that revision and those bytes is that, without parsing
 * its value again.
 */
const written = new LRUCache<string, { deleted: boolean; value: Buffer; kept: Kept }>({ max: 10_000 });

/** {@link keptOf} `record`, from {@link written} when it holds that very record. */
function keptAt(id: string, record: KeyRecord | null): Kept {
  const mine = record === null ? undefined : written.get(id);
  const same =
    mine !== undefined && mine.kept.revision === record!.revision && mine.deleted === record!.deleted && mine.value.equals(record!.value);
  return same ? mine.kept : keptOf(record);
}

async function applyTo(bucket: WriteBucket, key: string, event: Event, held: ReadBucket): Promise<Change> {
  const id = `${bucket.bucket}/${key}`;
  for (let attempt = 0; ; attempt++) {
    const kept = keptAt(id, await (attempt === 0 ? held : bucket).last(key));
    const { change, write } = decide(kept, event);
    try {
      if (write !== undefined && "put" in write) {
        const value = Buffer.from(JSON.stringify(write.put));
        const revision = await bucket.update(key, value, kept.revision);
        written.set(id, { deleted: false, value, kept: { state: "failing", revision, ...write.put } });
      }
      if (write !== undefined && "recover" in write) {
        const value = Buffer.from(JSON.stringify(write.recover));
        const revision = await bucket.delete(key, { revision: kept.revision, value });
        const { recovered, since } = write.recover;
        written.set(id, { deleted: true, value, kept: { state: "recovered", revision, at: recovered, ...(since ? { since } : {}) } });
      }
      return change;
    } catch (err) {
      // Each conflict means another write won: some run always progresses.
      if (!(err instanceof RevisionConflict) || attempt === MAX_ATTEMPTS) throw err;
    }
  }
}

/** One failing triple of status. */
export interface Failing {
  readonly provider: string;
  readonly machine: string;
  readonly consumer: string;
  readonly word: string;
  readonly since: string;
  readonly at: string;
}

const byTriple = (a: Failing, b: Failing) =>
  compareText(a.provider, b.provider) || compareText(a.machine, b.machine) || compareText(a.consumer, b.consumer);

/** The failing triples and out-of-shape keys among the live keys of the failing bucket. */
export function failingOf(entries: readonly { key: string; value: Uint8Array }[]): {
  failing: Failing[];
  outOfShape: { key: string; reason: string }[];
} {
  const { values, outOfShape } = valuesOf("failing", failingValue, "{ word, since, at }", entries);
  return { failing: values.map(({ fields, value }) => ({ ...fields, ...value })).sort(byTriple), outOfShape };
}
