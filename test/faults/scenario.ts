/**
 * A cluster run under faults, as the cluster fault test and `npm run faults` make it
 * (docs/runtime.md §6.14): three hosts, a nats-server 2.9.10 on each, replicas of the set
 * started at the same moment, the workload of workload.ts; the faults themselves, each made for
 * real and undone; and what a run is judged by (checks.ts).
 */
import { mkdirSync, mkdtempSync } from "node:fs";
import { join } from "node:path";
import type { NatsConnection } from "nats";
import { OPERATOR } from "../../runtime/testing.ts";
import { projectConfig, ROOT, until } from "../helpers.ts";
import { meshUsers, startHostCluster, startHosts, type HostCluster, type HostServer, type Hosts } from "../hosts.ts";
import { failedBetween, longestGap, lostEvents, lostWrites, missedWrites, readyWhileFailing, writesBackAt, type Missed } from "./checks.ts";
import { EVENTS, MACHINE, NEEDS, newToken, startReplicas, startWorkload, tail, type Replica, type Workload } from "./workload.ts";

/**
 * How soon after the servers recover every fresh read must answer again, in milliseconds. Once,
 * in a run on its own, nats-server 2.9.10 left the needs stream without a leader for about 25 s
 * after a minority server's partition healed (the set said `has no leader` meanwhile): 30 s.
 */
export const RECOVERED_WITHIN_MS = 30_000;
/** How long fresh reads are watched once they must answer again, in milliseconds. */
export const WATCHED_MS = 5_000;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** A cluster, its hosts, the set's replicas on it and the workload running. */
export interface Scene {
  readonly hosts: Hosts;
  readonly cluster: HostCluster;
  readonly replicas: Replica[];
  readonly workload: Workload;
  readonly token: string;
  /** Where each server's log is kept. */
  readonly serverLogs: string;
  /** The marks of the run and each replica's last log lines, for a failure's reader. */
  logs(): string;
  /** Stops the workload, the servers, every process of the hosts and the hosts. */
  stop(): Promise<void>;
}

/**
 * Starts three hosts, a cluster on them, `count` replicas of the set on hosts 1, 2, … at the
 * same moment (each given its host's server alone), waits until each is ready, then starts the
 * workload and lets it run `warmMs`. Releases what it started when a step fails.
 */
export async function startScene({ count = 2, warmMs = 3000 }: { count?: number; warmMs?: number } = {}): Promise<Scene> {
  const config = await projectConfig();
  const hosts = await startHosts(3);
  let cluster: HostCluster | undefined;
  let workload: Workload | undefined;
  try {
    mkdirSync(join(ROOT, ".tmp"), { recursive: true });
    const serverLogs = mkdtempSync(join(ROOT, ".tmp", "faults-servers-"));
    cluster = await startHostCluster(hosts, { users: await meshUsers(config), logDir: serverLogs });
    const token = newToken();
    const replicas = await startReplicas(cluster, cluster.servers.slice(0, count), { seat: config.seat, token });
    await until(
      async () =>
        (
          await Promise.all(
            replicas.map((r) =>
              fetch(`${r.httpUrl}/readyz`).then(
                (res) => res.status === 200,
                () => false,
              ),
            ),
          )
        ).every(Boolean),
      30_000,
      "every replica ready",
    );
    workload = await startWorkload(cluster, replicas, { nodes: ["alder", "birch", "cedar"], token });
    await sleep(warmMs);
    const made: Scene = {
      hosts,
      cluster,
      replicas,
      workload,
      token,
      serverLogs,
      logs: () =>
        [
          `marks: ${JSON.stringify(made.workload.recording.marks)}; servers' logs in ${serverLogs}`,
          ...replicas.map((r) => `--- replica ${r.name} (${r.logFile})\n${tail(r.logFile, 25)}`),
        ].join("\n"),
      stop: async () => {
        await workload?.stop();
        await cluster?.stop();
        await hosts.stop();
      },
    };
    return made;
  } catch (err) {
    await workload?.stop();
    await cluster?.stop();
    await hosts.stop();
    throw err;
  }
}

