import { HOLDERS } from "../../functions/_lib/provisioning.ts";
import { askAll } from "../ask.ts";
import { print, type AddCommand } from "../program.ts";
import { formatHolders } from "../rotation.ts";

/** `holders <provision>`: a provision's holders, stale or caught up (docs/rotation.md §8.1). */
export const holdersCommand: AddCommand = (program, { asking }) => {
  program
    .command("holders")
    .description("list the holders of a provision: each need of it, the revision its module has in use, stale or caught up")
    .argument("<provision>", "the provision (a need's name up to its first /)")
    .option("--node <node>", "narrow to one node")
    .option("--kind <kind>", "narrow to one kind")
    .option("--json", "print the answer as JSON")
    .action(async (provision: string, options: Record<string, unknown>) => {
      const { json, ...narrowing } = options;
      await asking("holders", async (nc) => print(await askAll(nc, { what: HOLDERS, provision, ...narrowing }), json, formatHolders));
    });
};
