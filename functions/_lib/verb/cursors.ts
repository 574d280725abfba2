/**
 * The verb's cursors (docs/verb.md §4.5): opaque, each the key its page continues after and a
 * fingerprint of the `what` and narrowing it was issued for.
 */
import { createHash } from "node:crypto";
import { badInput } from "../../../runtime/index.ts";

/** What a request's cursors are tied to: its `what` and its narrowing as key fields. */
export type Identity = readonly [what: string, narrowing: Readonly<Record<string, string>>];

/** Characters of a request's fingerprint in its cursors. */
const FINGERPRINT = 16;
const fingerprint = (identity: Identity) => createHash("sha256").update(JSON.stringify(identity)).digest("base64url").slice(0, FINGERPRINT);

/**
 * A cursor's JSON: the key its page continues after, and the fingerprint of its request; or, for
 * an answer that says keys out of shape before its entries, the last of those its page said (`oos`).
 */
const cursorJson = (after: string, of: string) => JSON.stringify({ after, of });
const cursorOf = (after: string, of: string) => Buffer.from(cursorJson(after, of)).toString("base64url");
const outOfShapeCursorOf = (oos: string, of: string) => Buffer.from(JSON.stringify({ oos, of })).toString("base64url");
/** Characters of the base64url text (unpadded) of `bytes` bytes. */
const base64urlLength = (bytes: number) => Math.ceil((bytes * 4) / 3);

/** The opaque cursor of the page after `key` of the request of `identity`. */
export const cursorAfterKey = (identity: Identity, key: string): string => cursorOf(key, fingerprint(identity));

/** The cursors of one request, made once for it: its fingerprint is computed once. */
export interface Cursors {
  /** The key the request's cursor continues after; undefined when it has none, or continues the keys out of shape said first. */
  readonly after: string | undefined;
  /** With a cursor that continues the keys out of shape said first: the last key its page said; else undefined. */
  readonly outOfShapeAfter: string | undefined;
  /** The cursor of the page after `key`. */
  next(key: string): string;
  /** The cursor of the page after `key`, of the keys out of shape said first: the entries come after them. */
  nextOutOfShape(key: string): string;
  /** Characters (bytes) of {@link Cursors.next}`(key)`, without making it. */
  length(key: string): number;
}

/** Bytes of a cursor's JSON less its key's: the same for every key (a fingerprint is {@link FINGERPRINT} characters). */
const FRAME = Buffer.byteLength(cursorJson("", "x".repeat(FINGERPRINT))) - Buffer.byteLength(JSON.stringify(""));

const NOT_A_CURSOR = "cursor: not a cursor of this verb; pass the `next` of the previous page";

/** The cursors of a request of `identity` given `cursor`; throws a 400 for a cursor not issued for it. */
export function cursorsFor(cursor: string | undefined, identity: Identity): Cursors {
  // Made at the first cursor read or made: most narrowed answers have none.
  let of: string | undefined;
  const ofRequest = () => (of ??= fingerprint(identity));
  const read = cursor === undefined ? undefined : cursorKey(cursor, ofRequest());
  return {
    after: read?.after,
    outOfShapeAfter: read?.oos,
    next: (key) => cursorOf(key, ofRequest()),
    nextOutOfShape: (key) => outOfShapeCursorOf(key, ofRequest()),
    length: (key) => base64urlLength(FRAME + Buffer.byteLength(JSON.stringify(key))),
  };
}

/**
 * The key `cursor` continues after, or the key out of shape it continues after; throws a 400 for
 * a cursor not issued for the request of fingerprint `of`.
 */
function cursorKey(cursor: string, of: string): { after: string; oos?: undefined } | { after?: undefined; oos: string } {
  let decoded: { after?: unknown; oos?: unknown; of?: unknown };
  try {
    decoded = JSON.parse(Buffer.from(cursor, "base64url").toString("utf8"));
  } catch {
    throw badInput(NOT_A_CURSOR);
  }
  const key = decoded?.after ?? decoded?.oos;
  if (typeof key !== "string" || (decoded.after !== undefined) === (decoded.oos !== undefined) || typeof decoded.of !== "string") {
    throw badInput(NOT_A_CURSOR);
  }
  if (decoded.of !== of) throw badInput("cursor: was issued for another what or narrowing; ask with the same ones");
  return decoded.after !== undefined ? { after: key } : { oos: key };
}

/**
 * The stream sequence a cursor continues below (the history's, docs/failing.md §5.8);
 * `undefined` without a cursor. Throws a 400 for a cursor whose key is not a sequence.
 */
export function sequenceBefore(cursors: Cursors): number | undefined {
  if (cursors.after === undefined) return undefined;
  if (!/^[1-9]\d{0,15}$/.test(cursors.after)) throw badInput(NOT_A_CURSOR);
  return Number(cursors.after);
}
