/**
 * The verb as a table of answerers (docs/verb.md §4, §4.11): one entry per `what`, with its
 * narrowings, its own fields, what it requires, its entry's schema, the views and streams it
 * reads and its answerer. The request's schema, the answer's, the function's access and its
 * dispatch are all made from it (../provisioning.ts, functions/provisioning.ts).
 */
import { z } from "zod";
import { filtersFor, type Fields, type ShapeName } from "../../../contract/keys.ts";
import { rfc3339 } from "../../../contract/times.ts";
import {
  modulesOf,
  moduleStateSchema,
  nodesAt,
  NODE_VIEWS,
  PRESENCES,
  readModel,
  stateAt,
  STATE_VIEWS,
  STATES,
  type ModuleState,
  type NodeEntry,
} from "../state.ts";
import { HISTORY, historyEntrySchema, historyOf, type HistoryEntry } from "../history.ts";
import { EVENTS_STREAM } from "../follower.ts";
import type { RotationState } from "../rotation.ts";
import { flag, type Narrowing } from "./fields.ts";
import { checksOf, checkValue, type Check } from "../checks.ts";
import { presenceAt } from "../state/presence.ts";
import { sequenceBefore } from "./cursors.ts";
import type { PageItem } from "./page.ts";
import { what, type View, type WhatEntry } from "./answerer.ts";
import { bucketEntrySchema, bucketItems, type BucketEntry } from "./buckets.ts";
import { holderItems, rotationItems, type HolderEntry } from "./holders.ts";

/** A `what` of one bucket's keys (docs/verb.md §4.2): the narrowing as key filters, read from the bucket's view. */
const bucket = <S extends ShapeName & View>(
  name: S,
  narrowings: readonly Narrowing[],
  columns: readonly string[],
): WhatEntry<BucketEntry, {}> & { readonly bucket: S; readonly columns: readonly string[] } => ({
  bucket: name,
  ...what<BucketEntry>({
    narrowings,
    columns,
    schema: bucketEntrySchema,
    views: [name],
    answer: async ({ request, narrowing, cursors, ctx }) => {
      const view = ctx.views[name];
      // `stale`: what the view holds now, without asking the server, and since when it is known
      // current (read first: a confirmation after the read would claim more than it holds).
      const confirmedAt = request.stale ? view.confirmedAt() : undefined;
      // One more than the page holds, to know whether keys remain.
      const reached = await (request.stale ? view.local : view).list(filtersFor(name, narrowing as Partial<Fields<S>>), {
        after: cursors.after,
        limit: request.limit + 1,
      });
      return { items: bucketItems(name, reached, cursors.after), confirmedAt };
    },
  }),
  columns,
});

// A module's entry text while it is unchanged and has no condition of the time asked: the model
// keeps the same object, and one text per presence of its node.
const entryTexts = new WeakMap<object, Partial<Record<string, string>>>();
function entryText(tracked: { base: { conditions: readonly unknown[] } }, at: ModuleState): string {
  if (at.conditions !== tracked.base.conditions) return JSON.stringify(at);
  let texts = entryTexts.get(tracked.base);
  if (texts === undefined) entryTexts.set(tracked.base, (texts = {}));
  return (texts[at.presence] ??= JSON.stringify(at));
}

/** How many check keys a `what=checks` narrowed by `ok` reads at a time from its snapshot. */
const CHECKS_CHUNK = 1024;

