import type { NatsConnection } from "nats";
import type { NodeEntry } from "../functions/_lib/state.ts";
import { askAll, failingFor, outOfShapeLines, table, type AnswerOf } from "./ask.ts";

/** Every node a narrowing reaches (docs/presence.md §16.3), through every page. */
export function askNodes(nc: NatsConnection, narrowing: Record<string, unknown>): Promise<AnswerOf<"nodes">> {
  return askAll(nc, { ...narrowing, what: "nodes" });
}

/** What a node's presence says in words: `reachable`, `unreachable for 3m10s`, `silent (never wrote presence)`. */
function presenceWords(n: NodeEntry, now: Date): string {
  if (n.presence === "unreachable") return `unreachable for ${failingFor(n.since!, now)}`;
  if (n.presence === "silent") return "silent (no presence written)";
  return "reachable";
}

/** Nodes as a table: node, presence in words, last seen and how long ago, its period, its modules; then the presence keys out of shape. */
export function formatNodes(
  answer: { entries: readonly NodeEntry[]; outOfShape: readonly { key: string; reason: string }[] },
  now: Date,
): string {
  if (answer.entries.length === 0) return ["no nodes", ...outOfShapeLines(answer.outOfShape)].join("\n");
  return [
    ...table([
      ["NODE", "PRESENCE", "LAST SEEN", "EVERY", "MODULES"],
      ...answer.entries.map((n) => [
        n.node,
        presenceWords(n, now),
        n.lastSeen === null ? "-" : `${failingFor(n.lastSeen, now)} ago`,
        n.everySeconds === null ? "-" : `${n.everySeconds}s`,
        String(n.modules),
      ]),
    ]),
    `${answer.entries.length} node${answer.entries.length === 1 ? "" : "s"}`,
    ...outOfShapeLines(answer.outOfShape),
  ].join("\n");
}
