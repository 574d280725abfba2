import { randomBytes } from "node:crypto";
import { existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import type { BucketConfig } from "./config.ts";
import { spawnNatsServer, type RunningNatsServer } from "./nats-server.ts";

/** A user of the embedded server. */
export interface Credentials {
  readonly user: string;
  readonly password: string;
}

export interface EmbeddedOptions {
  /** The state folder: holds the store (`jetstream/`), `users.json`, the server's conf and pid. */
  readonly stateDir: string;
  /** The seat's user name. */
  readonly seat: string;
  /** Buckets of the config by name: `writtenBy: "nodes"` ones are written by node users only. */
  readonly buckets: Readonly<Record<string, BucketConfig>>;
  /** One user per node, writing only its own `<node>.>` keys of node-written buckets. */
  readonly nodes: readonly string[];
  /** Provider users, what they publish (`{user}`: the provider) and which buckets they read. */
  readonly providers?: ProviderUsers;
  /** The server's `max_payload` in bytes (nats-server's default is 1 MiB). */
  readonly maxPayload?: number;
}

/** Provider users of the embedded server (config `embedded.providers`). */
export interface ProviderUsers {
  readonly users: readonly string[];
  readonly publish: readonly string[];
  /** Buckets by their config name. */
  readonly reads: readonly string[];
}

/** The embedded server, with the credentials of its users. */
export interface EmbeddedServer extends RunningNatsServer {
  readonly seat: Credentials;
  /** Node and provider users by name. */
  readonly users: Readonly<Record<string, Credentials>>;
}

interface Marker {
  readonly url: string;
  readonly pid: number;
  readonly owner: number;
}

/** Whether a process of that pid exists (and may be signalled by this one). */
export const alive = (pid: number): boolean => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};

const isNatsServer = (pid: number) => {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, "utf8").includes("nats-server");
  } catch {
    return false;
  }
};

/**
 * The seat's permissions on the embedded server: anything but writing the node-written buckets
 * (their `$KV` subjects and the stream calls that would edit them). The exact least-privilege
 * set derived from the functions' declarations replaces this later.
 */
export function seatPermissions(buckets: readonly BucketConfig[]) {
  const deny = buckets
    .filter((b) => b.writtenBy === "nodes")
    .flatMap(({ bucket }) => [
      `$KV.${bucket}.>`,
      ...["PURGE", "DELETE", "MSG.DELETE", "UPDATE"].map((op) => `$JS.API.STREAM.${op}.KV_${bucket}`),
    ]);
  return { publish: { allow: [">"], deny }, subscribe: { allow: [">"] } };
}

/** Publish subjects that read a bucket: info, direct get, and the ordered consumers of keys and watch. */
const readSubjects = (bucket: string) => {
  const s = `KV_${bucket}`;
  return [
    `$JS.API.STREAM.INFO.${s}`,
    `$JS.API.DIRECT.GET.${s}.>`,
    `$JS.API.CONSUMER.CREATE.${s}`,
    `$JS.API.CONSUMER.CREATE.${s}.>`,
    `$JS.API.CONSUMER.DELETE.${s}.>`,
    `$JS.FC.${s}.>`,
  ];
};

/**
 * A node's permissions (SPEC §2): write its own `<node>.>` keys of the node-written buckets,
 * read the seat-written buckets, ask the seat's verbs (`<seat>.>`), and receive replies.
 */
export function nodePermissions(node: string, seat: string, buckets: readonly BucketConfig[]) {
  const written = buckets.filter((b) => b.writtenBy === "nodes");
  return {
    publish: {
      allow: [
        "$JS.API.INFO",
        ...written.map(({ bucket }) => `$JS.API.STREAM.INFO.KV_${bucket}`),
        ...written.map(({ bucket }) => `$KV.${bucket}.${node}.>`),
        ...buckets.filter((b) => b.writtenBy === "seat").flatMap(({ bucket }) => readSubjects(bucket)),
        `${seat}.>`,
      ],
    },
    subscribe: { allow: ["_INBOX.>"] },
  };
}

/**
 * A provider's permissions (SPEC §1, §2): publish its own subjects of `publish` (`{user}`
 * replaced by its name), read the buckets of `reads` without writing them, ask the seat's
 * verbs, and receive replies (a JetStream publish's acknowledgement among them).
 */
export function providerPermissions(provider: string, seat: string, providers: ProviderUsers, buckets: Readonly<Record<string, BucketConfig>>) {
  return {
    publish: {
      allow: [
        "$JS.API.INFO",
        ...providers.publish.map((subject) => subject.replaceAll("{user}", provider)),
        ...providers.reads.flatMap((name) => readSubjects(buckets[name]!.bucket)),
        `${seat}.>`,
      ],
    },
    subscribe: { allow: ["_INBOX.>"] },
  };
}

