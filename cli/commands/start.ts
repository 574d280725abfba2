import { createLogger, describe, start, STOP_GRACE_MS, type Running } from "../../runtime/index.ts";
import type { AddCommand } from "../program.ts";
import { onStopSignals } from "../signals.ts";

/** What `start --help` says after its options: the program's own and the environment (docs/runtime.md §6.6). */
const START_HELP = `
The program's options apply: -c, --config <file> (default wrangler-free.config.ts), before the command.

Environment (docs/configuration.md §18.2; each that names a field of the config overrides it):
  NATS_URL                 server URLs, comma-separated; unset with no nats.servers: the embedded nats-server
  NATS_USER, NATS_PASSWORD the seat's user and password
  NATS_CREDS, NATS_NKEY    a credentials file, an nkey seed file
  NATS_TOKEN               a token
  NATS_CA                  a CA certificate to trust the server's TLS certificate
  NATS_CERT, NATS_KEY      a client certificate and its key
  NATS_REPLICAS            replicas of the buckets and streams: 1, 3 or 5
  NATS_SERVER_BIN          the nats-server binary of the embedded default
  HTTP_HOST, HTTP_PORT     where HTTP listens (default 127.0.0.1:8787; port 0 picks a free one)
  HTTP_TOKEN               the bearer token HTTP asks for (but /healthz and /readyz)
  HTTP_TRUSTED_NETWORK     1 or true: listen on a host that is not loopback without a token
  LOG_LEVEL                trace, debug, info, warn, error, fatal or silent (default info)
  NODE_COMPILE_CACHE       where Node 22.1 and later keep their compile cache (default .state/compile-cache)

It runs until SIGINT or SIGTERM (docs/operations.md §13.3).`;

/** `start`: runs the function set until a stop signal (docs/runtime.md §6.5). */
export const startCommand: AddCommand = (program, { config }) => {
  program
    .command("start")
    .description("run the function set: on NATS_URL, or on the embedded nats-server")
    .addHelpText("after", START_HELP)
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
