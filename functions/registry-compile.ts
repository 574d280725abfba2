import { z } from "zod";
import { defineFunction } from "../runtime/index.ts";
import { compileRegistry, registryTable } from "./_lib/registry.ts";

/** docs/registry.md §3: the config's registry table, compiled into the registry bucket at start and hourly. */
export default defineFunction({
  description: "Compiles the registry table into the registry bucket, writing only what differs.",
  triggers: [{ cron: "0 * * * *", onStart: true }],
  config: z.object({ registry: registryTable }),
  access: { writes: ["registry"] },
  metrics: {
    registry_compiles_total: { type: "counter", help: "Registry compiles done" },
    registry_kinds_written_total: { type: "counter", help: "Kinds written to the registry bucket by compiles" },
    registry_kinds_deleted_total: { type: "counter", help: "Kinds deleted from the registry bucket by compiles" },
  },
  handler: async (_input, ctx) => {
    const result = await compileRegistry(ctx.config.registry, ctx.buckets.registry);
    ctx.metrics.registry_compiles_total.inc();
    ctx.metrics.registry_kinds_written_total.inc(result.written.length);
    ctx.metrics.registry_kinds_deleted_total.inc(result.deleted.length);
    ctx.log.info({ written: result.written, deleted: result.deleted, unchanged: result.unchanged }, "registry compiled");
    return result;
  },
});
