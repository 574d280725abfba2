/**
 * The users of a bus as the function set sees them: their roles and permissions, their inbox
 * prefixes, their generated passwords (`users.json` of a state folder) and nats-server's
 * `authorization` block, in its configuration syntax or as the embedded server's conf object.
 * Used by the embedded server, the local cluster, the derived permissions and the test helpers.
 * A contract: it imports nothing of the runtime (docs/runtime.md §6).
 */
import { randomBytes } from "node:crypto";
import { chmodSync, existsSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";

/**
 * One user's permissions in nats-server's `authorization` block (nats-server 2.9 semantics):
 * subjects it may publish and subscribe to.
 */
export interface Permissions {
  readonly publish: { readonly allow: readonly string[] };
  readonly subscribe: { readonly allow: readonly string[] };
}

/** The three roles of the mesh's bus as this function set sees them (docs/mesh.md §1, docs/buckets.md §2). */
export type Role = "seat" | "node" | "provider";

/** A user of nats-server's `authorization.users`: credentials are added by whoever writes the conf. */
export interface AuthorizedUser {
  readonly role: Role;
  readonly user: string;
  readonly permissions: Permissions;
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
 * Checks the names of a bus's users: each one token (`*`, `>` or `.` would widen its grants to
 * other users' subjects), none twice (the seat, nodes and providers share one namespace). Throws
 * naming every bad or repeated name.
 */
export function checkUserNames(names: readonly string[]): void {
  const bad = names.filter((n) => !USER_NAME.test(n));
  if (bad.length > 0)
    throw new Error(`a user's name must be one token (A-Z a-z 0-9 - _ / =): ${bad.map((n) => JSON.stringify(n)).join(", ")}`);
  const twice = names.filter((n, i) => names.indexOf(n) !== i);
  if (twice.length > 0)
    throw new Error(`a user is named twice (the seat, nodes and providers share one namespace): ${[...new Set(twice)].join(", ")}`);
}

/**
 * The passwords of `names` from `<stateDir>/users.json`, a generated one (18 random bytes,
 * base64url) for any user missing; the file is written back with mode 0600, keeping the users
 * it had.
 */
export function userPasswords(stateDir: string, names: readonly string[]): Record<string, string> {
  const file = join(stateDir, "users.json");
  const known: Record<string, string> = existsSync(file) ? JSON.parse(readFileSync(file, "utf8")) : {};
  const all = Object.fromEntries(names.map((n) => [n, known[n] ?? randomBytes(18).toString("base64url")]));
  writeFileSync(file, JSON.stringify({ ...known, ...all }, null, 2), { mode: 0o600 });
  chmodSync(file, 0o600); // `mode` applies to a new file only
  return all;
}

/** nats-server's `authorization` block as a conf object: each user with its password and permissions. */
export function authorizationBlock(users: readonly AuthorizedUser[], passwords: Readonly<Record<string, string>>) {
  return { users: users.map(({ user, permissions }) => ({ user, password: passwords[user], permissions })) };
}

const quote = (text: string) => JSON.stringify(text);

/**
 * The users in nats-server's configuration syntax: an `authorization { users = [...] }` block,
 * each user with `password: $<VARIABLE>` (a variable of the conf or the environment, named after
 * the user) for the operator to define, and a comment saying its role. Throws when two users
 * would share a variable.
 */
export function toConf(users: readonly AuthorizedUser[]): string {
  const list = (subjects: readonly string[], indent: string) =>
    `[\n${subjects.map((s) => `${indent}  ${quote(s)}`).join("\n")}\n${indent}]`;
  const variable = (user: string) => `$${user.toUpperCase().replace(/[^A-Z0-9]/g, "_")}_PASSWORD`;
  const clash = users.find((u, i) => users.findIndex((v) => variable(v.user) === variable(u.user)) !== i);
  if (clash !== undefined) {
    throw new Error(`two users would share the password variable ${variable(clash.user)}: rename one of them`);
  }
  const blocks = users.map(({ role, user, permissions }) =>
    [
      `    # ${role}`,
      `    {`,
      `      user: ${quote(user)}`,
      `      password: ${variable(user)}`,
      `      permissions: {`,
      `        publish: { allow: ${list(permissions.publish.allow, "        ")} }`,
      `        subscribe: { allow: ${list(permissions.subscribe.allow, "        ")} }`,
      `      }`,
      `    }`,
    ].join("\n"),
  );
  return `authorization {\n  users = [\n${blocks.join("\n")}\n  ]\n}\n`;
}
