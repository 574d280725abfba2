import type { NatsConnection } from "nats";
import type { Answer } from "../functions/_lib/provisioning.ts";
import { VERB } from "../functions/_lib/provisioning.ts";

/** The verb refused a request: its SPEC §4 code and message. */
export class Refused extends Error {
  override readonly name = "Refused";
  constructor(
    readonly code: number,
    message: string,
  ) {
    super(message);
  }
}

const decoder = new TextDecoder();

/**
 * Sends one request to a verb of the function set and parses its JSON answer. Throws
 * {@link Refused} with the service error of a refusal, or the request's error (no responders,
 * timeout) with a hint.
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
        : `${subject}: ${message}`,
    );
  }
  const code = reply.headers?.get("Nats-Service-Error-Code");
  if (code) throw new Refused(Number(code), reply.headers!.get("Nats-Service-Error"));
  return JSON.parse(decoder.decode(reply.data)) as T;
}

/** Asks `mesh-provisioner.provisioning` once (SPEC §4): one page. */
export function askOnce(nc: NatsConnection, request: Record<string, unknown>): Promise<Answer> {
  return askVerb<Answer>(nc, VERB, request);
}

/** Asks every page of a request (following `next`) and returns them as one answer. */
export async function askAll(nc: NatsConnection, request: Record<string, unknown>): Promise<Answer> {
  let page = await askOnce(nc, request);
  const entries = [...page.entries];
  const outOfShape = [...page.outOfShape];
  while (page.next !== undefined) {
    page = await askOnce(nc, { ...request, cursor: page.next });
    entries.push(...page.entries);
    outOfShape.push(...page.outOfShape);
  }
  return { what: page.what, entries, outOfShape };
}

const COLUMNS: Record<Answer["what"], readonly string[]> = {
  registry: ["kind", "module", "where"],
  needs: ["node", "module", "kind", "name", "value"],
  applied: ["node", "module", "value"],
  collect: ["node", "collection", "contributor", "value"],
};

const WIDEST_VALUE = 72;

/**
 * Text as a table cell shows it: control and format characters (which could break the table,
 * drive the terminal or reorder what it shows) written as `\uXXXX`, and at most `width` characters, a longer text cut with `…`.
 */
export function shown(text: string, width: number): string {
  const safe = text.replace(/[\p{Cc}\p{Cf}\u2028\u2029]/gu, (c) => `\\u${c.codePointAt(0)!.toString(16).padStart(4, "0")}`);
  const chars = [...safe];
  return chars.length > width ? `${chars.slice(0, width - 1).join("")}…` : safe;
}

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
  return shown(typeof value === "string" ? value : JSON.stringify(value), WIDEST_VALUE);
}

/** Lines of aligned columns, the first row being the header. */
export function table(rows: readonly (readonly string[])[]): string[] {
  const widths = rows[0]!.map((_, i) => Math.max(...rows.map((row) => row[i]!.length)));
  return rows.map((row) => row.map((text, i) => (i === row.length - 1 ? text : text.padEnd(widths[i]!))).join("  "));
}

/** An answer as a readable table, then its out-of-shape keys with their reasons. */
export function formatAnswer(answer: Answer): string {
  const columns = COLUMNS[answer.what];
  const lines =
    answer.entries.length === 0
      ? [`no ${answer.what} entries`]
      : [
          ...table([columns.map((c) => c.toUpperCase()), ...answer.entries.map((e) => columns.map((c) => cell(e, c)))]),
          `${answer.entries.length} ${answer.what} entr${answer.entries.length === 1 ? "y" : "ies"}`,
        ];
  if (answer.outOfShape.length > 0) {
    lines.push("", `out of shape (${answer.outOfShape.length}):`, ...answer.outOfShape.map((o) => `  ${shown(o.key, 200)}: ${shown(o.reason, 200)}`));
  }
  if (answer.next !== undefined) lines.push("", `more remain: --cursor ${answer.next}`);
  return lines.join("\n");
}
