import { print, type AddCommand } from "../program.ts";
import { askStatus, formatStatus } from "../status.ts";

/** `status`: whether the mesh is well (docs/failing.md §5.6); exits 1 when not. */
export const statusCommand: AddCommand = (program, { asking }) => {
  program
    .command("status")
    .description("say whether the mesh is well, naming what fails and for how long; exits 1 when not well")
    .option("--provider <provider>", "narrow to one provider")
    .option("--machine <machine>", "narrow to one machine")
    .option("--consumer <consumer>", "narrow to one consumer")
    .option("--json", "print the answer as JSON")
    .action(async (options: Record<string, unknown>) => {
      const { json, ...narrowing } = options;
      await asking("status", async (nc) => {
        const status = await askStatus(nc, narrowing);
        print(status, json, formatStatus);
        if (!status.well) process.exitCode = 1;
      });
    });
};
