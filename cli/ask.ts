import { Option } from "commander";
import { isSafeNumber, LosslessNumber, parse, stringify } from "lossless-json";
import prettyMilliseconds from "pretty-ms";
import { ServiceError, type NatsConnection } from "nats";
import { ASKED, NARROWINGS, VERB, VERB_SHAPE, type Answer, type Asked, type Entries, type What } from "../functions/_lib/provisioning.ts";
import { writtenOut } from "../functions/_lib/text.ts";

const decoder = new TextDecoder();

/**
 * Sends one request to a verb of the function set and parses its JSON answer. Throws nats.js's
 * `ServiceError` with the code and message of a refusal (docs/verb.md §4), or the request's error (no
 * responders, timeout) with a hint.
 */
export async function askVerb<T>(nc: NatsConnection, subject: string, request: Record<string, unknown>): Promise<T> {
  let reply;
  try {
    reply = await nc.request(subject, JSON.stringify(request), { timeout: 10_000 });
  } catch (err) {
    const message = (err as Error).message;
    throw new Error(
      /503|no responders/i.test(message)
        ? `nothing answers ${subject}: is the function set running (npm start)?`
        : /timeout/i.test(message)
          ? // Asked across an account's import (a node's or a provider's user), no set running is a timeout too: the server says no "no responders" there.
            `${subject}: no answer within 10 s: the set is busy or cannot answer (its /readyz says why), or, asked as a node's or provider's user, no set is running`
          : `${subject}: ${message}`,
    );
  }
  const refused = ServiceError.toServiceError(reply);
  if (refused !== null) throw refused;
  const text = decoder.decode(reply.data);
  try {
    return parse(text, undefined, exactNumber) as T;
  } catch {
    // A value a node wrote with a key twice (lossless-json refuses it): read as JSON reads it, the last one kept.
    return JSON.parse(text) as T;
  }
}

/**
 * A number of an answer as a JavaScript number when that keeps every digit, else as its digits
 * (a `LosslessNumber`, written back as they are): values past double precision keep them
 * (docs/verb.md §4.4) in tables and in `--json` alike.
 */
const exactNumber = (digits: string) => (isSafeNumber(digits) ? Number(digits) : new LosslessNumber(digits));

export type { BucketEntry, Entries } from "../functions/_lib/provisioning.ts";

/** The answer to a request for `what` W: its entries are W's. */
export type AnswerOf<W extends Asked> = Omit<Answer, "what" | "entries"> & { readonly what: W; readonly entries: Entries[W][] };

/**
 * A request of the verb: `what` and its fields. The verb refuses a `what` it does not know, so the
 * answer to a `what` known only as a string is that of any of {@link ASKED}.
 */
export type AskRequest<W extends string> = { readonly what: W; readonly [field: string]: unknown };

/** Asks `mesh-provisioner.provisioning` once (docs/verb.md §4): one page. */
export function askOnce<W extends string>(nc: NatsConnection, request: AskRequest<W>): Promise<AnswerOf<W & Asked>> {
  return askVerb<AnswerOf<W & Asked>>(nc, VERB, request);
}

/**
 * Asks every page of a request (following `next`) and returns them as one answer. Read `stale`,
 * its `confirmedAt` is the oldest of its pages' (`null` when one was never confirmed): each page
 * holds what was acknowledged before its own time only (docs/verb.md §4.6.1).
 */
export async function askAll<W extends string>(nc: NatsConnection, request: AskRequest<W>): Promise<AnswerOf<W & Asked>> {
  let page = await askOnce(nc, request);
  const entries = [...page.entries];
  const outOfShape = [...page.outOfShape];
  let confirmedAt = page.confirmedAt;
  while (page.next !== undefined) {
    page = await askOnce(nc, { ...request, cursor: page.next });
    entries.push(...page.entries);
    outOfShape.push(...page.outOfShape);
    if (confirmedAt !== undefined && confirmedAt !== null && page.confirmedAt !== undefined) {
      confirmedAt = page.confirmedAt === null || Date.parse(page.confirmedAt) < Date.parse(confirmedAt) ? page.confirmedAt : confirmedAt;
    }
  }
  return { what: page.what, entries, outOfShape, ...(confirmedAt !== undefined ? { confirmedAt } : {}) };
}

