/**
 * Checks (docs/presence.md §16.5): the newest result per `<node>.<module>.<provision>` in the
 * checks bucket, its streak, and how one event changes it: newest by `at` wins, a failing result
 * wins a tie, compare-and-set on the key's last revision so replicas never lose one.
 */
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
import { DEFAULT_CHECK_REASON, MAX_WORD, type CheckedEvent } from "../../contract/events.ts";
import { MAX_TOKEN, TOKEN } from "../../contract/keys.ts";
import { compareTimes, rfc3339 } from "../../contract/times.ts";
import { cutText } from "../../contract/text.ts";
import { jsonOf, valuesOf } from "./values.ts";

/** The subjects checks are published on, one token a node (docs/presence.md §16.5). */
export const CHECKED_SUBJECTS = "mesh-provisioner.checked.*";

/** A check as the checks bucket keeps it (docs/buckets.md §2): `reason` and `message` `null` when ok; `since` its streak's start. */
export const checkValue = z.strictObject({
  ok: z.boolean(),
  reason: z.string().nullable(),
  message: z.string().nullable(),
  revision: z.string().nullable(),
  since: rfc3339,
  at: rfc3339,
});
export type CheckValue = z.output<typeof checkValue>;

/** The key of a check in the checks bucket: `<node>.<module>.<provision>`. */
export const checkKey = (node: string, module: string, provision: string) => `${node}.${module}.${provision}`;

/**
 * The node a check came from: the last token of its subject (`mesh-provisioner.checked.<node>`),
 * which the server lets only that node publish. Throws a 400 for a run that is no such event.
 */
export function nodeOfCheck(trigger: TriggerInfo): string {
  if (trigger.kind !== "event") throw badInput("the node is the last token of the check's subject, and this run has none");
  const node = trigger.subject.split(".")[2] ?? "";
  if (!TOKEN.test(node) || node.length > MAX_TOKEN) throw badInput(`subject ${trigger.subject}: the node is not one token`);
  return node;
}

/** What one check did: the first of its key, the streak went on, the result changed, an older one cut the streak, or nothing. */
export type CheckChange = "first" | "continued" | "changed" | "restarted" | "older";

/** The value a check event is kept as, its streak starting at `since`. */
const valueOf = (e: CheckedEvent, since: string): CheckValue => ({
  ok: e.ok,
  reason: e.ok ? null : (e.reason ?? DEFAULT_CHECK_REASON),
  message: e.ok || e.message === undefined ? null : cutText(e.message, MAX_WORD),
  revision: e.revision ?? null,
  since,
  at: e.at,
});

/**
 * What `e` does to what is kept for its key (docs/presence.md §16.5), as docs/failing.md §5 does to a triple:
 * - newer than what is kept: it is kept; its streak goes on when its result (ok or not) is the
 *   kept one's, and starts at its `at` when not;
 * - of the same instant: a failing result wins over an ok one; the same result is nothing new;
 * - older or of the same instant, of the other result and after the kept streak began: that
 *   streak was cut then, so it starts again at the kept `at` (`restarted`), whichever of the two
 *   arrived first; anything else older changes nothing.
 */
export function decideCheck(kept: CheckValue | undefined, e: CheckedEvent): { change: CheckChange; write?: CheckValue } {
  if (kept === undefined) return { change: "first", write: valueOf(e, e.at) };
  const order = compareTimes(e.at, kept.at);
  if (order > 0) {
    return e.ok === kept.ok ? { change: "continued", write: valueOf(e, kept.since) } : { change: "changed", write: valueOf(e, e.at) };
  }
  if (order === 0 && !e.ok && kept.ok) return { change: "changed", write: valueOf(e, e.at) };
  // Of the other result, at or before the kept `at` and after its streak began: the streak was cut then.
  if (e.ok !== kept.ok && compareTimes(e.at, kept.since) > 0 && compareTimes(kept.since, kept.at) < 0) {
    return { change: "restarted", write: { ...kept, since: kept.at } };
  }
  return { change: "older" };
}

/** A check's last record read: its value, or `undefined` when never written, deleted or unreadable. */
const keptOf = (record: KeyRecord | null): CheckValue | undefined =>
  record === null || record.deleted ? undefined : jsonOf(checkValue, record.value);

/** Compare-and-set rounds one check may lose before it is a fault. */
const MAX_ATTEMPTS = 500;
/** The checks of one key this process applies go one at a time (nats-server#4320, as the failing follower's). */
const oneAtATime = keyedSerial();

/**
 * Applies `event` of `node` to the checks bucket as {@link decideCheck} says, compare-and-set on
 * the key's last revision and decided again on a conflict. What is kept is first read from
 * `held` (a live view's local reads, which may lag: a stale revision only makes the write fail),
 * after a conflict from the bucket.
 */
export async function applyCheck(bucket: WriteBucket, node: string, event: CheckedEvent, held: ReadBucket = bucket): Promise<CheckChange> {
  const key = checkKey(node, event.module, event.provision);
  return oneAtATime(`${bucket.bucket}/${key}`, async () => {
    for (let attempt = 0; ; attempt++) {
      const record = await (attempt === 0 ? held : bucket).last(key);
      const { change, write } = decideCheck(keptOf(record), event);
      if (write === undefined) return change;
      try {
        await bucket.update(key, Buffer.from(JSON.stringify(write)), record?.revision ?? 0);
        return change;
      } catch (err) {
        // Each conflict means another write won: some run always progresses.
        if (!(err instanceof RevisionConflict) || attempt === MAX_ATTEMPTS) throw err;
      }
    }
  });
}

/** One kept check, as `what=checks` answers it (docs/presence.md §16.5). */
export type Check = CheckValue & { readonly key: string; readonly node: string; readonly module: string; readonly provision: string };

/** The checks among `entries` of the checks bucket, and the keys out of shape (docs/buckets.md §2). */
export function checksOf(entries: readonly { key: string; value: Uint8Array }[]): {
  checks: Check[];
  outOfShape: { key: string; reason: string }[];
} {
  const { values, outOfShape } = valuesOf("checks", checkValue, "{ ok, reason, message, revision, since, at }", entries);
  return { checks: values.map(({ key, fields, value }) => ({ key, ...fields, ...value })), outOfShape };
}
