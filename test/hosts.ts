/**
 * Hosts for a test of a cluster's faults: `n` Linux network namespaces joined to a bridge, each
 * with an address of its own in a private /24, where processes run (a nats-server each, see
 * {@link startHostCluster}) and where faults are made for real: hosts cut off from each other
 * by blackhole routes (established TCP connections hang as on a real partition), processes
 * stopped (SIGSTOP) or killed. The test machine keeps an address on the bridge, the gateway,
 * and reaches every host whatever is cut. Needs root and iproute2 (`ip`).
 *
 * Everything a run makes is named after its pid, `mpt<pid>br` (the bridge), `mpt<pid>h<n>`
 * (host n's namespace), `mpt<pid>v<n>` / `mpt<pid>p<n>` (its veth pair's ends), and the folder
 * `mesh-provisioner-hosts-<pid>` in the temporary folder (the cluster's stores), so that runs at
 * once on one machine never touch each other's. It is removed by {@link Hosts.stop}; on this
 * process's exit or a signal (SIGINT, SIGTERM, SIGHUP); by a watchdog process when this one dies
 * first (killed by vitest 500 ms after its SIGTERM, or by kill -9); and, should the watchdog die
 * too, by the next run's sweep of whatever belongs to a pid that no longer lives.
 */
import { execFile, execFileSync, spawn, type ChildProcess, type SpawnOptions } from "node:child_process";
import { accessSync, constants, createWriteStream, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import type { Socket } from "node:net";
import { tmpdir } from "node:os";
import { delimiter, dirname, join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import type { NatsConnection } from "nats";
import { startCluster, type Cluster, type ClusterServer } from "../runtime/cluster.ts";
import type { Config } from "../runtime/config.ts";
import { loadFunctions } from "../runtime/loader.ts";
import { authorization } from "../runtime/permissions.ts";
import { connectTo } from "../runtime/session.ts";
import { OPERATOR } from "../runtime/testing.ts";
import type { AuthorizedUser, Credentials } from "../runtime/users.ts";

/**
 * Whether this process may make hosts: network namespaces, veths and a bridge need root (CI runs
 * as root). The tests of hosts are skipped otherwise, saying so in their titles.
 */
export const canMakeHosts = process.getuid?.() === 0;

/** One host: a network namespace with its own address, on the bridge. */
export interface Host {
  /** Its number among the hosts, 1 to n. */
  readonly n: number;
  /** Its network namespace's name, `mpt<pid>h<n>`. */
  readonly name: string;
  /** Its address, reachable from the test machine and (unless cut) from every other host. */
  readonly ip: string;
  /**
   * Runs `command` inside the host (`ip netns exec`, which execs: the child's pid is the
   * command's), in a process group of its own, killed by {@link Hosts.stop}. Node's `spawn`
   * otherwise, options included.
   */
  spawn(command: string, args?: readonly string[], options?: SpawnOptions): ChildProcess;
}

/** The hosts of a test, and the faults made between them. */
export interface Hosts {
  readonly hosts: readonly Host[];
  /** The test machine's address on the bridge: reaches every host, cut from none. */
  readonly gateway: string;
  /** The hosts' network, e.g. `10.234.17.0/24`: one no interface or route of the machine used when it was picked. */
  readonly subnet: string;
  /** The bridge's name, `mpt<pid>br`. */
  readonly bridge: string;
  /**
   * This run's folder, `mesh-provisioner-hosts-<pid>` in the temporary folder, removed with the
   * hosts: for what runs in them to keep (the cluster's stores are there).
   */
  readonly dir: string;
  /** The pid of the watchdog process that removes the hosts should this process die first. */
  readonly watchdog: number;
  /** The pid of every process started in the hosts, in order, running or not. */
  readonly started: readonly number[];
  /**
   * Cuts the hosts given from every other host, both ways (a blackhole route to each address of
   * the other side, in every namespace of both sides); the test machine still reaches them all.
   * `partition(h1)` isolates h1. Cuts add up until {@link Hosts.heal}.
   */
  partition(...side: Host[]): Promise<void>;
  /** Undoes every cut. */
  heal(): Promise<void>;
  /** Stops a process (SIGSTOP): it holds its sockets and answers nothing, as a hung process. */
  pause(pid: number): void;
  /** Lets a stopped process go on (SIGCONT). */
  resume(pid: number): void;
  /** Kills a process at once (SIGKILL). */
  kill(pid: number): void;
  /**
   * Kills every process started in the hosts (their process groups, and whatever else runs in
   * the namespaces) and removes the namespaces, the veths and the bridge. Idempotent; bounded
   * (15 s at the very most).
   */
  stop(): Promise<void>;
}

/** The pid of the run that made a namespace or link of this harness, from its name. */
const OWNED = /^mpt(\d+)(?:br|[hvp]\d+)$/;
/** The longest any one command may take: nothing here waits for ever. */
const COMMAND_MS = 10_000;

/**
 * Removes every namespace, veth and bridge of the run `$1` and its folder in `$2` (the temporary
 * folder), and kills every process in its namespaces; as a shell script, so the watchdog runs it
 * after this process is gone.
 */
const REMOVE = `p="mpt$1"
for ns in $(ip netns list | cut -d' ' -f1 | grep -E "^\${p}h[0-9]+$"); do
  for pid in $(ip netns pids "$ns"); do kill -CONT "$pid" 2>/dev/null; kill -KILL "$pid" 2>/dev/null; done
  ip netns del "$ns"
done
for link in $(ip -br link | cut -d' ' -f1 | cut -d@ -f1 | grep -E "^\${p}(br|[vp][0-9]+)$"); do ip link del "$link" 2>/dev/null; done
[ -n "$2" ] && rm -rf -- "$2/mesh-provisioner-hosts-$1"
exit 0`;

/** The arguments of the shell running {@link REMOVE} (or the watchdog) for the run `owner`. */
const removeArgs = (script: string, owner: number) => ["-c", script, "sh", String(owner), tmpdir()];

/** The folder of the run `owner`: `mesh-provisioner-hosts-<pid>` in the temporary folder. */
const runDir = (owner: number) => join(tmpdir(), `mesh-provisioner-hosts-${owner}`);
const RUN_DIR = /^mesh-provisioner-hosts-(\d+)$/;

let ipFound: string | undefined;
/** The `ip` binary: on the `PATH` or in the folders Debian installs it in. */
function ipBin(): string {
  if (ipFound !== undefined) return ipFound;
  for (const dir of [...(process.env.PATH ?? "").split(delimiter), "/usr/sbin", "/sbin", "/usr/bin", "/bin"]) {
    try {
      accessSync(join(dir, "ip"), constants.X_OK);
      return (ipFound = join(dir, "ip"));
    } catch {
      // not here
    }
  }
  throw new Error("ip (iproute2) is not installed: a test's hosts need it (apt-get install iproute2), and root");
}

/** The environment of the removal script: `ip` and the shell's tools on its `PATH`. */
const scriptEnv = () => ({ PATH: [dirname(ipBin()), "/usr/sbin", "/usr/bin", "/sbin", "/bin"].join(delimiter) });

/** Runs `ip …args`, `input` on its standard input (`-batch -`); rejects with its error output. */
function ip(args: readonly string[], input?: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const child = execFile(ipBin(), args, { timeout: COMMAND_MS, killSignal: "SIGKILL" }, (err, stdout, stderr) =>
      err ? reject(new Error(`ip ${args.join(" ")}: ${stderr.trim() || err.message}`)) : resolve(stdout),
    );
    // An `ip` that exits before reading its input fails on its own; the pipe's error says nothing more.
    child.stdin?.on("error", () => undefined).end(input);
  });
}

