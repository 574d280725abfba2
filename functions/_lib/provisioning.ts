import { createHash } from "node:crypto";
import { LRUCache } from "lru-cache";
import { z } from "zod";
import { badInput, formatIssues, JsonText, type Entry } from "../../runtime/index.ts";
import { collectionName, decodeKey, filtersFor, token, type View } from "./keys.ts";
import { registryValue } from "./registry.ts";

/** The verb's subject (SPEC §4). */
export const VERB = "mesh-provisioner.provisioning";

/** The narrowing fields each `what` takes (SPEC §4). */
export const NARROWINGS = {
  registry: ["kind"],
  needs: ["node", "module", "kind"],
  applied: ["node", "module"],
  collect: ["node", "collection", "contributor"],
} as const satisfies Partial<Record<View, readonly string[]>>;

/** The views the verb answers. */
export type What = keyof typeof NARROWINGS;

type Narrowing = "node" | "module" | "kind" | "contributor" | "collection";
const ALL_NARROWINGS: readonly Narrowing[] = ["node", "module", "kind", "contributor", "collection"];

export const DEFAULT_LIMIT = 1000;
export const MAX_LIMIT = 10_000;

/** A whole number given as a JSON number or, from an HTTP query, as digits. */
const count = z
  .union([z.number(), z.string().regex(/^\d+$/).transform(Number)], { error: "must be a whole number" })
  .pipe(z.number().int().min(1).max(MAX_LIMIT));

/**
 * The request of `mesh-provisioner.provisioning` (SPEC §4): `what` (default `registry`), the
 * narrowings that apply to it, `limit` (1 to 10,000, default 1,000) and `cursor`. An unknown
 * field, a narrowing that does not apply to `what`, or a narrowing that is not one token
 * (a collection: a non-empty name) is refused, naming the field.
 */
export const provisioningRequest = z
  .strictObject({
    what: z.enum(["registry", "needs", "applied", "collect"]).default("registry"),
    node: token.optional(),
    module: token.optional(),
    kind: token.optional(),
    contributor: token.optional(),
    collection: collectionName.optional(),
    limit: count.default(DEFAULT_LIMIT),
    cursor: z.string().min(1).optional(),
  })
  .superRefine((request, ctx) => {
    const applies: readonly string[] = NARROWINGS[request.what];
    for (const field of ALL_NARROWINGS) {
      if (request[field] !== undefined && !applies.includes(field)) {
        const takers = Object.entries(NARROWINGS)
          .filter(([, fields]) => (fields as readonly string[]).includes(field))
          .map(([what]) => what);
        ctx.addIssue({
          code: "custom",
          path: [field],
          message: `does not apply to what=${request.what} (it narrows ${takers.join(", ")})`,
        });
      }
    }
  });

export type ProvisioningRequest = z.output<typeof provisioningRequest>;

/** An item of `outOfShape`: a key the narrowing reached that is not an entry, and why. */
export interface OutOfShape {
  readonly key: string;
  readonly reason: string;
}

/** One page of the verb's answer (SPEC §4). */
export interface Answer {
  readonly what: What;
  readonly entries: Record<string, unknown>[];
  readonly outOfShape: OutOfShape[];
  readonly next?: string;
}

/** An answer page as a schema, for the service's description of it ($SRV.INFO). */
export const answerSchema = z.object({
  what: z.enum(["registry", "needs", "applied", "collect"]),
  entries: z.array(
    z.looseObject({ key: z.string(), value: z.unknown(), revision: z.number().int(), at: z.string() }).describe(
      "the key, its fields by name (node, module, kind, name, collection, contributor), the value as the node wrote it",
    ),
  ),
  outOfShape: z.array(z.object({ key: z.string(), reason: z.string() })),
  next: z.string().optional(),
}) satisfies z.ZodType<Answer>;

/** The narrowing of a request, as key fields. */
function narrowingOf(request: ProvisioningRequest): Record<string, string> {
  return Object.fromEntries(
    NARROWINGS[request.what].flatMap((field) => (request[field] === undefined ? [] : [[field, request[field]]])),
  );
}

/** The key filters a request reads with: never the whole bucket when it narrows. */
export function requestFilters(request: ProvisioningRequest): string[] {
  return filtersFor(request.what, narrowingOf(request));
}

/** Characters of a request's fingerprint in its cursors. */
const FINGERPRINT = 16;
const fingerprint = (request: ProvisioningRequest) =>
  createHash("sha256").update(JSON.stringify([request.what, narrowingOf(request)])).digest("base64url").slice(0, FINGERPRINT);