/** When a fault began and when it was undone, ms since the epoch. */
export interface Made {
  readonly began: number;
  readonly undone: number;
}

/** A fault: what it is called in the table, and how it is made and undone on a scene. */
export interface Fault {
  readonly name: string;
  /** How many replicas of the set the scene has (2 unless said). */
  readonly replicas?: number;
  make(scene: Scene): Promise<Made>;
}

/**
 * Waits (30 s at most) until `server`, cut off, no longer believes it leads the needs stream.
 * nats-server 2.9.10 may keep, for good, publishes a cut-off leader took and never had
 * acknowledged when the cut heals before it stepped down (10 to 20 s after the cut): its replica
 * then differs from the others', which no client can mend (docs/runtime.md §6.14).
 */
export async function steppedDown(scene: Scene, server: HostServer): Promise<void> {
  await until(async () => (await scene.cluster.leaderOf(`KV_${NEEDS}`, server)) !== server, 30_000, `${server.name} stepped down`);
}

/** Cuts `server` off for `ms`, then until it stepped down when it led the needs stream, and heals. */
async function cut(scene: Scene, server: HostServer, ms: number, what: string): Promise<Made> {
  const began = Date.now();
  scene.workload.mark(what);
  await scene.hosts.partition(server.host);
  await sleep(ms);
  await steppedDown(scene, server);
  await scene.hosts.heal();
  scene.workload.mark("heal");
  return { began, undone: Date.now() };
}

/** Stops `pid` (SIGSTOP) for `ms`, then lets it go on. */
async function paused(scene: Scene, pause: () => void, resume: () => void, ms: number, what: string): Promise<Made> {
  const began = Date.now();
  scene.workload.mark(what);
  pause();
  await sleep(ms);
  resume();
  scene.workload.mark("SIGCONT");
  return { began, undone: Date.now() };
}

/** Every stream the set stores in (its buckets' and the events stream). */
const STREAMS = ["registry", "needs", "applied", "collect", "failing", "rotations", "runtime", "claims"].map(
  (b) => `KV_mesh-provisioner_${b}`,
);
const ALL_STREAMS = [...STREAMS, "KV_mesh-controller_assignments", EVENTS];

/**
 * Readies a fault of server `n` (1 to 3): the needs and applied streams led by it, every other
 * stream by another server, and the node writers moved to the other servers. So what the fault
 * cuts off or pauses is the leader of the streams the readers ask about, and nothing publishes
 * through it: a publish a leader cut off from its quorum takes stays on its replica, in place of
 * an acknowledged write, once the cut heals (nats-server 2.9.10, docs/runtime.md §6.14).
 */
async function leading(scene: Scene, n: number, { needs = true }: { needs?: boolean } = {}): Promise<HostServer> {
  const { servers } = scene.cluster;
  const faulted = servers[n - 1]!;
  const others = servers.filter((s) => s !== faulted);
  for (const [i, stream] of ALL_STREAMS.entries()) {
    const led = needs && (stream === `KV_${NEEDS}` || stream === "KV_mesh-provisioner_applied");
    const leader = await scene.cluster.leaderOf(stream);
    if (led ? leader !== faulted : leader === faulted) await scene.cluster.moveLeader(stream, led ? faulted : others[i % 2]!);
  }
  await scene.workload.writeThrough(others);
  return faulted;
}

