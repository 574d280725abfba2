import { defineFunction, RevisionConflict } from "../runtime/index.ts";
import { appliedIndex } from "./_lib/applied.ts";
import {
  heldIn,
  holdersIndex,
  refreshSubject,
  releasedSubject,
  rotationConfig,
  rotationsIn,
  rotationStates,
  type Rotation,
  type RotationValue,
} from "./_lib/rotation.ts";

/**
 * docs/rotation.md §8.5, docs/rotation.md §8.6: every second (claimed, so one replica a second), each kept rotation's
 * nodes with a stale holder are noticed at once and again every `renoticeEverySeconds` for
 * `renoticeMinutes`, and once no holder is stale the provider is told, once. What was noticed and
 * released is written in the rotation's record (compare-and-set) before it is published.
 */
export default defineFunction({
  description: "Notices nodes holding a rotated provision (mesh-provisioner.refresh.<node>) and tells the provider when none is stale.",
  triggers: [{ cron: "* * * * * *" }],
  config: rotationConfig,
  access: {
    views: ["rotations", "needs", "applied"],
    writes: ["rotations"],
    publishes: ["mesh-provisioner.refresh.*", "mesh-provisioner.released.*"],
  },
  handler: async (_input, ctx) => {
    const { renoticeMinutes, renoticeEverySeconds } = ctx.config.rotation;
    const [rotations, needs, applied] = await Promise.all([
      ctx.views.rotations.snapshot(),
      ctx.views.needs.snapshot(),
      ctx.views.applied.snapshot(),
    ]);
    const { rotations: kept } = await rotationsIn(rotations.reads);
    // A released rotation is done with.
    if (kept.every((r) => r.releasedAt !== null)) return { noticed: 0, released: 0 };
    const { states, stale } = rotationStates(kept, await holdersIndex(needs), heldIn(await appliedIndex(applied)));
    const now = ctx.clock.now();
    let noticed = 0;
    let released = 0;
    for (const [i, r] of kept.entries()) {
      if (r.releasedAt !== null) continue;
      const held = stale.get(r.key)!;
      if (held.length === 0) {
        if (!(await record(r, { releasedAt: now.toISOString() }))) continue;
        const { provision, revision, at } = r;
        ctx.publish(releasedSubject(r.provider), JSON.stringify({ provision, revision, at, holders: states[i]!.holders }));
        released++;
        continue;
      }
      const since = r.noticedAt === null ? Infinity : now.getTime() - Date.parse(r.noticedAt);
      const within = now.getTime() - Date.parse(r.arrivedAt) <= renoticeMinutes * 60_000;
      if (r.noticedAt !== null && (!within || since < renoticeEverySeconds * 1000)) continue;
      if (!(await record(r, { noticedAt: now.toISOString(), notices: r.notices + 1 }))) continue;
      const byNode = new Map<string, string[]>();
      for (const h of held) byNode.set(h.node, [...new Set([...(byNode.get(h.node) ?? []), h.module])]);
      for (const [node, modules] of byNode) {
        const { provider, provision, revision, at } = r;
        ctx.publish(refreshSubject(node), JSON.stringify({ provider, provision, revision, at, modules }));
        noticed++;
      }
    }
    return { noticed, released };

    /** Writes what was done in the rotation's record, unless it changed since it was read (then it is decided again next time). */
    async function record(r: Rotation, change: Partial<RotationValue>): Promise<boolean> {
      const { key: _key, provider: _p, provision: _v, machine: _m, consumer: _c, record: revision, ...value } = r;
      try {
        await ctx.buckets.rotations.update(r.key, JSON.stringify({ ...value, ...change }), revision);
        return true;
      } catch (err) {
        if (err instanceof RevisionConflict) return false;
        throw err;
      }
    }
  },
});
