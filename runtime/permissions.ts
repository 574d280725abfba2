import type { Config } from "./config.ts";
import { durableOf } from "./events.ts";
import type { LoadedFunction } from "./loader.ts";
import { claimsBucket, recordsBucket } from "./records.ts";

/**
 * One user's permissions in nats-server's `authorization` block (nats-server 2.9 semantics):
 * subjects it may publish and subscribe to, and whether it may answer requests it received.
 */
export interface Permissions {
  readonly publish: { readonly allow: readonly string[] };
  readonly subscribe: { readonly allow: readonly string[] };
}

/** The three roles of the mesh's bus as this function set sees them (SPEC §1, §2). */
export type Role = "seat" | "node" | "provider";

const kvStream = (bucket: string) => `KV_${bucket}`;

/**
 * Publish subjects that read all of a bucket with nats.js 2.x: direct get, and the ordered
 * consumers of keys and watch (created on the unscoped `CONSUMER.CREATE.KV_<b>`, so a reader
 * cannot be narrowed to a key prefix), their deletion and flow control.
 */
function readsBucket(bucket: string, role: Role = "seat"): string[] {
  const s = kvStream(bucket);
  return [
    `$JS.API.STREAM.INFO.${s}`,
    `$JS.API.DIRECT.GET.${s}.>`,
    // The get of a bucket with replicas, answered by its leader.
    `$JS.API.STREAM.MSG.GET.${s}`,
    `$JS.API.CONSUMER.CREATE.${s}`,
    `$JS.API.CONSUMER.CREATE.${s}.>`,
    // Deletion only for the seat: with it a node could delete another reader's consumer by name.
    ...(role === "seat" ? [`$JS.API.CONSUMER.DELETE.${s}.>`] : []),
    `$JS.FC.${s}.>`,
  ];
}

const unique = (subjects: readonly string[]) => [...new Set(subjects)];

/**
 * The inbox prefix of a user: replies to it come on `_INBOX.<user>.>`, which only that user may
 * subscribe to, so no user reads another's replies. Clients set it as nats.js's `inboxPrefix`.
 */
export const inboxOf = (user: string): string => `_INBOX.${user}`;

/** The request/reply subjects of a function set: what nodes and providers may ask. */
export function verbSubjects(functions: readonly LoadedFunction[]): string[] {
  return unique(functions.flatMap((fn) => fn.definition.triggers.flatMap((t) => ("subject" in t ? [t.subject] : []))));
}

/** The durable consumers of a function set's `{ event, stream }` triggers: stream and durable names. */
export function durables(functions: readonly LoadedFunction[], config: Config): { stream: string; durable: string }[] {
  return functions.flatMap((fn) =>
    fn.definition.triggers
      .filter((t) => "event" in t)
      .flatMap((t, i) =>
        "event" in t && t.stream !== undefined
          ? [{ stream: config.streams[t.stream]!.stream, durable: durableOf(fn, i) }]
          : [],
      ),
  );
}

/**
 * Exactly what the seat's user needs to run `functions` (SPEC §6): assert every bucket of the
 * config and the runtime's own; read the buckets functions read or write; write (`$KV.<b>.>`)
 * only seat-written buckets functions write, and the runtime's; assert the streams of event
 * triggers and run their durable consumers (create, info, pull, acknowledge); publish what
 * functions declare in `access.publishes`; serve and ask its verbs (subscribe, publish, reply
 * on `_INBOX.>`) and the
 * NATS service discovery subjects of its service; receive replies on `_INBOX.<seat>.>`. Never
 * `$JS.API.>` or `$JS.>`, and no `$KV` subject of a node-written bucket.
 */