/** Removes what the run `owner` made ({@link REMOVE}); never rejects. */
function remove(owner: number): Promise<void> {
  return new Promise((resolve) => {
    execFile("sh", removeArgs(REMOVE, owner), { env: scriptEnv(), timeout: COMMAND_MS, killSignal: "SIGKILL" }, () => resolve());
  });
}

/** The same, at once: for an exit or a signal, when nothing asynchronous runs any more. */
function removeNow(owner: number): void {
  try {
    execFileSync("sh", removeArgs(REMOVE, owner), { env: scriptEnv(), timeout: 3000, killSignal: "SIGKILL", stdio: "ignore" });
  } catch {
    // the watchdog finishes it
  }
}

/** Whether `pid` runs: it exists, and is no zombie (dead, not yet reaped by its parent). */
const alive = (pid: number): boolean => {
  try {
    process.kill(pid, 0);
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === "EPERM";
  }
  try {
    return readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1]?.[0] !== "Z";
  } catch {
    return false;
  }
};

/** Sends `signal` to process group `pid` when it still exists. */
const signalGroup = (pid: number, signal: NodeJS.Signals) => {
  try {
    process.kill(-pid, signal);
  } catch {
    // gone already
  }
};

/**
 * Removes the namespaces, veths, bridges and folders of earlier runs whose process no longer
 * lives, and kills whatever still runs in those namespaces; resolves with those runs' pids.
 * {@link startHosts} does it first.
 */
