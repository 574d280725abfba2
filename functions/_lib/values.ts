/**
 * The values the set keeps in its own buckets, read back (docs/buckets.md §2): one record's JSON
 * value as its schema reads it, and every entry of a bucket of one key shape, each key's fields
 * with its value, or said out of shape with why.
 */
import type { z } from "zod";
import { formatIssues } from "../../runtime/index.ts";
import { decodeKey, type Fields, type ShapeName } from "../../contract/keys.ts";

const decoder = new TextDecoder();

/** `bytes` as JSON that `schema` reads, or `undefined` when it is not JSON or not of that shape. */
export function jsonOf<T>(schema: z.ZodType<T>, bytes: Uint8Array): T | undefined {
  try {
    const result = schema.safeParse(JSON.parse(decoder.decode(bytes)));
    return result.success ? result.data : undefined;
  } catch {
    return undefined;
  }
}

/**
 * The `entries` of a bucket of key shape `shape`, in their order: each key's fields and its
 * value as `schema` reads it; a key not of the shape, a value not JSON or not `described` (the
 * value's shape in words, `{ word, since, at }`) in `outOfShape` with why.
 */
export function valuesOf<S extends ShapeName, T>(
  shape: S,
  schema: z.ZodType<T>,
  described: string,
  entries: readonly { key: string; value: Uint8Array }[],
): { values: { key: string; fields: Fields<S>; value: T }[]; outOfShape: { key: string; reason: string }[] } {
  const values: { key: string; fields: Fields<S>; value: T }[] = [];
  const outOfShape: { key: string; reason: string }[] = [];
  for (const { key, value } of entries) {
    const decoded = decodeKey(shape, key);
    if (!decoded.ok) {
      outOfShape.push({ key, reason: decoded.reason });
      continue;
    }
    let json: unknown;
    try {
      json = JSON.parse(decoder.decode(value));
    } catch (err) {
      outOfShape.push({ key, reason: `value is not JSON: ${(err as Error).message}` });
      continue;
    }
    const checked = schema.safeParse(json);
    if (!checked.success) outOfShape.push({ key, reason: `value is not ${described}: ${formatIssues(checked.error.issues)}` });
    else values.push({ key, fields: decoded.fields, value: checked.data });
  }
  return { values, outOfShape };
}
