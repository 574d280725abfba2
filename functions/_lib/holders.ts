/**
 * Holders (docs/rotation.md §8.1): who holds a provision (the needs naming it), indexed from the
 * needs view and kept up to date, and what each holder has in use (its module's applied record).
 */
import type { Entry, Snapshot } from "../../runtime/index.ts";
import { TOKEN } from "../../contract/keys.ts";
import { appliedOf } from "./applied.ts";
import { keeping } from "./keeping.ts";

/** One holder: a need of a provision (docs/rotation.md §8.1). */
export interface Holder {
  readonly key: string;
  readonly node: string;
  readonly module: string;
  readonly kind: string;
  readonly name: string;
}

/** The provision of a need's name: up to its first `/` (docs/rotation.md §8.1). */
export const provisionOf = (name: string) => {
  const slash = name.indexOf("/");
  return slash === -1 ? name : name.slice(0, slash);
};

/** The holder a needs key names, when it is one: four tokens (docs/rotation.md §8.1). */
function holderOf(key: string): Holder | undefined {
  const tokens = key.split(".");
  if (tokens.length !== 4 || tokens.some((t) => !TOKEN.test(t))) return undefined;
  const [node, module, kind, name] = tokens as [string, string, string, string];
  return { key, node, module, kind, name };
}

/** The index in `list` (sorted by key) of `key`, or where it would go. */
function indexOf(list: readonly Holder[], key: string): number {
  let lo = 0;
  let hi = list.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (list[mid]!.key < key) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

// The holders of each provision: made from every needs key once, then updated from the keys
// changed since (docs/runtime.md §6.12). A provision's list is replaced, never changed, so a
// caller keeping one keeps what it was.
const holders = keeping(
  async ({ needs }: { needs: Snapshot }) => {
    const byProvision = new Map<string, Holder[]>();
    for (const entry of await needs.reads.list(">")) {
      const h = holderOf(entry.key);
      if (h === undefined) continue;
      const provision = provisionOf(h.name);
      let list = byProvision.get(provision);
      if (list === undefined) byProvision.set(provision, (list = []));
      list.push(h);
    }
    return byProvision;
  },
  async (byProvision, { needs }, changes) => {
    const found = await Promise.all(changes.needs.map(async (key) => [key, await needs.reads.get(key)] as const));
    for (const [key, entry] of found) {
      const h = holderOf(key);
      if (h === undefined) continue;
      const provision = provisionOf(h.name);
      const list = [...(byProvision.get(provision) ?? [])];
      const at = indexOf(list, key);
      const held = list[at]?.key === key;
      if (entry === null && !held) continue;
      list.splice(at, held ? 1 : 0, ...(entry === null ? [] : [h]));
      if (list.length === 0) byProvision.delete(provision);
      else byProvision.set(provision, list);
    }
    return byProvision;
  },
);

/** The holders of every provision, from the needs' keys (in key order), kept and updated as the needs change. */
export const holdersIndex = (needs: Snapshot): Promise<ReadonlyMap<string, readonly Holder[]>> => holders({ needs });

/**
 * What one holder has in use: its module's applied `revisions[provision]`, when that record was
 * written (the server's time), and whether its revisions could be read at all.
 */
export interface Held {
  readonly revision: string | null;
  readonly appliedAt: Date | null;
  readonly appliedNanos: number | null;
  /** The record is there but its revisions cannot be read (not JSON, not an object, `revisions` not an object of strings). */
  readonly unreadable: boolean;
}

/** What a holder holds, from the applied records by key (docs/state.md §7.2). */
export const heldIn =
  (applied: ReadonlyMap<string, Entry>) =>
  (holder: Holder, provision: string): Held => {
    const entry = applied.get(`${holder.node}.${holder.module}`);
    if (entry === undefined) return { revision: null, appliedAt: null, appliedNanos: null, unreadable: false };
    const read = appliedOf(entry);
    return {
      revision: read.revisions?.[provision] ?? null,
      appliedAt: entry.created,
      appliedNanos: entry.createdNanos,
      unreadable: read.revisionsUnread === true,
    };
  };