export async function sweepHosts(): Promise<number[]> {
  const names = [
    ...(await ip(["netns", "list"])).split("\n").map((line) => line.split(" ")[0]!),
    ...(await ip(["-br", "link"])).split("\n").map((line) => line.split(" ")[0]!.split("@")[0]!),
  ];
  const folders = readdirSync(tmpdir());
  const owners = new Set(
    [...names.map((name) => OWNED.exec(name)?.[1]), ...folders.map((name) => RUN_DIR.exec(name)?.[1])].filter((pid) => pid !== undefined),
  );
  const dead = [...owners].map(Number).filter((pid) => pid !== process.pid && !alive(pid));
  await Promise.all(dead.map(remove));
  return dead;
}

/** An IPv4 prefix as a number and a length. */
const prefix = (cidr: string): [number, number] => {
  const [address, length = "32"] = cidr.split("/");
  const value = address!.split(".").reduce((sum, byte) => sum * 256 + Number(byte), 0);
  return [value, Number(length)];
};
const overlap = (a: string, b: string) => {
  const [x, m] = prefix(a);
  const [y, n] = prefix(b);
  const shift = 32 - Math.min(m, n);
  return Math.floor(x / 2 ** shift) === Math.floor(y / 2 ** shift);
};

/** The /24s the hosts' network may be: in 10.234.0.0/16 or 172.30.0.0/16. */
const CANDIDATES = ["10.234", "172.30"].flatMap((first) => Array.from({ length: 256 }, (_, i) => `${first}.${i}`));
const ROUTE_TYPES = new Set("unicast local broadcast multicast throw unreachable prohibit blackhole nat anycast".split(" "));

/** Every IPv4 prefix the machine's addresses and routes (every table) use, but `bridge`'s own. */
async function usedPrefixes(bridge: string): Promise<string[]> {
  const mine = new RegExp(`\\b${bridge}\\b`);
  const [routes, addresses] = await Promise.all([ip(["-4", "-o", "route", "show", "table", "all"]), ip(["-4", "-o", "addr", "show"])]);
  const routed = routes
    .split("\n")
    .filter((line) => line !== "" && !mine.test(line))
    .map((line) => line.split(/\s+/))
    .map((words) => (ROUTE_TYPES.has(words[0]!) ? words[1]! : words[0]!))
    .filter((p) => p !== "default" && p !== "0.0.0.0/0");
  const held = addresses
    .split("\n")
    .filter((line) => line !== "" && !mine.test(line))
    .map((line) => /\sinet ([\d./]+)/.exec(line)?.[1])
    .filter((p) => p !== undefined);
  return [...routed, ...held];
}

/**
 * Gives `bridge` the gateway's address (`.1`) in a /24 nothing else uses, and returns the /24's
 * first three bytes. Without a lock: the address is added, then the machine looked at again, and
 * given back when anything else holds that /24 by then (two runs picking at once both give it
 * back, and pick again at random; the later of two picking one after the other sees the other).
 */
async function claimSubnet(bridge: string): Promise<string> {
  const given = new Set<string>();
  for (let attempt = 0; attempt < 20; attempt++) {
    const used = await usedPrefixes(bridge);
    const free = CANDIDATES.filter((c) => !given.has(c) && !used.some((u) => overlap(`${c}.0/24`, u)));
    if (free.length === 0) throw new Error(`no /24 of 10.234.0.0/16 or 172.30.0.0/16 is free on this machine for a test's hosts`);
    const pick = free[attempt === 0 ? process.pid % free.length : Math.floor(Math.random() * free.length)]!;
    await ip(["addr", "add", `${pick}.1/24`, "dev", bridge]);
    if (!(await usedPrefixes(bridge)).some((u) => overlap(`${pick}.0/24`, u))) return pick;
    await ip(["addr", "del", `${pick}.1/24`, "dev", bridge]);
    given.add(pick);
    await sleep(Math.random() * 100);
  }
  throw new Error(`no /24 could be claimed for a test's hosts on ${bridge} in 20 attempts`);
}

