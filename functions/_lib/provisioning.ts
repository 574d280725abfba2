import { createHash } from "node:crypto";
import { LRUCache } from "lru-cache";
import { z } from "zod";
import { badInput, formatIssues, JsonText, type Entry } from "../../runtime/index.ts";
import { collectionName, decodeKey, filtersFor, token, type Field, type ShapeName } from "../../contract/keys.ts";
import { registryValue } from "./registry.ts";
import { modulesOf, moduleStateSchema, stateAt, STATES, type Model } from "./state.ts";
import { HISTORY, HISTORY_NARROWINGS, historyEntrySchema, type HistoryItem } from "./history.ts";
import { rfc3339 } from "../../contract/times.ts";

/** The verb's subject (docs/verb.md §4). */
export const VERB = "mesh-provisioner.provisioning";

/**
 * The shape of the verb (docs/verb.md §4), its one description: each `what` it answers (the first the
 * default), with the narrowing fields it takes and the columns the CLI's table shows of it; each
 * narrowing field, in the order it is checked and offered, with the schema of its value and how
 * the CLI asks for it (`--<field> <value>`, and its help).
 */
export const VERB_SHAPE = {
  whats: {
    registry: { narrowings: ["kind"], columns: ["kind", "module", "where"] },
    needs: { narrowings: ["node", "module", "kind"], columns: ["node", "module", "kind", "name", "value"] },
    applied: { narrowings: ["node", "module"], columns: ["node", "module", "value"] },
    collect: { narrowings: ["node", "collection", "contributor"], columns: ["node", "collection", "contributor", "value"] },
  },
  narrowings: {
    node: { schema: token, value: "node", help: "narrow to one node" },
    module: { schema: token, value: "module", help: "narrow to one module" },
    kind: { schema: token, value: "kind", help: "narrow to one kind" },
    contributor: { schema: token, value: "contributor", help: "narrow to one contributor" },
    collection: { schema: collectionName, value: "name", help: "narrow to one collection, by its name (shell:zsh:normal)" },
    provision: { schema: token, value: "provision", help: "the provision (holders: required; rotations: narrow to one)" },
    provider: { schema: token, value: "provider", help: "narrow to one provider" },
    machine: { schema: token, value: "machine", help: "narrow to one machine (history)" },
    consumer: { schema: token, value: "consumer", help: "narrow to one consumer (history)" },
  },
} as const satisfies {
  // Each `what` is a bucket's key shape, and narrows only by fields of its keys.
  readonly whats: { readonly [S in ShapeName]?: { readonly narrowings: readonly Field<S>[]; readonly columns: readonly string[] } };
  readonly narrowings: Readonly<Record<string, { readonly schema: z.ZodType<string>; readonly value: string; readonly help: string }>>;
};

/** The views the verb answers. */
export type What = keyof typeof VERB_SHAPE.whats;
/** A narrowing field of the request. */
export type Narrowing = keyof typeof VERB_SHAPE.narrowings;

/** Every `what`, in the order of {@link VERB_SHAPE}. */
export const WHATS = Object.keys(VERB_SHAPE.whats) as [What, ...What[]];
/** The `what` of a request that names none. */
export const DEFAULT_WHAT = WHATS[0];
/** Every narrowing field, in the order of {@link VERB_SHAPE}. */
export const NARROWINGS = Object.keys(VERB_SHAPE.narrowings) as Narrowing[];

/** The `what` of the module states (docs/state.md §7), answered from the views of several buckets, not one. */
export const STATE = "state";
/** The `what` of a provision's holders (docs/rotation.md §8.1). */
export const HOLDERS = "holders";
/** The `what` of the kept rotations (docs/rotation.md §8.6). */
export const ROTATIONS = "rotations";
export { HISTORY };
/** Every `what` a request may name: the buckets', the module states, the holders, the rotations and the events' history. */
export const ASKED = [...WHATS, STATE, HOLDERS, ROTATIONS, HISTORY] as const;
export type Asked = (typeof ASKED)[number];
/** What the module states narrow by: the node and module of their keys. */
export const STATE_NARROWINGS = ["node", "module"] as const satisfies readonly Narrowing[];
/** What each `what` beyond the buckets' takes. */
const DERIVED_NARROWINGS: Readonly<Record<typeof STATE | typeof HOLDERS | typeof ROTATIONS | typeof HISTORY, readonly Narrowing[]>> = {
  [STATE]: STATE_NARROWINGS,
  [HOLDERS]: ["provision", "node", "kind"],
  [ROTATIONS]: ["provider", "provision"],
  [HISTORY]: HISTORY_NARROWINGS,
};

