import { z } from "zod";
import type { ReadBucket, RuntimeRecords, StoreUse } from "../../runtime/index.ts";
import { EVENTS_STREAM, failingOf, type Failing } from "./follower.ts";
import { filtersFor, token } from "../../contract/keys.ts";
import { HEADROOM } from "./provisioning.ts";
import type { StaleHolder } from "./rotation.ts";
import { oneValueEach } from "./verb/fields.ts";
import {
  PRESENCES,
  provisioningSchema,
  readModel,
  type Model,
  type NodesStatus,
  type Provisioning,
  type StateContext,
  type StateInputs,
} from "./state.ts";

/** The status verb's subject (docs/failing.md §5). */
export const STATUS = "mesh-provisioner.status";
/** The function whose last scheduled run is the registry's `compiledAt`. */
export const COMPILE_FUNCTION = "registry-compile";

/** The narrowing of status: each a token, like the verb's (docs/verb.md §4). */
export const statusRequest = oneValueEach(
  z.strictObject({
    provider: z.optional(token),
    machine: z.optional(token),
    consumer: z.optional(token),
  }),
);
export type StatusRequest = z.output<typeof statusRequest>;

/** The status answer (docs/failing.md §5). */
export interface Status {
  /** True only when nothing the narrowing reaches is failing. */
  readonly well: boolean;
  /** Sorted by provider, machine, consumer. */
  readonly failing: Failing[];
  /** Keys of the failing bucket that are no triple or hold no failing value: failing all the same. */
  readonly outOfShape: { key: string; reason: string }[];
  /** Keys left out (out of shape first, then failing triples) because the answer would not fit in one reply. */
  readonly omitted: number;
  readonly registry: { readonly kinds: string[]; readonly compiledAt: string | null };
  /** Events the follower refused (not JSON, or not an event), since the bucket was made. */
  readonly rejectedEvents: number;
  readonly events: Events;
  /** Modules by state, and those that count against the mesh (docs/state.md §7.5). */
  readonly provisioning: Provisioning;
  /** Holders stale past the rotation's grace (docs/rotation.md §8.3). */
  readonly stale: StaleHolder[];
  /** Nodes by presence, and the unreachable ones (docs/presence.md §16.3). */
  readonly nodes: NodesStatus;
  /** How many kept checks fail (docs/presence.md §16.5): each also a module's `CheckFailing`. */
  readonly checks: { readonly failing: number };
}

/** The nodes of a status that speaks of no node (narrowed by provider). */
export const NO_NODES: NodesStatus = Object.freeze({ counts: Object.freeze({ reachable: 0, unreachable: 0, silent: 0 }), unreachable: [] });

/** Whether the mesh can record providers' events now, and what the follower holds of them (docs/failing.md §5.6). */
export interface Events {
  /** False while JetStream refuses the set's writes or does not answer them: providers' events are refused too. */
  readonly recording: boolean;
  /** Why not, in the server's words; `null` while recording. */
  readonly reason: string | null;
  /** When the server was last asked; `null` before the first time. */
  readonly checkedAt: string | null;
  /** The events stream's use against its limit. */
  readonly stream: { readonly name: string; readonly bytes: number; readonly maxBytes: number | null; readonly messages: number } | null;
  /** The seat's account's JetStream storage against its own limit (`null`: none, the server's applies). */
  readonly account: { readonly bytes: number; readonly maxBytes: number | null } | null;
  /** Events stored and not delivered yet to the follower. */
  readonly pending: number;
  /**
   * Events delivered to a replica of the set and not acknowledged yet: not in `failing` yet. A
   * replica that stopped holds them until `ackWaitSeconds` have passed, then another gets them.
   */
  readonly unacknowledged: number;
  readonly ackWaitSeconds: number | null;
}

const outOfShapeItem = z.object({ key: z.string(), reason: z.string() });