export function seatPermissions(config: Config, functions: readonly LoadedFunction[]): Permissions {
  const runtime = recordsBucket(config.seat);
  const claims = claimsBucket(config.seat);
  const bucketOf = (name: string) => config.buckets[name]!.bucket;
  const viewed = unique(functions.flatMap(({ definition: { access } }) => access?.views ?? []));
  const read = functions.flatMap(({ definition: { access } }) => [...(access?.reads ?? []), ...(access?.writes ?? []), ...(access?.views ?? [])]);
  const written = functions.flatMap((fn) => fn.definition.access?.writes ?? []).filter((b) => config.buckets[b]?.writtenBy === "seat");
  const streams = unique(
    functions.flatMap((fn) =>
      fn.definition.triggers.flatMap((t) => ("event" in t && t.stream !== undefined ? [config.streams[t.stream]!.stream] : [])),
    ),
  );
  const events = functions.flatMap((fn) =>
    fn.definition.triggers.flatMap((t) => ("event" in t && t.stream === undefined ? [t.event] : [])),
  );
  return {
    publish: {
      allow: unique([
        "$JS.API.INFO",
        ...[...Object.values(config.buckets).map((b) => b.bucket), runtime, claims].flatMap((b) => [
          `$JS.API.STREAM.INFO.${kvStream(b)}`,
          `$JS.API.STREAM.CREATE.${kvStream(b)}`,
        ]),
        ...[...read.map(bucketOf), runtime, claims].flatMap((b) => readsBucket(b)),
        // A live view asks for the first message after the last it applied (any subject), with
        // the stream API's get where the stream does not allow direct gets.
        ...viewed.flatMap((b) => [`$JS.API.DIRECT.GET.${kvStream(bucketOf(b))}`, `$JS.API.STREAM.MSG.GET.${kvStream(bucketOf(b))}`]),
        ...[...written.map(bucketOf), runtime, claims].map((b) => `$KV.${b}.>`),
        ...streams.flatMap((s) => [`$JS.API.STREAM.INFO.${s}`, `$JS.API.STREAM.CREATE.${s}`, `$JS.API.STREAM.UPDATE.${s}`]),
        ...durables(functions, config).flatMap(({ stream, durable }) => [
          `$JS.API.CONSUMER.CREATE.${stream}.${durable}`,
          `$JS.API.CONSUMER.CREATE.${stream}.${durable}.>`,
          `$JS.API.CONSUMER.INFO.${stream}.${durable}`,
          // To make a filtered durable of an earlier set unfiltered.
          `$JS.API.CONSUMER.DELETE.${stream}.${durable}`,
          `$JS.API.CONSUMER.MSG.NEXT.${stream}.${durable}`,
          `$JS.ACK.${stream}.${durable}.>`,
        ]),
        ...functions.flatMap((fn) => fn.definition.access?.publishes ?? []),
        // Its own verbs, so an operator holding the seat's credentials can ask them, and
        // describe the service (`nats micro info`).
        ...verbSubjects(functions),
        ...(verbSubjects(functions).length > 0 ? ["PING", "INFO", "STATS"].flatMap((v) => [`$SRV.${v}`, `$SRV.${v}.${config.seat}`, `$SRV.${v}.${config.seat}.*`]) : []),
        // Replies to its verbs' requesters (the runtime answers no other reply subject), instead
        // of `allow_responses`, with which nats-server 2.9 tracks the reply subject of every
        // JetStream message it delivers: reads of a large bucket then go ten times slower.
        "_INBOX.>",
      ]),
    },
    subscribe: {
      allow: unique([
        `${inboxOf(config.seat)}.>`,
        ...verbSubjects(functions),
        ...events,
        ...(verbSubjects(functions).length > 0 ? ["PING", "INFO", "STATS"].flatMap((v) => [`$SRV.${v}`, `$SRV.${v}.${config.seat}`, `$SRV.${v}.${config.seat}.*`]) : []),
      ]),
    },
  };
}

/**
 * A node client's permissions (SPEC §2): write its own `<node>.>` keys of the node-written
 * buckets and read them back, read the buckets read by nodes (the registry), ask the seat's
 * verbs, receive replies on its own `_INBOX.<node>.>`. It cannot touch another node's keys nor write a seat bucket.
 */