/** The faults, by key: those of the cluster fault test first, then those `npm run faults` adds. */
export const FAULTS = {
  partitionLeader: {
    name: "partition the needs leader (replica A's server) 20 s, two replicas",
    async make(scene) {
      return cut(scene, await leading(scene, 1), 20_000, "partition server 1");
    },
  },
  pauseLeader: {
    name: "SIGSTOP the needs leader (replica B's server) 15 s",
    async make(scene) {
      const two = await leading(scene, 2);
      return paused(
        scene,
        () => two.pause(),
        () => two.resume(),
        15_000,
        "SIGSTOP server 2",
      );
    },
  },
  partitionMinority: {
    name: "partition a minority server (no replica, no leader) 20 s",
    async make(scene) {
      return cut(scene, await leading(scene, 3, { needs: false }), 20_000, "partition server 3");
    },
  },
  partitionLeaderOneReplica: {
    name: "partition the needs leader (the one replica's server) 20 s",
    replicas: 1,
    async make(scene) {
      return cut(scene, await leading(scene, 1), 20_000, "partition server 1");
    },
  },
  killServer: {
    name: "kill -9 the needs leader (replica B's server), started again on its store after 15 s",
    async make(scene) {
      const two = await leading(scene, 2);
      const began = Date.now();
      scene.workload.mark("kill -9 server 2");
      await two.kill();
      await sleep(15_000);
      await two.start();
      scene.workload.mark("server 2 started");
      return { began, undone: Date.now() };
    },
  },
  killReplica: {
    name: "kill -9 replica A of the set",
    async make(scene) {
      const a = scene.replicas[0]!;
      const began = Date.now();
      scene.workload.mark("kill -9 replica A");
      scene.hosts.kill(a.child.pid!);
      await a.exited;
      await sleep(15_000);
      scene.workload.mark("(replica A stays down)");
      return { began, undone: Date.now() };
    },
  },
  pauseReplica: {
    name: "SIGSTOP replica A of the set 15 s",
    async make(scene) {
      const pid = scene.replicas[0]!.child.pid!;
      return paused(
        scene,
        () => scene.hosts.pause(pid),
        () => scene.hosts.resume(pid),
        15_000,
        "SIGSTOP replica A",
      );
    },
  },
} satisfies Record<string, Fault>;

/** What one fault's run came to: every figure of the table, and the evidence of each rule broken. */
export interface Judgement {
  readonly fault: string;
  /** Fresh answers (ok) and refusals (503s, timeouts) from the fault on. */
  readonly answered: number;
  readonly refused: number;
  /** Fresh answers missing a write acknowledged at least 2 ms before their request, and the writes they missed. */
  readonly missed: { readonly answers: number; readonly writes: number; readonly first: readonly Missed[] };
  /** Polls of `/readyz` that said ready while their replica could not answer fresh. */
  readonly readyWhileFailing: number;
  /**
   * From the fault's undoing: when the servers answered again (a meta leader every server sees,
   * writes through every server, every replica of the needs stream caught up with its leader).
   */
  readonly serversBackMs: number;
  /** Fresh reads refused from {@link RECOVERED_WITHIN_MS} after the servers were back (must be none). */
  readonly refusedAfterRecovery: readonly { readonly via: string; readonly afterMs: number; readonly message: string }[];
  /** The readers (a server's name over NATS, a replica's over HTTP) with a fresh answer from {@link RECOVERED_WITHIN_MS} after the servers were back. */
  readonly answeringAfterRecovery: readonly string[];
  /** The longest time without a fresh answer, per reader, in ms. */
  readonly longestGapMs: Readonly<Record<string, number>>;
}

/**
 * Waits until the servers are back after `made` (a meta leader every server sees, a write
 * acknowledged through every server, every server's replica of the needs stream as far as its
 * leader was then), then {@link RECOVERED_WITHIN_MS} and {@link WATCHED_MS} more, and judges the
 * run from the fault's beginning.
 */
