/**
 * The users of a bus as the function set sees them: their roles and permissions, their inbox
 * prefixes, their generated passwords (a users file such as `users.json` of a state folder) and
 * nats-server's `accounts` block, in its configuration syntax (alone, or in a complete server
 * configuration) or as the embedded server's conf object. Used by the embedded server, the local
 * cluster, the derived permissions, the CLI and the test helpers. A contract: it imports nothing
 * of the runtime (docs/runtime.md §6).
 */
import { randomBytes } from "node:crypto";
import { chmodSync, existsSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { z } from "zod";

/**
 * One user's permissions in nats-server's `authorization` block (nats-server 2.9 semantics):
 * subjects it may publish and subscribe to.
 */
export interface Permissions {
  readonly publish: { readonly allow: readonly string[] };
  readonly subscribe: { readonly allow: readonly string[] };
}

/** The roles of the mesh's bus as this function set sees them (docs/mesh.md §1, docs/buckets.md §2). */
export type Role = "seat" | "node" | "provider" | "controller";

/**
 * A user of the bus and its account (docs/runtime.md §6.7): users of the role `seat` share the
 * seat's account, which holds JetStream (the buckets and streams); every node and provider has
 * an account of its own, reaching the seat's only through `imports`. Credentials are added by
 * whoever writes the conf.
 */
export interface AuthorizedUser {
  readonly role: Role;
  readonly user: string;
  readonly permissions: Permissions;
  /**
   * The subjects this user's account imports as services from the seat's account (a node's own
   * keys, the reads and verbs it may ask); none for the seat's account. A reply the server makes
   * to a request through an import comes back into the importer's account, where no stream
   * captures it: no reply subject can make the server write into a bucket or the events stream.
   */
  readonly imports?: readonly string[];
  /**
   * The subjects this user's account imports as streams from the seat's account: messages the
   * seat publishes that reach this user (a node's own notices), each exported to it alone.
   */
  readonly receives?: readonly string[];
}

/** A user and its password, on the embedded server or a local cluster. */
export interface Credentials {
  readonly user: string;
  readonly password: string;
}

/**
 * The inbox prefix of a user: replies to it come on `_INBOX.<user>.>`, which only that user may
 * subscribe to, so no user reads another's replies. Clients set it as nats.js's `inboxPrefix`.
 */
export const inboxOf = (user: string): string => `_INBOX.${user}`;

/** A user's name: one token, so its grants (`<node>.>`, `_INBOX.<node>.>`) never widen. */
const USER_NAME = /^[A-Za-z0-9_/=-]+$/;

/**
 * A user's name as it enters from outside (a command's option, a file of names): one token
 * (docs/runtime.md §6.7.1); a `.`, `*`, `>`, white space or nothing is refused.
 */
export const userName = z.string().regex(USER_NAME, "must be one token (A-Z a-z 0-9 - _ / =): no ., *, > or white space");

/**
 * Checks the names of a bus's users: each one token (`*`, `>` or `.` would widen its grants to
 * other users' subjects), none twice (the seat, nodes and providers share one namespace). Throws
 * naming every bad or repeated name.
 */
export function checkUserNames(names: readonly string[]): void {
  const bad = names.filter((n) => !USER_NAME.test(n));
  if (bad.length > 0)
    throw new Error(`a user's name must be one token (A-Z a-z 0-9 - _ / =): ${bad.map((n) => JSON.stringify(n)).join(", ")}`);
  // A node writes its own key `<node>` of node-written buckets: this one is the live views' marker (docs/buckets.md §2).
  if (names.includes("_freshness")) throw new Error(`a user may not be named _freshness: that is the live views' marker key`);
  const twice = names.filter((n, i) => names.indexOf(n) !== i);
  if (twice.length > 0)
    throw new Error(`a user is named twice (the seat, nodes and providers share one namespace): ${[...new Set(twice)].join(", ")}`);
}

/** A users file: each user's password by its name, as `users.json` of a state folder holds them. */
const usersFile = z.record(z.string(), z.string().min(1, "must be a password, not empty"));

/**
 * The passwords of `names` from the users file `file` (JSON, `{ "<user>": "<password>" }`), a
 * generated one (18 random bytes, base64url) for any user missing, which `generated` lists; the
 * file is written back with mode 0600, keeping the users it had. Throws naming the file when it
 * is not JSON or not of that shape.
 */
export function passwordsIn(
  file: string,
  names: readonly string[],
): { readonly passwords: Record<string, string>; readonly generated: string[] } {
  let known: Record<string, string> = {};
  if (existsSync(file)) {
    let json: unknown;
    try {
      json = JSON.parse(readFileSync(file, "utf8"));
    } catch (err) {
      throw new Error(`${file}: not JSON (${(err as Error).message})`, { cause: err });
    }
    const parsed = usersFile.safeParse(json);
    if (!parsed.success) {
      const said = parsed.error.issues.map((i) => (i.path.length > 0 ? `${i.path.map(String).join(".")}: ${i.message}` : i.message));
      throw new Error(`${file}: a users file is { "<user>": "<password>" }: ${said.join("; ")}`);
    }
    known = parsed.data;
  }
  const generated = names.filter((n) => known[n] === undefined);
  const passwords = Object.fromEntries(names.map((n) => [n, known[n] ?? randomBytes(18).toString("base64url")]));
  writeFileSync(file, JSON.stringify({ ...known, ...passwords }, null, 2), { mode: 0o600 });
  chmodSync(file, 0o600); // `mode` applies to a new file only
  return { passwords, generated };
}

/** The passwords of `names` from `<stateDir>/users.json` ({@link passwordsIn}). */
export function userPasswords(stateDir: string, names: readonly string[]): Record<string, string> {
  return passwordsIn(join(stateDir, "users.json"), names).passwords;
}

/** An account of nats-server's `accounts` block. */
export interface AccountConf {
  /** JetStream for the account: on with the server's limits, or with a file storage limit of its own in bytes. */
  readonly jetstream?: "enabled" | { readonly max_file: number };
  readonly users: readonly { readonly user: string; readonly password: string; readonly permissions: Permissions }[];
  readonly exports?: readonly (({ readonly service: string } | { readonly stream: string }) & { readonly accounts: readonly string[] })[];
  readonly imports?: readonly (
    | { readonly service: { readonly account: string; readonly subject: string } }
    | { readonly stream: { readonly account: string; readonly subject: string } }
  )[];
}

/**
 * The accounts of `users` (docs/runtime.md §6.7), with `password(user)` for each: the seat's
 * account, named after the first user of the role `seat`, with JetStream, every seat-role user
 * and an export of each subject another account imports (to those accounts only); then one
 * account per node or provider, named after it, holding that user and its imports. Throws
 * when no user has the role `seat`.
 */
export function accountsOf(users: readonly AuthorizedUser[], password: (user: string) => string): Record<string, AccountConf> {
  const seats = users.filter((u) => u.role === "seat");
  const home = seats[0]?.user;
  if (home === undefined) throw new Error("the users of a bus need the seat: no user has the role seat");
  const importers = new Map<string, string[]>();
  const receivers = new Map<string, string[]>();
  for (const { user, imports = [], receives = [] } of users.filter((u) => u.role !== "seat")) {
    for (const subject of imports) importers.set(subject, [...(importers.get(subject) ?? []), user]);
    for (const subject of receives) receivers.set(subject, [...(receivers.get(subject) ?? []), user]);
  }
  const entry = ({ user, permissions }: AuthorizedUser) => ({ user, password: password(user), permissions });
  return {
    [home]: {
      jetstream: "enabled",
      users: seats.map(entry),
      exports: [
        ...[...importers].map(([service, accounts]) => ({ service, accounts })),
        ...[...receivers].map(([stream, accounts]) => ({ stream, accounts })),
      ],
    },
    ...Object.fromEntries(
      users
        .filter((u) => u.role !== "seat")
        .map((u) => [
          u.user,
          {
            users: [entry(u)],
            imports: [
              ...(u.imports ?? []).map((subject) => ({ service: { account: home, subject } })),
              ...(u.receives ?? []).map((subject) => ({ stream: { account: home, subject } })),
            ],
          },
        ]),
    ),
  };
}

const quote = (text: string) => JSON.stringify(text);

/** A user's password variable in a printed conf: `$<USER>_PASSWORD`, upper case, other characters `_`. */
const variable = (user: string) => `$${user.toUpperCase().replace(/[^A-Z0-9]/g, "_")}_PASSWORD`;

/**
 * The users in nats-server's configuration syntax: an `accounts { … }` block ({@link accountsOf}),
 * each user with a comment saying its role and `password: <password(user)>`, conf text as it is
 * written. By default `$<VARIABLE>`, a variable named after the user for the operator to define
 * (nats-server looks it up in the same file, then the server's environment, never in a file that
 * includes this one); then throws when two users would share a variable.
 */
export function toConf(users: readonly AuthorizedUser[], password?: (user: string) => string): string {
  const clash = users.find((u, i) => users.findIndex((v) => variable(v.user) === variable(u.user)) !== i);
  if (password === undefined && clash !== undefined) {
    throw new Error(`two users would share the password variable ${variable(clash.user)}: rename one of them`);
  }
  const list = (items: readonly string[], indent: string) => `[\n${items.map((s) => `${indent}  ${s}`).join("\n")}\n${indent}]`;
  const roleOf = (user: string) => users.find((u) => u.user === user)!.role;
  const blocks = Object.entries(accountsOf(users, password ?? variable)).map(([name, account]) => {
    const userLines = account.users.map(({ user, password, permissions }) =>
      [
        `{`,
        `        user: ${quote(user)}`,
        `        password: ${password}`,
        `        permissions: {`,
        `          publish: { allow: ${list(permissions.publish.allow.map(quote), "          ")} }`,
        `          subscribe: { allow: ${list(permissions.subscribe.allow.map(quote), "          ")} }`,
        `        }`,
        `      }`,
      ].join("\n"),
    );
    return [
      `  # ${account.jetstream ? "the seat's account: JetStream, its buckets and streams" : roleOf(account.users[0]!.user)}`,
      `  ${quote(name)}: {`,
      ...(account.jetstream ? [`    jetstream: enabled`] : []),
      `    users: ${list(userLines, "    ")}`,
      ...(account.exports && account.exports.length > 0
        ? [
            `    exports: ${list(
              account.exports.map(
                (e) =>
                  `{ ${"service" in e ? `service: ${quote(e.service)}` : `stream: ${quote(e.stream)}`}, accounts: [${e.accounts.map(quote).join(", ")}] }`,
              ),
              "    ",
            )}`,
          ]
        : []),
      ...(account.imports && account.imports.length > 0
        ? [
            `    imports: ${list(
              account.imports.map((i) => {
                const [kind, from] = "service" in i ? ["service", i.service] : ["stream", i.stream];
                return `{ ${kind}: { account: ${quote(from.account)}, subject: ${quote(from.subject)} } }`;
              }),
              "    ",
            )}`,
          ]
        : []),
      `  }`,
    ].join("\n");
  });
  return `accounts {\n${blocks.join("\n")}\n}\n`;
}

/** Where a server of {@link serverConf} listens and keeps its JetStream store. */
export interface ServerConfOptions {
  /** `host:port` clients connect to (`[v6-address]:port` for IPv6). */
  readonly listen: string;
  /** JetStream's store folder, an absolute path. */
  readonly storeDir: string;
  /** Each user's password as the server checks it: a bcrypt hash (`$2a$`, `$2b$`), written quoted. */
  readonly hash: (user: string) => string;
  /** Comment lines for the top of the file, without their `#`. */
  readonly comments?: readonly string[];
}

/**
 * A complete nats-server configuration (nats-server 2.9 syntax) that starts as it is: `listen`,
 * `jetstream { store_dir }` and the {@link toConf} accounts of `users`, each password the
 * quoted text of `hash(user)`. Nothing refers to a variable, so `nats-server --signal reload`
 * reads it whole (docs/runtime.md §6.7).
 */
export function serverConf(users: readonly AuthorizedUser[], options: ServerConfOptions): string {
  return [
    ...(options.comments ?? []).map((line) => (line === "" ? "#" : `# ${line}`)),
    `listen: ${quote(options.listen)}`,
    `jetstream {`,
    `  store_dir: ${quote(options.storeDir)}`,
    `}`,
    toConf(users, (user) => quote(options.hash(user))),
  ].join("\n");
}
