/**
 * A node's provisioner client (docs/client.md §9.1): it writes its own node's needs, applied
 * records and collection items, hears its rotation notices, and asks the set's verbs.
 */
import { headers, type KV, type MsgHdrs, type NatsConnection } from "nats";
import * as z from "zod/mini";
import { provisionName, token } from "../contract/keys.ts";
import {
  CHECK_REASON,
  checkedEvent,
  checkedSubject,
  DEFAULT_CHECK_REASON,
  MAX_WORD,
  refreshNotice,
  refreshSubject,
  type RefreshNotice,
} from "../contract/events.ts";
import { PRESENCE_EVERY_SECONDS, presenceValue } from "../contract/presence.ts";
import { cutText } from "../contract/text.ts";
import {
  allPages,
  asOperations,
  checked,
  ClientArgumentError,
  collectKey,
  jsonArg,
  listen,
  needOf,
  openMesh,
  tokenArg,
  type Mesh,
  type MeshOptions,
} from "./mesh.ts";

/** A node client's options: the mesh, and the node it writes for. The user defaults to the node's name. */
export interface NodeOptions extends Omit<MeshOptions, "credentials"> {
  readonly node: string;
  readonly credentials: { readonly user?: string; readonly password: string };
  /**
   * How often the node's presence is written (docs/presence.md §16.1), in seconds: 15 unless
   * given; `false` writes none (the node is then silent, and nothing is inferred from it).
   */
  readonly presence?: { readonly everySeconds?: number } | false;
  /**
   * Told of each write the client makes on its own that fails: a presence write, or a result
   * `keepChecking` publishes. Each is tried again at its next tick, and nothing else is said of
   * it; what this throws, or the promise it returns rejects with, is ignored. Not told once
   * `close()` was called, nor of a `keepChecking` stopped.
   */
  readonly onError?: (failure: BackgroundFailure) => void | PromiseLike<void>;
}

/** A write the client made on its own that failed ({@link NodeOptions.onError}). */
export type BackgroundFailure =
  | { readonly what: "presence"; readonly node: string; readonly error: Error }
  | { readonly what: "check"; readonly node: string; readonly module: string; readonly provision: string; readonly error: Error };

/**
 * A module's placeholders: a list of `${<kind>:<rest>}`, or each with what its need's value
 * holds besides the placeholder (a JSON object; `provider`, when given, the module that
 * answers it, one token, docs/state.md §7.4).
 */
export type Placeholders = readonly string[] | Readonly<Record<string, Readonly<Record<string, unknown>>>>;

export type { RefreshNotice } from "../contract/events.ts";