/** The status answer as a schema, for the service's description of it ($SRV.INFO). */
export const statusAnswer = z.object({
  well: z.boolean(),
  failing: z.array(
    z.object({ provider: z.string(), machine: z.string(), consumer: z.string(), word: z.string(), since: z.string(), at: z.string() }),
  ),
  outOfShape: z.array(outOfShapeItem),
  omitted: z.number().int(),
  registry: z.object({ kinds: z.array(z.string()), compiledAt: z.string().nullable() }),
  rejectedEvents: z.number().int(),
  events: z.object({
    recording: z.boolean(),
    reason: z.string().nullable(),
    checkedAt: z.string().nullable(),
    stream: z.object({ name: z.string(), bytes: z.number(), maxBytes: z.number().nullable(), messages: z.number() }).nullable(),
    account: z.object({ bytes: z.number(), maxBytes: z.number().nullable() }).nullable(),
    pending: z.number().int(),
    unacknowledged: z.number().int(),
    ackWaitSeconds: z.number().nullable(),
  }),
  provisioning: provisioningSchema,
  stale: z.array(
    z.object({
      provider: z.string(),
      provision: z.string(),
      node: z.string(),
      module: z.string(),
      key: z.string(),
      revision: z.string(),
      heldRevision: z.string().nullable(),
      rotatedAt: z.string(),
      appliedAt: z.string().nullable(),
    }),
  ),
  nodes: z.object({
    counts: z.object(Object.fromEntries(PRESENCES.map((p) => [p, z.number().int()])) as Record<(typeof PRESENCES)[number], z.ZodNumber>),
    unreachable: z.array(z.object({ node: z.string(), since: z.string(), lastSeen: z.string() })),
  }),
  checks: z.object({ failing: z.number().int() }),
}) satisfies z.ZodType<Status>;

/**
 * What status says of the events (docs/failing.md §5.6), from what the runtime last found of the
 * server: whether JetStream stores, the events stream and the account against their limits, and
 * the events the stream's durable consumer has not delivered yet, and has not had acknowledged (the
 * most of any durable it lists: it lists one, docs/failing.md §5.4).
 */
export function eventsOf(store: StoreUse): Events {
  const stream = store.streams[EVENTS_STREAM];
  const most = (pick: (c: { pending: number; unacknowledged: number }) => number) => Math.max(0, ...(stream?.consumers ?? []).map(pick));
  return {
    recording: store.refusing === null && !stream?.missing,
    reason: store.refusing ?? stream?.missing ?? null,
    checkedAt: store.checkedAt,
    stream:
      stream === undefined ? null : { name: stream.stream, bytes: stream.bytes, maxBytes: stream.maxBytes, messages: stream.messages },
    account: store.account,
    pending: most((c) => c.pending),
    unacknowledged: most((c) => c.unacknowledged),
    ackWaitSeconds: stream?.ackWaitSeconds ?? null,
  };
}

/** How many failing triples the failing bucket holds (its live keys in shape), and how many keys are out of shape (docs/failing.md §5). */
export async function countFailing(failing: ReadBucket): Promise<{ failing: number; outOfShape: number }> {
  const found = failingOf(await failing.list(">"));
  return { failing: found.failing.length, outOfShape: found.outOfShape.length };
}

/**
 * Status (docs/failing.md §5) of what `request` narrows to, from the failing and registry buckets and
 * the runtime's count of refused events and what it found JetStream stores. `well` is false
 * while any reached key is failing or out of shape, while the mesh cannot record events, while
 * a module counts against the mesh (`provisioning`, docs/state.md §7), a holder is stale past its
 * grace (`stale`, docs/rotation.md §8.3), a node is unreachable (`nodes`,
 * docs/presence.md §16.3) or a kept check fails (`checks`, docs/presence.md §16.5: a module
 * the state does not list has checks too). When the answer would not fit in `maxPayload`, out-of-shape keys and
 * then the last failing triples are left out, and counted in `omitted`.
 */
