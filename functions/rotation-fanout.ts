import { defineFunction, RevisionConflict, type Snapshot } from "../runtime/index.ts";
import { HEADROOM } from "./_lib/provisioning.ts";
import { refreshSubject, releasedSubject, type RefreshNotice, type ReleasedNotice } from "../contract/events.ts";
import { rotationsNow, type RotationState, type StaleHolder } from "./_lib/rotation.ts";
import { rotationConfig, valueOf, type Rotation, type RotationConfig, type RotationValue } from "./_lib/rotation-record.ts";

/**
 * docs/rotation.md §8.5, docs/rotation.md §8.6: every second (claimed, so one replica a second),
 * each kept rotation's nodes with a stale holder are noticed at once and again every
 * `renoticeEverySeconds` for `renoticeMinutes`, released or not; once no holder holds it back the
 * provider is told, once, and told again every `releaseEverySeconds` until it acknowledges. What
 * was noticed and released is written in the rotation's record (compare-and-set) once published.
 */
export default defineFunction({
  description:
    "Notices nodes holding a rotated provision (mesh-provisioner.refresh.<node>) and tells the provider when none is stale, until it acknowledges.",
  triggers: [{ cron: "* * * * * *" }],
  config: rotationConfig,
  access: {
    views: ["rotations", "needs", "applied"],
    writes: ["rotations"],
    publishes: ["mesh-provisioner.refresh.*", "mesh-provisioner.released.*"],
  },
  handler: async (_input, ctx) => {
    const now = ctx.clock.now();
    const { views } = ctx;
    // First from what the views hold, without asking the server: most seconds nothing is due.
    const local = await dueOf([views.rotations.localSnapshot(), views.needs.localSnapshot(), views.applied.localSnapshot()]);
    if (local.length === 0) return { noticed: 0, released: 0 };
    const due = await dueOf(await Promise.all([views.rotations.snapshot(), views.needs.snapshot(), views.applied.snapshot()]));
    let noticed = 0;
    let released = 0;
    for (const { rotation: r, state, release, nodes, byNode, again, stillNoticed } of due) {
      const { provider, provision, revision, at } = r;
      let change: Partial<RotationValue> = {};
      if (release !== undefined) {
        // Published, then written: a replica stopped in between leaves it to the next run, so the
        // provider hears it at least once; the claim of each second keeps it to one replica.
        const holder = r.machine === undefined ? {} : { machine: r.machine, consumer: r.consumer };
        const notice = { provision, revision, at, holders: state.holders, ...holder } satisfies ReleasedNotice;
        if (!send(releasedSubject(provider), notice)) continue;
        const sentAt = now.toISOString();
        change =
          release === "first"
            ? { releasedAt: sentAt, releaseSentAt: sentAt, releases: 1 }
            : { releaseSentAt: sentAt, releases: r.releases + 1 };
        if (release === "again") {
          ctx.log.info({ provider, provision, revision, releases: r.releases + 1 }, "release not acknowledged; published again");
        }
      }
      let sent = 0;
      for (const node of nodes) {
        // A node holding more modules than one message carries gets several.
        for (const part of chunks([...byNode.get(node)!], (modules) =>
          JSON.stringify({ provider, provision, revision, at, modules } satisfies RefreshNotice),
        )) {
          if (send(refreshSubject(node), part)) sent++;
        }
      }
      // What is noticed and still stale, so a holder that leaves and comes back is noticed again.
      let noticedModules: readonly string[] = stillNoticed;
      if (sent > 0) {
        noticedModules = [
          ...new Set([...stillNoticed, ...nodes.flatMap((node) => [...byNode.get(node)!].map((m) => `${node}.${m}`))]),
        ].sort();
        const noticedNodes = [...new Set([...r.noticedNodes, ...nodes])].sort();
        change = { ...change, ...(again ? { noticedAt: now.toISOString(), notices: r.notices + 1, noticedNodes } : { noticedNodes }) };
      }
      if (noticedModules.length !== (r.noticedModules?.length ?? -1) || noticedModules.some((m, i) => r.noticedModules![i] !== m)) {
        change = { ...change, noticedModules: [...noticedModules] };
      }
      if (Object.keys(change).length === 0 || !(await record(r, change))) continue;
      noticed += sent;
      if (release === "first") released++;
    }
    return { noticed, released };

    /** What is due now for each kept rotation, from these snapshots of the rotations, needs and applied buckets. */
    async function dueOf([rotations, needs, applied]: Snapshot[]): Promise<Due[]> {
      const { kept, states, stale } = await rotationsNow(rotations!, needs!, applied!);
      return kept.flatMap((r, i) => dueFor(r, states[i]!, stale.get(r.key)!, now, ctx.config.rotation) ?? []);
    }

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

    /**
     * The texts of `items` cut into parts each within the connection's max_payload (less a
     * headroom); `text` writes a part's items as a JSON array of strings, so a part's size is its
     * empty text's and each item's JSON with a comma.
     */
    function chunks(items: string[], text: (part: string[]) => string): string[] {
      const budget = ctx.limits.maxPayload - HEADROOM;
      const empty = Buffer.byteLength(text([]));
      const parts: string[] = [];
      let part: string[] = [];
      let size = empty;
      for (const item of items) {
        const itemSize = Buffer.byteLength(JSON.stringify(item));
        // A comma before each item but a part's first.
        if (part.length > 0 && size + 1 + itemSize > budget) {
          parts.push(text(part));
          part = [];
          size = empty;
        }
        size += (part.length > 0 ? 1 : 0) + itemSize;
        part.push(item);
      }
      if (part.length > 0) parts.push(text(part));
      return parts;
    }

    /**
     * Writes what was done in the rotation's record, unless it changed since it was read (then it
     * is decided again next time). A record too large for one message keeps no `noticedModules`
     * (docs/rotation.md §8.5); a write that fails otherwise is logged, and the other rotations go on.
     */
    async function record(r: Rotation, change: Partial<RotationValue>): Promise<boolean> {
      let value = { ...valueOf(r), ...change };
      let text = JSON.stringify(value);
      if (Buffer.byteLength(text) > ctx.limits.maxPayload - HEADROOM && Array.isArray(value.noticedModules)) {
        const { noticedModules: _dropped, ...kept } = change;
        // Nothing else to write: the record already keeps the nodes alone.
        if (Object.keys(kept).length === 0 && r.noticedModules === null) return false;
        ctx.log.warn(
          { provider: r.provider, provision: r.provision, noticedModules: value.noticedModules.length },
          "rotation record too large for one message: the modules noticed are not kept, their nodes stand for them",
        );
        value = { ...valueOf(r), ...kept, noticedModules: null };
        text = JSON.stringify(value);
      }
      try {
        await ctx.buckets.rotations.update(r.key, text, r.record);
        return true;
      } catch (err) {
        if (err instanceof RevisionConflict) return false;
        ctx.log.error({ provider: r.provider, provision: r.provision, err }, "rotation record not written; tried again at the next run");
        return false;
      }
    }
  },
});

