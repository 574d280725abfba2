/**
 * What node and provider clients share (docs/client.md §9): the connection as the permissions
 * require it, arguments checked before anything is sent, and asking the set's verbs.
 */
import { readFileSync } from "node:fs";
import { connect, ErrorCode, type NatsConnection } from "nats";
import * as z from "zod/mini";
import { en } from "zod/locales";
import { collectionName, encodeCollection, token } from "../contract/keys.ts";

// zod/mini names no issue in words until given a locale: the client's errors read as the set's do.
z.config(en());

/**
 * A connection's name, as the server shows it: its CONNECT line carries it, and the server
 * refuses one past its 4 KiB control line.
 */
const connectionName = z.string().check(z.minLength(1, "must not be empty"), z.maxLength(256, "must be at most 256 characters"));

/**
 * How much of `max_payload` a value written to a key leaves for its key, its fields and the
 * verb's reply around it (docs/verb.md §4.4), in bytes: 16 KiB, or a quarter of a smaller one.
 */
const valueHeadroom = (maxPayload: number) => Math.min(16 * 1024, Math.floor(maxPayload / 4));

/**
 * `value` as the JSON text written for `argument`, or a {@link ClientArgumentError} naming it:
 * no JSON value (a BigInt, a cycle, a function), or too large for the verb to answer it in one
 * reply (`maxPayload` less {@link valueHeadroom}).
 */
export function jsonArg(argument: string, value: unknown, maxPayload: number): string {
  let text: string | undefined;
  try {
    text = JSON.stringify(value);
  } catch (err) {
    throw new ClientArgumentError(argument, `must be a JSON value: ${(err as Error).message}`);
  }
  if (text === undefined) throw new ClientArgumentError(argument, "must be a JSON value");
  const bytes = Buffer.byteLength(text);
  const most = maxPayload - valueHeadroom(maxPayload);
  if (bytes > most) {
    throw new ClientArgumentError(
      argument,
      `is ${bytes} bytes as JSON: at most ${most} fit in one of the verb's replies (max_payload ${maxPayload})`,
    );
  }
  return text;
}

/** Where the mesh is and who connects. */
export interface MeshOptions {
  /** NATS server URLs (`nats://host:port`), one or several. */
  readonly servers: string | readonly string[];
  /** The user's name and password on the mesh's server (`mesh-provisioner permissions --credentials` writes them). */
  readonly credentials: Credentials;
  /** The seat whose buckets and verbs are used: `mesh-provisioner` unless the set runs under another. */
  readonly seat?: string;
  /** The connection's name, as the server's monitoring shows it. */
  readonly name?: string;
}

/** A user's name and password. */
export interface Credentials {
  readonly user: string;
  readonly password: string;
}

/** An argument of the client refused before anything was sent: `argument` names it. */
export class ClientArgumentError extends TypeError {
  constructor(
    readonly argument: string,
    reason: string,
    options?: ErrorOptions,
  ) {
    super(`${argument} ${reason}`, options);
    this.name = "ClientArgumentError";
  }
}

/** A request the set refused (docs/verb.md §4.3): `code` is the HTTP-like status of the service error. */
export class MeshRefusal extends Error {
  constructor(
    readonly code: number,
    message: string,
  ) {
    super(message);
    this.name = "MeshRefusal";
  }
}

/**
 * A request to a verb of the set that got no answer (docs/client.md §9): nobody serves the
 * subject (`code` `503`, when the server can tell) or no answer came within the time (`code`
 * `TIMEOUT`): the set is not running, not reachable from this server, or too busy. `subject` is
 * the verb's subject; `cause` nats.js's error.
 */
export class MeshUnanswered extends Error {
  constructor(
    readonly subject: string,
    readonly code: string,
    timeoutMs: number,
    cause: unknown,
  ) {
    super(
      code === ErrorCode.NoResponders
        ? `nobody answers ${subject}: the function set is not running`
        : `no answer on ${subject} within ${timeoutMs / 1000} s: the function set is not running, not reachable from this server, or too busy`,
      { cause },
    );
    this.name = "MeshUnanswered";
  }
}

