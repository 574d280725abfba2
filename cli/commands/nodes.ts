import { Option } from "commander";
import { PRESENCES } from "../../functions/_lib/state.ts";
import { print, type AddCommand } from "../program.ts";
import { askNodes, formatNodes } from "../nodes.ts";

/** `nodes`: each node and what its presence says (docs/presence.md §16.3). */
export const nodesCommand: AddCommand = (program, { asking }) => {
  program
    .command("nodes")
    .description("say each node's presence: reachable, unreachable for how long, or silent; when it last wrote, its modules")
    .option("--node <node>", "narrow to one node")
    .addOption(new Option("--presence <presence>", "narrow to one presence").choices(PRESENCES))
    .option("--json", "print the answer as JSON")
    .action(async (options: Record<string, unknown>) => {
      const { json, ...narrowing } = options;
      await asking("nodes", async (nc) => print(await askNodes(nc, narrowing), json, formatNodes));
    });
};
