/**
 * Nodes' presence (docs/presence.md §16.1): a node's last write of its own key in the presence
 * bucket, read as the server stored it (its `created`, never the node's clock), and what is said
 * of the node at a time asked: reachable, unreachable since when, or silent.
 */
import type { Entry } from "../../../runtime/index.ts";
import { decodeKey } from "../../../contract/keys.ts";
import { presenceValue } from "../../../contract/presence.ts";
import type { NodePresence, NodePresences, OutOfShapeKey, Presence } from "./vocabulary.ts";

const decoder = new TextDecoder("utf-8", { fatal: true });

/**
 * A presence write as the model keeps it, from `entry` of the presence bucket and
 * `presence.ttlSeconds`: unreachable once neither `ttlSeconds` nor three of its own
 * `everySeconds` have passed since the server stored it. A key out of shape is said (`bad`); a
 * value out of shape still shows the node wrote (the TTL alone applies) and is said too.
 */
export function presenceOfEntry(entry: Entry, ttlSeconds: number): { presence?: NodePresence; bad?: OutOfShapeKey } {
  const decoded = decodeKey("presence", entry.key);
  if (!decoded.ok) return { bad: { key: `presence:${entry.key}`, reason: decoded.reason } };
  let value: { everySeconds: number; client?: string } | undefined;
  let reason: string | undefined;
  try {
    const read = presenceValue.safeParse(JSON.parse(decoder.decode(entry.value)));
    if (read.success) value = read.data;
    else
      reason = `value is not { everySeconds, client? }: ${read.error.issues[0]!.path.join(".") || "value"} ${read.error.issues[0]!.message}`;
  } catch (err) {
    reason = `value is not JSON: ${(err as Error).message}`;
  }
  const lastSeen = entry.created.getTime();
  const limitSeconds = Math.max(ttlSeconds, 3 * (value?.everySeconds ?? 0));
  return {
    presence: {
      node: entry.key,
      lastSeen,
      everySeconds: value?.everySeconds ?? null,
      client: value?.client ?? null,
      unreachableAt: lastSeen + limitSeconds * 1000,
    },
    ...(reason === undefined ? {} : { bad: { key: `presence:${entry.key}`, reason } }),
  };
}

/** What is said of `node` at `now` (docs/presence.md §16.1), and since when it is unreachable (`null` otherwise). */
export function presenceAt(presence: NodePresences, node: string, now: Date): { presence: Presence; since: number | null } {
  const p = presence.get(node);
  if (p === undefined) return { presence: "silent", since: null };
  return now.getTime() >= p.unreachableAt ? { presence: "unreachable", since: p.unreachableAt } : { presence: "reachable", since: null };
}

/** The nodes unreachable at `now`, in key order. */
export function* unreachableNodes(presence: NodePresences, now: Date): Generator<NodePresence> {
  for (const p of presence.values()) if (now.getTime() >= p.unreachableAt) yield p;
}