/** The help of the `what` argument: every `what`, `registry, needs, applied, collect or state`. */
export const whatHelp = `${ASKED.slice(0, -1).join(", ")} or ${ASKED.at(-1)}`;

/** An option of the command line per narrowing field: `--<field> <value>` and its help. */
export const narrowingOptions = (): Option[] =>
  NARROWINGS.map((field) => new Option(`--${field} <${VERB_SHAPE.narrowings[field].value}>`, VERB_SHAPE.narrowings[field].help));

const WIDEST_VALUE = 72;

/**
 * Text as a table cell shows it: control and format characters (which could break the table,
 * drive the terminal or reorder what it shows) written as `\uXXXX`, and at most `width` characters, a longer text cut with `…`
 * (whole with {@link showWhole}).
 */
export function shown(text: string, width: number): string {
  const safe = writtenOut(text, /[\p{Cc}\p{Cf}\u2028\u2029]/gu);
  if (whole) return safe;
  const chars = [...safe];
  return chars.length > width ? `${chars.slice(0, width - 1).join("")}…` : safe;
}

let whole = false;
/** Whether {@link shown} shows every text whole (`--wide`) instead of cutting it at its width. */
export const showWhole = (on: boolean): void => {
  whole = on;
};

function cell(entry: Record<string, unknown>, column: string): string {
  if (column === "where") {
    const v = entry.value as Record<string, string>;
    if (v.verb !== undefined) return `verb ${v.verb}`;
    return `bucket ${v.bucket} key ${v.key}${v.collection !== undefined ? ` collection ${v.collection}` : ""}`;
  }
  if (column === "module" && entry.kind !== undefined && entry.node === undefined) {
    return String((entry.value as Record<string, unknown>).module);
  }
  const value = entry[column];
  return shown(typeof value === "string" ? value : (stringify(value) ?? "undefined"), WIDEST_VALUE);
}

/** Lines of aligned columns, the first row being the header. */
export function table(rows: readonly (readonly string[])[]): string[] {
  const widths = rows[0]!.map((_, i) => Math.max(...rows.map((row) => row[i]!.length)));
  return rows.map((row) => row.map((text, i) => (i === row.length - 1 ? text : text.padEnd(widths[i]!))).join("  "));
}

/** An answer's keys out of shape with their reasons, after a blank line; nothing when there are none. */
export function outOfShapeLines(outOfShape: readonly { readonly key: string; readonly reason: string }[]): string[] {
  if (outOfShape.length === 0) return [];
  return ["", `out of shape (${outOfShape.length}):`, ...outOfShape.map((o) => `  ${shown(o.key, 200)}: ${shown(o.reason, 200)}`)];
}

/** An answer as a readable table, then its out-of-shape keys with their reasons. */
export function formatAnswer(answer: AnswerOf<What>): string {
  const { columns } = VERB_SHAPE.whats[answer.what];
  const lines =
    answer.entries.length === 0
      ? [`no ${answer.what} entries`]
      : [
          ...table([columns.map((c) => c.toUpperCase()), ...answer.entries.map((e) => columns.map((c) => cell(e, c)))]),
          `${answer.entries.length} ${answer.what} entr${answer.entries.length === 1 ? "y" : "ies"}`,
        ];
  lines.push(...outOfShapeLines(answer.outOfShape));
  if (answer.next !== undefined) lines.push("", `more remain: --cursor ${answer.next}`);
  if (answer.confirmedAt !== undefined) lines.push("", `from memory: last confirmed current ${answer.confirmedAt ?? "never"}`);
  return lines.join("\n");
}

/** How long from `since` to `now`, in at most two units without spaces: `3h12m`, `45s`. */
export function failingFor(since: string, now: Date): string {
  const ms = Math.max(0, now.getTime() - Date.parse(since));
  if (ms < 1000) return "0s";
  return prettyMilliseconds(ms, { unitCount: 2, secondsDecimalDigits: 0 }).replaceAll(" ", "");
}
