import { authorization, createLogger, invoke, loadFunctions, openRunner, openSession } from "../../runtime/index.ts";
import { asJson, type AddCommand } from "../program.ts";

/** `invoke <function> [json]`: one function run once, locally, its answer printed (docs/runtime.md §6.8). */
export const invokeCommand: AddCommand = (program, { config }) => {
  program
    .command("invoke")
    .description("run one function once, locally, with the context the runtime builds")
    .argument("<function>", "the function's name (its file name without .ts)")
    .argument("[json]", "its input, as JSON", "{}")
    .action(async (name: string, json: string) => {
      let input: unknown;
      try {
        input = JSON.parse(json);
      } catch (err) {
        throw new Error(`the input is not JSON: ${(err as Error).message}`, { cause: err });
      }
      const cfg = await config();
      const functions = await loadFunctions(cfg);
      const fn = functions.find((f) => f.name === name);
      if (fn === undefined) {
        throw new Error(`no function ${name}; there are: ${functions.map((f) => f.name).join(", ")}`);
      }
      const session = await openSession(cfg, {
        embedded: "join-or-start",
        name: `mesh-provisioner invoke ${name}`,
        users: authorization(cfg, functions, cfg.embedded),
      });
      try {
        // stdout is the answer: logs go to stderr.
        const runner = await openRunner({ nc: session.nc, config: cfg, log: createLogger(process.env, { to: "stderr" }) });
        console.log(asJson(await invoke(runner, fn, input)));
      } finally {
        await session.close();
      }
    });
};