export async function judge(scene: Scene, fault: string, made: Made): Promise<Judgement> {
  await scene.cluster.ready(90_000);
  const readyAt = Date.now();
  const recording = scene.workload.recording;
  await until(() => writesBackAt(recording, made.undone) !== undefined, 60_000, "writes acknowledged through every server again");
  // And every server's replica of the needs stream caught up with what its leader held then.
  const leader = await scene.cluster.leaderOf(`KV_${NEEDS}`);
  const target = leader === undefined ? 0 : ((await scene.cluster.replicaOf(`KV_${NEEDS}`, leader))?.lastSeq ?? 0);
  await until(
    async () => {
      const replicas = await Promise.all(scene.cluster.servers.map((server) => scene.cluster.replicaOf(`KV_${NEEDS}`, server)));
      return replicas.every((r) => r !== undefined && r.lastSeq >= target);
    },
    60_000,
    "every server's replica of the needs stream caught up",
  );
  const back = Math.max(readyAt, writesBackAt(recording, made.undone)!, Date.now());
  const from = back + RECOVERED_WITHIN_MS;
  await sleep(Math.max(0, from + WATCHED_MS - Date.now()));
  const to = Date.now();
  // A replica whose process is gone (killed) answers nothing, and is not asked.
  const gone = new Set(scene.replicas.filter((r) => r.child.exitCode !== null || r.child.signalCode !== null).map((r) => r.name));
  const window = {
    ...recording,
    answers: recording.answers.filter((a) => a.sentAt >= made.began && a.sentAt < to && !gone.has(a.via)),
    polls: recording.polls.filter((p) => p.at >= made.began && p.at < to),
  };
  const missed = missedWrites(window);
  const vias = [...new Set(window.answers.map((a) => a.via))].sort();
  return {
    fault,
    answered: window.answers.filter((a) => a.ok).length,
    refused: window.answers.filter((a) => !a.ok).length,
    missed: { answers: missed.answers, writes: missed.writes, first: missed.missed.slice(0, 5) },
    readyWhileFailing: readyWhileFailing(window).length,
    serversBackMs: back - made.undone,
    refusedAfterRecovery: failedBetween(window, from, to).map((a) => ({
      via: a.via,
      afterMs: a.sentAt - back,
      message: a.ok ? "" : `${a.code}: ${a.message}`,
    })),
    answeringAfterRecovery: [...new Set(window.answers.filter((a) => a.ok && a.sentAt >= from).map((a) => a.via))].sort(),
    longestGapMs: Object.fromEntries(vias.map((via) => [via, longestGap(window, via, made.began, to)])),
  };
}

/** What the end of a run found lost: acknowledged writes and events, and each server's replica of the needs stream. */
export interface Losses {
  readonly writes: readonly { readonly key: string; readonly acked: number; readonly held: number | undefined }[];
  readonly events: readonly string[];
  /** Each server's replica of the needs stream at the end: its last sequence (they differ when nats-server diverged). */
  readonly replicas: readonly (number | undefined)[];
}

/**
 * Stops the workload and finds what was lost: the count of the last record of every key, read
 * from the stream's leader, against the newest acknowledged write; every acknowledged failing in
 * the status of each live replica (waited for, 60 s at most).
 */
export async function losses(scene: Scene): Promise<Losses> {
  await scene.workload.stop();
  const recording = scene.workload.recording;
  const operator: NatsConnection = await scene.cluster.connect(OPERATOR, scene.cluster.servers[0]!);
  const finals = new Map<string, number>();
  for (const keys of recording.keys.values()) {
    for (const key of keys) {
      const reply = await operator.request(`$JS.API.STREAM.MSG.GET.KV_${NEEDS}`, JSON.stringify({ last_by_subj: `$KV.${NEEDS}.${key}` }), {
        timeout: 5000,
      });
      const data = (reply.json() as { message?: { data?: string } }).message?.data;
      if (data !== undefined) finals.set(key, (JSON.parse(Buffer.from(data, "base64").toString()) as { n: number }).n);
    }
  }
  let events: string[] = [];
  for (const replica of scene.replicas.filter((r) => r.child.exitCode === null && r.child.signalCode === null)) {
    await until(
      async () => {
        const response = await fetch(`${replica.httpUrl}/status?machine=${MACHINE}`, {
          headers: { authorization: `Bearer ${scene.token}` },
        }).catch(() => undefined);
        const body = (await response?.json().catch(() => undefined)) as { failing?: { consumer: string }[] } | undefined;
        events = lostEvents(recording, new Set((body?.failing ?? []).map((f) => f.consumer)));
        return body?.failing !== undefined && events.length === 0;
      },
      60_000,
      `every event in status of replica ${replica.name}`,
    ).catch(() => {});
    if (events.length > 0) break;
  }
  const replicas = await Promise.all(scene.cluster.servers.map((server) => scene.cluster.replicaOf(`KV_${NEEDS}`, server)));
  return { writes: lostWrites(recording, finals), events, replicas: replicas.map((r) => r?.lastSeq) };
}
