/**
 * The one page-filler of the verb (docs/verb.md §4.4, §4.5): items in order, at most `limit` and
 * `max_payload` less a headroom, `next` when some remain, `confirmedAt` with `stale`.
 */
import { z } from "zod";
import { JsonText } from "../../../runtime/index.ts";
import type { Cursors } from "./cursors.ts";

/** Bytes kept free in a reply (or any message the set publishes) beyond the answer's own JSON. */
export const HEADROOM = 1024;

/**
 * The members of an answer page (docs/verb.md §4), in the order its JSON text writes them, given
 * the schemas of `what` and of an entry: the schema of the service's description ($SRV.INFO) and
 * the page's text are both made from it.
 */
export const answerMembers = <W extends z.ZodType, E extends z.ZodType>(what: W, entry: E) => ({
  what,
  entries: z.array(entry),
  // Each a key the narrowing reached that is not an entry, and why.
  outOfShape: z.array(z.object({ key: z.string(), reason: z.string() })),
  next: z.string().optional(),
  // With `stale`: when the view was last confirmed current (RFC 3339), or null if never.
  confirmedAt: z.string().nullable().optional(),
});

type Member = keyof ReturnType<typeof answerMembers>;
const MEMBER_NAMES = Object.keys(answerMembers(z.string(), z.unknown())) as Member[];

/** An answer page's JSON text from each member's JSON text, in the order of its members; an absent one is left out. */
function answerText(members: { readonly [M in Member]?: string }): string {
  const written: string[] = [];
  for (const name of MEMBER_NAMES) {
    const text = members[name];
    if (text !== undefined) written.push(`${JSON.stringify(name)}:${text}`);
  }
  return `{${written.join(",")}}`;
}

/** The members of an empty page of `what`, as JSON text. */
const emptyPage = (what: string) => ({ what: JSON.stringify(what), entries: "[]", outOfShape: "[]" });

/**
 * Bytes a page counts for its `next` besides the cursor: those of `,"next":""`, and one spare
 * (pages have always been cut with it).
 */
const NEXT_BYTES = Buffer.byteLength(answerText({ ...emptyPage(""), next: '""' })) - Buffer.byteLength(answerText(emptyPage(""))) + 1;

/**
 * An item of a page: its key (what a cursor continues after), its JSON text, whether it is said
 * in `outOfShape` rather than `entries`, and its bytes with a comma when known.
 */
export interface PageItem {
  readonly key: string;
  readonly text: string;
  readonly outOfShape?: boolean;
  readonly size?: number;
}

/** What an answerer gives the page: its items, its keys out of shape, and, with `stale`, since when it is known current. */
export interface PageSource {
  /** In key order (the history's: newest first), those after the cursor only; one more than `limit` tells that some remain. */
  readonly items: Iterable<PageItem>;
  /** Said first on a request's first page. */
  readonly outOfShape?: readonly { readonly key: string; readonly reason: string }[];
  readonly confirmedAt?: Date | null;
}

/** What a page is cut to: the request's `limit`, the connection's `max_payload`, the request's cursors. */
export interface PageBounds {
  readonly limit: number;
  readonly maxPayload: number;
  readonly cursors: Cursors;
}

/**
 * One page of `what` (docs/verb.md §4.4): at most `limit` items and `maxPayload` bytes less
 * {@link HEADROOM}, `next` when some remain. `outOfShape` (keys of the views an answer is made
 * of, not of its entries) is said first, in key order, over as many pages as it takes: a page
 * that cannot hold the rest of them holds no entry, its `next` continuing them; the entries
 * follow. An item larger than any reply is said in `outOfShape` when it is the first of its page,
 * never a failed page.
 */
export function fillPage(what: string, { limit, maxPayload, cursors }: PageBounds, source: PageSource): JsonText {
  const { confirmedAt, outOfShape = [] } = source;
  const confirmed = confirmedAt === undefined ? {} : { confirmedAt: JSON.stringify(confirmedAt?.toISOString() ?? null) };
  const budget = maxPayload - HEADROOM;
  const misshapen: string[] = [];
  let size = Buffer.byteLength(answerText({ ...emptyPage(what), ...confirmed }));
  // Items of the page so far: the keys out of shape said first count against `limit` too.
  let taken = 0;
  if (cursors.after === undefined && outOfShape.length > 0) {
    const from = cursors.outOfShapeAfter;
    const pending = outOfShape
      .filter((o) => from === undefined || o.key > from)
      .sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0));
    let said: string | undefined;
    for (const [i, o] of pending.entries()) {
      let text = JSON.stringify(o);
      if (size + Buffer.byteLength(text) + 1 + NEXT_BYTES + cursors.length(o.key) > budget && i === 0) {
        // Larger than any reply: said by its key alone.
        text = JSON.stringify({ key: o.key, reason: `its reason does not fit in one reply (max_payload ${maxPayload})` });
      }
      // A page holds at least one item.
      if (said !== undefined && (taken === limit || size + Buffer.byteLength(text) + 1 + NEXT_BYTES + cursors.length(o.key) > budget)) {
        return page(what, [], misshapen, cursors.nextOutOfShape(said), confirmed);
      }
      misshapen.push(text);
      size += Buffer.byteLength(text) + 1;
      said = o.key;
      taken++;
    }
  }
  const entries: string[] = [];
  // The key the next page continues after: the last one on this page, else what came before it.
  let lastKey = cursors.after ?? "";
  let more = false;
  for (const item of source.items) {
    if (taken === limit) {
      more = true;
      break;
    }
    let itemSize = item.size ?? Buffer.byteLength(item.text) + 1;
    let { text, outOfShape: misfit = false } = item;
    if (size + itemSize + NEXT_BYTES + cursors.length(item.key) > budget) {
      // Full, or the keys out of shape took the room: the next page starts at this item.
      if (entries.length > 0 || misshapen.length > 0) {
        more = true;
        break;
      }
      text = JSON.stringify({
        key: item.key,
        reason: `its entry (${itemSize} bytes) does not fit in one reply (max_payload ${maxPayload})`,
      });
      itemSize = Buffer.byteLength(text) + 1;
      misfit = true;
    }
    (misfit ? misshapen : entries).push(text);
    size += itemSize;
    lastKey = item.key;
    taken++;
  }
  return page(what, entries, misshapen, more ? cursors.next(lastKey) : undefined, confirmed);
}

/** A page's JSON text from its items' texts, its `next` cursor and its `confirmedAt` member. */
function page(
  what: string,
  entries: readonly string[],
  misshapen: readonly string[],
  next: string | undefined,
  confirmed: { readonly confirmedAt?: string },
): JsonText {
  return new JsonText(
    answerText({
      what: JSON.stringify(what),
      entries: `[${entries.join(",")}]`,
      outOfShape: `[${misshapen.join(",")}]`,
      ...(next === undefined ? {} : { next: JSON.stringify(next) }),
      ...confirmed,
    }),
  );
}
