import { HOLDERS, ROTATIONS } from "../functions/_lib/provisioning.ts";
import { failingFor, shown, table, type AnswerOf } from "./ask.ts";

/** The holders of a provision as a table: node, module, need, the revision in use, stale or caught up. */
export function formatHolders(answer: AnswerOf<typeof HOLDERS>, now: Date): string {
  if (answer.entries.length === 0) return `no ${HOLDERS}`;
  return [
    ...table([
      ["NODE", "MODULE", "NEED", "REVISION", "APPLIED", "STALE"],
      ...answer.entries.map((h) => [
        h.node,
        h.module,
        `${h.kind}.${h.name}`,
        shown(h.revision ?? "-", 40),
        h.appliedAt === null ? "never" : `${failingFor(h.appliedAt, now)} ago`,
        h.stale ? "stale" : "caught up",
      ]),
    ]),
    `${answer.entries.length} holder${answer.entries.length === 1 ? "" : "s"}, ${answer.entries.filter((h) => h.stale).length} stale`,
  ].join("\n");
}

/** The kept rotations as a table: provider, provision (and holder), revision, holders caught up, released. */
export function formatRotations(answer: AnswerOf<typeof ROTATIONS>, now: Date): string {
  if (answer.entries.length === 0) return `no ${ROTATIONS}`;
  return [
    ...table([
      ["PROVIDER", "PROVISION", "HOLDER", "REVISION", "ROTATED", "CAUGHT UP", "RELEASED"],
      ...answer.entries.map((r) => [
        r.provider,
        r.provision,
        r.machine === undefined ? "every" : `${r.consumer} on ${r.machine}`,
        shown(r.revision, 40),
        `${failingFor(r.arrivedAt, now)} ago`,
        `${r.caughtUp} of ${r.holders}`,
        r.releasedAt === null ? "not yet" : `${failingFor(r.releasedAt, now)} ago`,
      ]),
    ]),
    `${answer.entries.length} rotation${answer.entries.length === 1 ? "" : "s"}`,
  ].join("\n");
}
