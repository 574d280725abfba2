/**
 * What the page of docs/page.md §10 shows, read once per request: status (docs/failing.md §5.6),
 * every module's state (docs/state.md §7), the registry and when it was compiled, the events
 * the stream still holds (docs/failing.md §5.8), narrowed by the page's filters.
 */
import { z } from "zod";
import type { ReadStream } from "../../runtime/index.ts";
import type { Failing } from "./follower.ts";
import { historyOf, type HistoryItem } from "./history.ts";
import { decodeKey, token } from "../../contract/keys.ts";
import type { StaleHolder } from "./rotation.ts";
import { oneValueEach } from "./verb/fields.ts";
import {
  countsAgainstAt,
  modulesOf,
  moduleStateAt,
  nodesStatusOf,
  provisioningOf,
  staleHoldersOf,
  stateAt,
  type ModuleState,
  type StateInputs,
} from "./state.ts";
import { readStatus, statusReads, type Status, type StatusContext } from "./status.ts";

/** A pair or triple of tokens joined by `.`: `<node>.<module>`, `<provider>.<machine>.<consumer>`. */
const joined = (count: number, names: string) =>
  z
    .string()
    .refine(
      (s) => s.split(".").length === count && s.split(".").every((part) => token.safeParse(part).success),
      `must be ${names}, each one token (A-Z a-z 0-9 - _ / =)`,
    );

/**
 * The page's query (docs/page.md §10.2): filters by node, module and provider, the module whose
 * details are open, the triple whose timeline is shown; an empty one is absent. Any other field
 * is refused, naming it.
 */
export const pageQuery = oneValueEach(
  z.preprocess(
    // A filter the form sends empty (its "all") is no filter.
    (query) =>
      typeof query === "object" && query !== null ? Object.fromEntries(Object.entries(query).filter(([, v]) => v !== "")) : query,
    z.strictObject({
      node: z.optional(token),
      module: z.optional(token),
      provider: z.optional(token),
      open: joined(2, "<node>.<module>").optional(),
      triple: joined(3, "<provider>.<machine>.<consumer>").optional(),
    }),
  ),
);
export type PageQuery = z.output<typeof pageQuery>;

/** Rows of the grid shown at most; a filter by node shows the others (docs/page.md §10.1). */
export const GRID_NODES = 200;
/** Items of each list shown at most, the rest counted. */
export const LISTED = 100;
/** Events of the stream shown at most under "Recent events"; events of a triple's timeline. */
export const RECENT = 20;
export const TIMELINE = 500;

/** One module's details: its state, its needs, its applied record. */
export interface Opened {
  readonly state: ModuleState | undefined;
  readonly node: string;
  readonly module: string;
  /** Its keys of the needs bucket; `outOfShape` the reason of one that is no need (docs/buckets.md §2.3). */
  readonly needs: readonly { readonly key: string; readonly value: string; readonly outOfShape?: string }[];
  readonly applied: { readonly value: string; readonly at: string } | null;
}

/** What one request of the page reads. */
export interface Overview {
  readonly now: Date;
  readonly query: PageQuery;
  readonly status: Status;
  /** Every node, module and provider known, for the filters. */
  readonly nodes: readonly string[];
  readonly modules: readonly string[];
  readonly providers: readonly string[];
  readonly failing: readonly Failing[];
  readonly stale: readonly StaleHolder[];
  readonly notWell: readonly ModuleState[];
  /** Whether {@link Overview.notWell} is the modules not well of the whole mesh, not narrowed by the provider filter. */
  readonly notWellUnnarrowed: boolean;
  readonly grid: {
    readonly nodes: readonly string[];
    readonly modules: readonly string[];
    readonly cells: ReadonlyMap<string, ModuleState>;
    /** The cells' keys whose module counts against the mesh (docs/state.md §7.6), in the grid's order. */
    readonly notWell: readonly string[];
  };
  /** Nodes the filters reach beyond {@link GRID_NODES}. */
  readonly gridHidden: number;
  readonly registry: readonly { readonly kind: string; readonly value: Record<string, unknown> | null }[];
  readonly compiledAt: string | null;
  readonly recent: readonly HistoryItem[];
  readonly opened: Opened | null;
  readonly timeline: readonly HistoryItem[] | null;
}

/** What the page reads from: its function's `ctx`, what status reads and the events stream, the clock and the limits. */
export interface OverviewContext extends StatusContext {
  readonly streams: Readonly<Record<string, ReadStream>>;
  readonly clock: { now(): Date };
  readonly limits: { readonly maxPayload: number };
}

const decoder = new TextDecoder();
const text = (value: Uint8Array) => decoder.decode(value);