/** The hosts of this process, while they run: one set at a time (their names are the pid's). */
let current: Hosts | undefined;

/**
 * Makes `n` hosts: a bridge in the root namespace holding the gateway's address, and `n`
 * network namespaces joined to it by veth pairs, addresses `.2` to `.<n+1>` of a free private
 * /24, `lo` up in each. Sweeps the leftovers of dead runs first ({@link sweepHosts}). Throws
 * when this process has hosts running already, or when `ip` fails (not root, no iproute2);
 * then removes whatever it made.
 */
export async function startHosts(n: number): Promise<Hosts> {
  if (current !== undefined) throw new Error("this process has hosts running already: stop() them before starting others");
  if (!Number.isInteger(n) || n < 1 || n > 99) throw new Error(`a test's hosts are 1 to 99, not ${n}`);
  await sweepHosts();
  const pid = process.pid;
  const bridge = `mpt${pid}br`;
  const spawned = new Map<number, ChildProcess>();
  const started: number[] = [];
  const cuts = new Set<string>();
  const dir = runDir(pid);

  // The watchdog: removes everything of this pid when its standard input closes without "done",
  // which the kernel does when this process dies, however it dies.
  const watchdog = spawn("sh", removeArgs(`read -r line && [ "$line" = done ] && exit 0\n${REMOVE}`, pid), {
    stdio: ["pipe", "ignore", "ignore"],
    detached: true,
    env: scriptEnv(),
  });
  watchdog.unref();
  (watchdog.stdin as Socket).unref();

  const killAll = () => {
    for (const child of spawned.values()) {
      signalGroup(child.pid!, "SIGCONT");
      signalGroup(child.pid!, "SIGKILL");
    }
  };
  let removed = false;
  const onExit = () => {
    if (removed) return;
    removed = true;
    killAll();
    removeNow(pid);
  };
  const onSignal = (signal: NodeJS.Signals) => {
    onExit();
    // Alone to listen, it dies of the signal as it would have; otherwise the other listeners decide.
    if (process.listenerCount(signal) === 1) {
      unregister();
      process.kill(process.pid, signal);
    }
  };
  const SIGNALS = ["SIGINT", "SIGTERM", "SIGHUP"] as const;
  const unregister = () => {
    process.off("exit", onExit);
    for (const signal of SIGNALS) process.off(signal, onSignal);
  };
  process.on("exit", onExit);
  for (const signal of SIGNALS) process.on(signal, onSignal);

  let stopping: Promise<void> | undefined;
  const stop = () =>
    (stopping ??= (async () => {
      killAll();
      await remove(pid);
      removed = true;
      // Every child reaped (bounded: SIGKILL cannot be caught), so none is left even as a zombie.
      await Promise.race([
        Promise.all(
          [...spawned.values()].map(
            (child) =>
              new Promise((resolve) => ((child.exitCode ?? child.signalCode) !== null ? resolve(null) : child.once("exit", resolve))),
          ),
        ),
        sleep(5000, undefined, { ref: false }),
      ]);
      watchdog.stdin!.end("done\n");
      unregister();
      current = undefined;
    })());

  try {
    rmSync(dir, { recursive: true, force: true });
    mkdirSync(dir, { mode: 0o700 });
    await ip(["link", "add", bridge, "type", "bridge"]);
    await ip(["link", "set", bridge, "up"]);
    const net = await claimSubnet(bridge);
    const hosts: Host[] = Array.from({ length: n }, (_, i) => {
      const name = `mpt${pid}h${i + 1}`;
      return {
        n: i + 1,
        name,
        ip: `${net}.${i + 2}`,
        spawn: (command, args = [], options = {}) => {
          const child = spawn(ipBin(), ["netns", "exec", name, command, ...args], { ...options, detached: true });
          if (child.pid !== undefined) {
            const childPid = child.pid;
            started.push(childPid);
            spawned.set(childPid, child);
            child.once("exit", () => spawned.delete(childPid));
          }
          return child;
        },
      };
    });
    await ip(
      ["-batch", "-"],
      hosts
        .flatMap(({ n: i, name }) => [
          `netns add ${name}`,
          `link add mpt${pid}v${i} type veth peer name mpt${pid}p${i} netns ${name}`,
          `link set mpt${pid}v${i} master ${bridge}`,
          `link set mpt${pid}v${i} up`,
        ])
        .join("\n"),
    );
    await Promise.all(
      hosts.map((host) =>
        ip(
          ["-n", host.name, "-batch", "-"],
          [`link set lo up`, `addr add ${host.ip}/24 dev mpt${pid}p${host.n}`, `link set mpt${pid}p${host.n} up`].join("\n"),
        ),
      ),
    );

    // One host's way to another blackholed: what it sends there is dropped, what it has sent waits unacknowledged.
    const blackhole = (from: Host, to: Host) => {
      cuts.add(`${from.name} ${to.ip}`);
      return ip(["-n", from.name, "route", "replace", "blackhole", `${to.ip}/32`]);
    };
    current = {
      hosts,
      gateway: `${net}.1`,
      subnet: `${net}.0/24`,
      bridge,
      dir,
      watchdog: watchdog.pid!,
      started,
      partition: async (...side) => {
        const others = hosts.filter((h) => !side.includes(h));
        await Promise.all(side.flatMap((a) => others.flatMap((b) => [blackhole(a, b), blackhole(b, a)])));
      },
      heal: async () => {
        const entries = [...cuts];
        cuts.clear();
        await Promise.all(
          entries.map((entry) => {
            const [namespace, to] = entry.split(" ") as [string, string];
            return ip(["-n", namespace, "route", "del", "blackhole", `${to}/32`]).catch(() => undefined);
          }),
        );
      },
      pause: (target) => process.kill(target, "SIGSTOP"),
      resume: (target) => process.kill(target, "SIGCONT"),
      kill: (target) => process.kill(target, "SIGKILL"),
      stop,
    };
    return current;
  } catch (err) {
    await stop();
    throw err;
  }
}

