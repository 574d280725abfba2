import type { KV } from "nats";
import type { Config } from "../runtime/index.ts";
import { openSession } from "../runtime/index.ts";
import { NODES, recordsOf } from "../demo/mesh.ts";

/**
 * Writes the demo mesh as its node clients would: each node connects with its own node user
 * of the embedded server (or the configured credentials when NATS_URL is set) and puts its
 * own keys of needs, applied and collect. The function set must have run once, so the
 * buckets exist. Returns how many records each node wrote.
 */
export async function writeDemo(config: Config): Promise<Record<string, number>> {
  const written: Record<string, number> = {};
  for (const node of NODES) {
    const session = await openSession(config, { embedded: "join", user: node, name: `${node} provisioner client` });
    try {
      const js = session.nc.jetstream();
      const records = recordsOf(node);
      const kvs = new Map<string, KV>();
      for (const { bucket, key, value } of records) {
        if (!kvs.has(bucket)) kvs.set(bucket, await js.views.kv(config.buckets[bucket]!.bucket, { bindOnly: true }));
        await kvs.get(bucket)!.put(key, JSON.stringify(value));
      }
      written[node] = records.length;
    } catch (err) {
      throw new Error(`node ${node} could not write its records: ${(err as Error).message}`);
    } finally {
      await session.close();
    }
  }
  return written;
}
