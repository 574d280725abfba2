import type { NatsConnection } from "nats";
import type { Check } from "../functions/_lib/checks.ts";
import { DEFAULT_CHECK_REASON } from "../contract/events.ts";
import { askAll, failingFor, outOfShapeLines, shown, table, type AnswerOf } from "./ask.ts";

/** Every kept check a narrowing reaches (docs/presence.md §16.5), through every page. */
export function askChecks(nc: NatsConnection, narrowing: Record<string, unknown>): Promise<AnswerOf<"checks">> {
  return askAll(nc, { ...narrowing, what: "checks" });
}

/** Checks as a table: node, module, provision, the result and for how long, whether its node confirms it, the revision and message. */
export function formatChecks(
  answer: { entries: readonly (Check & { confirmed: boolean })[]; outOfShape: readonly { key: string; reason: string }[] },
  now: Date,
): string {
  if (answer.entries.length === 0) return ["no checks", ...outOfShapeLines(answer.outOfShape)].join("\n");
  return [
    ...table([
      ["NODE", "MODULE", "PROVISION", "RESULT", "CONFIRMED", "REVISION", "MESSAGE"],
      ...answer.entries.map((c) => [
        c.node,
        c.module,
        c.provision,
        `${c.ok ? "ok" : (c.reason ?? DEFAULT_CHECK_REASON)} ${failingFor(c.since, now)}`,
        c.confirmed ? "yes" : "no (node unreachable or silent)",
        c.revision ?? "-",
        shown(c.message || "-", 80),
      ]),
    ]),
    `${answer.entries.length} check${answer.entries.length === 1 ? "" : "s"}`,
    ...outOfShapeLines(answer.outOfShape),
  ].join("\n");
}
