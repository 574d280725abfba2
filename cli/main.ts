import { rmSync, writeFileSync } from "node:fs";
import { join, relative } from "node:path";
import { Command, InvalidArgumentError, Option } from "commander";
import {
  authorization,
  CONFIG_FILE,
  configPath,
  createLogger,
  describe,
  invoke,
  loadConfig,
  loadFunctions,
  openRunner,
  openSession,
  passwordsIn,
  serverConf,
  ServiceError,
  start,
  startCluster,
  STOP_GRACE_MS,
  toConf,
  type Running,
  type Session,
} from "../runtime/index.ts";
import { DEFAULT_WHAT, HISTORY, HOLDERS, ROTATIONS, STATE } from "../functions/_lib/provisioning.ts";
import { STATES } from "../functions/_lib/state.ts";
import { askAll, askOnce, formatAnswer, narrowingOptions, showWhole, whatHelp } from "./ask.ts";
import { catchUpDemo, DEMO_FAILING, DEMO_ROTATION, demoBus, publishDemoEvent, publishDemoRotation, writeDemo } from "./demo.ts";
import { bcryptHash, BCRYPT_COST, CONTROLLER, namesOf, parseListen, storeDirOf, type NameOptions } from "./permissions.ts";
import { formatHolders, formatRotations } from "./rotation.ts";
import { onStopSignals } from "./signals.ts";
import { askStates, formatStates } from "./state.ts";
import { askStatus, formatStatus } from "./status.ts";

const program = new Command("mesh-provisioner")
  .description("The provisioner's server of the mesh: the registry and the verb mesh-provisioner.provisioning.")
  .option("-c, --config <file>", "the config file", CONFIG_FILE)
  .option("-w, --wide", "show every value whole in tables (they cut long ones with …)")
  .showHelpAfterError()
  .hook("preAction", () => showWhole(program.opts<{ wide?: boolean }>().wide === true));

const config = () => loadConfig(program.opts<{ config: string }>().config);

/** Runs `use` on a connection of the config's bus as the seat (the embedded server joined), named `mesh-provisioner <command>`, closed after. */
async function asking(command: string, use: (nc: Session["nc"]) => Promise<void>): Promise<void> {
  const session = await openSession(await config(), { embedded: "join", name: `mesh-provisioner ${command}` });
  try {
    await use(session.nc);
  } finally {
    await session.close();
  }
}

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

const positive = (text: string) => {
  if (!/^\d+$/.test(text)) throw new InvalidArgumentError("must be a whole number");
  return Number(text);
};

const ask = program
  .command("ask")
  .description("ask mesh-provisioner.provisioning and print the answer")
  .argument("[what]", whatHelp, DEFAULT_WHAT);
for (const option of narrowingOptions()) ask.addOption(option);
ask
  .addOption(new Option("--limit <n>", "ask one page of at most n entries").argParser(positive))
  .option("--cursor <cursor>", "ask the page after this cursor (the `next` of a page)")
  .option("--stale", "answer from the live view without asking the server whether it is current (says when it last was)")
  .option("--since <time>", "with history: the events stored at or after this RFC 3339 time")
  .option("--json", "print the answer as JSON")
  .action(async (what: string, options: Record<string, unknown>) => {
    const { json, ...fields } = options;
    const request = { what, ...fields };
    await asking("ask", async (nc) => {
      const onePage = fields.limit !== undefined || fields.cursor !== undefined;
      const answer = onePage ? await askOnce(nc, request) : await askAll(nc, request);
      const shownAs = () =>
        answer.what === STATE
          ? formatStates(answer as Parameters<typeof formatStates>[0], new Date())
          : answer.what === HISTORY || answer.what === HOLDERS || answer.what === ROTATIONS
            ? JSON.stringify(answer, null, 2)
            : formatAnswer(answer as Parameters<typeof formatAnswer>[0]);
      console.log(json ? JSON.stringify(answer, null, 2) : shownAs());
    });
  });

program
  .command("state")
  .description("say each module's provisioning state on each node, for how long, and its conditions in words")
  .option("--node <node>", "narrow to one node")
  .option("--module <module>", "narrow to one module")
  .addOption(new Option("--state <state>", "narrow to one state").choices(STATES))
  .option("--json", "print the answer as JSON")
  .action(async (options: Record<string, unknown>) => {
    const { json, ...narrowing } = options;
    await asking("state", async (nc) => {
      const answer = await askStates(nc, narrowing);
      console.log(json ? JSON.stringify(answer, null, 2) : formatStates(answer, new Date()));
    });
  });

program
  .command("holders")
  .description("list the holders of a provision: each need of it, the revision its module has in use, stale or caught up")
  .argument("<provision>", "the provision (a need's name up to its first /)")
  .option("--node <node>", "narrow to one node")
  .option("--kind <kind>", "narrow to one kind")
  .option("--json", "print the answer as JSON")
  .action(async (provision: string, options: Record<string, unknown>) => {
    const { json, ...narrowing } = options;
    await asking("holders", async (nc) => {
      const answer = await askAll(nc, { what: HOLDERS, provision, ...narrowing });
      console.log(
        json ? JSON.stringify(answer, null, 2) : formatHolders(answer as unknown as Parameters<typeof formatHolders>[0], new Date()),
      );
    });
  });

