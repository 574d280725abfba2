import * as z from "zod/mini";

/** A key token (docs/buckets.md §2): one or more of `A-Z a-z 0-9 - _ / =`. */
export const TOKEN = /^[A-Za-z0-9\-_/=]+$/;

/**
 * The longest token a narrowing may hold, in characters: filters are carried in NATS subjects,
 * whose protocol line is 4 KiB at most, so no narrowing may make one longer.
 */
export const MAX_TOKEN = 256;
/** The longest key token a collection name may encode to, in characters. */
export const MAX_COLLECTION_TOKEN = 1024;

/** A narrowing value: one token, so it can never widen a key filter (docs/verb.md §4). */
export const token = z
  .string()
  .check(
    z.regex(TOKEN, "must be one token (A-Z a-z 0-9 - _ / =): no '.', '*', '>', white space, nor nothing"),
    z.maxLength(MAX_TOKEN, `must be at most ${MAX_TOKEN} characters`),
  );

/** A provision (docs/rotation.md §8.1): a need's name up to its first `/`, so one token holding no `/`. */
export const provisionName = token.check(
  z.refine((p) => !p.includes("/"), "a provision is a need's name up to its first /, so it holds no /"),
);

/** A collection name (docs/buckets.md §2): any non-empty, well-formed string; it is encoded into its token. */
export const collectionName = z.string().check(
  z.minLength(1, "must be a non-empty collection name"),
  z.refine((s) => s.isWellFormed(), "must be well-formed Unicode (no lone surrogate)"),
  z.refine(
    (s) => encodeCollection(s).length <= MAX_COLLECTION_TOKEN,
    `is too long: its key token may be at most ${MAX_COLLECTION_TOKEN} characters`,
  ),
);

const PLAIN = /^[A-Za-z0-9\-_/]$/;
const HEX = "0123456789ABCDEF";
const utf8 = new TextDecoder("utf-8", { fatal: true });

/**
 * A collection name's key token (docs/buckets.md §2): every byte of its UTF-8 form outside
 * `A-Z a-z 0-9 - _ /` is written `=` and two upper-case hex digits (`shell:zsh:normal` →
 * `shell=3Azsh=3Anormal`). `name` must be non-empty and well-formed.
 */
export function encodeCollection(name: string): string {
  let out = "";
  for (const byte of new TextEncoder().encode(name)) {
    const char = String.fromCharCode(byte);
    out += byte < 0x80 && PLAIN.test(char) ? char : `=${HEX[byte >> 4]}${HEX[byte & 15]}`;
  }
  return out;
}

/**
 * The collection name a key token encodes, or why it encodes none: a bad `=` escape, bytes that
 * are not UTF-8, or a form {@link encodeCollection} would not write (so each name has one key).
 */
export function decodeCollection(tokenText: string): { ok: true; name: string } | { ok: false; reason: string } {
  const bytes: number[] = [];
  for (let i = 0; i < tokenText.length; i++) {
    const char = tokenText[i]!;
    if (char !== "=") {
      bytes.push(char.charCodeAt(0));
      continue;
    }
    const hex = tokenText.slice(i + 1, i + 3);
    if (!/^[0-9A-F]{2}$/.test(hex)) {
      return { ok: false, reason: `bad = escape at offset ${i}: "=${hex}" is not = and two upper-case hex digits` };
    }
    bytes.push(parseInt(hex, 16));
    i += 2;
  }
  let name: string;
  try {
    name = utf8.decode(new Uint8Array(bytes));
  } catch {
    return { ok: false, reason: "its = escapes are not UTF-8" };
  }
  if (encodeCollection(name) !== tokenText) {
    return { ok: false, reason: `not the canonical encoding of "${name}" (that is ${encodeCollection(name)})` };
  }
  return { ok: true, name };
}

/** The key shape of each bucket (docs/buckets.md §2), token by token. */
export const SHAPES = {
  registry: ["kind"],
  needs: ["node", "module", "kind", "name"],
  applied: ["node", "module"],
  collect: ["node", "collection", "contributor"],
  failing: ["provider", "machine", "consumer"],
  assignments: ["node", "module"],
  presence: ["node"],
  checks: ["node", "module", "provision"],
} as const;

/** A bucket's key shape, by the bucket's name in {@link SHAPES}. */
export type ShapeName = keyof typeof SHAPES;
export type Field<S extends ShapeName> = (typeof SHAPES)[S][number];
export type Fields<S extends ShapeName> = { [F in Field<S>]: string };

const plural = (n: number) => `${n} token${n === 1 ? "" : "s"}`;

/**
 * Reads a key of the bucket of shape `name` into its fields (a collection token decoded to its
 * name), or says why the key is out of shape: its number of tokens, an empty token, a character
 * a token cannot hold, or a bad collection token.
 */
export function decodeKey<S extends ShapeName>(name: S, key: string): { ok: true; fields: Fields<S> } | { ok: false; reason: string } {
  const shape: readonly string[] = SHAPES[name];
  const tokens = key.split(".");
  if (tokens.length !== shape.length) {
    return { ok: false, reason: `${name} keys have ${plural(shape.length)}, this has ${tokens.length}` };
  }
  const fields: Record<string, string> = {};
  for (const [i, field] of shape.entries()) {
    const text = tokens[i]!;
    if (text === "") return { ok: false, reason: `token ${i + 1} (${field}) is empty` };
    if (!TOKEN.test(text)) return { ok: false, reason: `token ${i + 1} (${field}) holds a character a token cannot` };
    if (field === "collection") {
      const decoded = decodeCollection(text);
      if (!decoded.ok) return { ok: false, reason: `token ${i + 1} (collection): ${decoded.reason}` };
      fields[field] = decoded.name;
    } else {
      fields[field] = text;
    }
  }
  return { ok: true, fields: fields as Fields<S> };
}

/**
 * The key filters that reach every key of shape `name` matching `narrowing`: the given tokens
 * in place (a collection encoded) and `*` for the others up to the last given one, then that
 * prefix alone and followed by `>`, so keys with too few or too many tokens are reached too and
 * said out of shape. Only ever built from {@link token}-checked values and encoded collections:
 * no value can widen it.
 */
export function filtersFor<S extends ShapeName>(name: S, narrowing: Partial<Fields<S>>): string[] {
  const shape: readonly string[] = SHAPES[name];
  const given = narrowing as Partial<Record<string, string>>;
  const tokens = shape.map((field) => {
    const value = given[field];
    if (value === undefined) return "*";
    return field === "collection" ? encodeCollection(value) : value;
  });
  const last = tokens.findLastIndex((t) => t !== "*");
  if (last === -1) return [">"];
  const prefix = tokens.slice(0, last + 1).join(".");
  return [prefix, `${prefix}.>`];
}