/** The narrowing fields `what` takes. */
const narrowingsOf = (what: Asked): readonly Narrowing[] =>
  what === STATE || what === HOLDERS || what === ROTATIONS || what === HISTORY
    ? DERIVED_NARROWINGS[what]
    : VERB_SHAPE.whats[what].narrowings;

export const DEFAULT_LIMIT = 1000;
export const MAX_LIMIT = 10_000;

/** A whole number given as a JSON number or, from an HTTP query, as digits. */
const count = z
  .union([z.number(), z.string().regex(/^\d+$/).transform(Number)], { error: "must be a whole number" })
  .pipe(z.number().int().min(1).max(MAX_LIMIT));

type NarrowingFields = { [F in Narrowing]: z.ZodOptional<(typeof VERB_SHAPE.narrowings)[F]["schema"]> };
const narrowingFields = Object.fromEntries(
  NARROWINGS.map((field) => [field, VERB_SHAPE.narrowings[field].schema.optional()]),
) as NarrowingFields;

/**
 * The request of `mesh-provisioner.provisioning` (docs/verb.md §4): `what` (default `registry`), the
 * narrowings that apply to it, `limit` (1 to 10,000, default 1,000) and `cursor`. An unknown
 * field, a narrowing that does not apply to `what`, or a narrowing that is not one token
 * (a collection: a non-empty name) is refused, naming the field.
 */
export const provisioningRequest = z
  .strictObject({
    what: z.enum(ASKED).default(DEFAULT_WHAT),
    ...narrowingFields,
    // With what=state: one state of docs/state.md §7.
    state: z.enum(STATES).optional(),
    // With what=history: the events stored at or after this time (docs/failing.md §5.8).
    since: rfc3339.optional(),
    limit: count.default(DEFAULT_LIMIT),
    cursor: z.string().min(1).optional(),
    // Answer from the live view without asking the server whether it is current (docs/verb.md §4.6).
    stale: z
      .union([z.boolean(), z.enum(["true", "false"]).transform((text) => text === "true")], { error: "must be true or false" })
      .optional(),
  })
  .superRefine((request, ctx) => {
    const applies = narrowingsOf(request.what);
    for (const field of NARROWINGS) {
      if (request[field] !== undefined && !applies.includes(field)) {
        const narrowableWhats = ASKED.filter((what) => narrowingsOf(what).includes(field));
        ctx.addIssue({
          code: "custom",
          path: [field],
          message: `does not apply to what=${request.what} (it narrows ${narrowableWhats.join(", ")})`,
        });
      }
    }
    if (request.what === HOLDERS && request.provision === undefined) {
      ctx.addIssue({
        code: "custom",
        path: ["provision"],
        message: `is required with what=${HOLDERS}: the provision whose holders to list`,
      });
    }
    if (request.state !== undefined && request.what !== STATE) {
      ctx.addIssue({ code: "custom", path: ["state"], message: `does not apply to what=${request.what} (it narrows ${STATE})` });
    }
    if (request.since !== undefined && request.what !== HISTORY) {
      ctx.addIssue({ code: "custom", path: ["since"], message: `does not apply to what=${request.what} (it narrows ${HISTORY})` });
    }
  });

export type ProvisioningRequest = z.output<typeof provisioningRequest>;
/** A request of one bucket's view (every `what` but {@link STATE}). */
export type BucketRequest = ProvisioningRequest & { readonly what: What };

/**
 * The members of an answer page (docs/verb.md §4), in the order its JSON text writes them: the schema
 * of the service's description ($SRV.INFO) and the page's text are both made from it.
 */
