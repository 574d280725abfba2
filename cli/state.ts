import type { NatsConnection } from "nats";
import { STATE } from "../functions/_lib/provisioning.ts";
import type { Condition, ModuleState } from "../functions/_lib/state.ts";
import { askAll, failingFor, outOfShapeLines, shown, table, type AnswerOf } from "./ask.ts";

/** Every module state a narrowing reaches (docs/state.md §7.5), through every page. */
export function askStates(nc: NatsConnection, narrowing: Record<string, unknown>): Promise<AnswerOf<typeof STATE>> {
  return askAll(nc, { ...narrowing, what: STATE });
}

const WIDEST = 120;

/** A condition in words: `Unanswerable: no domain answers kind wormhole (need wormhole.exit)`. */
export const conditionWords = (c: Condition) => `${c.type}: ${c.message}`;

/** What a module's state says beyond its name: the pending needs, the error, for how long. */
function stateWords(m: ModuleState, now: Date): string {
  const long = failingFor(m.since, now);
  if (m.state === "failed") return `failed ${long}: ${m.error ?? ""}`;
  if (m.state === "pending") {
    return m.appliedAt === null
      ? `pending ${long}: ${m.needs} need${m.needs === 1 ? "" : "s"}, never applied`
      : `pending ${long}: needs written after the last apply`;
  }
  return `${m.state} ${long}`;
}

/** Module states as a table: node, module, state and for how long, its node's presence, conditions in words; then the keys that name no module. */
export function formatStates(
  answer: { entries: readonly ModuleState[]; outOfShape: readonly { key: string; reason: string }[] },
  now: Date,
): string {
  const lines =
    answer.entries.length === 0
      ? ["no modules"]
      : [
          ...table([
            ["NODE", "MODULE", "STATE", "PRESENCE", "CONDITIONS"],
            ...answer.entries.map((m) => [
              m.node,
              m.module,
              shown(stateWords(m, now), 80),
              m.presence,
              shown(m.conditions.map(conditionWords).join("; ") || "-", WIDEST),
            ]),
          ]),
          `${answer.entries.length} module${answer.entries.length === 1 ? "" : "s"}`,
        ];
  return [...lines, ...outOfShapeLines(answer.outOfShape)].join("\n");
}
