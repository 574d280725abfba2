import { Option } from "commander";
import { STATES } from "../../functions/_lib/state.ts";
import { print, type AddCommand } from "../program.ts";
import { askStates, formatStates } from "../state.ts";

/** `state`: each module's provisioning state (docs/state.md §7.5). */
export const stateCommand: AddCommand = (program, { asking }) => {
  program
    .command("state")
    .description("say each module's provisioning state on each node, for how long, and its conditions in words")
    .option("--node <node>", "narrow to one node")
    .option("--module <module>", "narrow to one module")
    .addOption(new Option("--state <state>", "narrow to one state").choices(STATES))
    .option("--json", "print the answer as JSON")
    .action(async (options: Record<string, unknown>) => {
      const { json, ...narrowing } = options;
      await asking("state", async (nc) => print(await askStates(nc, narrowing), json, formatStates));
    });
};