const ANSWER_MEMBERS = {
  what: z.enum(ASKED),
  entries: z.array(
    z.union([
      z
        .looseObject({ key: z.string(), value: z.unknown(), revision: z.number().int(), at: z.string() })
        .describe("the key, its fields by name (node, module, kind, name, collection, contributor), the value as the node wrote it"),
      moduleStateSchema.describe("with what=state: a module's state, since when, and its conditions (docs/state.md §7)"),
      historyEntrySchema.describe("with what=history: an event the stream holds, newest first (docs/failing.md §5.8)"),
    ]),
  ),
  // Each a key the narrowing reached that is not an entry, and why.
  outOfShape: z.array(z.object({ key: z.string(), reason: z.string() })),
  next: z.string().optional(),
  // With `stale`: when the view was last confirmed current (RFC 3339), or null if never.
  confirmedAt: z.string().nullable().optional(),
};

/** An answer page as a schema, for the service's description of it ($SRV.INFO). */
export const answerSchema = z.object(ANSWER_MEMBERS);

/** One page of the verb's answer (docs/verb.md §4). */
export type Answer = z.output<typeof answerSchema>;

const MEMBER_NAMES = Object.keys(ANSWER_MEMBERS) as (keyof Answer)[];

/** An answer page's JSON text from each member's JSON text, in the order of its members; an absent one is left out. */
function answerText(members: { readonly [M in keyof Answer]: string }): string {
  const written: string[] = [];
  for (const name of MEMBER_NAMES) {
    const text = members[name];
    if (text !== undefined) written.push(`${JSON.stringify(name)}:${text}`);
  }
  return `{${written.join(",")}}`;
}

/** The narrowing of a request, as key fields. */
function narrowingOf(request: ProvisioningRequest): Record<string, string> {
  const fields = narrowingsOf(request.what).flatMap((field) => (request[field] === undefined ? [] : [[field, request[field]]]));
  if (request.state !== undefined) fields.push(["state", request.state]);
  if (request.since !== undefined) fields.push(["since", request.since]);
  return Object.fromEntries(fields);
}

/** The key filters a request reads with: never the whole bucket when it narrows. */
export function requestFilters(request: BucketRequest): string[] {
  return filtersFor(request.what, narrowingOf(request));
}

/** Characters of a request's fingerprint in its cursors. */
const FINGERPRINT = 16;
const fingerprint = (request: ProvisioningRequest) =>
  createHash("sha256")
    .update(JSON.stringify([request.what, narrowingOf(request)]))
    .digest("base64url")
    .slice(0, FINGERPRINT);

/** A cursor's JSON: the key its page continues after, and the fingerprint of its request. */
const cursorJson = (after: string, of: string) => JSON.stringify({ after, of });
const cursorOf = (after: string, of: string) => Buffer.from(cursorJson(after, of)).toString("base64url");
/** Characters of the base64url text (unpadded) of `bytes` bytes. */
const base64urlLength = (bytes: number) => Math.ceil((bytes * 4) / 3);

/** The opaque cursor of the page after `key`, tied to the request's narrowing. */
export function cursorAfter(request: ProvisioningRequest, key: string): string {
  return cursorOf(key, fingerprint(request));
}

/** The cursors of one request, made once for it: its fingerprint is computed once. */
export interface Cursors {
  /** The key the request's cursor continues after; undefined when it has none. */
  readonly after: string | undefined;
  /** The cursor of the page after `key`. */
  next(key: string): string;
  /** Characters (bytes) of {@link Cursors.next}`(key)`, without making it. */
  length(key: string): number;
}

const NOT_A_CURSOR = "cursor: not a cursor of this verb; pass the `next` of the previous page";

/** A request's cursors; throws a 400 for a cursor not issued for it. */
export function cursorsOf(request: ProvisioningRequest): Cursors {
  // Made at the first cursor read or made: most narrowed answers have none.
  let of: string | undefined;
  const ofRequest = () => (of ??= fingerprint(request));
  // The cursor's JSON less its key's: the same for every key (a fingerprint is FINGERPRINT characters).
  const frame = Buffer.byteLength(cursorJson("", "x".repeat(FINGERPRINT))) - Buffer.byteLength(JSON.stringify(""));
  return {
    after: request.cursor === undefined ? undefined : cursorKey(request.cursor, ofRequest()),
    next: (key) => cursorOf(key, ofRequest()),
    length: (key) => base64urlLength(frame + Buffer.byteLength(JSON.stringify(key))),
  };
}

