import { rmSync, writeFileSync } from "node:fs";
import { join, relative } from "node:path";
import { Option } from "commander";
import { authorization, configPath, loadFunctions, startCluster } from "../../runtime/index.ts";
import { asJson, positive, type AddCommand } from "../program.ts";
import { onStopSignals } from "../signals.ts";

/** `cluster`: a local NATS cluster with JetStream, its env and users files for the set and the demo (docs/servers.md §12.5). */
export const clusterCommand: AddCommand = (program, { config }) => {
  program
    .command("cluster")
    .description("run a local NATS cluster with JetStream (3 servers on loopback), for trying several replicas of the set")
    .addOption(new Option("--size <n>", "how many servers").argParser(positive).default(3))
    .action(async (options: { size: number }) => {
      if (options.size < 3) throw new Error("--size: a cluster needs 3 servers or more, to keep serving when one is lost");
      const cfg = await config();
      const dir = join(configPath(cfg, cfg.state), "cluster");
      const users = authorization(cfg, await loadFunctions(cfg), cfg.embedded);
      const cluster = await startCluster({ stateDir: dir, users, size: options.size, name: cfg.seat });
      const env = join(dir, "env");
      // Its ports die with it: the env file goes first, so nothing starts on them meanwhile.
      onStopSignals(() => {
        rmSync(env, { force: true });
        void cluster.stop().then(() => process.exit(0));
      });
      const replicas = Math.min(3, options.size);
      writeFileSync(
        env,
        [
          `NATS_URL=${cluster.urls.join(",")}`,
          `NATS_USER=${cluster.seat.user}`,
          `NATS_PASSWORD=${cluster.seat.password}`,
          `NATS_REPLICAS=${replicas}`,
          "",
        ].join("\n"),
        { mode: 0o600 },
      );
      // The users' passwords, for clients and the demo on this cluster (`demo --users`).
      const usersFile = join(dir, "users.json");
      const passwords = Object.fromEntries(
        [cluster.seat, ...Object.values(cluster.users)].map((credentials) => [credentials.user, credentials.password]),
      );
      writeFileSync(usersFile, asJson(passwords), { mode: 0o600 });
      const shown = relative(process.cwd(), dir) || dir;
      console.error(
        [
          `NATS cluster ${cfg.seat}: ${options.size} servers with JetStream, the embedded default's users`,
          ...cluster.servers.map(
            (server, i) => `  ${server.name}  ${server.url}  (monitoring ${server.monitor}, store ${join(shown, String(i + 1))})`,
          ),
          "",
          `Its URLs, the seat's user and replicas ${replicas} are in ${join(shown, "env")}. Start replicas of the set on it,`,
          "each in a terminal of its own:",
          `  set -a; . ${join(shown, "env")}; set +a; HTTP_PORT=0 npm start`,
          "",
          `Its users' passwords are in ${join(shown, "users.json")}; the demo writes on it as they would:`,
          `  set -a; . ${join(shown, "env")}; set +a; npm run demo -- --users ${join(shown, "users.json")}`,
          "",
          `Ctrl-C stops the cluster and removes ${join(shown, "env")}; its stores stay for the next start.`,
        ].join("\n"),
      );
    });
};