/** What a node client does. Every method checks its arguments before anything is sent and throws a `ClientArgumentError` naming the first bad one. */
export interface NodeClient {
  readonly node: string;
  readonly nc: NatsConnection;
  /**
   * Writes the needs of `module` for `placeholders` (`<node>.<module>.<kind>.<name>` of the
   * needs bucket, docs/rotation.md §8.1), leaving unchanged ones as they are (a rewrite would
   * make the module pending again), and deletes the module's needs it no longer declares,
   * keys out of shape included. Returns the keys written, deleted and left.
   */
  declare(module: string, placeholders: Placeholders): Promise<{ written: string[]; deleted: string[]; unchanged: string[] }>;
  /**
   * Writes the applied record of `module` after a pass (docs/state.md §7.2): `at` now,
   * `revisions` (provision → revision in use), `error` when the pass failed, and any other
   * JSON fields. Returns the record's revision.
   */
  applied(
    module: string,
    record?: { readonly revisions?: Readonly<Record<string, string>>; readonly error?: string; readonly [field: string]: unknown },
  ): Promise<number>;
  /** Puts this node's item of `collection` from `contributor` (`<node>.<collection token>.<contributor>`, docs/buckets.md §2). Returns its revision. */
  contribute(collection: string, contributor: string, item: unknown): Promise<number>;
  /** Deletes this node's item of `collection` from `contributor`. */
  withdraw(collection: string, contributor: string): Promise<void>;
  /** Calls `handler` with each notice on `mesh-provisioner.refresh.<node>` until stopped; a notice out of shape is skipped. */
  onRefresh(handler: (notice: RefreshNotice) => void | Promise<void>): { stop(): void };
  /**
   * Publishes the result of `module`'s check of `provision` on `mesh-provisioner.checked.<node>`
   * (docs/presence.md §16.5) when it differs from the last this client published for them (its
   * `ok`, `reason` or `revision`), `at` now; the first result is always published. Returns
   * whether it published. `reason` is one CamelCase word (`AuthFailed`), `CheckFailed` when a
   * failing result gives none; `message` is sent cut to 1,024 characters, as the set keeps it.
   */
  check(module: string, provision: string, result: CheckResult): Promise<boolean>;
  /**
   * Runs `probe` (connect, log in with the credential held) now and every `everySeconds` (60 by
   * default), each within `timeoutSeconds` (10 by default), and publishes each change of its
   * result with {@link NodeClient.check}: ok when it returns (its `revision`, when it gives one),
   * failing when it throws (the error's `message`, and its `reason` when that is one CamelCase
   * word), times out (`Timeout`), or gives a `revision` that is not a revision's name
   * (`CheckFailed`, saying so). Stops on `stop()` or `close()`, a probe still running then not
   * waited for; throws a `ClientClosed` once the client is closing.
   */
  keepChecking(
    module: string,
    provision: string,
    probe: () => unknown,
    options?: { readonly everySeconds?: number; readonly timeoutSeconds?: number },
  ): { stop(): void };
  /** One page of the verb `mesh-provisioner.provisioning` (docs/verb.md §4); a refusal throws a `MeshRefusal`. */
  ask(request: Readonly<Record<string, unknown>>): Promise<unknown>;
  /** The set's status (docs/failing.md §5.6), narrowed as given. */
  status(narrowing?: { readonly provider?: string; readonly machine?: string; readonly consumer?: string }): Promise<unknown>;
  /**
   * Stops writing presence and deletes the node's presence key: the node is silent from then on,
   * not unreachable (docs/presence.md §16.1). For a node taken out of the mesh on purpose.
   */
  retire(): Promise<void>;
  /**
   * Stops writing presence and checking, waits for the calls under way (a `declare`, a `check`,
   * an `ask`, …) to end as they would have, then drains the connection: the node is unreachable
   * once its limit passes. A call made after it rejects with a `ClientClosed`, nothing sent.
   * Called again, resolves when the first call does.
   */
  close(): Promise<void>;
}

/** A check's result (docs/presence.md §16.5). */
export interface CheckResult {
  readonly ok: boolean;
  readonly reason?: string;
  readonly message?: string;
  /** The revision of the provision checked with. */
  readonly revision?: string;
}

const checkResult = z.pick(checkedEvent, { ok: true, reason: true, message: true, revision: true });
const seconds = (most: number) => z.optional(z.number().check(z.positive("must be a positive number of seconds"), z.maximum(most)));
const checkingOptions = z.optional(z.object({ everySeconds: seconds(86_400), timeoutSeconds: seconds(3600) }));

/** What the client says it is in its presence writes. */
const CLIENT = "mesh-provisioner client";

const record = z.object({
  revisions: z.optional(z.record(provisionName, z.string().check(z.minLength(1, "must name a revision")))),
  error: z.optional(z.string().check(z.minLength(1, "must say what failed"))),
});
const needValue = z.record(z.string(), z.unknown()).check(
  z.refine((v) => v.provider === undefined || token.safeParse(v.provider).success, {
    message: "provider must be one token (a module's name)",
  }),
  z.refine((v) => !Object.hasOwn(v, "placeholder"), {
    message: "placeholder is the need's own field, written from the placeholder given: a value of its own would contradict its key",
  }),
);
const statusNarrowing = z.strictObject({ provider: z.optional(token), machine: z.optional(token), consumer: z.optional(token) });

