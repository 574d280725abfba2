import { createLogger, describe, start, STOP_GRACE_MS, type Running } from "../../runtime/index.ts";
import type { AddCommand } from "../program.ts";
import { onStopSignals } from "../signals.ts";

/** `start`: runs the function set until a stop signal (docs/runtime.md §6.5). */
export const startCommand: AddCommand = (program, { config }) => {
  program
    .command("start")
    .description("run the function set: on NATS_URL, or on the embedded nats-server")
    .action(async () => {
      // Handlers first: a signal during start, or right after the banner, still stops in order.
      // SIGHUP too: a closed terminal must not leave the embedded server behind.
      let running: Running | undefined;
      let stopping = false;
      const shutdown = (r: Running) =>
        r.stop().then(
          () => process.exit(0),
          (err: unknown) => {
            console.error(`mesh-provisioner: stopping failed: ${(err as Error).message}`);
            process.exit(1);
          },
        );
      const log = createLogger();
      // A later signal exits at once, 130 (the exit hook kills the embedded server).
      onStopSignals((signal) => {
        stopping = true;
        log.info({ signal }, "signal: stopping");
        if (running !== undefined) return void shutdown(running);
        // Start still going (a long run at start): it gets the same grace as requests in hand.
        setTimeout(() => {
          log.error(`start did not end within ${STOP_GRACE_MS / 1000} s of the signal; exiting`);
          process.exit(1); // the exit hook stops the embedded server
        }, STOP_GRACE_MS).unref();
      });
      running = await start({ config: await config(), log });
      if (stopping) return void shutdown(running);
      // stdout carries only log lines; the banner is for whoever watches the terminal.
      console.error(describe(running).join("\n"));
    });
};