export function nodePermissions(node: string, config: Config, functions: readonly LoadedFunction[]): Permissions {
  const own = Object.values(config.buckets).filter((b) => b.writtenBy === "nodes");
  return {
    publish: {
      allow: unique([
        "$JS.API.INFO",
        // No STREAM.INFO of these: its `subjects_filter` would list other nodes' keys. A client
        // opens them with `{ bindOnly: true, allow_direct: true }`.
        ...own.flatMap(({ bucket }) => [
          `$KV.${bucket}.${node}.>`,
          `$JS.API.DIRECT.GET.${kvStream(bucket)}.$KV.${bucket}.${node}.>`,
        ]),
        ...Object.values(config.buckets).filter((b) => b.readBy.includes("nodes")).flatMap(({ bucket }) => readsBucket(bucket, "node")),
        ...verbSubjects(functions),
      ]),
    },
    subscribe: { allow: [`${inboxOf(node)}.>`] },
  };
}

/**
 * A provider's permissions (SPEC §1, §5): publish the config's `providers.publish` subjects for
 * itself (`{provider}` replaced by its name), read the buckets read by providers (the needs)
 * without writing them, ask the seat's verbs, receive replies on its own `_INBOX.<provider>.>`
 * (a JetStream publish's acknowledgement among them).
 */
export function providerPermissions(provider: string, config: Config, functions: readonly LoadedFunction[]): Permissions {
  return {
    publish: {
      allow: unique([
        "$JS.API.INFO",
        ...config.providers.publish.map((subject) => subject.replaceAll("{provider}", provider)),
        ...Object.values(config.buckets).filter((b) => b.readBy.includes("providers")).flatMap(({ bucket }) => readsBucket(bucket, "provider")),
        ...verbSubjects(functions),
      ]),
    },
    subscribe: { allow: [`${inboxOf(provider)}.>`] },
  };
}

/** A user of nats-server's `authorization.users`: credentials are added by whoever writes the conf. */
export interface AuthorizedUser {
  readonly role: Role;
  readonly user: string;
  readonly permissions: Permissions;
}

const USER_NAME = /^[A-Za-z0-9_/=-]+$/;

/**
 * The users of a bus for the function set: the seat, each node and each provider named. Throws
 * when a name is not one token (`*`, `>` or `.` would widen its grants to other users' subjects)
 * or names two users.
 */
export function authorization(
  config: Config,
  functions: readonly LoadedFunction[],
  names: { readonly nodes: readonly string[]; readonly providers: readonly string[] },
): AuthorizedUser[] {
  const all = [config.seat, ...names.nodes, ...names.providers];
  const bad = all.filter((n) => !USER_NAME.test(n));
  if (bad.length > 0) throw new Error(`a user's name must be one token (A-Z a-z 0-9 - _ / =): ${bad.map((n) => JSON.stringify(n)).join(", ")}`);
  const twice = all.filter((n, i) => all.indexOf(n) !== i);
  if (twice.length > 0) throw new Error(`a user is named twice (the seat, nodes and providers share one namespace): ${[...new Set(twice)].join(", ")}`);
  return [
    { role: "seat", user: config.seat, permissions: seatPermissions(config, functions) },
    ...names.nodes.map((node) => ({ role: "node" as const, user: node, permissions: nodePermissions(node, config, functions) })),
    ...names.providers.map((p) => ({ role: "provider" as const, user: p, permissions: providerPermissions(p, config, functions) })),
  ];
}

const quote = (text: string) => JSON.stringify(text);

/**
 * The users in nats-server's configuration syntax: an `authorization { users = [...] }` block,
 * each user with `password: $<VARIABLE>` (a variable of the conf or the environment, named after
 * the user) for the operator to define, and a comment saying its role.
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
