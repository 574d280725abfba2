/**
 * The history of docs/failing.md §5.8: the failing, recovered and rotated events the events
 * stream still holds (a week by default), newest first, each as the provider published it, or
 * refused with why.
 */
import { z } from "zod";
import { formatIssues, type ReadStream, type StreamMessage } from "../../runtime/index.ts";
import { failingEvent, recoveredEvent, rotatedEvent } from "../../contract/events.ts";
import { TOKEN } from "../../contract/keys.ts";
import { aheadOf } from "./follower.ts";

/** The `what` of the events' history (docs/failing.md §5.8). */
export const HISTORY = "history";
/** What the history narrows by. */
export const HISTORY_NARROWINGS = ["provider", "machine", "consumer"] as const;

/** The events of the history, by the last token of their subject `<provider>.provisioner.<event>`. */
export const EVENTS = ["failing", "recovered", "rotated"] as const;
export type EventName = (typeof EVENTS)[number];

/** One event of the history (docs/failing.md §5.8). */
export interface HistoryEntry {
  /** The stream sequence, as text: what the cursor continues below. */
  readonly key: string;
  readonly seq: number;
  readonly event: EventName;
  readonly provider: string;
  /** A failing's or recovered's, and a rotation's of one holder. */
  readonly machine?: string;
  readonly consumer?: string;
  readonly word?: string;
  readonly provision?: string;
  readonly revision?: string;
  /** The time the provider said. */
  readonly at: string;
  /** When the server stored it (RFC 3339, UTC, to the millisecond). */
  readonly storedAt: string;
}

export const historyEntrySchema = z.object({
  key: z.string(),
  seq: z.number().int(),
  event: z.enum(EVENTS),
  provider: z.string(),
  machine: z.string().optional(),
  consumer: z.string().optional(),
  word: z.string().optional(),
  provision: z.string().optional(),
  revision: z.string().optional(),
  at: z.string(),
  storedAt: z.string(),
}) satisfies z.ZodType<HistoryEntry>;

/** A message of the stream as the history says it: an entry, or why it is refused. */
export type HistoryItem = { readonly entry: HistoryEntry } | { readonly refused: { readonly key: string; readonly reason: string } };

const SUBJECT = /^([^.]+)\.provisioner\.(failing|recovered|rotated)$/;
/** The stream's other events, said elsewhere: a node's checks (what=checks) and a provider's acknowledgements (what=rotations). */
const ELSEWHERE = /^(mesh-provisioner\.checked\.[^.]+|[^.]+\.provisioner\.acknowledged)$/;
const utf8 = new TextDecoder("utf-8", { fatal: true });
const schemas = { failing: failingEvent, recovered: recoveredEvent, rotated: rotatedEvent } as const;

/** The history's item of one stored message: what the provider said, or, as the follower would refuse it, why not. */
export function historyItemOf(message: StreamMessage): HistoryItem {
  const key = String(message.seq);
  const refused = (reason: string) => ({ refused: { key, reason: `${message.subject}: ${reason}` } });
  const matched = SUBJECT.exec(message.subject);
  if (matched === null || !TOKEN.test(matched[1]!)) return refused("not a subject <provider>.provisioner.failing, recovered or rotated");
  const [, provider, event] = matched as unknown as [string, string, EventName];
  let value: unknown;
  try {
    value = JSON.parse(utf8.decode(message.data));
  } catch (err) {
    return refused(`not JSON: ${(err as Error).message}`);
  }
  const parsed = schemas[event].safeParse(value);
  if (!parsed.success) return refused(`not a ${event} event: ${formatIssues(parsed.error.issues)}`);
  const said = parsed.data as { machine?: string; consumer?: string; word?: string; provision?: string; revision?: string; at: string };
  // Refused by the follower too (docs/failing.md §5.3): never shown as what happened.
  const ahead = aheadOf(said.at, message.time);
  if (ahead !== undefined) return refused(ahead);
  return {
    entry: {
      key,
      seq: message.seq,
      event,
      provider,
      ...(said.machine === undefined ? {} : { machine: said.machine, consumer: said.consumer }),
      ...(event === "failing" ? { word: said.word } : {}),
      ...(event === "rotated" ? { provision: said.provision, revision: said.revision } : {}),
      at: said.at,
      storedAt: message.time.toISOString(),
    },
  };
}

/** A narrowing of the history: each field given is equal to the event's. */
export type HistoryNarrowing = { readonly provider?: string; readonly machine?: string; readonly consumer?: string };

/**
 * Whether `message` is reached by `narrowing`: its provider (the subject's first token), and its
 * machine and consumer as its JSON says them. A refused message whose machine or consumer
 * cannot be read is reached: said refused, never missed.
 */
function reached(message: StreamMessage, item: HistoryItem, narrowing: HistoryNarrowing): boolean {
  if (narrowing.provider !== undefined && message.subject.slice(0, message.subject.indexOf(".")) !== narrowing.provider) return false;
  if (narrowing.machine === undefined && narrowing.consumer === undefined) return true;
  let said: { machine?: unknown; consumer?: unknown };
  if ("entry" in item) said = item.entry;
  else {
    try {
      said = JSON.parse(utf8.decode(message.data)) ?? {};
    } catch {
      return true;
    }
  }
  const matches = (field: "machine" | "consumer") =>
    narrowing[field] === undefined || typeof said[field] !== "string" || said[field] === narrowing[field];
  // A rotation of every holder reaches each machine and consumer.
  return matches("machine") && matches("consumer");
}

/**
 * The history's items newest first: the messages of `stream` below sequence `before` (the
 * cursor's), stored at or after `since`, that `narrowing` reaches, at most `count` of them.
 */
export async function historyOf(
  stream: ReadStream,
  narrowing: HistoryNarrowing,
  options: { readonly before?: number; readonly since?: Date; readonly count: number },
): Promise<HistoryItem[]> {
  const found: HistoryItem[] = [];
  if (options.count <= 0) return found;
  // The provider's events only: the nodes' checks may be most of the stream.
  for await (const message of stream.newest({ before: options.before, since: options.since, subject: "*.provisioner.*" })) {
    if (ELSEWHERE.test(message.subject)) continue;
    const item = historyItemOf(message);
    if (!reached(message, item, narrowing)) continue;
    found.push(item);
    if (found.length >= options.count) break;
  }
  return found;
}