/**
 * An operation of a client called once its `close()` was (docs/client.md §9): nothing was sent.
 * `operation` names it (`declare`, `rotated`, …).
 */
export class ClientClosed extends Error {
  constructor(readonly operation: string) {
    super(`${operation}: the client is closed, nothing was sent`);
    this.name = "ClientClosed";
  }
}

/**
 * `client` with each of its methods `names` run as one operation of `mesh` ({@link Mesh.operation}):
 * refused with a {@link ClientClosed} once `mesh` is closing, waited for by its `close()`.
 */
export function asOperations<C extends object>(mesh: Mesh, client: C, names: readonly (keyof C & string)[]): C {
  const wrapped: Record<string, unknown> = { ...(client as Record<string, unknown>) };
  for (const name of names) {
    const method = client[name] as (...args: unknown[]) => Promise<unknown>;
    wrapped[name] = (...args: unknown[]) => mesh.operation(name, () => method(...args));
  }
  return wrapped as C;
}

/** `value` as `schema` reads it, or a {@link ClientArgumentError} naming `argument` and the first issue. */
export function checked<T>(argument: string, schema: z.ZodMiniType<T>, value: unknown): T {
  const result = schema.safeParse(value);
  if (result.success) return result.data;
  const issue = result.error.issues[0]!;
  const path = issue.path.join(".");
  throw new ClientArgumentError(argument === "" ? path : path === "" ? argument : `${argument}.${path}`, issue.message);
}

/** A token argument (docs/buckets.md §2): a node, module, provider, machine, consumer, kind or provision name. */
export const tokenArg = (argument: string, value: unknown) => checked(argument, token, value);
/** A collection name argument (docs/buckets.md §2). */
export const collectionArg = (argument: string, value: unknown) => checked(argument, collectionName, value);

const credentials = z.object({ user: token, password: z.string().check(z.minLength(1, "must not be empty")) });

/**
 * The placeholder `${<kind>:<rest>}` as its need (docs/rotation.md §8.1): kind and name, the
 * name being `<rest>` with every `:` written `/` (`${bound:postgres:address}` → `bound`,
 * `postgres/address`). Throws a {@link ClientArgumentError} when it is not a placeholder or its
 * kind or name is not one token.
 */
export function needOf(placeholder: string, argument = "placeholder"): { kind: string; name: string } {
  const match = typeof placeholder === "string" ? /^\$\{([^:}]*):([^}]*)\}$/.exec(placeholder) : null;
  if (match === null)
    throw new ClientArgumentError(argument, `must be a placeholder \${<kind>:<name>}, not ${JSON.stringify(placeholder)}`);
  const kind = tokenArg(`${argument} ${placeholder}: its kind`, match[1]);
  const name = tokenArg(`${argument} ${placeholder}: its name`, match[2]!.replaceAll(":", "/"));
  return { kind, name };
}

/** The needs key of `placeholder` for `module` on `node` (docs/buckets.md §2, docs/rotation.md §8.1): `<node>.<module>.<kind>.<name>`. Throws a {@link ClientArgumentError} naming a bad argument. */
export function needKey(node: string, module: string, placeholder: string): string {
  const { kind, name } = needOf(placeholder);
  return `${tokenArg("node", node)}.${tokenArg("module", module)}.${kind}.${name}`;
}

/** The collect key of `contributor`'s item of `collection` on `node` (docs/buckets.md §2): the collection name encoded. Throws a {@link ClientArgumentError} naming a bad argument. */
export const collectKey = (node: string, collection: string, contributor: string): string =>
  `${tokenArg("node", node)}.${encodeCollection(collectionArg("collection", collection))}.${tokenArg("contributor", contributor)}`;

