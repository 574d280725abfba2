import { join } from "node:path";
import { connectNode, connectProvider, usersFile, type Credentials } from "../client/index.ts";
import { openMesh } from "../client/mesh.ts";
import type { Config } from "../runtime/index.ts";
import { configPath, openSession } from "../runtime/index.ts";
import { assignmentsOf, DEMO_FAILING, DEMO_ROTATION, demoMesh, NODES, STRAY } from "../demo/mesh.ts";
import { HOLDERS } from "../functions/_lib/provisioning.ts";
import { askAll } from "./ask.ts";
import { askStatus } from "./status.ts";

export { DEMO_FAILING, DEMO_ROTATION };

/** How long the demo waits for the set to show what it published, in milliseconds. */
const WAIT_MS = 30_000;

/** Where the demo writes: the servers, and the credentials of each of its users. */
export interface DemoBus {
  readonly servers: readonly string[];
  credentials(user: string): Credentials;
}

/** `connecting`'s client, or an error naming the demo's `user` and where its password comes from. */
async function as<T>(user: string, connecting: Promise<T>): Promise<T> {
  try {
    return await connecting;
  } catch (err) {
    throw new Error(
      `the demo's user ${user} cannot connect: ${(err as Error).message} (its password is the one of .state/users.json, or of the --users file on a server of your own)`,
      { cause: err },
    );
  }
}

/** `provider`'s client on the demo's bus. */
const providerOn = (bus: DemoBus, provider: string) =>
  as(provider, connectProvider({ servers: bus.servers, provider, credentials: bus.credentials(provider), name: `${provider} provider` }));
/**
 * `node`'s client on the demo's bus. It writes once and leaves, so it writes no presence: its
 * node is silent, and nothing is inferred from that (docs/presence.md §16.1).
 */
const nodeOn = (bus: DemoBus, node: string) =>
  as(
    node,
    connectNode({ servers: bus.servers, node, credentials: bus.credentials(node), name: `${node} provisioner client`, presence: false }),
  );

