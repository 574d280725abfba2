import type { KV } from "nats";
import type { Config } from "../runtime/index.ts";
import { openSession } from "../runtime/index.ts";
import { assignmentsOf, DEMO_FAILING, DEMO_ROTATION, NODES, recordsOf } from "../demo/mesh.ts";
import { HOLDERS } from "../functions/_lib/provisioning.ts";
import { askAll } from "./ask.ts";
import { askStatus } from "./status.ts";

export { DEMO_FAILING, DEMO_ROTATION };

/**
 * Writes the demo mesh as the controller and its node clients would: the controller's user
 * puts the assignments, then each node connects with its own node user of the embedded server
 * (or the configured credentials when NATS_URL is set) and puts its own keys of needs, applied
 * and collect. The function set must have run once, so the
 * buckets exist. Returns how many records each node wrote.
 */
export async function writeDemo(config: Config): Promise<Record<string, number>> {
  const written: Record<string, number> = {};
  // The controller first: its assignments mirror (docs/state.md §7.1).
  const controller = config.embedded.controllers[0];
  if (controller !== undefined && config.buckets.assignments !== undefined) {
    const session = await openSession(config, { embedded: "join", user: controller, name: `${controller} assignments` });
    try {
      const kv = await session.nc.jetstream().views.kv(config.buckets.assignments.bucket, { bindOnly: true, allow_direct: true });
      const assignments = assignmentsOf();
      for (const { key, value } of assignments) await kv.put(key, JSON.stringify(value));
      written[controller] = assignments.length;
    } catch (err) {
      throw new Error(`the controller ${controller} could not write its assignments: ${(err as Error).message}`, { cause: err });
    } finally {
      await session.close();
    }
  }
  for (const node of NODES) {
    const session = await openSession(config, { embedded: "join", user: node, name: `${node} provisioner client` });
    try {
      const js = session.nc.jetstream();
      const records = recordsOf(node);
      const kvs = new Map<string, KV>();
      for (const { bucket, key, value } of records) {
        if (!kvs.has(bucket)) kvs.set(bucket, await js.views.kv(config.buckets[bucket]!.bucket, { bindOnly: true, allow_direct: true }));
        await kvs.get(bucket)!.put(key, JSON.stringify(value));
      }
      written[node] = records.length;
    } catch (err) {
      throw new Error(`node ${node} could not write its records: ${(err as Error).message}`, { cause: err });
    } finally {
      await session.close();
    }
  }
  return written;
}

/**
 * Publishes the demo provider's `failing` or `recovered` (docs/failing.md §5) as the provider's own user,
 * through JetStream, then waits (up to 10 s) until status shows it applied.
 */
export async function publishDemoEvent(config: Config, kind: "failing" | "recovered"): Promise<void> {
  const { provider, machine, consumer, word } = DEMO_FAILING;
  const session = await openSession(config, { embedded: "join", user: provider, name: `${provider} provider` });
  try {
    const event = { machine, consumer, at: new Date().toISOString(), ...(kind === "failing" ? { word } : {}) };
    await session.nc.jetstream().publish(`${provider}.provisioner.${kind}`, JSON.stringify(event));
    const deadline = Date.now() + 10_000;
    for (;;) {
      const { failing } = await askStatus(session.nc, { provider, machine, consumer });
      if (failing.length === (kind === "failing" ? 1 : 0)) return;
      if (Date.now() > deadline) throw new Error(`the ${kind} of ${provider} was published but status does not show it after 10 s`);
      await new Promise((r) => setTimeout(r, 100));
    }
  } finally {
    await session.close();
  }
}

/**
 * Publishes the demo's rotation (docs/rotation.md §8.2) as keycloak's user, through JetStream,
 * then waits (up to 10 s) until its holder is stale.
 */
export async function publishDemoRotation(config: Config): Promise<void> {
  const { provider, provision, revision, machine, consumer } = DEMO_ROTATION;
  const session = await openSession(config, { embedded: "join", user: provider, name: `${provider} provider` });
  try {
    const event = { provision, revision, machine, consumer, at: new Date().toISOString() };
    await session.nc.jetstream().publish(`${provider}.provisioner.rotated`, JSON.stringify(event));
    const deadline = Date.now() + 10_000;
    for (;;) {
      const { entries } = await askAll(session.nc, { what: HOLDERS, provision, node: machine });
      if ((entries as unknown as { module: string; stale: boolean }[]).some((h) => h.module === consumer && h.stale)) return;
      if (Date.now() > deadline) throw new Error(`the rotation of ${provision} was published but its holder is not stale after 10 s`);
      await new Promise((r) => setTimeout(r, 100));
    }
  } finally {
    await session.close();
  }
}

/**
 * Catches the demo's holder up (docs/rotation.md §8.3): dogwood's client writes grafana's applied
 * record with the new revision, and keycloak waits (up to 10 s) for the release it is then sent.
 * Returns the release.
 */
export async function catchUpDemo(config: Config): Promise<unknown> {
  const { provider, provision, revision, machine, consumer } = DEMO_ROTATION;
  const listener = await openSession(config, { embedded: "join", user: provider, name: `${provider} provider` });
  const node = await openSession(config, { embedded: "join", user: machine, name: `${machine} provisioner client` });
  try {
    const released = listener.nc.subscribe(`mesh-provisioner.released.${provider}`, { max: 1, timeout: 10_000 });
    await listener.nc.flush();
    const record = recordsOf(machine).find((r) => r.bucket === "applied" && r.key === `${machine}.${consumer}`)!;
    const applied = await node.nc.jetstream().views.kv(config.buckets.applied!.bucket, { bindOnly: true, allow_direct: true });
    await applied.put(record.key, JSON.stringify({ ...(record.value as object), revisions: { [provision]: revision } }));
    for await (const m of released) return m.json();
    throw new Error(`no release of ${provision} within 10 s`);
  } finally {
    await node.close();
    await listener.close();
  }
}