/** The key `cursor` continues after; throws a 400 for a cursor not issued for the request of fingerprint `of`. */
function cursorKey(cursor: string, of: string): string {
  let decoded: { after?: unknown; of?: unknown };
  try {
    decoded = JSON.parse(Buffer.from(cursor, "base64url").toString("utf8"));
  } catch {
    throw badInput(NOT_A_CURSOR);
  }
  if (typeof decoded?.after !== "string" || typeof decoded.of !== "string") throw badInput(NOT_A_CURSOR);
  if (decoded.of !== of) throw badInput("cursor: was issued for another what or narrowing; ask with the same ones");
  return decoded.after;
}

const utf8 = new TextDecoder("utf-8", { fatal: true });

/**
 * An item of the answer for one stored key, as JSON text: an entry, its value the node's JSON
 * exactly as written, or an `outOfShape` item saying why it is none.
 */
export type Item = { readonly entry: string } | { readonly outOfShape: string };

const outOfShape = (key: string, reason: string): { outOfShape: string } => ({ outOfShape: JSON.stringify({ key, reason }) });

/** The item of one stored key (docs/verb.md §4): an entry, or why it is out of shape. */
export function itemOf(what: What, entry: Entry): Item {
  const decoded = decodeKey(what, entry.key);
  if (!decoded.ok) return outOfShape(entry.key, decoded.reason);
  let text: string;
  let value: unknown;
  try {
    // The decoder drops a byte-order mark; what is left parses, so it is one JSON value.
    text = utf8.decode(entry.value);
    value = JSON.parse(text);
  } catch (err) {
    return outOfShape(entry.key, `value is not JSON: ${(err as Error).message}`);
  }
  if (what === "registry") {
    const checked = registryValue.safeParse(value);
    if (!checked.success) return outOfShape(entry.key, `value is not a registry value: ${formatIssues(checked.error.issues)}`);
    if (checked.data.kind !== entry.key) return outOfShape(entry.key, `value is of kind ${checked.data.kind}, not ${entry.key}`);
  }
  const fields = JSON.stringify({ key: entry.key, ...decoded.fields }).slice(0, -1);
  return { entry: `${fields},"value":${text.trim()},"revision":${entry.revision},"at":"${entry.created.toISOString()}"}` };
}

/** Bytes kept free in a reply (or any message the set publishes) beyond the answer's own JSON. */
export const HEADROOM = 1024;

/**
 * The items of small answers made last, with their bytes, by what and key, each for the
 * revision it was made from: a narrowing asked again and again (a node's own needs) is not made
 * again until its keys change. Pages longer than {@link REMEMBERED} walk a bucket and are not
 * remembered; the cache is bounded in items and bytes, and keeps no large item. The revision and
 * write time together tell the value: a bucket made again starts its revisions again.
 */
const made = new LRUCache<string, { revision: number; nanos: number; item: Item; size: number }>({
  max: 10_000,
  maxSize: 16 * 1024 * 1024,
  maxEntrySize: 64 * 1024,
  sizeCalculation: (made) => made.size,
});
const REMEMBERED = 100;

function madeItem(what: What, entry: Entry, remember: boolean): { item: Item; size: number } {
  const key = remember ? `${what} ${entry.key}` : "";
  let found = remember ? made.get(key) : undefined;
  if (found === undefined || found.revision !== entry.revision || found.nanos !== entry.createdNanos) {
    const item = itemOf(what, entry);
    found = {
      revision: entry.revision,
      nanos: entry.createdNanos,
      item,
      size: Buffer.byteLength("entry" in item ? item.entry : item.outOfShape) + 1,
    };
    if (remember) made.set(key, found);
  }
  return found;
}

/** The members of an empty page of `what`, as JSON text. */
const emptyPage = (what: Asked) => ({ what: JSON.stringify(what), entries: "[]", outOfShape: "[]" });

/**
 * Bytes a page counts for its `next` besides the cursor: those of `,"next":""`, and one spare
 * (pages have always been cut with it).
 */
const NEXT_BYTES =
  Buffer.byteLength(answerText({ ...emptyPage(DEFAULT_WHAT), next: JSON.stringify("") })) -
  Buffer.byteLength(answerText(emptyPage(DEFAULT_WHAT))) +
  1;