/**
 * The users of the embedded default for `config`: the seat, its nodes, providers and
 * controllers, with the least privileges derived from the function set (as `startTestBus` has).
 */
export async function meshUsers(config: Config): Promise<AuthorizedUser[]> {
  return authorization(config, await loadFunctions(config), {
    nodes: config.embedded.nodes,
    providers: config.embedded.providers,
    controllers: config.embedded.controllers,
  });
}

/** Conf of nats-server in its object form (the JSON the harness writes). */
export type ServerConf = Readonly<Record<string, unknown>>;

export interface HostClusterOptions {
  /** The users and their permissions, the first the seat ({@link meshUsers}); {@link OPERATOR} is added, who may do anything. */
  readonly users: readonly AuthorizedUser[];
  /**
   * More conf for every server, or for server `n` (1 to the hosts' count), set over the
   * generated one key by key: `ping_interval`, `ping_max`, `write_deadline`…
   *
   * How fast a route cut by a blackhole is noticed, with nats-server 2.9.10's defaults: late. A
   * route is pinged only after `ping_interval` (2 min; the first ping 1 s after it connects)
   * without traffic either way, and closed at the tick after `ping_max` (2) pings went
   * unanswered; but the raft messages a server keeps sending to a cut-off peer (heartbeats every
   * 1 s, votes) count as traffic, so while a stream or the meta group spans the cut the route is
   * not pinged at all. It is closed once a write of it is blocked for `write_deadline` (10 s),
   * when the kernel's send buffer is full (some 18 KB queued: minutes of raft traffic), or by
   * TCP itself (`tcp_retries2`, about 15 min). Seen on these hosts: the first route closed 3.5 min after
   * the cut (as a slow consumer), the last after 4 to 5.5 min; a smaller `ping_interval` (2 s)
   * closes an idle route within 4 to 6 s, not one that carries raft traffic. JetStream does not
   * wait for the route: raft groups heartbeat every 1 s, followers elect a new leader after 4
   * to 9 s without one, and a leader cut from its quorum steps down after 10 to 20 s. After a
   * heal, a route still open carries its queue again within a second or two; a closed one is
   * dialled again every 1 s (a blackhole refuses a dial at once, it does not time out).
   */
  readonly conf?: ServerConf | ((n: number) => ServerConf);
  /** The cluster's name, and its servers' `<name>-<n>`: `hosts` by default. */
  readonly name?: string;
  /** A folder where each server's log is written whole (`<host's name>.log`, appended to across restarts). */
  readonly logDir?: string;
}