/**
 * The credentials of `user` in a users file in the shape `mesh-provisioner` writes
 * (`.state/users.json`, `permissions --credentials`): `{ "<user>": "<password>", … }`. Throws
 * naming the file and the user when either is missing.
 */
export function usersFile(file: string, user: string): Credentials {
  let users: unknown;
  try {
    users = JSON.parse(readFileSync(file, "utf8"));
  } catch (err) {
    throw new ClientArgumentError("users file", `${file} cannot be read as JSON: ${(err as Error).message}`, { cause: err });
  }
  const password = (users as Record<string, unknown> | null)?.[user];
  if (typeof password !== "string") throw new ClientArgumentError("user", `${JSON.stringify(user)} is not in ${file}`);
  return { user, password };
}

/** The opened connection of a client, its seat and its bucket names. */
export interface Mesh {
  readonly nc: NatsConnection;
  readonly seat: string;
  /** The stream-backed bucket `<seat>_<name>`. */
  bucket(name: string): string;
  /** The server's `max_payload`, in bytes. */
  maxPayload(): number;
  /** One request to a verb of the seat (`<seat>.<verb>`): its JSON answer; a {@link MeshRefusal}, or a {@link MeshUnanswered}. */
  request(verb: string, body: unknown, timeoutMs?: number): Promise<unknown>;
  /**
   * Runs `work`, one operation of the client named `operation`, counted as under way until it
   * settles; once {@link Mesh.close} was called, rejects with a {@link ClientClosed} instead,
   * `work` not called.
   */
  operation<T>(operation: string, work: () => Promise<T>): Promise<T>;
  /** Throws a {@link ClientClosed} naming `operation` once {@link Mesh.close} was called: for what starts listening. */
  ensureOpen(operation: string): void;
  /**
   * Waits for the operations under way ({@link Mesh.operation}) to settle, each within its own
   * time, then drains the connection, closing it after {@link DRAIN_MS} when the server does not
   * answer the drain (away, or paused); once: a second call, or one after the connection closed,
   * gets the same promise.
   */
  close(): Promise<void>;
}

const decoder = new TextDecoder();

/** How long `close()` waits for the connection to drain before it closes it, in milliseconds. */
const DRAIN_MS = 5000;

/**
 * Connects as `options.credentials.user`, with replies on that user's own `_INBOX.<user>`
 * (the only inbox its permissions let it read, docs/runtime.md §6.7). Throws a
 * {@link ClientArgumentError} on bad options before connecting, and nats.js's error when the
 * server refuses.
 */