/**
 * One page of the answer (docs/verb.md §4), as JSON text of the shape of {@link Answer}, from the
 * entries the request's filters reached, in key order (those after the cursor's key, and one
 * more than `limit` is enough to know whether keys remain): after the cursor's key, at most
 * `limit` items, at most `maxPayload` bytes less a headroom. A value too large for any reply
 * is said in `outOfShape`. `next` is present only when keys remain. `cursors` are the
 * request's (made from it when not given, which throws a 400 for a cursor not issued for it).
 */
export function answerPage(
  request: BucketRequest,
  reached: readonly Entry[],
  maxPayload: number,
  cursors: Cursors = cursorsOf(request),
  confirmedAt?: Date | null,
): JsonText {
  const confirmed = confirmedAt === undefined ? {} : { confirmedAt: JSON.stringify(confirmedAt?.toISOString() ?? null) };
  const { after } = cursors;
  const rows = after === undefined ? reached : reached.filter((e) => e.key > after);
  const budget = maxPayload - HEADROOM;
  const entries: string[] = [];
  const outOfShapes: string[] = [];
  let size = Buffer.byteLength(answerText({ ...emptyPage(request.what), ...confirmed }));
  let taken = 0;
  for (const row of rows) {
    if (taken === request.limit) break;
    let { item, size: itemSize } = madeItem(request.what, row, rows.length <= REMEMBERED);
    if (size + itemSize + NEXT_BYTES + cursors.length(row.key) > budget) {
      if (taken > 0) break;
      const cut = outOfShape(row.key, `its entry (${itemSize} bytes) does not fit in one reply (max_payload ${maxPayload})`);
      item = cut;
      itemSize = Buffer.byteLength(cut.outOfShape) + 1;
    }
    if ("entry" in item) entries.push(item.entry);
    else outOfShapes.push(item.outOfShape);
    size += itemSize;
    taken++;
  }
  return new JsonText(
    answerText({
      what: JSON.stringify(request.what),
      entries: `[${entries.join(",")}]`,
      outOfShape: `[${outOfShapes.join(",")}]`,
      ...(taken < rows.length ? { next: JSON.stringify(cursors.next(rows[taken - 1]!.key)) } : {}),
      ...confirmed,
    }),
  );
}

/**
 * One page of the module states (docs/state.md §7.5) of `model` at `now`, narrowed by the
 * request's node, module and state, in key order, paged as {@link answerItemsPage} pages.
 * `outOfShape` holds the keys that name no module (on the first page, when the request narrows
 * by no node or module).
 */
export function answerStatePage(
  request: ProvisioningRequest,
  model: Model,
  now: Date,
  graceSeconds: number,
  maxPayload: number,
  cursors: Cursors = cursorsOf(request),
  confirmedAt?: Date | null,
): JsonText {
  const { node, module, state } = request;
  function* items(): Generator<{ key: string; text: string }> {
    for (const tracked of modulesOf(model.modules, { node, module, after: cursors.after })) {
      const at = stateAt(tracked, now, graceSeconds);
      if (state === undefined || at.state === state) yield { key: tracked.base.key, text: entryText(tracked, at) };
    }
  }
  const misshapen = node === undefined && module === undefined ? model.outOfShape : [];
  return fillPage(STATE, request.limit, cursors, maxPayload, items(), misshapen, confirmedAt);
}

/**
 * The stream sequence a history request's cursor continues below; `undefined` without a cursor.
 * Throws a 400 for a cursor whose key is not a sequence.
 */
export function historyBefore(cursors: Cursors): number | undefined {
  if (cursors.after === undefined) return undefined;
  if (!/^[1-9]\d{0,15}$/.test(cursors.after)) throw badInput(NOT_A_CURSOR);
  return Number(cursors.after);
}

/**
 * One page of the history (docs/failing.md §5.8): `items` newest first (one more than the page
 * holds is enough to know whether some remain), refused events in `outOfShape` in their place,
 * paged as {@link fillPage} pages, the cursor continuing below the last sequence shown.
 */
