import { defineFunction, RevisionConflict } from "../runtime/index.ts";
import { appliedIndex } from "./_lib/applied.ts";
import { HEADROOM } from "./_lib/provisioning.ts";
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
 * `renoticeMinutes`, and once no holder holds the rotation back the provider is told, once. What
 * was noticed and released is written in the rotation's record (compare-and-set) once published.
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
    // Nothing to do while every kept rotation is released, as the view holds them: no request to the server.
    if ((await rotationsIn(ctx.views.rotations.localSnapshot().reads)).rotations.every((r) => r.releasedAt !== null)) {
      return { noticed: 0, released: 0 };
    }
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
      if (states[i]!.stale === 0) {
        // Published, then written: a replica stopped in between leaves it to the next run, so the
        // provider hears it at least once; the claim of each second keeps it to one replica.
        const { provision, revision, at } = r;
        if (!send(releasedSubject(r.provider), { provision, revision, at, holders: states[i]!.holders })) continue;
        if (await record(r, { releasedAt: now.toISOString() })) released++;
        continue;
      }
      if (held.length === 0) continue;
      const byNode = new Map<string, Set<string>>();
      for (const h of held) byNode.set(h.node, (byNode.get(h.node) ?? new Set()).add(h.module));
      const since = r.noticedAt === null ? Infinity : now.getTime() - Date.parse(r.noticedAt);
      const within = now.getTime() - Date.parse(r.arrivedAt) <= renoticeMinutes * 60_000;
      const again = r.noticedAt === null || (within && since >= renoticeEverySeconds * 1000);
      // A node with a stale holder never noticed of this rotation (a need written since) is noticed at once.
      const told = new Set(r.noticedNodes);
      const nodes = [...byNode.keys()].filter((node) => again || !told.has(node));
      if (nodes.length === 0) continue;
      const { provider, provision, revision, at } = r;
      let sent = 0;
      for (const node of nodes) {
        // A node holding more modules than one message carries gets several.
        for (const part of chunks([...byNode.get(node)!], (m) => JSON.stringify({ provider, provision, revision, at, modules: m }))) {
          if (send(refreshSubject(node), part)) sent++;
        }
      }
      if (sent === 0) continue;
      const noticedNodes = [...new Set([...r.noticedNodes, ...nodes])].sort();
      const change = again ? { noticedAt: now.toISOString(), notices: r.notices + 1, noticedNodes } : { noticedNodes };
      if (await record(r, change)) noticed += sent;
    }
    return { noticed, released };

    /** Publishes one notice or release; a publish that fails is logged and tried again at the next run. */
    function send(subject: string, body: unknown): boolean {
      try {
        ctx.publish(subject, typeof body === "string" ? body : JSON.stringify(body));
        return true;
      } catch (err) {
        ctx.log.warn({ subject, err: (err as Error).message }, "not published; tried again at the next run");
        return false;
      }
    }

    /** The texts of `items` cut into parts each within the connection's max_payload (less a headroom). */
    function chunks(items: string[], text: (part: string[]) => string): string[] {
      const budget = ctx.limits.maxPayload - HEADROOM;
      const parts: string[] = [];
      let part: string[] = [];
      for (const item of items) {
        if (part.length > 0 && Buffer.byteLength(text([...part, item])) > budget) {
          parts.push(text(part));
          part = [];
        }
        part.push(item);
      }
      if (part.length > 0) parts.push(text(part));
      return parts;
    }

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