/** A value's JSON text, or `undefined` when it has none here (nested too deep to be written again). */
function textOf(value: unknown): string | undefined {
  try {
    return JSON.stringify(value);
  } catch {
    return undefined;
  }
}

/** The headers of a KV delete marker, as nats.js's `kv.delete` writes it. */
function deleteHeaders(): MsgHdrs {
  const h = headers();
  h.set("KV-Operation", "DEL");
  return h;
}

/**
 * Connects as node `options.node` (docs/client.md §9.1) and opens its buckets as its
 * permissions allow (bound, direct gets: `<seat>_needs`, `<seat>_applied`, `<seat>_collect`).
 * Throws a `ClientArgumentError` on bad options, and nats.js's error when the server refuses.
 */
export async function connectNode(options: NodeOptions): Promise<NodeClient> {
  if (options === null || typeof options !== "object") throw new ClientArgumentError("options", "must be an object");
  const node = tokenArg("node", options.node);
  const everySeconds =
    options.presence === false
      ? null
      : (checked("presence", z.optional(z.object({ everySeconds: z.optional(presenceValue.shape.everySeconds) })), options.presence)
          ?.everySeconds ?? PRESENCE_EVERY_SECONDS);
  if (options.onError !== undefined && typeof options.onError !== "function")
    throw new ClientArgumentError("onError", "must be a function");
  let closed = false;
  const failed = (failure: BackgroundFailure) => {
    if (closed) return;
    try {
      const told: unknown = options.onError?.(failure);
      if (typeof (told as PromiseLike<void> | undefined)?.then === "function") (told as PromiseLike<void>).then(undefined, () => {});
    } catch {
      // The caller's; the client goes on.
    }
  };
  const mesh: Mesh = await openMesh({
    ...options,
    credentials: { user: options.credentials?.user ?? node, password: options.credentials?.password } as never,
  });
  const js = mesh.nc.jetstream();
  const buckets = new Map<string, Promise<KV>>();
  const kv = (name: string) => {
    let opened = buckets.get(name);
    if (opened === undefined) {
      buckets.set(name, (opened = js.views.kv(mesh.bucket(name), { bindOnly: true, allow_direct: true })));
      // A bucket not there yet is looked for again next time.
      opened.catch(() => buckets.delete(name));
    }
    return opened;
  };
  const moduleArg = (module: unknown) => tokenArg("module", module);
  const presence = writePresence(node, everySeconds, kv, (error) => failed({ what: "presence", node, error }));
  // Written before the client is handed out: a client that closes at once has said the node was there.
  await presence.first;
  /** The last result published per `<module>.<provision>`, as `ok reason revision`. */
  const published = new Map<string, string>();
  const checking = new Set<{ stop(): void }>();
  const check = async (module: string, provision: string, result: CheckResult): Promise<boolean> => {
    moduleArg(module);
    checked("provision", checkedEvent.shape.provision, provision);
    const read = checked("result", checkResult, result);
    const said = [read.ok, read.ok ? "" : (read.reason ?? DEFAULT_CHECK_REASON), read.revision ?? ""].join(" ");
    const id = `${module}.${provision}`;
    const before = published.get(id);
    if (before === said) return false;
    // Cut as the set keeps it: a message too long for one message would never be published.
    const message = read.message === undefined ? {} : { message: cutText(read.message, MAX_WORD) };
    const event = { module, provision, ...read, ...message, at: new Date().toISOString() };
    // Taken as published at once: a call meanwhile with the same result publishes nothing.
    published.set(id, said);
    try {
      await js.publish(checkedSubject(node), JSON.stringify(event));
    } catch (err) {
      // Not known to be published (a timeout may still be stored later): the next call publishes
      // whatever its result, unless another result came meanwhile.
      if (published.get(id) === said) published.delete(id);
      throw err;
    }
    return true;
  };

  const client: NodeClient = {
    node,
    nc: mesh.nc,
    async declare(module, placeholders) {
      moduleArg(module);
      const list: [string, Readonly<Record<string, unknown>>][] = Array.isArray(placeholders)
        ? (placeholders as readonly string[]).map((p) => [p, {}])
        : placeholders !== null && typeof placeholders === "object"
          ? Object.entries(placeholders as Record<string, Readonly<Record<string, unknown>>>)
          : (() => {
              throw new ClientArgumentError("placeholders", "must be a list of placeholders or an object of them");
            })();
      const wanted = new Map<string, string>();
      for (const [placeholder, value] of list) {
        const { kind, name } = needOf(placeholder, "placeholders:");
        checked(`placeholders: ${placeholder}`, needValue, value);
        wanted.set(
          `${node}.${module}.${kind}.${name}`,
          jsonArg(`placeholders: ${placeholder}`, { placeholder, ...value }, mesh.maxPayload()),
        );
      }
      const held = await allPages<{ key: string; value: unknown }>(mesh, { what: "needs", node, module });
      const now = new Map(held.entries.map((e) => [e.key, textOf(e.value)]));
      const needs = await kv("needs");
      const written: string[] = [];
      const unchanged: string[] = [];
      for (const [key, text] of wanted) {
        if (now.get(key) === text) {
          unchanged.push(key);
          continue;
        }
        await needs.put(key, text);
        written.push(key);
      }
      const deleted = [...held.entries.map((e) => e.key), ...(held.outOfShape as { key: string }[]).map((o) => o.key)].filter(
        (key) => !wanted.has(key),
      );
      // Deleted as the server names them: a key out of shape may hold what nats.js's KV refuses in a key (`a:b`, `naïve`).
      for (const key of deleted) await js.publish(`$KV.${mesh.bucket("needs")}.${key}`, undefined, { headers: deleteHeaders() });
      return { written, deleted, unchanged };
    },
    async applied(module, fields = {}) {
      moduleArg(module);
      if (fields === null || typeof fields !== "object" || Array.isArray(fields)) {
        throw new ClientArgumentError("record", "must be an object of the applied record's fields");
      }
      checked("record", record, fields);
      const text = jsonArg("record", { at: new Date().toISOString(), ...fields }, mesh.maxPayload());
      return (await kv("applied")).put(`${node}.${module}`, text);
    },
    async contribute(collection, contributor, item) {
      const key = collectKey(node, collection, contributor);
      return (await kv("collect")).put(key, jsonArg("item", item, mesh.maxPayload()));
    },
    async withdraw(collection, contributor) {
      await (await kv("collect")).delete(collectKey(node, collection, contributor));
    },
    onRefresh: (handler) => {
      mesh.ensureOpen("onRefresh");
      return listen(mesh.nc, refreshSubject(node), refreshNotice, handler);
    },
    check,
    keepChecking(module, provision, probe, options) {
      moduleArg(module);
      checked("provision", checkedEvent.shape.provision, provision);
      if (typeof probe !== "function") throw new ClientArgumentError("probe", "must be a function");
      const { everySeconds = 60, timeoutSeconds = 10 } = checked("options", checkingOptions, options) ?? {};
      mesh.ensureOpen("keepChecking");
      let stopped = false;
      let timer: NodeJS.Timeout | undefined;
      let timeout: NodeJS.Timeout | undefined;
      const once = async () => {
        let result: CheckResult;
        try {
          const gave = await Promise.race([
            Promise.resolve().then(probe),
            new Promise<never>((_, reject) => {
              timeout = setTimeout(() => reject(new ProbeTimeout(timeoutSeconds)), timeoutSeconds * 1000);
            }),
          ]);
          // Whatever it returns is ok; a `revision` it gives must name one.
          const given = typeof gave === "object" && gave !== null ? (gave as { revision?: unknown }).revision : undefined;
          const revision = checkedEvent.shape.revision.safeParse(given);
          result = revision.success
            ? { ok: true, ...(revision.data === undefined ? {} : { revision: revision.data }) }
            : {
                ok: false,
                reason: DEFAULT_CHECK_REASON,
                message: `the probe gave a revision out of shape: ${z.prettifyError(revision.error)}`,
              };
        } catch (err) {
          result = failureOf(err);
        } finally {
          clearTimeout(timeout);
        }
        // A publish that fails is tried again at the next probe: nothing was recorded as published.
        if (!stopped)
          await check(module, provision, result).catch((error: Error) => {
            if (!stopped) failed({ what: "check", node, module, provision, error });
          });
        if (!stopped) timer = setTimeout(() => void once(), everySeconds * 1000);
      };
      const handle = {
        stop: () => {
          stopped = true;
          clearTimeout(timer);
          // A probe still running is not waited for: its result is dropped, and its time limit no longer holds the process.
          clearTimeout(timeout);
          checking.delete(handle);
        },
      };
      checking.add(handle);
      void once();
      return handle;
    },
    ask: (request) => mesh.request("provisioning", request),
    status: async (narrowing = {}) => mesh.request("status", checked("narrowing", statusNarrowing, narrowing)),
    retire: async () => {
      presence.stop();
      await (await kv("presence")).delete(node);
    },
    close: async () => {
      closed = true;
      presence.stop();
      for (const c of [...checking]) c.stop();
      await mesh.close();
    },
  };
  return asOperations(mesh, client, ["declare", "applied", "contribute", "withdraw", "check", "ask", "status", "retire"]);
}

