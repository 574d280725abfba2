/**
 * The embedded default's nats-server: one per state folder, started with JetStream and the users
 * given, found again by the CLI from another process through `<stateDir>/embedded.json`, and a
 * server left by a killed process stopped at the next start (docs/runtime.md §6.7).
 */
import { existsSync, mkdirSync, readFileSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { freePortPreferring, spawnNatsServer, type RunningNatsServer } from "./nats-server.ts";
import { accountsOf, userPasswords, type AccountConf, type AuthorizedUser, type Credentials } from "./users.ts";

export interface EmbeddedOptions {
  /** The state folder: holds the store (`jetstream/`), `users.json`, the server's conf and pid. */
  readonly stateDir: string;
  /** The users and their permissions; the first is the seat. */
  readonly users: readonly AuthorizedUser[];
  /** The server's `max_payload` in bytes (nats-server's default is 1 MiB). */
  readonly maxPayload?: number;
  /** The loopback port to listen on; when absent, the last start's if it is free, else a free one. */
  readonly port?: number;
  /** JetStream's file storage limit (`max_file_store`) in bytes; the server's default (most of the disk) when absent. */
  readonly maxFileStore?: number;
  /** The seat's account's own JetStream file storage limit (`max_file`) in bytes; none (the server's applies) when absent. */
  readonly seatMaxFile?: number;
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

/** The port the server of the state folder listened on last (its conf, written at each start); none when unknown. */
function lastPort(confFile: string): number | undefined {
  try {
    const { port } = JSON.parse(readFileSync(confFile, "utf8")) as { port?: unknown };
    return typeof port === "number" ? port : undefined;
  } catch {
    return undefined;
  }
}

/**
 * Moves the streams an earlier version kept in the server's global account (`$G`, every user in
 * one account) into the seat's account, where this version keeps them (docs/runtime.md §6.7), so
 * the buckets written before an upgrade are read after it. Only when the seat's account has no
 * store of its own yet; nothing is removed.
 */
function adoptGlobalStore(storeDir: string, seatAccount: string): void {
  const accounts = join(storeDir, "jetstream");
  const global = join(accounts, "$G");
  const own = join(accounts, seatAccount);
  if (existsSync(global) && !existsSync(own)) renameSync(global, own);
}

/** `accounts` with the seat's account given a file storage limit of its own, when one is. */
function withSeatLimit(accounts: Record<string, AccountConf>, seat: string, maxFile: number | undefined): Record<string, AccountConf> {
  return maxFile === undefined ? accounts : { ...accounts, [seat]: { ...accounts[seat]!, jetstream: { max_file: maxFile } } };
}

/**
 * Starts the embedded `nats-server` of a state folder: JetStream with its store in
 * `<stateDir>/jetstream`, on a free loopback port, with the users given and their permissions
 * (passwords generated once into `<stateDir>/users.json`, mode 0600). Records itself in
 * `<stateDir>/embedded.json` so the CLI finds it. Throws {@link NatsServerMissing} when no
 * `nats-server` is installed, or when the folder's server is owned by another live process.
 */
export async function startEmbedded(options: EmbeddedOptions): Promise<EmbeddedServer> {
  const { stateDir } = options;
  const seat = options.users[0]!.user;
  const names = options.users.map((u) => u.user);
  const twice = names.find((n, i) => names.indexOf(n) !== i);
  if (twice !== undefined) throw new Error(`the embedded server's user ${twice} is named twice (seat, nodes and providers)`);
  mkdirSync(stateDir, { recursive: true, mode: 0o700 });
  const markerFile = join(stateDir, "embedded.json");
  await clearStale(markerFile);
  const passwords = userPasswords(stateDir, names);
  adoptGlobalStore(join(stateDir, "jetstream"), seat);
  const conf = {
    server_name: `${seat}-embedded`,
    jetstream: { store_dir: join(stateDir, "jetstream"), ...(options.maxFileStore ? { max_file_store: options.maxFileStore } : {}) },
    ...(options.maxPayload ? { max_payload: options.maxPayload } : {}),
    accounts: withSeatLimit(
      accountsOf(options.users, (user) => passwords[user]!),
      seat,
      options.seatMaxFile,
    ),
  };
  const confFile = join(stateDir, "nats-server.conf");
  // The port of the last start when it is free: clients connected to it find the server again after a crash.
  const port = options.port ?? (await freePortPreferring(lastPort(confFile)));
  const server = await spawnNatsServer({ conf, confFile, port });
  const marker: Marker = { url: server.url, pid: server.pid, owner: process.pid };
  writeFileSync(markerFile, JSON.stringify(marker), { mode: 0o600 });
  const credentials = (user: string): Credentials => ({ user, password: passwords[user]! });
  return {
    ...server,
    seat: credentials(seat),
    users: Object.fromEntries(names.slice(1).map((name) => [name, credentials(name)])),
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