export async function openMesh(options: MeshOptions): Promise<Mesh> {
  const given: unknown = options.servers;
  const servers: unknown[] = typeof given === "string" ? [given] : Array.isArray(given) ? [...given] : [];
  if (servers.length === 0 || servers.some((s) => typeof s !== "string" || s === "")) {
    throw new ClientArgumentError("servers", "must be one NATS URL or more");
  }
  for (const s of servers as string[]) {
    // As nats.js reads one: a URL, or host:port with no scheme.
    if (!URL.canParse(s.includes("://") ? s : `nats://${s}`)) throw new ClientArgumentError("servers", `${JSON.stringify(s)} is no URL`);
  }
  if (options.name !== undefined) checked("name", connectionName, options.name);
  const { user, password } = checked("credentials", credentials, options.credentials);
  const seat = tokenArg("seat", options.seat ?? "mesh-provisioner");
  const nc = await connect({
    servers: servers as string[],
    user,
    pass: password,
    inboxPrefix: `_INBOX.${user}`,
    name: options.name ?? `${user} (mesh-provisioner client)`,
    maxReconnectAttempts: -1,
    timeout: 5000,
  });
  let closing: Promise<void> | undefined;
  const underWay = new Set<Promise<unknown>>();
  return {
    nc,
    seat,
    bucket: (name) => `${seat}_${name}`,
    maxPayload: () => nc.info?.max_payload ?? 1024 * 1024,
    async request(verb, body, timeoutMs = 10_000) {
      const subject = `${seat}.${verb}`;
      const reply = await nc.request(subject, JSON.stringify(body), { timeout: timeoutMs }).catch((err: unknown) => {
        const code = (err as { code?: unknown }).code;
        throw code === ErrorCode.Timeout || code === ErrorCode.NoResponders ? new MeshUnanswered(subject, code, timeoutMs, err) : err;
      });
      const code = reply.headers?.get("Nats-Service-Error-Code");
      const text = decoder.decode(reply.data);
      if (code) {
        const said = (JSON.parse(text || "{}") as { error?: { message?: string } }).error?.message;
        throw new MeshRefusal(Number(code), said ?? reply.headers?.get("Nats-Service-Error") ?? `refused with ${code}`);
      }
      return JSON.parse(text);
    },
    ensureOpen(operation) {
      if (closing !== undefined || nc.isClosed()) throw new ClientClosed(operation);
    },
    operation<T>(operation: string, work: () => Promise<T>): Promise<T> {
      if (closing !== undefined || nc.isClosed()) return Promise.reject(new ClientClosed(operation));
      let running: Promise<T>;
      try {
        running = work();
      } catch (err) {
        return Promise.reject(err);
      }
      underWay.add(running);
      const settled = () => underWay.delete(running);
      running.then(settled, settled);
      return running;
    },
    close: () =>
      (closing ??= (async () => {
        // A declare or a publish under way ends as it would have: its writes are not cut off halfway.
        await Promise.allSettled(underWay);
        if (nc.isClosed()) return;
        // A server away or paused answers no drain's flush (and nats.js then never closes): closed all the same.
        let timer: NodeJS.Timeout | undefined;
        await Promise.race([nc.drain().catch(() => {}), new Promise((resolve) => (timer = setTimeout(resolve, DRAIN_MS)))]);
        clearTimeout(timer);
        if (!nc.isClosed()) await nc.close();
      })()),
  };
}

/**
 * Calls `handler` with each message on `subject` that `schema` reads (JSON; others are
 * skipped) until stopped; what it throws, or the promise it returns rejects with, is ignored.
 * Throws a {@link ClientArgumentError} when `handler` is not a function.
 */
export function listen<T>(
  nc: NatsConnection,
  subject: string,
  schema: z.ZodMiniType<T>,
  handler: (value: T) => void | Promise<void>,
): { stop(): void } {
  if (typeof handler !== "function") throw new ClientArgumentError("handler", "must be a function");
  const sub = nc.subscribe(subject, {
    callback: (err, msg) => {
      if (err) return;
      let read: unknown;
      try {
        read = msg.json();
      } catch {
        return;
      }
      const parsed = schema.safeParse(read);
      // What the handler throws, at once or later, is its own: it never reaches nats.js's reader.
      if (parsed.success)
        void Promise.resolve(parsed.data)
          .then(handler)
          .catch(() => {});
    },
  });
  return { stop: () => sub.unsubscribe() };
}

/** Every entry of a verb's answer across its pages (docs/verb.md §4.5), each page asked after the last. */
export async function allPages<E>(mesh: Mesh, request: Record<string, unknown>): Promise<{ entries: E[]; outOfShape: unknown[] }> {
  const entries: E[] = [];
  const outOfShape: unknown[] = [];
  let cursor: string | undefined;
  do {
    const page = (await mesh.request("provisioning", { ...request, ...(cursor === undefined ? {} : { cursor }) })) as {
      entries: E[];
      outOfShape: unknown[];
      next?: string;
    };
    entries.push(...page.entries);
    outOfShape.push(...page.outOfShape);
    cursor = page.next;
  } while (cursor !== undefined);
  return { entries, outOfShape };
}