/** The opaque cursor of the page after `key`, tied to the request's narrowing. */
export function cursorAfter(request: ProvisioningRequest, key: string): string {
  return Buffer.from(JSON.stringify({ after: key, of: fingerprint(request) })).toString("base64url");
}

/** Bytes of `{"next":"<cursor>"}` for a cursor after `key`, without making it: base64url of the cursor's JSON. */
const nextBytes = (key: string) => 11 + Math.ceil(((Buffer.byteLength(JSON.stringify(key)) + FINGERPRINT + 18) * 4) / 3);

/** The key a request's cursor continues after; throws a 400 for a cursor not issued for it. */
export function cursorKey(request: ProvisioningRequest): string | undefined {
  if (request.cursor === undefined) return undefined;
  let decoded: { after?: unknown; of?: unknown };
  try {
    decoded = JSON.parse(Buffer.from(request.cursor, "base64url").toString("utf8"));
  } catch {
    throw badInput("cursor: not a cursor of this verb; pass the `next` of the previous page");
  }
  if (typeof decoded?.after !== "string" || typeof decoded.of !== "string") {
    throw badInput("cursor: not a cursor of this verb; pass the `next` of the previous page");
  }
  if (decoded.of !== fingerprint(request)) {
    throw badInput("cursor: was issued for another what or narrowing; ask with the same ones");
  }
  return decoded.after;
}

const utf8 = new TextDecoder("utf-8", { fatal: true });

/**
 * An item of the answer for one stored key, as JSON text: an entry, its value the node's JSON
 * exactly as written, or an `outOfShape` item saying why it is none.
 */
export type Item = { readonly entry: string } | { readonly outOfShape: string };

const outOfShape = (key: string, reason: string): { outOfShape: string } => ({ outOfShape: JSON.stringify({ key, reason }) });

/** The item of one stored key (SPEC §4): an entry, or why it is out of shape. */
export function itemOf(what: View, entry: Entry): Item {
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

/** Bytes kept free in a reply beyond the answer's own JSON. */
const HEADROOM = 1024;

/**
 * The items of small answers made last, with their bytes, by the entry they came from: a live
 * view hands out the same entry until its key changes, so a narrowing asked again and again (a
 * node's own needs) is not made again. Pages longer than {@link REMEMBERED} walk a bucket and
 * are not remembered; the cache is bounded in items and bytes, and keeps no large item.
 */
const made = new LRUCache<Entry, { item: Item; size: number }>({
  max: 10_000,
  // Bytes: the item's text and the stored value its entry holds on to.
  maxSize: 16 * 1024 * 1024,
  maxEntrySize: 64 * 1024,
  sizeCalculation: (made, entry) => made.size + entry.value.length,
});
const REMEMBERED = 100;

function madeItem(what: View, entry: Entry, remember: boolean): { item: Item; size: number } {
  let found = remember ? made.get(entry) : undefined;
  if (found === undefined) {
    const item = itemOf(what, entry);
    found = { item, size: Buffer.byteLength("entry" in item ? item.entry : item.outOfShape) + 1 };
    if (remember) made.set(entry, found);
  }
  return found;
}

/**
 * One page of the answer (SPEC §4), as JSON text of the shape of {@link Answer}, from the
 * entries the request's filters reached, in key order (those after the cursor's key, and one
 * more than `limit` is enough to know whether keys remain): after the cursor's key, at most
 * `limit` items, at most `maxPayload` bytes less a headroom. A value too large for any reply
 * is said in `outOfShape`. `next` is present only when keys remain. Throws a 400 for a cursor
 * not issued for this request.
 */
export function answerPage(request: ProvisioningRequest, reached: readonly Entry[], maxPayload: number): JsonText {
  const after = cursorKey(request);
  const rows = after === undefined ? reached : reached.filter((e) => e.key > after);
  const budget = maxPayload - HEADROOM;
  const entries: string[] = [];
  const outOfShapes: string[] = [];
  let size = Buffer.byteLength(JSON.stringify({ what: request.what, entries: [], outOfShape: [] }));
  let taken = 0;
  for (const row of rows) {
    if (taken === request.limit) break;
    let { item, size: itemSize } = madeItem(request.what, row, rows.length <= REMEMBERED);
    if (size + itemSize + nextBytes(row.key) > budget) {
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
  const next = taken < rows.length ? `,"next":${JSON.stringify(cursorAfter(request, rows[taken - 1]!.key))}` : "";
  return new JsonText(`{"what":${JSON.stringify(request.what)},"entries":[${entries.join(",")}],"outOfShape":[${outOfShapes.join(",")}]${next}}`);
}
