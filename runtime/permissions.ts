/**
 * The least-privilege users of a bus for a function set, derived from what its functions declare
 * and from each trigger kind's needs: the seat's, each node's and each provider's permissions
 * (nats-server 2.9 semantics), and the list of users with them (docs/runtime.md §6.7).
 */
import type { LoadedFunction } from "./define.ts";
import { claimsBucket, recordsBucket, type Config } from "./config.ts";
import { advisorySubject } from "./jetstream.ts";
import { KINDS } from "./triggers/index.ts";
import { targetsOf } from "./triggers/kind.ts";
import { MARKER_KEY } from "./views/index.ts";
import { checkUserNames, inboxOf, type AuthorizedUser, type Permissions } from "./users.ts";

const kvStream = (bucket: string) => `KV_${bucket}`;

/**
 * Publish subjects that read all of a bucket with nats.js 2.x: direct get, and the ordered
 * consumers of keys and watch (created on the unscoped `CONSUMER.CREATE.KV_<b>`, so a reader
 * cannot be narrowed to a key prefix), their deletion and flow control. The seat's alone: a
 * consumer made by another account's request would deliver, in the seat's account, to a subject
 * of the requester's choosing.
 */
function readsBucket(bucket: string): string[] {
  const s = kvStream(bucket);
  return [
    `$JS.API.STREAM.INFO.${s}`,
    `$JS.API.DIRECT.GET.${s}.>`,
    // The get of a bucket with replicas, answered by its leader.
    `$JS.API.STREAM.MSG.GET.${s}`,
    `$JS.API.CONSUMER.CREATE.${s}`,
    `$JS.API.CONSUMER.CREATE.${s}.>`,
    `$JS.API.CONSUMER.DELETE.${s}.>`,
    `$JS.FC.${s}.>`,
  ];
}

/**
 * What another account imports to read all of a bucket: its stream's info (what nats.js's and
 * nats.go's key-value API ask for when opening it) and gets by key or sequence (direct, and from
 * the leader of a replicated stream). No consumer: the whole bucket is read through the verbs.
 */
function getsOf(bucket: string): string[] {
  const s = kvStream(bucket);
  return [`$JS.API.STREAM.INFO.${s}`, `$JS.API.DIRECT.GET.${s}`, `$JS.API.DIRECT.GET.${s}.>`, `$JS.API.STREAM.MSG.GET.${s}`];
}

const unique = (subjects: readonly string[]) => [...new Set(subjects)];

/** The request/reply subjects of a function set, from every kind that has some: what nodes and providers may ask. */
export function verbSubjects(functions: readonly LoadedFunction[]): string[] {
  return unique(KINDS.flatMap((kind) => kind.asked?.(targetsOf(functions, kind)) ?? []));
}

/**
 * Exactly what the seat's user needs to run `functions` (docs/runtime.md §6.7): assert every
 * bucket of the config and the runtime's own; read the buckets functions read or write; write
 * (`$KV.<b>.>`) only seat-written buckets functions write, and the runtime's; get by sequence the
 * streams functions read (`access.streams`); publish what
 * functions declare in `access.publishes`; what each trigger kind needs for its triggers (the
 * verbs and the NATS service's discovery subjects, the streams and durable consumers of events);
 * reply on `_INBOX.>`; receive replies on `_INBOX.<seat>.>`. Never `$JS.API.>` or `$JS.>`, and
 * of a node-written bucket no `$KV` subject but its live view's marker (`$KV.<b>._freshness`, a
 * delete marker of a key of no bucket's shape: docs/verb.md §4.6).
 */
