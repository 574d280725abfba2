/**
 * A local NATS cluster with JetStream on loopback ports (`npm run cluster`, and the cluster tests):
 * its servers routed to each other, each with its own store, all with the users given; a server
 * can be killed and started again on the same ports and store (docs/runtime.md §6.7). Its
 * servers may also each run at an address of its own, started by a function of the caller's
 * (a test's hosts in network namespaces).
 */
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { freePorts, spawnNatsServer, type RunningNatsServer, type SpawnProcess } from "./nats-server.ts";
import { accountsOf, userPasswords, type AuthorizedUser, type Credentials } from "./users.ts";

export interface ClusterOptions {
  /** The cluster's folder: `users.json`, and per server `<n>/` with its conf and store. */
  readonly stateDir: string;
  /** The users and their permissions; the first is the seat. */
  readonly users: readonly AuthorizedUser[];
  /** How many servers: 3 by default (JetStream's replicas 3 need three). */
  readonly size?: number;
  /** The cluster's name, and its servers' `<name>-<n>`. */
  readonly name?: string;
  /** Each server's `max_payload` in bytes. */
  readonly maxPayload?: number;
  /**
   * Where each server runs, one a server (then `size` is their count): at an address of its own,
   * with nats-server's default ports (client 4222, route 6222, monitoring 8222), its process
   * started by `spawn`. All on 127.0.0.1 and free ports, started by node's `spawn`, by default.
   */
  readonly hosts?: readonly ClusterHost[];
  /**
   * More configuration for server `n` (1 to size), set over the generated one key by key (a
   * `cluster` given replaces the generated block whole): `ping_interval`, `write_deadline`…
   */
  readonly conf?: (n: number) => Readonly<Record<string, unknown>>;
}

/** Where a server of a cluster runs: its own address, and how its process is started. */
export interface ClusterHost {
  /** The address every port of the server listens on, reachable from this process and the other servers. */
  readonly address: string;
  /** Starts the server's process; node's `spawn` by default. */
  readonly spawn?: SpawnProcess;
}

/** One server of a {@link Cluster}, by its number (1 to size). */
export interface ClusterServer {
  readonly name: string;
  /** Client URL, `nats://127.0.0.1:<port>` (or its host's address); the same after {@link ClusterServer.start}. */
  readonly url: string;
  /** Monitoring URL (`/jsz`, `/routez`…), `http://127.0.0.1:<port>` (or its host's address). */
  readonly monitor: string;
  /** The running process's pid; `undefined` while stopped. */
  readonly pid: number | undefined;
  /** Kills the server at once (SIGKILL), as a crash would. */
  kill(): Promise<void>;
  /** Starts it again, on the same ports and store. */
  start(): Promise<void>;
}

/** A local NATS cluster with JetStream, its servers routed to each other on loopback. */
export interface Cluster {
  readonly servers: readonly ClusterServer[];
  /** Every server's client URL, for `NATS_URL` (comma-separated). */
  readonly urls: readonly string[];
  readonly seat: Credentials;
  /** Node and provider users by name. */
  readonly users: Readonly<Record<string, Credentials>>;
  /** Resolves once every running server sees the same JetStream meta leader and all peers current. */
  ready(timeoutMs?: number): Promise<void>;
  /** Stops every server (SIGTERM). */
  stop(): Promise<void>;
}

interface Jsz {
  readonly meta_cluster?: {
    readonly leader?: string;
    readonly cluster_size?: number;
    readonly replicas?: readonly { readonly current: boolean }[];
  };
}

/**
 * Starts a local cluster of `size` nats-servers with JetStream (default 3), routed to each other
 * on loopback ports (or one on each of `hosts`, at its address), each with its own store under `<stateDir>/<n>/`, all with the users given
 * (passwords generated once into `<stateDir>/users.json`, as the embedded server does). Resolves
 * once JetStream has a meta leader and every peer is current, so replicas 3 can be placed.
 * Throws {@link NatsServerMissing} when no `nats-server` is installed, and with the server's log
 * when one does not start.
 */