/** The page's reading of the mesh now (docs/page.md §10), narrowed by `query`; `stream` is the events stream's config name. */
export async function overviewOf(ctx: OverviewContext, query: PageQuery, stream: string): Promise<Overview> {
  const now = ctx.clock.now();
  const { graceSeconds } = ctx.config.provisioning;
  const { inputs, model, runtime } = await statusReads(ctx);
  // The banner speaks of the whole mesh, as GET /status does; the lists of what the filters reach.
  const status = await readStatus(
    {},
    { failing: inputs.failing.reads, registry: inputs.registry.reads },
    runtime,
    Number.MAX_SAFE_INTEGER,
    {
      provisioning: provisioningOf(model, now, graceSeconds),
      stale: staleHoldersOf(model, now),
      nodes: nodesStatusOf(model, now),
      checks: { failing: model.checks.failing },
    },
  );
  const { node, module, provider } = query;
  const nodes = new Set<string>();
  const modules = new Set<string>();
  const cells = new Map<string, ModuleState>();
  const notWellCells: string[] = [];
  const gridNodes = new Set<string>();
  let gridHidden = 0;
  for (const tracked of modulesOf(model.modules)) {
    const { node: n, module: m } = tracked.base;
    nodes.add(n);
    modules.add(m);
    if ((node !== undefined && n !== node) || (module !== undefined && m !== module)) continue;
    if (!gridNodes.has(n) && gridNodes.size >= GRID_NODES) {
      gridHidden++;
      continue;
    }
    gridNodes.add(n);
    cells.set(tracked.base.key, stateAt(model, tracked, now, graceSeconds));
    if (countsAgainstAt(model, tracked, now)) notWellCells.push(tracked.base.key);
  }
  const reaches = (f: { provider?: string; node?: string; machine?: string; module?: string; consumer?: string }) =>
    (provider === undefined || f.provider === undefined || f.provider === provider) &&
    (node === undefined || (f.node ?? f.machine) === node) &&
    (module === undefined || (f.module ?? f.consumer) === module);
  const providers = new Set([
    ...status.failing.map((f) => f.provider),
    ...status.stale.map((s) => s.provider),
    ...(await inputs.rotations.reads.list(">")).map((e) => e.key.split(".")[0]!),
  ]);
  const events = ctx.streams[stream]!;
  const [registry, recent, opened, timeline] = await Promise.all([
    inputs.registry.reads.list(">"),
    historyOf(events, { provider, machine: node, consumer: module }, { count: RECENT }),
    query.open === undefined
      ? null
      : openedOf(inputs, query.open, cells.get(query.open) ?? moduleStateAt(model, query.open, now, graceSeconds)),
    query.triple === undefined
      ? null
      : (() => {
          const [p, machine, consumer] = query.triple.split(".") as [string, string, string];
          return historyOf(events, { provider: p, machine, consumer }, { count: TIMELINE });
        })(),
  ]);
  return {
    now,
    query,
    status,
    nodes: [...nodes].sort(),
    modules: [...modules].sort(),
    providers: [...providers].sort(),
    failing: status.failing.filter(reaches),
    stale: status.stale.filter(reaches),
    // A module names no provider: the provider filter leaves them all, said so in their list.
    notWell: status.provisioning.notWell.filter(
      (m) => (node === undefined || m.node === node) && (module === undefined || m.module === module),
    ),
    notWellUnnarrowed: provider !== undefined,
    grid: { nodes: [...gridNodes], modules: [...new Set([...cells.values()].map((s) => s.module))].sort(), cells, notWell: notWellCells },
    gridHidden,
    registry: registry.map((e) => {
      let value: Record<string, unknown> | null = null;
      try {
        value = JSON.parse(text(e.value));
      } catch {}
      return { kind: e.key, value };
    }),
    compiledAt: status.registry.compiledAt,
    recent,
    opened,
    timeline,
  };
}

/** A module's details: its state, its needs (`<node>.<module>.>`) and its applied record (`<node>.<module>`), values as the node wrote them. */
async function openedOf(inputs: StateInputs, key: string, state: ModuleState | undefined): Promise<Opened> {
  const [node, module] = key.split(".") as [string, string];
  const [needs, applied] = await Promise.all([inputs.needs.reads.list([`${key}.>`], { limit: LISTED }), inputs.applied.reads.get(key)]);
  return {
    state,
    node,
    module,
    needs: needs.map((e) => {
      const decoded = decodeKey("needs", e.key);
      return { key: e.key, value: text(e.value), ...(decoded.ok ? {} : { outOfShape: decoded.reason }) };
    }),
    applied: applied === null ? null : { value: text(applied.value), at: applied.created.toISOString() },
  };
}