/** Reads the users file of the state folder, adding a generated password for any user missing. */
function users(stateDir: string, names: readonly string[]): Record<string, string> {
  const file = join(stateDir, "users.json");
  const known: Record<string, string> = existsSync(file) ? JSON.parse(readFileSync(file, "utf8")) : {};
  const all = Object.fromEntries(names.map((n) => [n, known[n] ?? randomBytes(18).toString("base64url")]));
  writeFileSync(file, JSON.stringify({ ...known, ...all }, null, 2), { mode: 0o600 });
  return all;
}

/**
 * Clears what a previous run left: a server whose owner process is gone is stopped. Throws when
 * a live process of this folder still owns its server.
 */
async function clearStale(markerFile: string): Promise<void> {
  if (!existsSync(markerFile)) return;
  const marker = JSON.parse(readFileSync(markerFile, "utf8")) as Marker;
  if (alive(marker.pid) && isNatsServer(marker.pid)) {
    if (alive(marker.owner) && marker.owner !== process.pid) {
      throw new Error(
        `the embedded nats-server of this folder (${marker.url}) is in use by process ${marker.owner}; ` +
          "stop that one first, or set NATS_URL to share its server",
      );
    }
    process.kill(marker.pid, "SIGTERM");
    for (let i = 0; i < 50 && alive(marker.pid); i++) await sleep(100);
  }
  rmSync(markerFile, { force: true });
}

/**
 * Starts the embedded `nats-server` of a state folder: JetStream with its store in
 * `<stateDir>/jetstream`, on a free loopback port, with the seat's user, one user per node and
 * one per provider (passwords generated once into `<stateDir>/users.json`, mode 0600). Records itself in
 * `<stateDir>/embedded.json` so the CLI finds it. Throws {@link NatsServerMissing} when no
 * `nats-server` is installed, or when the folder's server is owned by another live process.
 */
export async function startEmbedded(options: EmbeddedOptions): Promise<EmbeddedServer> {
  const { stateDir, seat, nodes } = options;
  const providers = options.providers ?? { users: [], publish: [], reads: [] };
  const buckets = Object.values(options.buckets);
  const names = [...nodes, ...providers.users];
  if (names.includes(seat)) throw new Error(`a node or provider cannot be named like the seat (${seat})`);
  const twice = names.find((n, i) => names.indexOf(n) !== i);
  if (twice !== undefined) throw new Error(`the embedded server's user ${twice} is named twice (nodes and providers)`);
  for (const name of providers.reads) {
    if (options.buckets[name] === undefined) throw new Error(`embedded.providers.reads: no bucket "${name}" in the config`);
  }
  mkdirSync(stateDir, { recursive: true, mode: 0o700 });
  const markerFile = join(stateDir, "embedded.json");
  await clearStale(markerFile);
  const passwords = users(stateDir, [seat, ...names]);
  const conf = {
    server_name: `${seat}-embedded`,
    jetstream: { store_dir: join(stateDir, "jetstream") },
    ...(options.maxPayload ? { max_payload: options.maxPayload } : {}),
    authorization: {
      users: [
        { user: seat, password: passwords[seat], permissions: seatPermissions(buckets) },
        ...nodes.map((node) => ({
          user: node,
          password: passwords[node],
          permissions: nodePermissions(node, seat, buckets),
        })),
        ...providers.users.map((provider) => ({
          user: provider,
          password: passwords[provider],
          permissions: providerPermissions(provider, seat, providers, options.buckets),
        })),
      ],
    },
  };
  const server = await spawnNatsServer({ conf, confFile: join(stateDir, "nats-server.conf") });
  const marker: Marker = { url: server.url, pid: server.pid, owner: process.pid };
  writeFileSync(markerFile, JSON.stringify(marker), { mode: 0o600 });
  const credentials = (user: string): Credentials => ({ user, password: passwords[user]! });
  return {
    ...server,
    seat: credentials(seat),
    users: Object.fromEntries(names.map((name) => [name, credentials(name)])),
    stop: async () => {
      await server.stop();
      rmSync(markerFile, { force: true });
    },
  };
}

/**
 * The running embedded server of a state folder, as the CLI sees it from another process:
 * its URL and the credentials of its users; `undefined` when none runs.
 */
export function findEmbedded(stateDir: string): { url: string; users: Record<string, Credentials> } | undefined {
  const markerFile = join(stateDir, "embedded.json");
  if (!existsSync(markerFile)) return undefined;
  const marker = JSON.parse(readFileSync(markerFile, "utf8")) as Marker;
  if (!alive(marker.pid) || !alive(marker.owner)) return undefined;
  const passwords = JSON.parse(readFileSync(join(stateDir, "users.json"), "utf8")) as Record<string, string>;
  return {
    url: marker.url,
    users: Object.fromEntries(Object.entries(passwords).map(([user, password]) => [user, { user, password }])),
  };
}
