/**
 * Who `mesh-provisioner permissions` prints (docs/runtime.md §6.7): the names of nodes, providers
 * and controllers from options, files and the assignments mirror, checked; and what `--conf`
 * needs besides: the listen address, the store folder, bcrypt hashes.
 */
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { resolve } from "node:path";
import type { NatsConnection } from "nats";
import { z } from "zod";
import { decodeKey } from "../contract/keys.ts";
import { openSession, userName, type Config } from "../runtime/index.ts";

/**
 * The bcrypt cost of the hashes `permissions --conf` prints: nats-server checks a client's
 * password against its hash at every connect, about 75 ms a connect at cost 10 (nats-server
 * 2.9.10, one core of the test machine); hashing one here takes about as long.
 */
export const BCRYPT_COST = 10;

/** The mesh's controller (docs/mesh.md §1): the user `permissions` prints when no `--controller` is given. */
export const CONTROLLER = "mesh-controller";

/** The options of `mesh-provisioner permissions` that name its users. */
export interface NameOptions {
  readonly node?: readonly string[];
  readonly nodesFile?: string;
  readonly fromAssignments?: boolean;
  readonly provider?: readonly string[];
  readonly providersFile?: string;
  readonly controller?: readonly string[];
  readonly demo?: boolean;
}

/** The users `permissions` prints besides the seat, each list in the order first named, once. */
export interface Names {
  readonly nodes: string[];
  readonly providers: string[];
  readonly controllers: string[];
}

/** `name` as a user's name ({@link userName}); throws naming where it came from and the name. */
function checked(name: string, from: string): string {
  const parsed = userName.safeParse(name);
  if (!parsed.success) throw new Error(`${from} ${JSON.stringify(name)}: ${parsed.error.issues[0]!.message}`);
  return parsed.data;
}

/**
 * The names of a file of names: one a line, white space around it and blank lines left out, a
 * line starting with `#` a comment. Throws naming the option, the file and the line of a bad name.
 */
export function namesInFile(file: string, option: string): string[] {
  let text: string;
  try {
    text = readFileSync(file, "utf8");
  } catch (err) {
    throw new Error(`${option} ${file}: ${(err as Error).message}`, { cause: err });
  }
  return text.split("\n").flatMap((line, i) => {
    const name = line.trim();
    return name === "" || name.startsWith("#") ? [] : [checked(name, `${option} ${file} line ${i + 1}:`)];
  });
}

/**
 * The nodes the controller's assignments mirror names: the first token of each key
 * `<node>.<module>` of `bucket` (docs/buckets.md §2), deleted keys left out, in key order. A key
 * out of shape is returned with its reason, not a node. Lists the keys with an ordered consumer
 * (the seat's right, docs/runtime.md §6.7); throws naming the bucket when it cannot be read.
 */
export async function nodesOfAssignments(
  nc: NatsConnection,
  bucket: string,
): Promise<{ nodes: string[]; outOfShape: { key: string; reason: string }[] }> {
  const keys: string[] = [];
  try {
    const kv = await nc.jetstream().views.kv(bucket, { bindOnly: true });
    for await (const key of await kv.keys()) keys.push(key);
  } catch (err) {
    throw new Error(`--from-assignments: the bucket ${bucket} could not be read: ${(err as Error).message}`, { cause: err });
  }
  const nodes = new Set<string>();
  const outOfShape: { key: string; reason: string }[] = [];
  for (const key of keys.sort()) {
    const decoded = decodeKey("assignments", key);
    if (decoded.ok) nodes.add(decoded.fields.node);
    else outOfShape.push({ key, reason: decoded.reason });
  }
  return { nodes: [...nodes], outOfShape };
}

const once = (names: readonly string[]) => [...new Set(names)];

/**
 * The users named by `options` (docs/runtime.md §6.7): nodes from `--node`, `--nodes-file` and
 * `--from-assignments` (the assignments mirror read over the configured connection, or the
 * embedded server's), providers from `--provider` and `--providers-file`, controllers from
 * `--controller` (else {@link CONTROLLER}); `--demo` adds the config's `embedded` users. Throws
 * when no node is named, naming the options, and on a bad name, naming it. Keys of the
 * assignments mirror out of shape are passed to `warn`.
 */
export async function namesOf(config: Config, options: NameOptions, warn: (line: string) => void): Promise<Names> {
  const demo = options.demo ? config.embedded : { nodes: [], providers: [], controllers: [] };
  const nodes = [
    ...demo.nodes,
    ...(options.node ?? []).map((n) => checked(n, "--node")),
    ...(options.nodesFile === undefined ? [] : namesInFile(options.nodesFile, "--nodes-file")),
  ];
  if (options.fromAssignments) {
    const bucket = config.buckets.assignments?.bucket;
    if (bucket === undefined) throw new Error("--from-assignments: the config has no bucket `assignments` (the controller's mirror)");
    const session = await openSession(config, { embedded: "join", name: "mesh-provisioner permissions" }).catch((err: Error) => {
      throw new Error(`--from-assignments: ${err.message}`, { cause: err });
    });
    try {
      const mirror = await nodesOfAssignments(session.nc, bucket);
      for (const { key, reason } of mirror.outOfShape) warn(`${bucket}: key ${JSON.stringify(key)} left out, out of shape: ${reason}`);
      nodes.push(...mirror.nodes);
    } finally {
      await session.close();
    }
  }
  if (nodes.length === 0) {
    throw new Error(
      "no nodes given: name them with --node <name> (repeatable), --nodes-file <file> (one a line) or --from-assignments " +
        "(the controller's assignments mirror); --demo prints the embedded demo's users",
    );
  }
  const providers = [
    ...demo.providers,
    ...(options.provider ?? []).map((p) => checked(p, "--provider")),
    ...(options.providersFile === undefined ? [] : namesInFile(options.providersFile, "--providers-file")),
  ];
  const controllers = [
    ...demo.controllers,
    ...(options.controller ?? (options.demo ? [] : [CONTROLLER])).map((c) => checked(c, "--controller")),
  ];
  return { nodes: once(nodes), providers: once(providers), controllers: once(controllers) };
}

/** `host:port` for nats-server's `listen`: a host name, an IPv4 address or a `[v6]` address, and a port 1 to 65535. */
export const listenAddress = z
  .string()
  .regex(/^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):\d{1,5}$/, "must be host:port, e.g. 127.0.0.1:4222 or [::1]:4222")
  .refine((text) => {
    const port = Number(text.slice(text.lastIndexOf(":") + 1));
    return port >= 1 && port <= 65535;
  }, "its port must be 1 to 65535");

/** `--listen`'s value, checked ({@link listenAddress}); throws naming the option and the value. */
export function parseListen(text: string): string {
  const parsed = listenAddress.safeParse(text);
  if (!parsed.success) throw new Error(`--listen ${JSON.stringify(text)}: ${parsed.error.issues[0]!.message}`);
  return parsed.data;
}

/** A `--store-dir` as nats-server's `store_dir`: resolved against the working folder, so the server's own does not matter. */
export const storeDirOf = (text: string): string => {
  if (text.trim() === "") throw new Error("--store-dir: must be a folder, not empty");
  return resolve(text);
};

/**
 * A password's bcrypt hash at {@link BCRYPT_COST} (`$2b$10$…`), as nats-server checks it.
 * bcryptjs is loaded at the first hash, so the commands that print none never load it.
 */
export const bcryptHash = (password: string): string =>
  (createRequire(import.meta.url)("bcryptjs") as typeof import("bcryptjs")).hashSync(password, BCRYPT_COST);
