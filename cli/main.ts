import { Command } from "commander";
import { CONFIG_FILE, ServiceError, thrownText } from "../runtime/index.ts";
import { showWhole } from "./ask.ts";
import { askCommand } from "./commands/ask.ts";
import { clusterCommand } from "./commands/cluster.ts";
import { demoCommand } from "./commands/demo.ts";
import { holdersCommand } from "./commands/holders.ts";
import { invokeCommand } from "./commands/invoke.ts";
import { permissionsCommand } from "./commands/permissions.ts";
import { rotationsCommand } from "./commands/rotations.ts";
import { startCommand } from "./commands/start.ts";
import { stateCommand } from "./commands/state.ts";
import { nodesCommand } from "./commands/nodes.ts";
import { checksCommand } from "./commands/checks.ts";
import { statusCommand } from "./commands/status.ts";
import { cliOf } from "./program.ts";

const program = new Command("mesh-provisioner")
  .description("The provisioner's server of the mesh: the registry and the verb mesh-provisioner.provisioning.")
  .option("-c, --config <file>", "the config file", CONFIG_FILE)
  .option("-w, --wide", "show every value whole in tables (they cut long ones with …)")
  // Answered by bin/mesh-provisioner.mjs before the program loads; here so that --help lists it.
  .option("-V, --version", "print the version")
  .showHelpAfterError()
  .hook("preAction", () => showWhole(program.opts<{ wide?: boolean }>().wide === true));

// In the order `--help` lists them.
const cli = cliOf(program);
for (const add of [
  startCommand,
  askCommand,
  stateCommand,
  nodesCommand,
  checksCommand,
  holdersCommand,
  rotationsCommand,
  statusCommand,
  permissionsCommand,
  clusterCommand,
  invokeCommand,
  demoCommand,
]) {
  add(program, cli);
}

program.parseAsync().catch((err: unknown) => {
  // The runtime's refusals (invoke) and the verbs' (ask, status) as nats.js reads them.
  if (err instanceof ServiceError) {
    console.error(`mesh-provisioner: refused (${err.code}): ${err.message}`);
    process.exit(2);
  }
  console.error(`mesh-provisioner: ${thrownText(err)}`);
  process.exit(1);
});
