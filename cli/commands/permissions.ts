import { Option } from "commander";
import { authorization, loadFunctions, passwordsIn, serverConf, toConf } from "../../runtime/index.ts";
import { bcryptHash, BCRYPT_COST, CONTROLLER, namesOf, parseListen, storeDirOf, type NameOptions } from "../permissions.ts";
import { asJson, type AddCommand } from "../program.ts";

/** A repeatable option's values: each given one after those before. */
const names = (value: string, previous: string[] = []) => [...previous, value];

/** `permissions`: the nats-server users and permissions the set needs, or a whole configuration (docs/runtime.md §6.7). */
export const permissionsCommand: AddCommand = (program, { config }) => {
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
      if (!options.conf) return void console.log(options.json ? asJson(users) : toConf(users).trimEnd());
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
};