/**
 * The failing result of a probe that threw `err`: reason `Timeout` when it ran out of time, else
 * the error's `reason` when that is one CamelCase word, else `CheckFailed`; the message the
 * error's, or the value thrown as text. Never throws, whatever was thrown.
 */
function failureOf(err: unknown): CheckResult {
  const said = <T>(read: () => T): T | undefined => {
    try {
      return read();
    } catch {
      return undefined;
    }
  };
  if (said(() => err instanceof ProbeTimeout) === true) return { ok: false, reason: "Timeout", message: (err as ProbeTimeout).message };
  const reason = said(() => (err as { reason?: unknown } | null)?.reason);
  const message = said(() => (err instanceof Error ? err.message : String(err)));
  return {
    ok: false,
    reason: typeof reason === "string" && CHECK_REASON.test(reason) ? reason : DEFAULT_CHECK_REASON,
    message: typeof message === "string" ? message : "the probe threw a value that cannot be said as text",
  };
}

/** A probe that did not finish within its time. */
class ProbeTimeout extends Error {
  constructor(seconds: number) {
    super(`the probe did not finish within ${seconds} s`);
  }
}

/**
 * Writes `<node>` of the presence bucket now (`first`) and every `everySeconds`
 * (docs/presence.md §16.1) until stopped; `null` writes none. A write that fails (the connection
 * away, a set without the bucket) is told to `failed` and tried again at the next tick: presence
 * is best effort, its absence is what it says.
 */
function writePresence(
  node: string,
  everySeconds: number | null,
  kv: (name: string) => Promise<KV>,
  failed: (error: Error) => void,
): { stop(): void; first: Promise<void> } {
  if (everySeconds === null) return { stop: () => {}, first: Promise.resolve() };
  const value = JSON.stringify({ everySeconds, client: CLIENT });
  let writing = false;
  const write = async () => {
    if (writing) return;
    writing = true;
    try {
      await (await kv("presence")).put(node, value);
    } catch (err) {
      // Said by its absence too: the node is unreachable once its limit passes.
      failed(err instanceof Error ? err : new Error(String(err)));
    } finally {
      writing = false;
    }
  };
  const first = write();
  const timer = setInterval(() => void write(), everySeconds * 1000);
  return { stop: () => clearInterval(timer), first };
}