program
  .command("rotations")
  .description("list the rotations providers announced: holders caught up, and whether the old credential was released")
  .option("--provider <provider>", "narrow to one provider")
  .option("--provision <provision>", "narrow to one provision")
  .option("--json", "print the answer as JSON")
  .action(async (options: Record<string, unknown>) => {
    const { json, ...narrowing } = options;
    await asking("rotations", async (nc) => {
      const answer = await askAll(nc, { what: ROTATIONS, ...narrowing });
      console.log(
        json ? JSON.stringify(answer, null, 2) : formatRotations(answer as unknown as Parameters<typeof formatRotations>[0], new Date()),
      );
    });
  });

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
      console.log(json ? JSON.stringify(status, null, 2) : formatStatus(status, new Date()));
      if (!status.well) process.exitCode = 1;
    });
  });

const names = (value: string, previous: string[] = []) => [...previous, value];

const permissions = program
  .command("permissions")
  .description(
    "print the nats-server users and permissions the function set needs: the seat, each node, each provider, the controller " +
      "(an accounts block, each password a variable to define), or with --conf a complete nats-server configuration",
  )
  .option("--node <node>", "a node user to print (repeatable)", names)
  .option("--nodes-file <file>", "a file of node users, one a line (blank lines and # comments left out)")
  .option(
    "--from-assignments",
    "every node the controller's assignments mirror (mesh-controller_assignments) names, read over NATS_URL or the embedded server",
  )
  .option("--provider <provider>", "a provider user to print (repeatable)", names)
  .option("--providers-file <file>", "a file of provider users, one a line")
  .option("--controller <controller>", `the controller's user (repeatable; default: ${CONTROLLER})`, names)
  .option("--demo", "the embedded demo's users (the config's embedded nodes, providers and controllers), besides any named")
  .addOption(new Option("--json", "print the users as JSON instead of nats-server's configuration syntax").conflicts("conf"))
  .option(
    "--conf",
    "print a complete nats-server configuration that starts as it is: listen, jetstream, the accounts, bcrypt-hashed passwords",
  )
  .option("--listen <host:port>", "with --conf: where the server listens", "127.0.0.1:4222")
  .option("--store-dir <dir>", "with --conf: JetStream's store folder", "/var/lib/nats")
  .option("--credentials <file>", "with --conf (needed): the users file of the clients' passwords, read back and kept; written mode 0600")
  .addHelpText(
    "after",
    [
      "",
      "Without --conf, each password is a variable ($ALDER_PASSWORD) to define in",
      "the same file or the server's environment. With --conf, the configuration",
      `holds each password's bcrypt hash (cost ${BCRYPT_COST}), which cannot be turned back:`,
      "the passwords the clients connect with are in the --credentials file",
      '({ "<user>": "<password>" }). Users it holds keep their passwords; new users',
      "get new ones. To add a node, print the configuration again over the old one",
      "with the same --credentials file, then `nats-server --signal reload` twice",
      "(nats-server 2.9 wires the imports of an account a reload adds at the next one):",
      "",
      "  mesh-provisioner permissions --conf --node alder --provider keycloak \\",
      "    --credentials users.json > nats-server.conf",
      "  nats-server -c nats-server.conf",
      "",
    ].join("\n"),
  )
  .action(async (options: NameOptions & { json?: boolean; conf?: boolean; listen: string; storeDir: string; credentials?: string }) => {
    const given = (key: string) => permissions.getOptionValueSource(key) === "cli";
    if (!options.conf) {
      const stray = [
        ["listen", "--listen"],
        ["storeDir", "--store-dir"],
        ["credentials", "--credentials"],
      ].filter(([key]) => given(key!));
      if (stray.length > 0) throw new Error(`${stray.map(([, flag]) => flag).join(", ")}: only with --conf`);
    } else if (options.credentials === undefined) {
      throw new Error(
        "--conf needs --credentials <file>: the clients' passwords go there, as the configuration holds only their bcrypt hashes",
      );
    }
    const listen = options.conf ? parseListen(options.listen) : "";
    const storeDir = options.conf ? storeDirOf(options.storeDir) : "";
    const cfg = await config();
    const named = await namesOf(cfg, options, (line) => console.error(`mesh-provisioner: ${line}`));
    const users = authorization(cfg, await loadFunctions(cfg), named);
    if (!options.conf) return void console.log(options.json ? JSON.stringify(users, null, 2) : toConf(users).trimEnd());
    const file = options.credentials!;
    const { passwords, generated } = passwordsIn(
      file,
      users.map((u) => u.user),
    );
    console.log(
      serverConf(users, {
        listen,
        storeDir,
        hash: (user) => bcryptHash(passwords[user]!),
        comments: [
          `nats-server configuration of the function set ${cfg.seat} (docs/runtime.md §6.7), as \`mesh-provisioner permissions --conf\` prints it.`,
          `Each password is a bcrypt hash (cost ${BCRYPT_COST}); the clients' passwords are in ${file}.`,
          "To add a node: print it again over this file with the same --credentials file, then `nats-server --signal reload`",
          "twice: nats-server 2.9 wires the imports of an account a reload adds only at the next reload.",
        ],
      }).trimEnd(),
    );
    console.error(
      `mesh-provisioner: the passwords of ${users.length} users are in ${file} (${generated.length === 0 ? "none new" : `new: ${generated.join(", ")}`}); the configuration holds their bcrypt hashes`,
    );
  });

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
    writeFileSync(usersFile, JSON.stringify(passwords, null, 2), { mode: 0o600 });
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
      console.log(JSON.stringify(await invoke(runner, fn, input), null, 2));
    } finally {
      await session.close();
    }
  });