export async function startCluster(options: ClusterOptions): Promise<Cluster> {
  const { stateDir, hosts, name = "mesh" } = options;
  const size = hosts?.length ?? options.size ?? 3;
  mkdirSync(stateDir, { recursive: true, mode: 0o700 });
  const names = options.users.map((u) => u.user);
  const passwords = userPasswords(stateDir, names);
  const accounts = accountsOf(options.users, (user) => passwords[user]!);
  // Every loopback port picked at once, so no two of the servers' ports are the same.
  const picked = hosts ? [] : await freePorts(size * 3);
  const places = Array.from({ length: size }, (_, i) =>
    hosts
      ? { host: hosts[i]!.address, spawn: hosts[i]!.spawn, client: 4222, route: 6222, monitor: 8222 }
      : { host: "127.0.0.1", spawn: undefined, client: picked[3 * i]!, route: picked[3 * i + 1]!, monitor: picked[3 * i + 2]! },
  );
  const routes = places.map((p) => `nats-route://${p.host}:${p.route}`);

  const servers = places.map((place, i) => {
    const n = i + 1;
    const dir = join(stateDir, String(n));
    mkdirSync(dir, { recursive: true, mode: 0o700 });
    const conf = {
      server_name: `${name}-${n}`,
      jetstream: { store_dir: join(dir, "jetstream") },
      cluster: { name, host: place.host, port: place.route, routes },
      http: `${place.host}:${place.monitor}`,
      ...(options.maxPayload ? { max_payload: options.maxPayload } : {}),
      accounts,
      ...options.conf?.(n),
    };
    let running: RunningNatsServer | undefined;
    const server: ClusterServer = {
      name: conf.server_name,
      url: `nats://${place.host}:${place.client}`,
      monitor: `http://${place.host}:${place.monitor}`,
      get pid() {
        return running?.pid;
      },
      kill: async () => {
        if (running === undefined) return;
        process.kill(running.pid, "SIGKILL");
        await running.stop();
        running = undefined;
      },
      start: async () => {
        running ??= await spawnNatsServer({
          conf,
          confFile: join(dir, "nats-server.conf"),
          port: place.client,
          host: place.host,
          spawn: place.spawn,
        });
      },
    };
    const stopServer = async () => {
      await running?.stop();
      running = undefined;
    };
    return { server, stop: stopServer };
  });

  const stop = async () => {
    await Promise.all(servers.map((s) => s.stop()));
  };
  const jsz = async (server: ClusterServer): Promise<Jsz | undefined> => {
    if (server.pid === undefined) return undefined;
    // A server that does not answer within 2 s (stopped, cut off) is seen without a leader.
    return (await fetch(`${server.monitor}/jsz`, { signal: AbortSignal.timeout(2000) })
      .then((r) => r.json())
      .catch(() => undefined)) as Jsz | undefined;
  };
  const ready = async (timeoutMs = 30_000) => {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const running = servers.map((s) => s.server).filter((s) => s.pid !== undefined);
      const seen = await Promise.all(running.map(jsz));
      const leaders = new Set(seen.map((j) => j?.meta_cluster?.leader ?? ""));
      const leader = seen.find((j) => j?.meta_cluster?.leader !== undefined && j.meta_cluster.replicas !== undefined);
      const current = (leader?.meta_cluster?.replicas ?? []).filter((r) => r.current).length + 1;
      if (leaders.size === 1 && !leaders.has("") && current >= running.length) return;
      if (Date.now() > deadline) throw new Error(`the cluster has no JetStream meta leader with every peer current within ${timeoutMs} ms`);
      await sleep(100);
    }
  };

  try {
    await Promise.all(servers.map((s) => s.server.start()));
    await ready();
  } catch (err) {
    await stop();
    throw err;
  }
  const credentials = (user: string): Credentials => ({ user, password: passwords[user]! });
  return {
    servers: servers.map((s) => s.server),
    urls: servers.map((s) => s.server.url),
    seat: credentials(names[0]!),
    users: Object.fromEntries(names.slice(1).map((user) => [user, credentials(user)])),
    ready,
    stop,
  };
}
