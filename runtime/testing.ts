/**
 * Helpers for tests of functions and of the runtime: a real nats-server per test file,
 * configured as the embedded default is (the seat's user, node and provider users), in a
 * temporary folder that is removed at the end; and buckets in memory for the tests that need no
 * server.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { KV, NatsConnection } from "nats";
import { startCluster, type Cluster } from "./cluster.ts";
import type { Config } from "./config.ts";
import type { LoadedFunction } from "./define.ts";
import { startEmbedded, type EmbeddedServer } from "./embedded.ts";
import { loadFunctions } from "./loader.ts";
import { authorization } from "./permissions.ts";
import type { AuthorizedUser, Credentials, Permissions } from "./users.ts";
import { subjectMatches } from "./subjects.ts";
import type { Entry, KeyRecord, ListOptions, ReadBucket, Snapshot } from "./types.ts";
import { connectTo } from "./session.ts";

/** A nats-server of a test, and ways to reach it as its users. */
export interface TestBus {
  /** The running server (another one after {@link TestBus.restart}). */
  readonly server: EmbeddedServer;
  readonly url: string;
  /** `config` pointed at this server as the seat, with HTTP on a free port. */
  readonly config: Config;
  /** Connects as the seat (no argument) or as a node's or provider's user. */
  connect(user?: string): Promise<NatsConnection>;
  /** A bucket of the config (by its config name) opened as the seat or another user, never created. */
  kv(bucket: string, user?: string): Promise<KV>;
  /**
   * Kills the server (SIGKILL) and starts it again on the same port and store; with another
   * `max_payload` or `max_file_store` when given; with its JetStream store removed when `emptyStore` (a disk lost).
   */
  restart(options?: {
    readonly maxPayload?: number;
    readonly emptyStore?: boolean;
    readonly maxFileStore?: number;
    readonly seatMaxFile?: number;
  }): Promise<void>;
  /** Closes every connection opened here, stops the server and removes its folder. */
  stop(): Promise<void>;
}

export interface TestBusOptions {
  /** The server's `max_payload`, in bytes. */
  readonly maxPayload?: number;
  /** Node users; the config's embedded nodes by default. */
  readonly nodes?: readonly string[];
  /** Provider users; the config's embedded providers by default. */
  readonly providers?: readonly string[];
  /** The function set the users' permissions are derived from; the config's by default. */
  readonly functions?: readonly LoadedFunction[];
  /**
   * The seat's permissions instead of those derived: for tests of the runtime that bind
   * subjects no function set declares.
   */
  readonly seatPermissions?: Permissions;
  /** The folder the server's temporary folder is made in (a small tmpfs, for a full disk); the system's by default. */
  readonly under?: string;
  /** JetStream's file storage limit (`max_file_store`) in bytes. */
  readonly maxFileStore?: number;
  /** The seat's account's own JetStream file storage limit (`max_file`) in bytes. */
  readonly seatMaxFile?: number;
}

/**
 * Starts a nats-server for a test from `config` on a free port, with its store in a new
 * temporary folder, and the users the embedded default has: the seat, nodes, providers and the controller, with
 * the permissions derived from the function set.
 */
