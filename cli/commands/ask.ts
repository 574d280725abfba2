import { Option } from "commander";
import { DEFAULT_WHAT, type Asked } from "../../functions/_lib/provisioning.ts";
import { askAll, askOnce, formatAnswer, narrowingOptions, whatHelp, type AnswerOf } from "../ask.ts";
import { positive, print, type AddCommand } from "../program.ts";
import { formatStates } from "../state.ts";
import { formatNodes } from "../nodes.ts";
import { formatChecks } from "../checks.ts";
import { formatHistory } from "../history.ts";
import { formatHolders, formatRotations } from "../rotation.ts";

/** How `ask` shows the answer to each `what` without `--json`: a table. */
const FORMATS: { readonly [W in Asked]: (answer: AnswerOf<W>, now: Date) => string } = {
  registry: formatAnswer,
  needs: formatAnswer,
  applied: formatAnswer,
  collect: formatAnswer,
  state: formatStates,
  nodes: formatNodes,
  checks: formatChecks,
  holders: formatHolders,
  rotations: formatRotations,
  history: formatHistory,
};

/** An answer as `ask` shows it: as its `what`'s {@link FORMATS} does. */
function formatAsked<W extends Asked>(answer: AnswerOf<W>, now: Date): string {
  const format: (answer: AnswerOf<W>, now: Date) => string = FORMATS[answer.what];
  return format(answer, now);
}

/** `ask [what]`: one request of mesh-provisioner.provisioning (docs/verb.md §4), every page or one. */
export const askCommand: AddCommand = (program, { asking }) => {
  const ask = program
    .command("ask")
    .description("ask mesh-provisioner.provisioning and print the answer")
    .argument("[what]", whatHelp, DEFAULT_WHAT);
  for (const option of narrowingOptions()) ask.addOption(option);
  ask
    .addOption(new Option("--limit <n>", "ask one page of at most n entries").argParser(positive))
    .option("--cursor <cursor>", "ask the page after this cursor (the `next` of a page)")
    .option("--stale", "answer from the live view without asking the server whether it is current (says when it last was)")
    .option("--since <time>", "with history: the events stored at or after this RFC 3339 time")
    .option("--json", "print the answer as JSON")
    .action(async (what: string, options: Record<string, unknown>) => {
      const { json, ...fields } = options;
      const request = { what, ...fields };
      await asking("ask", async (nc) => {
        const onePage = fields.limit !== undefined || fields.cursor !== undefined;
        print(onePage ? await askOnce(nc, request) : await askAll(nc, request), json, formatAsked);
      });
    });
};