/** Asks `shown` every 100 ms until it holds, for up to {@link WAIT_MS}; then throws `what was published but …`. */
async function untilShown(shown: () => Promise<boolean>, what: string): Promise<void> {
  const deadline = Date.now() + WAIT_MS;
  while (!(await shown())) {
    if (Date.now() > deadline) throw new Error(`${what} after ${WAIT_MS / 1000} s`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

/**
 * The bus of the demo: on the embedded default, the running embedded server and its users
 * (`.state/users.json`); on a server of one's own (NATS_URL set), its URLs and the users file
 * given (the shape of `.state/users.json`, as `npm run cluster` writes one). Throws when
 * NATS_URL is set and no users file is given, or when no embedded server runs.
 */
export async function demoBus(config: Config, users?: string): Promise<DemoBus> {
  if (config.nats.servers.length > 0) {
    if (users === undefined) {
      throw new Error(
        "on a server of your own, the demo writes as its node, provider and controller users: give their passwords with --users <file> (the shape of .state/users.json; `npm run cluster` writes one)",
      );
    }
    // Every user the demo writes as, before anything is written.
    for (const user of demoUsers(config)) usersFile(users, user);
    return { servers: config.nats.servers, credentials: (user) => usersFile(users, user) };
  }
  const session = await openSession(config, { embedded: "join", name: "mesh-provisioner demo" });
  const url = session.url;
  await session.close();
  const file = users ?? join(configPath(config, config.state), "users.json");
  return { servers: [url], credentials: (user) => usersFile(file, user) };
}

/** The users the demo writes as: the controller, the nodes, the failing and rotating provider. */
const demoUsers = (config: Config) => [
  config.embedded.controllers[0] ?? "mesh-controller",
  ...NODES,
  ...new Set([DEMO_FAILING.provider, DEMO_ROTATION.provider]),
];

/**
 * Writes the demo mesh as the controller and its node clients would: the controller's user
 * puts the assignments, then each node connects with the client library as its own node user
 * and declares its modules' needs, writes their applied records and its collection items, and
 * one key out of shape as a client with a bug would. The function set must have run once, so
 * the buckets exist. Returns how many records each user wrote.
 */
export async function writeDemo(config: Config, bus: DemoBus): Promise<Record<string, number>> {
  const written: Record<string, number> = {};
  // The controller first: its assignments mirror (docs/state.md §7.1).
  const controller = config.embedded.controllers[0] ?? "mesh-controller";
  if (config.buckets.assignments !== undefined) {
    const mesh = await as(
      controller,
      openMesh({ servers: bus.servers, credentials: bus.credentials(controller), name: `${controller} assignments` }),
    );
    try {
      const kv = await mesh.nc.jetstream().views.kv(config.buckets.assignments.bucket, { bindOnly: true, allow_direct: true });
      const assignments = assignmentsOf();
      for (const { key, value } of assignments) await kv.put(key, JSON.stringify(value));
      written[controller] = assignments.length;
    } catch (err) {
      throw new Error(`the controller ${controller} could not write its assignments: ${(err as Error).message}`, { cause: err });
    } finally {
      await mesh.nc.drain();
    }
  }
  for (const node of NODES) {
    const client = await nodeOn(bus, node);
    try {
      let count = 0;
      for (const step of demoMesh(node)) {
        if (step.declare !== undefined) count += (await client.declare(step.module, step.declare)).written.length;
        if (step.applied !== undefined) {
          await client.applied(step.module, step.applied);
          count++;
        }
        for (const [collection, contributor, item] of step.contribute ?? []) {
          await client.contribute(collection, contributor, item);
          count++;
        }
      }
      // A client with a bug writes a key out of its bucket's shape (docs/buckets.md §2.3).
      for (const { key, value } of STRAY[node] ?? []) {
        const needs = await client.nc.jetstream().views.kv(config.buckets.needs!.bucket, { bindOnly: true, allow_direct: true });
        await needs.put(key, JSON.stringify(value));
        count++;
      }
      written[node] = count;
    } catch (err) {
      throw new Error(`node ${node} could not write its records: ${(err as Error).message}`, { cause: err });
    } finally {
      await client.close();
    }
  }
  return written;
}

/**
 * Publishes the demo provider's `failing` or `recovered` (docs/failing.md §5) with the client
 * library as the provider's own user, then waits (up to 30 s) until status shows it applied.
 */
export async function publishDemoEvent(bus: DemoBus, kind: "failing" | "recovered"): Promise<void> {
  const { provider, machine, consumer, word } = DEMO_FAILING;
  const client = await providerOn(bus, provider);
  try {
    if (kind === "failing") await client.failing(machine, consumer, word);
    else await client.recovered(machine, consumer);
    await untilShown(
      async () => (await askStatus(client.nc, { provider, machine, consumer })).failing.length === (kind === "failing" ? 1 : 0),
      `the ${kind} of ${provider} was published but status does not show it`,
    );
  } finally {
    await client.close();
  }
}

/**
 * Publishes the demo's rotation (docs/rotation.md §8.2) with the client library as keycloak's
 * user, then waits (up to 30 s) until its holder is stale.
 */
export async function publishDemoRotation(bus: DemoBus): Promise<void> {
  const { provider, provision, revision, machine, consumer } = DEMO_ROTATION;
  const client = await providerOn(bus, provider);
  try {
    await client.rotated(provision, revision, { machine, consumer });
    await untilShown(async () => {
      const { entries } = await askAll(client.nc, { what: HOLDERS, provision, node: machine });
      return entries.some((h) => h.module === consumer && h.stale);
    }, `the rotation of ${provision} was published but its holder is not stale`);
  } finally {
    await client.close();
  }
}

/**
 * `node`'s client writes its presence once and leaves (docs/presence.md §16.1): the node is
 * unreachable once `presence.ttlSeconds` (or three of its periods) have passed with no write.
 */
export async function silenceDemoNode(bus: DemoBus, node: string): Promise<void> {
  const client = await as(
    node,
    connectNode({ servers: bus.servers, node, credentials: bus.credentials(node), name: `${node} provisioner client` }),
  );
  await client.close();
}

/**
 * The demo's holder checks its credential from its node after catching up
 * (docs/presence.md §16.5): keycloak refuses it (`AuthFailed`) though it holds the newest
 * revision, the frozen password; then waits (up to 30 s) until its module says so.
 */
export async function failDemoCheck(bus: DemoBus): Promise<void> {
  const { provision, revision, machine, consumer } = DEMO_ROTATION;
  const node = await nodeOn(bus, machine);
  try {
    await node.check(consumer, provision, {
      ok: false,
      reason: "AuthFailed",
      message: "401 Unauthorized from the token endpoint",
      revision,
    });
    await untilShown(async () => {
      const { entries } = await askAll(node.nc, { what: "state", node: machine, module: consumer });
      return entries.some((m) => m.conditions.some((c) => c.type === "CheckFailing"));
    }, `the check of ${provision} was published but ${consumer} on ${machine} does not show it`);
  } finally {
    await node.close();
  }
}

/**
 * Catches the demo's holder up (docs/rotation.md §8.3): dogwood's client writes grafana's applied
 * record with the new revision, and keycloak waits (up to 30 s) for the release it is then sent.
 * Returns the release.
 */
export async function catchUpDemo(bus: DemoBus): Promise<unknown> {
  const { provider, provision, revision, machine, consumer } = DEMO_ROTATION;
  const listener = await providerOn(bus, provider);
  const node = await nodeOn(bus, machine);
  try {
    const released = new Promise<unknown>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`no release of ${provision} within ${WAIT_MS / 1000} s`)), WAIT_MS);
      listener.onReleased((r) => {
        clearTimeout(timer);
        resolve(r);
      });
    });
    await listener.nc.flush();
    const step = demoMesh(machine).find((s) => s.module === consumer && s.applied !== undefined)!;
    await node.applied(consumer, { ...step.applied, revisions: { [provision]: revision } });
    return await released;
  } finally {
    await node.close();
    await listener.close();
  }
}