export async function startTestBus(config: Config, options: TestBusOptions = {}): Promise<TestBus> {
  const dir = mkdtempSync(join(options.under ?? tmpdir(), "mesh-provisioner-test-"));
  const users = authorization(config, options.functions ?? (await loadFunctions(config)), {
    nodes: options.nodes ?? config.embedded.nodes,
    providers: options.providers ?? config.embedded.providers,
    controllers: config.embedded.controllers,
  });
  const embedded = {
    stateDir: dir,
    users: options.seatPermissions ? [{ ...users[0]!, permissions: options.seatPermissions }, ...users.slice(1)] : users,
    maxPayload: options.maxPayload,
    maxFileStore: options.maxFileStore,
    seatMaxFile: options.seatMaxFile,
  };
  let server = await startEmbedded(embedded);
  const opened: NatsConnection[] = [];
  const credentials = (user?: string): Credentials => {
    const found = user === undefined ? server.seat : server.users[user];
    if (found === undefined) throw new Error(`the test server has no user ${user}`);
    return found;
  };
  const connect = async (user?: string) => {
    const { user: name, password } = credentials(user);
    const nc = await connectTo([server.url], { user: name, pass: password, name: `test ${name}` });
    opened.push(nc);
    return nc;
  };
  return {
    get server() {
      return server;
    },
    url: server.url,
    config: {
      ...config,
      nats: { servers: [server.url], user: server.seat.user, password: server.seat.password },
      http: { host: "127.0.0.1", port: 0 },
    },
    connect,
    kv: async (bucket, user) => {
      const name = config.buckets[bucket]?.bucket ?? bucket;
      return (await connect(user)).jetstream().views.kv(name, { bindOnly: true, allow_direct: true });
    },
    restart: async ({
      maxPayload = embedded.maxPayload,
      emptyStore = false,
      maxFileStore = embedded.maxFileStore,
      seatMaxFile = embedded.seatMaxFile,
    } = {}) => {
      process.kill(server.pid, "SIGKILL");
      await server.stop();
      if (emptyStore) rmSync(join(dir, "jetstream"), { recursive: true, force: true });
      server = await startEmbedded({ ...embedded, maxPayload, maxFileStore, seatMaxFile, port: server.port });
    },
    stop: async () => {
      await Promise.all(opened.map((nc) => nc.close()));
      await server.stop();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** The user of a test cluster who may publish and subscribe anything. */
export const OPERATOR = "operator";

/** A local 3-server JetStream cluster of a test, and ways to reach it as its users. */
export interface TestCluster {
  readonly cluster: Cluster;
  /** `config` on every server of the cluster as the seat, with replicas 3 and HTTP on a free port. */
  readonly config: Config;
  /** The same, listing only server `n` (1 to 3): the set connects there and learns the others from it. */
  configOn(n: number): Config;
  /** Connects as the seat (no user) or as a node's or provider's user, to server `n` (default 1). */
  connect(user?: string, n?: number): Promise<NatsConnection>;
  /** Closes every connection opened here, stops the servers and removes their folder. */
  stop(): Promise<void>;
}

/**
 * Starts a 3-server JetStream cluster ({@link startCluster}) for a test, in a new temporary
 * folder, with the users the embedded default has (the seat, nodes and providers, permissions
 * derived from the function set), and {@link OPERATOR}.
 */
export async function startTestCluster(config: Config, options: Omit<TestBusOptions, "seatPermissions"> = {}): Promise<TestCluster> {
  const dir = mkdtempSync(join(tmpdir(), "mesh-provisioner-cluster-"));
  const users = authorization(config, options.functions ?? (await loadFunctions(config)), {
    nodes: options.nodes ?? config.embedded.nodes,
    providers: options.providers ?? config.embedded.providers,
    controllers: config.embedded.controllers,
  });
  // And an operator who may do anything: a test's view from outside ($SRV.STATS, stream infos).
  const operator: AuthorizedUser = {
    role: "seat",
    user: OPERATOR,
    permissions: { publish: { allow: [">"] }, subscribe: { allow: [">"] } },
  };
  const cluster = await startCluster({
    stateDir: dir,
    users: [...users, operator],
    maxPayload: options.maxPayload,
    name: `${config.seat}-test`,
  });
  const opened: NatsConnection[] = [];
  const on = (servers: readonly string[]): Config => ({
    ...config,
    nats: { servers: [...servers], user: cluster.seat.user, password: cluster.seat.password },
    replicas: 3,
    http: { host: "127.0.0.1", port: 0 },
  });
  return {
    cluster,
    config: on(cluster.urls),
    configOn: (n) => on([cluster.urls[n - 1]!]),
    connect: async (user, n = 1) => {
      const found = user === undefined ? cluster.seat : cluster.users[user];
      if (found === undefined) throw new Error(`the test cluster has no user ${user}`);
      const nc = await connectTo([cluster.urls[n - 1]!], { user: found.user, pass: found.password, name: `test ${found.user}` });
      opened.push(nc);
      return nc;
    },
    stop: async () => {
      await Promise.all(opened.map((nc) => nc.close().catch(() => {})));
      await cluster.stop();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** A bucket held in memory (see {@link memoryBucket}): the reads of a bucket, its writes, and its snapshots. */
export interface MemoryBucket extends ReadBucket {
  /** Writes `key`; returns its revision. */
  put(key: string, value: Uint8Array | string): number;
  /** Deletes `key` (a delete marker); returns its revision. */
  delete(key: string): number;
  /** The bucket as it is now, held still: later writes change neither its reads nor its stamp. */
  snapshot(): Snapshot;
}

const encoder = new TextEncoder();
let memoryBuckets = 0;

/**
 * A bucket in memory for tests that need no nats-server (the unit lane): the runtime's own
 * `ReadBucket` and `Snapshot` over a map, each write given the next revision and a time from
 * `nanos` (the server's, in nanoseconds since the epoch; 1 ms apart from `start` by default), and
 * each snapshot's `changedSince` naming the keys written since an earlier snapshot of it, as a
 * live view's does (docs/runtime.md §6.12).
 */
export function memoryBucket(bucket: string, nanos?: () => number): MemoryBucket {
  const id = `memory-${++memoryBuckets}`;
  let revision = 0;
  const now = nanos ?? (() => Date.UTC(2026, 0, 1) * 1e6 + revision * 1e6);
  const records = new Map<string, KeyRecord>();
  /** Each write's key, by revision (index `revision - 1`). */
  const written: string[] = [];
  const write = (key: string, value: Uint8Array, deleted: boolean): number => {
    revision++;
    const createdNanos = now();
    records.set(key, { key, value, revision, created: new Date(Math.floor(createdNanos / 1e6)), createdNanos, deleted });
    written.push(key);
    return revision;
  };
  const readsOf = (held: ReadonlyMap<string, KeyRecord>): ReadBucket => {
    const matching = (filters: string | readonly string[], { after, limit }: ListOptions = {}, deleted: boolean) => {
      const patterns = typeof filters === "string" ? [filters] : filters;
      const found = [...held.values()]
        .filter((r) => (deleted || !r.deleted) && patterns.some((p) => subjectMatches(p, r.key)) && (after === undefined || r.key > after))
        .sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0));
      return limit === undefined ? found : found.slice(0, limit);
    };
    const live = ({ deleted: _, ...entry }: KeyRecord): Entry => entry;
    return {
      bucket,
      get: async (key) => {
        const r = held.get(key);
        return r === undefined || r.deleted ? null : live(r);
      },
      last: async (key) => held.get(key) ?? null,
      list: async (filters, options) => matching(filters, options, false).map(live),
      records: async (filters, options) => matching(filters, options, true),
    };
  };
  return {
    ...readsOf(records),
    put: (key, value) => write(key, typeof value === "string" ? encoder.encode(value) : value, false),
    delete: (key) => write(key, new Uint8Array(), true),
    snapshot() {
      const at = revision;
      return {
        stamp: `${id}.${at}`,
        reads: readsOf(new Map(records)),
        changedSince: (stamp) => {
          const [of, since] = [stamp.slice(0, stamp.lastIndexOf(".")), Number(stamp.slice(stamp.lastIndexOf(".") + 1))];
          return of === id && since <= at ? [...new Set(written.slice(since, at))] : undefined;
        },
      };
    },
  };
}