export function answerHistoryPage(
  request: ProvisioningRequest,
  items: readonly HistoryItem[],
  maxPayload: number,
  cursors: Cursors,
): JsonText {
  const texts = items.map((item) =>
    "entry" in item
      ? { key: item.entry.key, text: JSON.stringify(item.entry) }
      : { key: item.refused.key, text: JSON.stringify(item.refused), outOfShape: true },
  );
  return fillPage(HISTORY, request.limit, cursors, maxPayload, texts, []);
}

// A module's entry text while it is unchanged and not Late: the model keeps the same object.
const entryTexts = new WeakMap<object, string>();
function entryText(tracked: { base: object }, at: object): string {
  if (at !== tracked.base) return JSON.stringify(at);
  let text = entryTexts.get(tracked.base);
  if (text === undefined) entryTexts.set(tracked.base, (text = JSON.stringify(tracked.base)));
  return text;
}

/**
 * One page of `items` (sorted by key, each its JSON text) for `what`: those after the request's
 * cursor, paged as {@link fillPage} pages.
 */
export function answerItemsPage(
  what: Asked,
  request: ProvisioningRequest,
  items: readonly { key: string; text: string }[],
  maxPayload: number,
  cursors: Cursors = cursorsOf(request),
  outOfShape: readonly { key: string; reason: string }[] = [],
): JsonText {
  const { after } = cursors;
  return fillPage(
    what,
    request.limit,
    cursors,
    maxPayload,
    after === undefined ? items : items.filter((item) => item.key > after),
    outOfShape,
  );
}

/**
 * One page of `items` (in key order, each its JSON text, those after the cursor only): at most
 * `limit` and `maxPayload` bytes less a headroom, `next` when some remain (docs/verb.md §4.4).
 * On a request's first page `outOfShape` goes first, in at most half the page (the rest counted in
 * a last item); a first item larger than any reply is said in `outOfShape`, never a failed page.
 */
function fillPage(
  what: Asked,
  limit: number,
  cursors: Cursors,
  maxPayload: number,
  items: Iterable<{ key: string; text: string; outOfShape?: boolean }>,
  outOfShape: readonly { key: string; reason: string }[],
  confirmedAt?: Date | null,
): JsonText {
  const confirmed = confirmedAt === undefined ? {} : { confirmedAt: JSON.stringify(confirmedAt?.toISOString() ?? null) };
  const budget = maxPayload - HEADROOM;
  const misshapen: string[] = [];
  let size = Buffer.byteLength(answerText({ ...emptyPage(what), ...confirmed }));
  if (cursors.after === undefined) {
    for (const [i, o] of outOfShape.entries()) {
      const text = JSON.stringify(o);
      if (size + Buffer.byteLength(text) + 1 > budget / 2) {
        misshapen.push(JSON.stringify({ key: "…", reason: `${outOfShape.length - i} more keys out of shape, not named here` }));
        size += 200;
        break;
      }
      misshapen.push(text);
      size += Buffer.byteLength(text) + 1;
    }
  }
  const entries: string[] = [];
  // The key the next page continues after: the last one on this page, else what came before it.
  let lastKey = cursors.after ?? "";
  let more = false;
  let taken = 0;
  const iterator = items[Symbol.iterator]();
  for (let next = iterator.next(); !next.done; next = iterator.next()) {
    const item = next.value;
    if (taken === limit) {
      more = true;
      break;
    }
    const itemSize = Buffer.byteLength(item.text) + 1;
    if (size + itemSize + NEXT_BYTES + cursors.length(item.key) > budget) {
      // Full, or the keys out of shape took the room: the next page starts at this item.
      if (entries.length > 0 || misshapen.length > 0) {
        more = true;
        break;
      }
      misshapen.push(
        JSON.stringify({ key: item.key, reason: `its entry (${itemSize} bytes) does not fit in one reply (max_payload ${maxPayload})` }),
      );
      lastKey = item.key;
      more = !iterator.next().done;
      break;
    }
    (item.outOfShape === true ? misshapen : entries).push(item.text);
    size += itemSize;
    lastKey = item.key;
    taken++;
  }
  return new JsonText(
    answerText({
      what: JSON.stringify(what),
      entries: `[${entries.join(",")}]`,
      outOfShape: `[${misshapen.join(",")}]`,
      ...(more ? { next: JSON.stringify(cursors.next(lastKey)) } : {}),
      ...confirmed,
    }),
  );
}