export function seatPermissions(config: Config, functions: readonly LoadedFunction[]): Permissions {
  const runtime = recordsBucket(config.seat);
  const claims = claimsBucket(config.seat);
  const bucketOf = (name: string) => config.buckets[name]!.bucket;
  const viewed = unique(functions.flatMap(({ definition: { access } }) => access?.views ?? []));
  const read = functions.flatMap(({ definition: { access } }) => [
    ...(access?.reads ?? []),
    ...(access?.writes ?? []),
    ...(access?.views ?? []),
  ]);
  const written = functions.flatMap((fn) => fn.definition.access?.writes ?? []).filter((b) => config.buckets[b]?.writtenBy === "seat");
  const kinds = KINDS.map((kind) => kind.seatGrants?.(targetsOf(functions, kind), config) ?? { publish: [], subscribe: [] });
  return {
    publish: {
      allow: unique([
        "$JS.API.INFO",
        ...[...Object.values(config.buckets).map((b) => b.bucket), runtime, claims].flatMap((b) => [
          `$JS.API.STREAM.INFO.${kvStream(b)}`,
          `$JS.API.STREAM.CREATE.${kvStream(b)}`,
        ]),
        ...[...read.map(bucketOf), runtime, claims].flatMap((b) => readsBucket(b)),
        // A live view (of a viewed bucket, and of the runtime's records) asks for the first message
        // after the last it applied (any subject), with the stream API's get where the stream
        // does not allow direct gets.
        ...[...viewed.map(bucketOf), runtime].flatMap((b) => [
          `$JS.API.DIRECT.GET.${kvStream(b)}`,
          `$JS.API.STREAM.MSG.GET.${kvStream(b)}`,
        ]),
        ...[...written.map(bucketOf), runtime, claims].map((b) => `$KV.${b}.>`),
        // And writes its marker when short of a replicated stream (docs/verb.md §4.6): in a bucket
        // the seat does not write otherwise, that one key alone.
        ...viewed.filter((b) => config.buckets[b]?.writtenBy !== "seat").map((b) => `$KV.${bucketOf(b)}.${MARKER_KEY}`),
        // A stream of `access.streams`: its info and its leader's get by sequence, no consumer.
        ...unique(functions.flatMap(({ definition: { access } }) => access?.streams ?? [])).flatMap((name) => [
          `$JS.API.STREAM.INFO.${config.streams[name]!.stream}`,
          `$JS.API.STREAM.MSG.GET.${config.streams[name]!.stream}`,
        ]),
        ...kinds.flatMap((k) => k.publish),
        ...functions.flatMap((fn) => fn.definition.access?.publishes ?? []),
        // Replies to its verbs' requesters (the runtime answers no other reply subject): inboxes of
        // its own account, and `_R_.` subjects, the server's mapping of a reply through another
        // account's import. Not `allow_responses`, with which nats-server 2.9 tracks the reply
        // subject of every JetStream message it delivers: reads of a large bucket then go ten
        // times slower.
        "_INBOX.>",
        "_R_.>",
      ]),
    },
    subscribe: {
      allow: unique([
        `${inboxOf(config.seat)}.>`,
        // The server's advisories of its buckets' streams made and deleted (docs/operations.md §13.4).
        ...[...Object.values(config.buckets).map((b) => b.bucket), runtime, claims].flatMap((b) => [
          advisorySubject("created", b),
          advisorySubject("deleted", b),
        ]),
        ...kinds.flatMap((k) => k.subscribe),
      ]),
    },
  };
}

/**
 * A node client's permissions, in its own account (docs/buckets.md §2, docs/runtime.md §6.7):
 * write its own keys of the node-written buckets (`<node>.>`, or its key `<node>` alone where the
 * bucket's `nodeKeys` is `own`), get them back, and open those
 * buckets (their stream's info); publish the config's `nodes.publish` subjects for itself
 * (`{node}` replaced by its name); get keys of the buckets read by nodes (the registry); ask the
 * seat's verbs; receive replies on its own `_INBOX.<node>.>`. Every subject it publishes is one
 * its account imports from the seat's: it cannot touch another node's keys, write a seat bucket,
 * or make a consumer.
 */
export function nodePermissions(node: string, config: Config, functions: readonly LoadedFunction[]): Permissions {
  const own = Object.values(config.buckets).filter((b) => b.writtenBy === "nodes");
  return {
    publish: {
      allow: unique([
        "$JS.API.INFO",
        ...config.nodes.publish.map((subject) => subject.replaceAll("{node}", node)),
        ...own.flatMap(({ bucket, nodeKeys }) => {
          const key = nodeKeys === "own" ? node : `${node}.>`;
          return [
            `$KV.${bucket}.${key}`,
            `$JS.API.DIRECT.GET.${kvStream(bucket)}.$KV.${bucket}.${key}`,
            `$JS.API.STREAM.INFO.${kvStream(bucket)}`,
          ];
        }),
        ...Object.values(config.buckets)
          .filter((b) => b.readBy.includes("nodes"))
          .flatMap(({ bucket }) => getsOf(bucket)),
        ...verbSubjects(functions),
      ]),
    },
    subscribe: { allow: [`${inboxOf(node)}.>`, ...receivedBy(config.nodes.receive, "{node}", node)] },
  };
}

