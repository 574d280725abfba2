/**
 * The applied record a node's client writes after each pass over a module (docs/state.md §7.2):
 * the fields this project reads, a field of the wrong type read as absent and said.
 */
import type { Entry, Snapshot } from "../../runtime/index.ts";
import { keeping } from "./keeping.ts";
import { cutText } from "../../contract/text.ts";

const decoder = new TextDecoder("utf-8", { fatal: true });
/** The longest `error` kept, in characters; a longer one is cut and marked with `…`. */
export const MAX_ERROR = 1024;

/** What is read of an applied record; `revisionsUnread` when its revisions cannot be read (not JSON, not an object, not an object of strings). */
export type AppliedFields = { error?: string; revisions?: Record<string, string>; bad: string[]; revisionsUnread?: true };
/** The fields of an applied record this project reads (docs/state.md §7.2); a field of the wrong type is read as absent and said. */
export function appliedOf(entry: Entry): AppliedFields {
  let value: unknown;
  try {
    value = JSON.parse(decoder.decode(entry.value));
  } catch (err) {
    return { bad: [`applied value is not JSON: ${(err as Error).message}`], revisionsUnread: true };
  }
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    return { bad: ["applied value is not a JSON object"], revisionsUnread: true };
  }
  const { error, revisions } = value as { error?: unknown; revisions?: unknown };
  const bad: string[] = [];
  const read: { error?: string; revisions?: Record<string, string>; revisionsUnread?: true } = {};
  if (error !== undefined) {
    if (typeof error === "string") read.error = cutText(error, MAX_ERROR);
    else bad.push("applied record's error is not a string");
  }
  if (revisions !== undefined) {
    const ok =
      typeof revisions === "object" &&
      revisions !== null &&
      !Array.isArray(revisions) &&
      Object.values(revisions).every((r) => typeof r === "string");
    if (ok) read.revisions = revisions as Record<string, string>;
    else {
      bad.push("applied record's revisions is not an object of strings");
      read.revisionsUnread = true;
    }
  }
  return { ...read, bad };
}

// The applied records by key: listed once, then updated from the keys changed since (docs/runtime.md §6.12).
const index = keeping(
  async ({ applied }: { applied: Snapshot }) => new Map((await applied.reads.list(">")).map((e) => [e.key, e] as const)),
  async (byKey, { applied }, changes) => {
    const found = await Promise.all(changes.applied.map(async (key) => [key, await applied.reads.get(key)] as const));
    for (const [key, entry] of found) {
      if (entry === null) byKey.delete(key);
      else byKey.set(key, entry);
    }
    return byKey;
  },
);

/** Every applied record by its key `<node>.<module>`, kept and updated as the applied bucket changes. */
export const appliedIndex = (applied: Snapshot): Promise<ReadonlyMap<string, Entry>> => index({ applied });
