import { Option } from "commander";
import { print, type AddCommand } from "../program.ts";
import { askChecks, formatChecks } from "../checks.ts";

/** `checks`: each module's newest check of each provision it holds (docs/presence.md §16.5). */
export const checksCommand: AddCommand = (program, { asking }) => {
  program
    .command("checks")
    .description("say each module's newest check of each provision it holds: ok or why not, for how long, and whether its node confirms it")
    .option("--node <node>", "narrow to one node")
    .option("--module <module>", "narrow to one module")
    .option("--provision <provision>", "narrow to one provision")
    .addOption(new Option("--failing", "only the checks that fail"))
    .option("--json", "print the answer as JSON")
    .action(async (options: Record<string, unknown>) => {
      const { json, failing, ...narrowing } = options;
      await asking("checks", async (nc) =>
        print(await askChecks(nc, { ...narrowing, ...(failing === true ? { ok: false } : {}) }), json, formatChecks),
      );
    });
};