/** The subjects the seat publishes to one node or provider: `subjects` with `{node}` or `{provider}` replaced by its name. */
const receivedBy = (subjects: readonly string[], placeholder: string, user: string) => subjects.map((s) => s.replaceAll(placeholder, user));

/**
 * A provider's permissions, in its own account (docs/mesh.md §1, docs/failing.md §5): publish
 * the config's `providers.publish` subjects for itself (`{provider}` replaced by its name), get
 * keys of the buckets read by providers (the needs) without writing them, ask the seat's verbs,
 * receive replies on its own `_INBOX.<provider>.>` (a JetStream publish's acknowledgement among
 * them). Every subject it publishes is one its account imports from the seat's.
 */
export function providerPermissions(provider: string, config: Config, functions: readonly LoadedFunction[]): Permissions {
  return {
    publish: {
      allow: unique([
        "$JS.API.INFO",
        ...config.providers.publish.map((subject) => subject.replaceAll("{provider}", provider)),
        ...Object.values(config.buckets)
          .filter((b) => b.readBy.includes("providers"))
          .flatMap(({ bucket }) => getsOf(bucket)),
        ...verbSubjects(functions),
      ]),
    },
    subscribe: { allow: [`${inboxOf(provider)}.>`, ...receivedBy(config.providers.receive, "{provider}", provider)] },
  };
}

/**
 * The controller's permissions, in its own account (docs/buckets.md §2): write every key of the
 * controller-written buckets (its assignments mirror) and read them back, open them (their
 * stream's info), ask the seat's verbs, receive replies on its own `_INBOX.<controller>.>`.
 * Nothing of the other buckets; every subject it publishes is one its account imports from the seat's.
 */
export function controllerPermissions(controller: string, config: Config, functions: readonly LoadedFunction[]): Permissions {
  return {
    publish: {
      allow: unique([
        "$JS.API.INFO",
        ...Object.values(config.buckets)
          .filter((b) => b.writtenBy === "controller")
          .flatMap(({ bucket }) => [`$KV.${bucket}.>`, ...getsOf(bucket)]),
        ...verbSubjects(functions),
      ]),
    },
    subscribe: { allow: [`${inboxOf(controller)}.>`] },
  };
}

/** A node's, provider's or controller's user: its account imports from the seat's every subject it may publish. */
const imported = (
  role: "node" | "provider" | "controller",
  user: string,
  permissions: Permissions,
  receives: readonly string[] = [],
): AuthorizedUser => ({
  role,
  user,
  permissions,
  imports: permissions.publish.allow,
  ...(receives.length > 0 ? { receives } : {}),
});

/**
 * The users of a bus for the function set: the seat, each node and each provider named, with
 * their permissions. Throws when a name is not one token or names two users ({@link checkUserNames}).
 */
export function authorization(
  config: Config,
  functions: readonly LoadedFunction[],
  names: { readonly nodes: readonly string[]; readonly providers: readonly string[]; readonly controllers?: readonly string[] },
): AuthorizedUser[] {
  const controllers = names.controllers ?? [];
  checkUserNames([config.seat, ...names.nodes, ...names.providers, ...controllers]);
  return [
    { role: "seat", user: config.seat, permissions: seatPermissions(config, functions) },
    ...names.nodes.map((node) =>
      imported("node", node, nodePermissions(node, config, functions), receivedBy(config.nodes.receive, "{node}", node)),
    ),
    ...names.providers.map((p) =>
      imported("provider", p, providerPermissions(p, config, functions), receivedBy(config.providers.receive, "{provider}", p)),
    ),
    ...controllers.map((c) => imported("controller", c, controllerPermissions(c, config, functions))),
  ];
}
