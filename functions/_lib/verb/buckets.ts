/**
 * The `what`s of one bucket's keys (docs/verb.md §4.2, §4.4): each key the narrowing reaches, an
 * entry (its fields by name, its value as the node wrote it) or why it is out of shape.
 */
import { LRUCache } from "lru-cache";
import { z } from "zod";
import { formatIssues, type Entry } from "../../../runtime/index.ts";
import { decodeKey, type ShapeName } from "../../../contract/keys.ts";
import { registryValue } from "../registry.ts";
import type { PageItem } from "./page.ts";

/** An entry of a bucket's view, as the answer's schema describes it. */
export const bucketEntrySchema = z
  .looseObject({ key: z.string(), value: z.unknown(), revision: z.number().int(), at: z.string() })
  .describe("the key, its fields by name (node, module, kind, name, collection, contributor), the value as the node wrote it");
/** An entry of a bucket's view (docs/verb.md §4.4): the key, its fields by name, the value as the node wrote it. */
export type BucketEntry = z.output<typeof bucketEntrySchema>;

const utf8 = new TextDecoder("utf-8", { fatal: true });

const outOfShape = (key: string, reason: string): PageItem => ({ key, text: JSON.stringify({ key, reason }), outOfShape: true });

/** The item of one stored key of bucket `what` (docs/verb.md §4.4): an entry, or why it is out of shape. */
export function itemOf(what: ShapeName, entry: Entry): PageItem {
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
  return {
    key: entry.key,
    text: `${fields},"value":${text.trim()},"revision":${entry.revision},"at":"${entry.created.toISOString()}"}`,
  };
}

/**
 * The items of small answers made last, with their bytes, by what and key, each for the
 * revision it was made from: a narrowing asked again and again (a node's own needs) is not made
 * again until its keys change. Pages longer than {@link REMEMBERED} walk a bucket and are not
 * remembered; the cache is bounded in items and bytes, and keeps no large item. The revision and
 * write time together tell the value: a bucket made again starts its revisions again.
 */
const made = new LRUCache<string, { revision: number; nanos: number; item: PageItem }>({
  max: 10_000,
  maxSize: 16 * 1024 * 1024,
  maxEntrySize: 64 * 1024,
  sizeCalculation: (made) => made.item.size!,
});
const REMEMBERED = 100;

function madeItem(what: ShapeName, entry: Entry, remember: boolean): PageItem {
  const key = remember ? `${what} ${entry.key}` : "";
  let found = remember ? made.get(key) : undefined;
  if (found === undefined || found.revision !== entry.revision || found.nanos !== entry.createdNanos) {
    const item = itemOf(what, entry);
    found = { revision: entry.revision, nanos: entry.createdNanos, item: { ...item, size: Buffer.byteLength(item.text) + 1 } };
    if (remember) made.set(key, found);
  }
  return found.item;
}

/** The items of the stored keys `reached` (in key order) after the key `after`, each made when the page takes it. */
export function* bucketItems(what: ShapeName, reached: readonly Entry[], after: string | undefined): Generator<PageItem> {
  const rows = after === undefined ? reached : reached.filter((e) => e.key > after);
  for (const row of rows) yield madeItem(what, row, rows.length <= REMEMBERED);
}
