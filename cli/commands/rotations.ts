import { ROTATIONS } from "../../functions/_lib/provisioning.ts";
import { askAll } from "../ask.ts";
import { print, type AddCommand } from "../program.ts";
import { formatRotations } from "../rotation.ts";

/** `rotations`: the rotations providers announced, their holders caught up, released or not (docs/rotation.md §8.6). */
export const rotationsCommand: AddCommand = (program, { asking }) => {
  program
    .command("rotations")
    .description("list the rotations providers announced: holders caught up, and whether the old credential was released")
    .option("--provider <provider>", "narrow to one provider")
    .option("--provision <provision>", "narrow to one provision")
    .option("--json", "print the answer as JSON")
    .action(async (options: Record<string, unknown>) => {
      const { json, ...narrowing } = options;
      await asking("rotations", async (nc) => print(await askAll(nc, { what: ROTATIONS, ...narrowing }), json, formatRotations));
    });
};
