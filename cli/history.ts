import { HISTORY } from "../functions/_lib/provisioning.ts";
import { shown, table, type AnswerOf } from "./ask.ts";

/**
 * The events the stream holds as a table, newest first (docs/failing.md §5.8): sequence, when
 * stored, the event, provider, machine and consumer (or `every` holder), the word or the
 * provision and revision; then the refused ones with their reasons.
 */
export function formatHistory(answer: AnswerOf<typeof HISTORY>): string {
  const lines =
    answer.entries.length === 0
      ? ["no history entries"]
      : [
          ...table([
            ["SEQ", "STORED", "EVENT", "PROVIDER", "MACHINE", "CONSUMER", "SAYS"],
            ...answer.entries.map((e) => [
              String(e.seq),
              e.storedAt.slice(0, 19).replace("T", " "),
              e.event,
              e.provider,
              e.machine ?? (e.event === "rotated" ? "every" : "-"),
              e.consumer ?? (e.event === "rotated" ? "every" : "-"),
              shown(e.event === "rotated" ? `${e.provision} at ${e.revision}` : (e.word ?? ""), 80),
            ]),
          ]),
          `${answer.entries.length} event${answer.entries.length === 1 ? "" : "s"}, newest first`,
        ];
  if (answer.outOfShape.length > 0) {
    lines.push("", `refused (${answer.outOfShape.length}):`, ...answer.outOfShape.map((o) => `  ${o.key}: ${shown(o.reason, 200)}`));
  }
  if (answer.next !== undefined) lines.push("", `more remain: --cursor ${answer.next}`);
  return lines.join("\n");
}