/** One nats-server of a {@link HostCluster}, on its host. */
export interface HostServer {
  /** `<cluster>-<n>`, as JetStream names it (a stream's leader, a raft peer). */
  readonly name: string;
  readonly host: Host;
  /** Client URL, `nats://<host's address>:4222`; the same after {@link HostServer.start}. */
  readonly url: string;
  /** Monitoring URL, `http://<host's address>:8222` (`/jsz?accounts=true&streams=true`, `/routez`…). */
  readonly monitor: string;
  /** The running process's pid; `undefined` while killed. */
  readonly pid: number | undefined;
  /** Whether it is stopped by {@link HostServer.pause}. */
  readonly paused: boolean;
  /** Kills it at once (SIGKILL), paused or not, as a crash would. */
  kill(): Promise<void>;
  /** Starts it again, on the same address, ports and store; resolves once it is ready. */
  start(): Promise<void>;
  /** Stops the process (SIGSTOP): its connections stay open and nothing answers, as a hung server. */
  pause(): void;
  /** Lets it go on (SIGCONT). */
  resume(): void;
}

/** A stream's replica on one server, as that server's monitoring endpoint says. */
export interface StreamReplica {
  /** The server leading the stream in this server's view; undefined when it knows none. */
  readonly leader: HostServer | undefined;
  readonly messages: number;
  readonly lastSeq: number;
}

/** A JetStream cluster of one nats-server a host, routed over the hosts' addresses. */
export interface HostCluster {
  /** Server n is `servers[n - 1]`, on host n. */
  readonly servers: readonly HostServer[];
  /** Every server's client URL. */
  readonly urls: readonly string[];
  /**
   * Resolves once every server running sees the same meta leader and every peer is current;
   * a paused server's silence holds it back. Rejects after `timeoutMs` (30 s by default).
   */
  ready(timeoutMs?: number): Promise<void>;
  /**
   * The server leading `stream`: as a majority of all the servers sees it, each asked at its
   * monitoring port (a cut-off old leader that still thinks it leads is outvoted), or as
   * `seenBy` alone sees it. Undefined when there is none such.
   */
  leaderOf(stream: string, seenBy?: HostServer): Promise<HostServer | undefined>;
  /**
   * Moves `stream`'s leader to `to`: `$JS.API.STREAM.LEADER.STEPDOWN.<stream>` as the operator,
   * again until a majority sees `to` lead. Rejects after `timeoutMs` (30 s by default) naming
   * where it leads.
   */
  moveLeader(stream: string, to: HostServer, timeoutMs?: number): Promise<void>;
  /** `stream`'s replica on `server`; undefined when the server does not answer within 2 s or holds none. */
  replicaOf(stream: string, server: HostServer): Promise<StreamReplica | undefined>;
  /** A user's credentials; throws for a user the cluster has not. */
  credentials(user: string): Credentials;
  /**
   * Connects from the test machine as `user` to `server` alone (never to another it learns of),
   * with the user's inbox prefix, reconnecting to it for ever; closed by {@link HostCluster.stop}.
   */
  connect(user: string, server: HostServer): Promise<NatsConnection>;
  /** Closes every connection opened here, kills every server and removes their folder. Idempotent. */
  stop(): Promise<void>;
}

interface Jsz {
  readonly account_details?: readonly {
    readonly stream_detail?: readonly {
      readonly name: string;
      readonly cluster?: { readonly leader?: string };
      readonly state?: { readonly messages: number; readonly last_seq: number };
    }[];
  }[];
}

/**
 * Starts one nats-server 2.9 a host, with JetStream (its store in a new temporary folder), in
 * one cluster routed over the hosts' addresses (client port 4222, routes 6222, monitoring 8222
 * on each host's address), with the accounts of `users` and {@link OPERATOR}; resolves once the
 * cluster is ready (a meta leader every server sees, every peer current). Rejects with a
 * server's log when one does not start.
 */