/** What is due for one rotation: its release (the first, or again), and the nodes to notice. */
interface Due {
  readonly rotation: Rotation;
  readonly state: RotationState;
  readonly release?: "first" | "again";
  readonly nodes: readonly string[];
  readonly byNode: ReadonlyMap<string, ReadonlySet<string>>;
  /** Whether this is a notice of every stale node again (rather than only of those not noticed yet). */
  readonly again: boolean;
  /** The modules noticed before and still stale, `<node>.<module>`, sorted. */
  readonly stillNoticed: readonly string[];
}

/** How long, at most, between two publishes of a release not acknowledged, in milliseconds. */
export const RELEASE_EVERY_MAX_MS = 60 * 60_000;

/**
 * What is due at `now` for rotation `r` (docs/rotation.md §8.5, §8.6), or nothing: the first
 * release once no holder holds it back; the release again until the provider acknowledges,
 * `releaseEverySeconds` after the first, the wait doubling after each to at most
 * {@link RELEASE_EVERY_MAX_MS} (not for a release of an earlier version, which published it
 * once); a notice at once to each node with a stale holder not noticed yet (a module not among
 * those noticed and still stale), and to all of them again every `renoticeEverySeconds` for
 * `renoticeMinutes` after the rotation arrived; and the noticed modules written again when some
 * are stale no more.
 */
function dueFor(r: Rotation, state: RotationState, held: readonly StaleHolder[], now: Date, config: RotationConfig): Due | undefined {
  const sinceRelease = r.releaseSentAt === null ? 0 : now.getTime() - Date.parse(r.releaseSentAt);
  const wait = Math.min(config.releaseEverySeconds * 1000 * 2 ** Math.max(0, r.releases - 1), RELEASE_EVERY_MAX_MS);
  const release =
    r.releasedAt === null
      ? state.stale === 0
        ? "first"
        : undefined
      : r.acknowledgedAt === null && r.releases > 0 && sinceRelease >= wait
        ? "again"
        : undefined;
  const byNode = new Map<string, Set<string>>();
  for (const h of held) byNode.set(h.node, (byNode.get(h.node) ?? new Set()).add(h.module));
  const since = r.noticedAt === null ? Infinity : now.getTime() - Date.parse(r.noticedAt);
  const within = now.getTime() - Date.parse(r.arrivedAt) <= config.renoticeMinutes * 60_000;
  const again = r.noticedAt === null || (within && since >= config.renoticeEverySeconds * 1000);
  // A stale holder not noticed yet (a need written since, again, or after the release) is noticed
  // at once. A record of an earlier version kept the nodes noticed, and did not empty them at the release.
  const stale = held.map((h) => `${h.node}.${h.module}`);
  // Kept by node alone (a record of an earlier version before its release, or one whose modules
  // were too many for one message): a stale holder on a node noticed counts as noticed.
  const onNoticedNodes = () => stale.filter((m) => r.noticedNodes.includes(m.slice(0, m.indexOf("."))));
  const noticed = new Set(
    r.noticedModules === null ? onNoticedNodes() : (r.noticedModules ?? (r.releasedAt === null ? onNoticedNodes() : [])),
  );
  const stillNoticed = [...new Set(stale.filter((m) => noticed.has(m)))].sort();
  const nodes = [...byNode.keys()].filter((node) => again || [...byNode.get(node)!].some((m) => !noticed.has(`${node}.${m}`)));
  const forgotten = r.noticedModules !== null && (r.noticedModules?.length ?? 0) !== stillNoticed.length;
  if (release === undefined && nodes.length === 0 && !forgotten) return undefined;
  return { rotation: r, state, ...(release === undefined ? {} : { release }), nodes, byNode, again, stillNoticed };
}
