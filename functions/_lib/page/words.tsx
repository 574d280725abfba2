/** @jsxImportSource hono/jsx */
/** The page's words and small pieces (docs/page.md §10): each state's word, durations, times, links, a list's table. */
import type { PageQuery } from "../overview.ts";
import type { State } from "../state.ts";

/** Each state's short word in the grid and its meaning in the legend (docs/state.md §7.3). */
export const STATE_WORDS: Readonly<Record<State, { readonly short: string; readonly says: string }>> = {
  applied: { short: "ok", says: "applied: its needs are applied" },
  "declares-nothing": { short: "none", says: "declares nothing: ran, needs nothing" },
  pending: { short: "wait", says: "pending: needs written after its last applied record" },
  "never-ran": { short: "new", says: "never ran: assigned, no record yet" },
  failed: { short: "fail", says: "failed: its last pass failed" },
  unassigned: { short: "left", says: "unassigned: left on a node it is no longer assigned to" },
};

/** How long from `since` to `now`, in words: `42 s`, `3 min`, `2 h 5 min`, `3 d 4 h`. */
export const lasted = (since: string | Date, now: Date): string => duration(now.getTime() - new Date(since).getTime());

/** `ms` milliseconds in words, as {@link lasted} says them. */
export function duration(ms: number): string {
  const s = Math.max(0, Math.floor(ms / 1000));
  if (s < 60) return `${s} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} min`;
  const h = Math.floor(m / 60);
  if (h < 48) return `${h} h${m % 60 === 0 ? "" : ` ${m % 60} min`}`;
  return `${Math.floor(h / 24)} d${h % 24 === 0 ? "" : ` ${h % 24} h`}`;
}

/** A time as the page says it: `2026-11-29 18:00:00 UTC`. */
export const when = (at: string | Date) => `${new Date(at).toISOString().slice(0, 19).replace("T", " ")} UTC`;
export const Time = ({ at }: { at: string }) => <time datetime={at}>{when(at)}</time>;

/** The query string of `query` changed by `change` (a field set to `undefined` is left out), `?` included. */
export function linkTo(query: PageQuery, change: Partial<Record<keyof PageQuery, string | undefined>>): string {
  const merged = { ...query, ...change } as Record<string, string | undefined>;
  const fields = Object.entries(merged).filter((e): e is [string, string] => e[1] !== undefined);
  return fields.length === 0 ? "/" : `/?${new URLSearchParams(fields).toString()}`;
}

/** A list as a table: its column heads, then `children` (its rows), scrolling sideways when wider than the page. */
export const ListTable = ({ columns, children }: { columns: readonly string[]; children?: unknown }) => (
  <div class="scroll">
    <table class="list">
      <thead>
        <tr>
          {columns.map((c) => (
            <th scope="col">{c}</th>
          ))}
        </tr>
      </thead>
      <tbody>{children}</tbody>
    </table>
  </div>
);