/** Every `what` the verb answers, the first the default (docs/verb.md §4.1). */
export const WHAT_TABLE = {
  registry: bucket("registry", ["kind"], ["kind", "module", "where"]),
  needs: bucket("needs", ["node", "module", "kind"], ["node", "module", "kind", "name", "value"]),
  applied: bucket("applied", ["node", "module"], ["node", "module", "value"]),
  collect: bucket("collect", ["node", "collection", "contributor"], ["node", "collection", "contributor", "value"]),
  // The module states (docs/state.md §7.5), by key; `outOfShape` the keys that name no module
  // (on the first page, when the request narrows by no node or module).
  state: what<ModuleState, { state: z.ZodOptional<z.ZodEnum<{ [S in (typeof STATES)[number]]: S }>> }>({
    narrowings: ["node", "module"],
    fields: { state: z.enum(STATES).optional() },
    schema: moduleStateSchema.describe("with what=state: a module's state, since when, and its conditions (docs/state.md §7)"),
    views: STATE_VIEWS,
    answer: async ({ request, cursors, ctx }) => {
      const { node, module, state } = request;
      const { model, confirmedAt } = await readModel(ctx, { stale: request.stale });
      const now = ctx.clock.now();
      function* items(): Generator<PageItem> {
        for (const tracked of modulesOf(model.modules, { node, module, after: cursors.after })) {
          const at = stateAt(model, tracked, now, ctx.config.provisioning.graceSeconds);
          if (state === undefined || at.state === state) yield { key: tracked.base.key, text: entryText(tracked, at) };
        }
      }
      return { items: items(), outOfShape: node === undefined && module === undefined ? model.outOfShape : [], confirmedAt };
    },
  }),
  // The nodes and what their presence says (docs/presence.md §16.3), by node.
  nodes: what<NodeEntry, { presence: z.ZodOptional<z.ZodEnum<{ [P in (typeof PRESENCES)[number]]: P }>> }>({
    narrowings: ["node"],
    fields: { presence: z.enum(PRESENCES).optional() },
    schema: z
      .object({
        key: z.string(),
        node: z.string(),
        presence: z.enum(PRESENCES),
        since: z.string().nullable(),
        lastSeen: z.string().nullable(),
        everySeconds: z.number().nullable(),
        client: z.string().nullable(),
        modules: z.number().int(),
      })
      .describe("with what=nodes: a node, what its presence says and since when (docs/presence.md §16.3)"),
    views: STATE_VIEWS,
    answer: async ({ request, cursors, ctx }) => {
      const { node, presence } = request;
      // Fresh of what a node's entry depends on alone; the rest of the model as held.
      const { model, confirmedAt } = await readModel(ctx, { stale: request.stale, fresh: NODE_VIEWS });
      const now = ctx.clock.now();
      function* items(): Generator<PageItem> {
        for (const entry of nodesAt(model, now, { node, after: cursors.after })) {
          if (presence === undefined || entry.presence === presence) yield { key: entry.node, text: JSON.stringify(entry) };
        }
      }
      // The presence keys out of shape (docs/presence.md §16.1): every one, or the node's own when narrowed to one.
      const outOfShape = model.outOfShape.filter((o) =>
        node === undefined ? o.key.startsWith("presence:") : o.key === `presence:${node}`,
      );
      return { items: items(), outOfShape, confirmedAt };
    },
  }),
  // The kept checks (docs/presence.md §16.5), by key, each confirmed while its node is reachable.
  checks: what<Check & { confirmed: boolean }, { ok: z.ZodOptional<typeof flag> }>({
    narrowings: ["node", "module", "provision"],
    fields: { ok: flag.optional() },
    schema: checkValue
      .extend({ key: z.string(), node: z.string(), module: z.string(), provision: z.string(), confirmed: z.boolean() })
      .describe(
        "with what=checks: a module's newest check of a provision, its streak, whether its node confirms it (docs/presence.md §16.5)",
      ),
    views: STATE_VIEWS,
    answer: async ({ request, narrowing, cursors, ctx }) => {
      const { inputs, model, confirmedAt } = await readModel(ctx, { stale: request.stale });
      const now = ctx.clock.now();
      // The snapshot the model was made of: proven current once, for every read below.
      const reads = inputs.checks.reads;
      const filters = filtersFor("checks", narrowing as Partial<Fields<"checks">>);
      // Read in pages until one more than the page holds passed `ok`, or the keys run out; with
      // `ok`, in larger pages, as most keys may not pass it.
      const chunk = request.ok === undefined ? request.limit + 1 : Math.max(request.limit + 1, CHECKS_CHUNK);
      const items: PageItem[] = [];
      for (let after = cursors.after; items.length <= request.limit;) {
        const reached = await reads.list(filters, { after, limit: chunk });
        const { checks, outOfShape } = checksOf(reached);
        const found: PageItem[] = [
          ...checks
            .filter((c) => request.ok === undefined || c.ok === request.ok)
            .map((c) => ({
              key: c.key,
              text: JSON.stringify({ ...c, confirmed: presenceAt(model.presence, c.node, now).presence === "reachable" }),
            })),
          ...outOfShape.map((o) => ({ key: o.key, text: JSON.stringify(o), outOfShape: true })),
        ];
        items.push(...found.sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0)));
        if (reached.length < chunk) break;
        after = reached.at(-1)!.key;
      }
      return { items, confirmedAt };
    },
  }),
  // A provision's holders (docs/rotation.md §8.1).
  holders: what<HolderEntry>({
    narrowings: ["provision", "node", "kind"],
    required: { field: "provision", why: "the provision whose holders to list" },
    views: ["needs", "applied", "rotations"],
    answer: holderItems,
  }),
  // The kept rotations (docs/rotation.md §8.6).
  rotations: what<RotationState>({
    narrowings: ["provider", "provision"],
    views: ["needs", "applied", "rotations"],
    answer: rotationItems,
  }),
  // The events the stream holds, newest first, the cursor continuing below the last sequence shown (docs/failing.md §5.8).
  [HISTORY]: what<HistoryEntry, { since: z.ZodOptional<typeof rfc3339> }>({
    narrowings: ["provider", "machine", "consumer"],
    // The events stored at or after this time.
    fields: { since: z.optional(rfc3339) },
    schema: historyEntrySchema.describe("with what=history: an event the stream holds, newest first (docs/failing.md §5.8)"),
    views: [],
    streams: [EVENTS_STREAM],
    answer: async ({ request, cursors, ctx }) => {
      const { provider, machine, consumer, since } = request;
      const found = await historyOf(
        ctx.streams[EVENTS_STREAM]!,
        { provider, machine, consumer },
        { before: sequenceBefore(cursors), since: since === undefined ? undefined : new Date(since), count: request.limit + 1 },
      );
      const items = found.map((item) =>
        "entry" in item
          ? { key: item.entry.key, text: JSON.stringify(item.entry) }
          : { key: item.refused.key, text: JSON.stringify(item.refused), outOfShape: true },
      );
      return { items };
    },
  }),
} as const;