export async function readStatus(
  request: StatusRequest,
  buckets: { failing: ReadBucket; registry: ReadBucket },
  runtime: { lastRun(name: string): Promise<{ at: Date } | null>; refusedEvents(): Promise<{ count: number }>; store(): StoreUse },
  maxPayload: number,
  of: {
    readonly provisioning: Provisioning;
    readonly stale: StaleHolder[];
    readonly nodes: NodesStatus;
    readonly checks: { readonly failing: number };
  },
): Promise<Status> {
  const { provisioning, stale, nodes, checks } = of;
  const [entries, kinds, compiled, refused] = await Promise.all([
    buckets.failing.list(filtersFor("failing", request)),
    buckets.registry.list(">"),
    runtime.lastRun(COMPILE_FUNCTION),
    runtime.refusedEvents(),
  ]);
  const { failing, outOfShape } = failingOf(entries);
  const events = eventsOf(runtime.store());
  const status: Status = {
    well:
      failing.length === 0 &&
      outOfShape.length === 0 &&
      events.recording &&
      provisioning.notWell.length === 0 &&
      stale.length === 0 &&
      nodes.unreachable.length === 0 &&
      checks.failing === 0,
    failing,
    outOfShape,
    omitted: 0,
    registry: { kinds: kinds.map((e) => e.key), compiledAt: compiled?.at.toISOString() ?? null },
    rejectedEvents: refused.count,
    events,
    provisioning,
    stale,
    nodes,
    checks,
  };
  return fitted(status, maxPayload - HEADROOM);
}

/**
 * `status` cut to `budget` bytes of JSON: stale holders go first (all but one), then unreachable
 * nodes (all but one; their count stays), then modules not
 * well (counted in `provisioning.omitted`), then out-of-shape keys, then failing triples from the
 * end; all but the modules counted in `omitted`.
 */
function fitted(status: Status, budget: number): Status {
  const itemBytes = (item: unknown) => Buffer.byteLength(JSON.stringify(item)) + 1;
  let size = Buffer.byteLength(JSON.stringify(status)) + 32; // room for larger `omitted`s
  if (size <= budget) return status;
  const notWell = [...status.provisioning.notWell];
  const stale = [...status.stale];
  while (size > budget && stale.length > 1) size -= itemBytes(stale.pop());
  // `nodes.counts.unreachable` still says how many there are.
  const unreachable = [...status.nodes.unreachable];
  while (size > budget && unreachable.length > 1) size -= itemBytes(unreachable.pop());
  const outOfShape = [...status.outOfShape];
  const failing = [...status.failing];
  while (size > budget && notWell.length > 0) size -= itemBytes(notWell.pop());
  while (size > budget && outOfShape.length > 0) size -= itemBytes(outOfShape.pop());
  while (size > budget && failing.length > 0) size -= itemBytes(failing.pop());
  const omitted = status.failing.length - failing.length + status.outOfShape.length - outOfShape.length;
  const provisioning = { ...status.provisioning, notWell, omitted: status.provisioning.notWell.length - notWell.length };
  const nodes = { ...status.nodes, unreachable };
  return { ...status, failing, outOfShape, omitted: omitted + status.stale.length - stale.length, provisioning, stale, nodes };
}

/** What a reader of the whole status needs of its `ctx` (docs/failing.md §5.6): the state's views, its graces, the runtime's records. */
export interface StatusContext extends StateContext {
  readonly runtime: RuntimeRecords & { store(): StoreUse };
}

/**
 * Every read status makes, at once: the model of the state's views now, each view checked
 * current once (docs/state.md §7.5), the compile's last run and the refused events (the
 * runtime's records). `runtime` answers from what was read.
 */
export async function statusReads(
  ctx: StatusContext,
): Promise<{ inputs: StateInputs; model: Model; runtime: RuntimeRecords & { store(): StoreUse } }> {
  const [{ inputs, model }, compiled, refused] = await Promise.all([
    readModel(ctx),
    ctx.runtime.lastRun(COMPILE_FUNCTION),
    ctx.runtime.refusedEvents(),
  ]);
  return { inputs, model, runtime: { lastRun: async () => compiled, refusedEvents: async () => refused, store: ctx.runtime.store } };
}
