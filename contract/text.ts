/**
 * Text as the set keeps it and a client sends it: a long text cut to a length. Imports nothing.
 */

/** `text` of at most `max` characters (code points): a longer one cut and marked with `…`. */
export function cutText(text: string, max: number): string {
  const chars = [...text];
  return chars.length <= max ? text : `${chars.slice(0, max - 1).join("")}…`;
}