export async function startHostCluster(hosts: Hosts, options: HostClusterOptions): Promise<HostCluster> {
  const dir = mkdtempSync(join(hosts.dir, "cluster-"));
  const operator: AuthorizedUser = {
    role: "seat",
    user: OPERATOR,
    permissions: { publish: { allow: [">"] }, subscribe: { allow: [">"] } },
  };
  const more = options.conf;
  let cluster: Cluster;
  try {
    cluster = await startCluster({
      stateDir: dir,
      users: [...options.users, operator],
      name: options.name ?? "hosts",
      hosts: hosts.hosts.map((host) => ({
        address: host.ip,
        spawn: (command, args, spawnOptions) => {
          const child = host.spawn(command, args, spawnOptions);
          // Each server's log kept whole in `logDir`, besides what start reads of it.
          if (options.logDir !== undefined) child.stderr?.pipe(createWriteStream(join(options.logDir, `${host.name}.log`), { flags: "a" }));
          return child;
        },
      })),
      conf: typeof more === "function" ? more : () => more ?? {},
    });
  } catch (err) {
    rmSync(dir, { recursive: true, force: true });
    throw err;
  }

  const servers = cluster.servers.map((server: ClusterServer, i): HostServer => {
    let paused = false;
    return {
      name: server.name,
      host: hosts.hosts[i]!,
      url: server.url,
      monitor: server.monitor,
      get pid() {
        return server.pid;
      },
      get paused() {
        return paused;
      },
      kill: async () => {
        await server.kill();
        paused = false;
      },
      start: () => server.start(),
      pause: () => {
        if (server.pid === undefined) throw new Error(`${server.name} is not running: there is nothing to pause`);
        hosts.pause(server.pid);
        paused = true;
      },
      resume: () => {
        if (server.pid !== undefined) hosts.resume(server.pid);
        paused = false;
      },
    };
  });
  const byName = (name: string | undefined) => servers.find((s) => s.name === name);

  const replicaOf = async (stream: string, server: HostServer): Promise<StreamReplica | undefined> => {
    if (server.pid === undefined) return undefined;
    const jsz = (await fetch(`${server.monitor}/jsz?accounts=true&streams=true`, { signal: AbortSignal.timeout(2000) })
      .then((r) => r.json())
      .catch(() => undefined)) as Jsz | undefined;
    const detail = jsz?.account_details?.flatMap((a) => a.stream_detail ?? []).find((s) => s.name === stream);
    if (detail === undefined) return undefined;
    return { leader: byName(detail.cluster?.leader), messages: detail.state?.messages ?? 0, lastSeq: detail.state?.last_seq ?? 0 };
  };
  const leaderOf = async (stream: string, seenBy?: HostServer) => {
    if (seenBy !== undefined) return (await replicaOf(stream, seenBy))?.leader;
    const seen = await Promise.all(servers.map((s) => replicaOf(stream, s)));
    return servers.find((s) => seen.filter((r) => r?.leader === s).length > servers.length / 2);
  };

  const opened: NatsConnection[] = [];
  const credentials = (user: string): Credentials => {
    const found = user === cluster.seat.user ? cluster.seat : cluster.users[user];
    if (found === undefined) throw new Error(`the cluster has no user ${user}`);
    return found;
  };
  const connect = async (user: string, server: HostServer) => {
    const { password } = credentials(user);
    const nc = await connectTo([server.url], { user, pass: password, name: `test ${user}`, ignoreClusterUpdates: true });
    opened.push(nc);
    return nc;
  };

  const moveLeader = async (stream: string, to: HostServer, timeoutMs = 30_000) => {
    const deadline = Date.now() + timeoutMs;
    const nc = await connect(OPERATOR, to);
    try {
      for (;;) {
        const leader = await leaderOf(stream);
        if (leader === to) return;
        if (Date.now() > deadline) {
          throw new Error(`the leader of ${stream} did not move to ${to.name} within ${timeoutMs} ms: it is ${leader?.name ?? "nobody"}`);
        }
        if (leader === undefined) {
          await sleep(100);
          continue;
        }
        await nc.request(`$JS.API.STREAM.LEADER.STEPDOWN.${stream}`, undefined, { timeout: 5000 }).catch(() => undefined);
        // Until a leader other than the one stepping down is elected (or the time is up).
        while (Date.now() < deadline && [undefined, leader].includes(await leaderOf(stream))) await sleep(100);
      }
    } finally {
      await nc.close().catch(() => undefined);
    }
  };

  let stopping: Promise<void> | undefined;
  const stop = () =>
    (stopping ??= (async () => {
      // A connection to a paused server closes without its answer.
      await Promise.race([Promise.all(opened.map((nc) => nc.close().catch(() => undefined))), sleep(2000, undefined, { ref: false })]);
      await Promise.all(servers.map((s) => s.kill()));
      rmSync(dir, { recursive: true, force: true });
    })());

  return {
    servers,
    urls: cluster.urls,
    ready: (timeoutMs) => cluster.ready(timeoutMs),
    leaderOf,
    moveLeader,
    replicaOf,
    credentials,
    connect,
    stop,
  };
}
