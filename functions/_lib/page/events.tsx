/** @jsxImportSource hono/jsx */
/** The page's parts about events (docs/page.md §10.1): a triple's timeline, the registry, the recent events, the filters. */
import type { HistoryItem } from "../history.ts";
import type { Overview } from "../overview.ts";
import { plural } from "../text.ts";
import { duration, lasted, linkTo, ListTable, Time } from "./words.tsx";

/** What one event of the history says, in words. */
function eventWords(item: HistoryItem): string {
  if ("refused" in item) return `refused: ${item.refused.reason}`;
  const e = item.entry;
  const holder = e.machine === undefined ? "every holder" : `${e.consumer} on ${e.machine}`;
  if (e.event === "failing") return `${e.provider} fails ${holder}: ${e.word}`;
  if (e.event === "recovered") return `${e.provider} recovered ${holder}`;
  return `${e.provider} rotated ${e.provision} to ${e.revision} for ${holder}`;
}

const EventRow = ({ item }: { item: HistoryItem }) => {
  const kind = "refused" in item ? "refused" : item.entry.event;
  return (
    <li class={`ev e-${kind}`}>
      <span class="tag">{kind}</span> {"entry" in item ? <Time at={item.entry.storedAt} /> : `#${item.refused.key}`} {eventWords(item)}
    </li>
  );
};

/** The spans a triple failed, oldest first: from each failing that began a streak to the recovered that ended it. */
export function spansOf(items: readonly HistoryItem[]): { from: string; to: string | null; words: number }[] {
  const spans: { from: string; to: string | null; words: number }[] = [];
  for (const item of [...items].reverse()) {
    if (!("entry" in item)) continue;
    const open = spans.at(-1)?.to === null ? spans.at(-1) : undefined;
    if (item.entry.event === "failing") {
      if (open === undefined) spans.push({ from: item.entry.storedAt, to: null, words: 1 });
      else open.words++;
    } else if (item.entry.event === "recovered" && open !== undefined) open.to = item.entry.storedAt;
  }
  return spans;
}

export function Timeline({ o }: { o: Overview }) {
  if (o.timeline === null || o.query.triple === undefined) return <></>;
  const [provider, machine, consumer] = o.query.triple.split(".");
  const items = o.timeline;
  const spans = spansOf(items);
  const oldest = items.at(-1);
  const start = oldest === undefined ? o.now.getTime() : new Date("entry" in oldest ? oldest.entry.storedAt : o.now).getTime();
  const total = Math.max(1, o.now.getTime() - start);
  const failedMs = spans.reduce((sum, s) => sum + ((s.to === null ? o.now : new Date(s.to)).getTime() - new Date(s.from).getTime()), 0);
  const pct = (t: number) => `${(((t - start) / total) * 100).toFixed(2)}%`;
  return (
    <>
      <h2>
        History of {provider} → {consumer} on {machine}
      </h2>
      <p>
        <a href={linkTo(o.query, { triple: undefined })}>Close</a>
      </p>
      <p>
        {plural(spans.length, "failing span")} in the {plural(items.length, "event")} the stream holds, failing for {duration(failedMs)} in
        all{spans.at(-1)?.to === null ? `; failing now, for ${lasted(spans.at(-1)!.from, o.now)}` : "; not failing now"}.
      </p>
      {items.length === 0 ? (
        ""
      ) : (
        <div class="bar" role="img" aria-label="failing spans over time; the list below says each">
          {spans.map((s) => {
            const from = new Date(s.from).getTime();
            const to = (s.to === null ? o.now : new Date(s.to)).getTime();
            return <span class="span" style={`left:${pct(from)};width:max(3px,calc(${pct(to)} - ${pct(from)}))`} />;
          })}
        </div>
      )}
      <ol class="events">
        {[...items].reverse().map((item) => (
          <EventRow item={item} />
        ))}
      </ol>
    </>
  );
}

export function Registry({ o }: { o: Overview }) {
  return (
    <>
      <h2>Registry ({o.registry.length} kinds)</h2>
      <p>
        {o.compiledAt === null ? (
          "Not compiled by a scheduled run yet."
        ) : (
          <>
            Compiled <Time at={o.compiledAt} /> ({lasted(o.compiledAt, o.now)} ago).
          </>
        )}
      </p>
      <ListTable columns={["Kind", "Module", "Where"]}>
        {o.registry.map((r) => (
          <tr>
            <td data-label="Kind">{r.kind}</td>
            <td data-label="Module">{String(r.value?.module ?? "?")}</td>
            <td data-label="Where">
              {r.value === null
                ? "not JSON"
                : r.value.verb !== undefined
                  ? `verb ${r.value.verb}`
                  : `bucket ${r.value.bucket} key ${r.value.key}${r.value.collection === undefined ? "" : ` collection ${r.value.collection}`}`}
            </td>
          </tr>
        ))}
      </ListTable>
    </>
  );
}

export function Recent({ o }: { o: Overview }) {
  return (
    <>
      <h2>Recent events</h2>
      {o.recent.length === 0 ? (
        <p class="none">No event the filters reach in the stream.</p>
      ) : (
        <ol class="events">
          {o.recent.map((item) => (
            <EventRow item={item} />
          ))}
        </ol>
      )}
    </>
  );
}

export function Filters({ o }: { o: Overview }) {
  const select = (name: "node" | "module" | "provider", options: readonly string[]) => {
    const current = o.query[name];
    const all = current !== undefined && !options.includes(current) ? [current, ...options] : options;
    return (
      <label>
        {name}
        <select name={name}>
          <option value="">all</option>
          {all.map((v) => (
            <option value={v} selected={v === current}>
              {v}
            </option>
          ))}
        </select>
      </label>
    );
  };
  return (
    <form method="get" action="/" class="filters" aria-label="filters">
      {select("node", o.nodes)}
      {select("module", o.modules)}
      {select("provider", o.providers)}
      <button type="submit">Filter</button>
      <a href="/">Clear</a>
    </form>
  );
}
