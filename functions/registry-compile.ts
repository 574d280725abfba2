import { z } from "zod";
import { defineFunction } from "../runtime/index.ts";
import { compileRegistry, registryTable } from "./_lib/registry.ts";

/** SPEC §3: the config's registry table, compiled into the registry bucket at start and hourly. */
export default defineFunction({
  description: "Compiles the registry table into the registry bucket, writing only what differs.",
  triggers: [{ cron: "0 * * * *", onStart: true }],
  config: z.object({ registry: registryTable }),
  access: { writes: ["registry"] },
  handler: async (_input, ctx) => {
    const result = await compileRegistry(ctx.config.registry, ctx.buckets.registry);
    ctx.log.info({ written: result.written, deleted: result.deleted, unchanged: result.unchanged }, "registry compiled");
    return result;
  },
});
