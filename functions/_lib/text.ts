/**
 * Text and ordering the domain's files share: counting in words, comparing keys (cutting a text
 * to a length is the contract's, contract/text.ts). Imported, never copied.
 */

/**
 * `text` with each character `pattern` matches written out as `\uXXXX` (its code point in hex):
 * how the command line and the page show control and direction characters that someone else
 * wrote. `pattern` must be global.
 */
export const writtenOut = (text: string, pattern: RegExp): string =>
  text.replace(pattern, (c) => `\\u${c.codePointAt(0)!.toString(16).padStart(4, "0")}`);

/** `n` and its noun: `1 need`, `3 needs`; `pluralForm` when adding `s` is not the plural. */
export const plural = (n: number, singular: string, pluralForm = `${singular}s`): string => `${n} ${n === 1 ? singular : pluralForm}`;

/** Strings in the order of their UTF-16 code units, as `Array.prototype.sort` orders them (and the views order keys). */
export const compareText = (a: string, b: string): number => (a < b ? -1 : a > b ? 1 : 0);

/** Items with a `key` in the order of their keys ({@link compareText}). */
export const byKey = (a: { readonly key: string }, b: { readonly key: string }): number => compareText(a.key, b.key);

/** Whether `a` and `b` are the same as JSON text (the order of their fields included). */
export const sameJson = (a: unknown, b: unknown): boolean => JSON.stringify(a) === JSON.stringify(b);