program
  .command("demo")
  .description("write the demo mesh as its node clients would, have its identity provider fail a consumer, then ask about it")
  .option("--recover", `only publish the recovery of ${DEMO_FAILING.provider}, then print status`)
  .option(
    "--catch-up",
    `only catch ${DEMO_ROTATION.consumer} on ${DEMO_ROTATION.machine} up with the rotated credential, then print the release`,
  )
  .option(
    "--users <file>",
    "the passwords of the demo's node, provider and controller users (the shape of .state/users.json): needed on a server of your own (NATS_URL)",
  )
  .action(async (options: { recover?: boolean; catchUp?: boolean; users?: string }) => {
    const cfg = await config();
    const bus = await demoBus(cfg, options.users);
    const session = await openSession(cfg, { embedded: "join", name: "mesh-provisioner demo" });
    const { provider, machine, consumer } = DEMO_FAILING;
    const showStatus = async () => {
      console.log("\n$ status");
      console.log(formatStatus(await askStatus(session.nc, {}), new Date()));
    };
    try {
      if (options.recover) {
        await publishDemoEvent(bus, "recovered");
        console.log(`${provider}: published ${provider}.provisioner.recovered for ${consumer} on ${machine}`);
        await showStatus();
        return;
      }
      if (options.catchUp) {
        const released = await catchUpDemo(bus);
        console.log(
          `${DEMO_ROTATION.machine}: wrote ${DEMO_ROTATION.consumer}'s applied record with ${DEMO_ROTATION.provision} at ${DEMO_ROTATION.revision}`,
        );
        console.log(`${DEMO_ROTATION.provider}: received mesh-provisioner.released.${DEMO_ROTATION.provider} ${JSON.stringify(released)}`);
        console.log("\n$ rotations");
        console.log(
          formatRotations((await askAll(session.nc, { what: ROTATIONS })) as unknown as Parameters<typeof formatRotations>[0], new Date()),
        );
        return;
      }
      const written = await writeDemo(cfg, bus);
      for (const [user, count] of Object.entries(written)) {
        console.log(
          cfg.embedded.controllers.includes(user)
            ? `${user}: wrote ${count} assignments as the controller`
            : `${user}: wrote ${count} records as node ${user}`,
        );
      }
      await publishDemoEvent(bus, "failing");
      console.log(`${provider}: published ${provider}.provisioner.failing for ${consumer} on ${machine}`);
      for (const request of [
        { what: "registry" },
        { what: "needs", node: "birch", module: "gitea" },
        { what: "collect", collection: "shell:zsh:normal" },
        { what: "needs", node: "dogwood", module: "grafana" },
      ]) {
        console.log(`\n$ ask ${JSON.stringify(request)}`);
        console.log(formatAnswer((await askAll(session.nc, request)) as Parameters<typeof formatAnswer>[0]));
      }
      await publishDemoRotation(bus);
      const { provider: rotator, provision, revision, machine: at, consumer: holder } = DEMO_ROTATION;
      console.log(`\n${rotator}: published ${rotator}.provisioner.rotated: ${provision} at ${revision} for ${holder} on ${at}`);
      console.log(`\n$ holders ${provision}`);
      console.log(
        formatHolders(
          (await askAll(session.nc, { what: HOLDERS, provision })) as unknown as Parameters<typeof formatHolders>[0],
          new Date(),
        ),
      );
      await showStatus();
      console.log(`\n(mesh-provisioner demo --recover publishes ${provider}'s recovery; --catch-up catches ${holder} on ${at} up)`);
    } finally {
      await session.close();
    }
  });

program.parseAsync().catch((err: unknown) => {
  // The runtime's refusals (invoke) and the verbs' (ask, status) as nats.js reads them.
  if (err instanceof ServiceError) {
    console.error(`mesh-provisioner: refused (${err.code}): ${err.message}`);
    process.exit(2);
  }
  console.error(`mesh-provisioner: ${(err as Error).message}`);
  process.exit(1);
});
