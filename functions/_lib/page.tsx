/** @jsxImportSource hono/jsx */
/**
 * The page of docs/page.md §10, rendered on the server with hono/jsx: a banner, what fails, what
 * is stale or not well, the grid of nodes × modules, a module's details, a triple's timeline,
 * the registry and the recent events; every part also as HTML text for the live script (§10.3).
 * Nothing is loaded from elsewhere: the style and the script are inline.
 */
import type { Child } from "hono/jsx";
import { raw } from "hono/html";
import type { Failing } from "./follower.ts";
import type { HistoryItem } from "./history.ts";
import { GRID_NODES, LISTED, type Overview, type PageQuery } from "./overview.ts";
import type { StaleHolder } from "./rotation.ts";
import { STATES, type ModuleState, type State } from "./state.ts";
import { plural } from "./text.ts";

/** The route of the page's parts, as JSON `{ parts: { <id>: <html> } }` (docs/page.md §10.3). */
export const PARTS_PATH = "/page.json";

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
const when = (at: string | Date) => `${new Date(at).toISOString().slice(0, 19).replace("T", " ")} UTC`;
const Time = ({ at }: { at: string }) => <time datetime={at}>{when(at)}</time>;

/** The query string of `query` changed by `change` (a field set to `undefined` is left out), `?` included. */
export function linkTo(query: PageQuery, change: Partial<Record<keyof PageQuery, string | undefined>>): string {
  const merged = { ...query, ...change } as Record<string, string | undefined>;
  const fields = Object.entries(merged).filter((e): e is [string, string] => e[1] !== undefined);
  return fields.length === 0 ? "/" : `/?${new URLSearchParams(fields).toString()}`;
}

/** A list as a table: its column heads, then `children` (its rows), scrolling sideways when wider than the page. */
const ListTable = ({ columns, children }: { columns: readonly string[]; children?: unknown }) => (
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

function Banner({ o }: { o: Overview }) {
  const { status } = o;
  const counts = [
    plural(status.failing.length + status.outOfShape.length, "failing"),
    plural(status.stale.length, "stale holder"),
    plural(status.provisioning.notWell.length + status.provisioning.omitted, "module not well", "modules not well"),
    plural(status.outOfShape.length, "failing key out of shape", "failing keys out of shape"),
  ];
  return (
    <div class={status.well ? "banner well" : "banner ill"}>
      <p class="verdict">
        <span aria-hidden="true">{status.well ? "✓ " : "✗ "}</span>
        {status.well ? "Well" : "Not well"}
      </p>
      <ul class="counts">
        {counts.map((c) => (
          <li>{c}</li>
        ))}
        {status.events.recording ? "" : <li>events not recorded: {status.events.reason}</li>}
      </ul>
      <p class="asof">
        as of <Time at={o.now.toISOString()} />
      </p>
    </div>
  );
}

function FailingList({ o }: { o: Overview }) {
  const rows = o.failing.slice(0, LISTED);
  return (
    <>
      <h2>Failing providers ({o.failing.length})</h2>
      {rows.length === 0 ? (
        <p class="none">Nothing the filters reach is failing.</p>
      ) : (
        <ListTable columns={["Provider", "Machine", "Consumer", "Word", "For"]}>
          {rows.map((f: Failing) => (
            <tr>
              <td data-label="Provider">{f.provider}</td>
              <td data-label="Machine">{f.machine}</td>
              <td data-label="Consumer">{f.consumer}</td>
              <td data-label="Word" class="word">
                {f.word}
              </td>
              <td data-label="For">
                <a href={`${linkTo(o.query, { triple: `${f.provider}.${f.machine}.${f.consumer}` })}#timeline`}>{lasted(f.since, o.now)}</a>
              </td>
            </tr>
          ))}
        </ListTable>
      )}
      {o.status.outOfShape.length === 0 ? (
        ""
      ) : (
        <ul class="refused">
          {o.status.outOfShape.map((k) => (
            <li>
              failing key <code>{k.key}</code> out of shape: {k.reason}
            </li>
          ))}
        </ul>
      )}
      {o.failing.length > rows.length ? <p>{o.failing.length - rows.length} more not shown: filter to see them.</p> : ""}
    </>
  );
}

function Conditions({ m }: { m: ModuleState }) {
  if (m.conditions.length === 0 && m.error === undefined) {
    return (
      <p class="none">{m.state === "unassigned" ? "Left on this node: the controller no longer assigns it here." : "No condition."}</p>
    );
  }
  return (
    <ul class="conditions">
      {m.error === undefined ? "" : <li>error of its last pass: {m.error}</li>}
      {m.conditions.map((c) => (
        <li>
          <strong>{c.type}</strong> ({c.reason}): {c.message}
        </li>
      ))}
    </ul>
  );
}

function NotWellList({ o }: { o: Overview }) {
  const modules = o.notWell.slice(0, LISTED);
  return (
    <>
      <h2>
        Stale holders ({o.stale.length}) and modules not well ({o.notWell.length})
      </h2>
      {o.stale.length === 0 && modules.length === 0 ? <p class="none">None the filters reach.</p> : ""}
      {o.stale.length === 0 ? (
        ""
      ) : (
        <ul class="items">
          {o.stale.slice(0, LISTED).map((s: StaleHolder) => (
            <li>
              <strong>
                {s.node} / {s.module}
              </strong>{" "}
              holds {s.provision} at {s.heldRevision ?? "no revision"}; {s.provider} rotated it to {s.revision} {lasted(s.rotatedAt, o.now)}{" "}
              ago
            </li>
          ))}
        </ul>
      )}
      {modules.length === 0 ? (
        ""
      ) : (
        <ul class="items">
          {modules.map((m) => (
            <li>
              <a href={`${linkTo(o.query, { open: m.key })}#detail`}>
                <strong>
                  {m.node} / {m.module}
                </strong>
              </a>{" "}
              <span class={`tag s-${m.state}`}>{m.state}</span> for {lasted(m.since, o.now)}
              <Conditions m={m} />
            </li>
          ))}
        </ul>
      )}
      {o.notWell.length > modules.length ? <p>{o.notWell.length - modules.length} more not shown: filter to see them.</p> : ""}
    </>
  );
}

function Grid({ o }: { o: Overview }) {
  const { nodes, modules, cells } = o.grid;
  return (
    <>
      <h2>Modules by node</h2>
      <ul class="legend" aria-label="legend">
        {STATES.map((s) => (
          <li>
            <span class={`tag s-${s}`}>{STATE_WORDS[s].short}</span> {STATE_WORDS[s].says}
          </li>
        ))}
        <li>
          <span class="tag bad">!</span> counts against the mesh
        </li>
      </ul>
      {nodes.length === 0 ? (
        <p class="none">No module the filters reach.</p>
      ) : (
        <div class="scroll">
          <table class="grid">
            <thead>
              <tr>
                <th scope="col">Node</th>
                {modules.map((m) => (
                  <th scope="col" class="mod">
                    <span>{m}</span>
                  </th>
                ))}
              </tr>
            </thead>
            <tbody>
              {nodes.map((n) => (
                <tr>
                  <th scope="row">{n}</th>
                  {modules.map((m) => {
                    const cell = cells.get(`${n}.${m}`);
                    if (cell === undefined) return <td class="empty">·</td>;
                    const bad = cell.conditions.length > 0 || cell.state === "failed" || cell.state === "unassigned";
                    const open = o.query.open === cell.key;
                    return (
                      <td class={`s-${cell.state}${open ? " open" : ""}`}>
                        <a
                          href={`${linkTo(o.query, { open: cell.key })}#detail`}
                          aria-label={`${n} ${m}: ${cell.state}${bad ? ", not well" : ""}`}
                          aria-current={open ? "true" : undefined}
                        >
                          {STATE_WORDS[cell.state].short}
                          {bad ? "!" : ""}
                        </a>
                      </td>
                    );
                  })}
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      )}
      {o.gridHidden > 0 ? (
        <p>
          {plural(o.gridHidden, "more module")} on nodes beyond the first {GRID_NODES}: filter by node to see them.
        </p>
      ) : (
        ""
      )}
    </>
  );
}

function Detail({ o }: { o: Overview }) {
  const d = o.opened;
  if (d === null) return <></>;
  const m = d.state;
  return (
    <>
      <h2>
        {d.node} / {d.module}
      </h2>
      <p>
        <a href={linkTo(o.query, { open: undefined })}>Close</a>
      </p>
      {m === undefined ? (
        <p class="none">No such module on this node.</p>
      ) : (
        <>
          <p>
            <span class={`tag s-${m.state}`}>{m.state}</span> since <Time at={m.since} /> ({lasted(m.since, o.now)});{" "}
            {m.assigned ? "assigned" : "not assigned"}; {plural(m.needs, "need")}
          </p>
          <h3>Conditions</h3>
          <Conditions m={m} />
        </>
      )}
      <h3>Needs ({d.needs.length})</h3>
      {d.needs.length === 0 ? (
        <p class="none">None.</p>
      ) : (
        <ul class="items">
          {d.needs.map((n) => (
            <li>
              <code>{n.key.split(".").slice(2).join(".")}</code> <code class="value">{n.value}</code>
            </li>
          ))}
        </ul>
      )}
      <h3>Applied record</h3>
      {d.applied === null ? (
        <p class="none">None.</p>
      ) : (
        <>
          <p>
            written <Time at={d.applied.at} />
          </p>
          <pre>{d.applied.value}</pre>
        </>
      )}
    </>
  );
}

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

function Timeline({ o }: { o: Overview }) {
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

function Registry({ o }: { o: Overview }) {
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

function Recent({ o }: { o: Overview }) {
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

function Filters({ o }: { o: Overview }) {
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

/** Each live part of the page by its element id, in page order. */
const PARTS = {
  banner: Banner,
  failing: FailingList,
  notwell: NotWellList,
  detail: Detail,
  timeline: Timeline,
  grid: Grid,
  recent: Recent,
  registry: Registry,
} satisfies Record<string, (props: { o: Overview }) => Child>;

/** Every part's inner HTML by its id, for `GET /page.json` (docs/page.md §10.3). */
export function partsOf(o: Overview): Record<string, string> {
  return Object.fromEntries(Object.entries(PARTS).map(([id, Part]) => [id, String(<Part o={o} />)]));
}

export const STYLE = `
:root{color-scheme:light;--fg:#1b1f24;--mute:#59636e;--line:#d0d7de;--bg:#fff;--soft:#f6f8fa}
*{box-sizing:border-box}
body{margin:0;font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--fg);background:var(--soft)}
header,main{max-width:1200px;margin:0 auto;padding:0 16px}
header{display:flex;flex-wrap:wrap;align-items:baseline;gap:4px 16px;padding-top:12px}
h1{font-size:20px;margin:0}
h2{font-size:17px;margin:0 0 8px}
h3{font-size:15px;margin:12px 0 4px}
section{background:var(--bg);border:1px solid var(--line);border-radius:8px;padding:12px 16px;margin:12px 0;overflow-wrap:break-word}
code,pre,.word,.conditions,.events{overflow-wrap:anywhere}
section:empty{display:none}
a{color:#0550ae}
a:focus-visible,button:focus-visible,select:focus-visible{outline:3px solid #0969da;outline-offset:2px}
#live{margin:0;color:var(--mute);font-size:13px}
#live.lost{color:#a40e26;font-weight:600}
.banner{display:flex;flex-wrap:wrap;align-items:center;gap:4px 20px;margin:-12px -16px;padding:12px 16px;border-radius:8px}
.well{background:#dafbe1;color:#0a3622}.ill{background:#ffebe9;color:#6e0b14}
.verdict{font-size:22px;font-weight:700;margin:0}
.counts{display:flex;flex-wrap:wrap;gap:2px 14px;margin:0;padding:0;list-style:none}
.asof{margin:0 0 0 auto;font-size:13px}
.filters{display:flex;flex-wrap:wrap;gap:8px 12px;align-items:end}
.filters label{display:flex;flex-direction:column;font-size:13px;color:var(--mute)}
select,button{font:inherit;padding:4px 8px;border:1px solid #8c959f;border-radius:6px;background:#fff;min-height:32px}
button{background:#1f6feb;color:#fff;border-color:#1f6feb;cursor:pointer}
.scroll{overflow-x:auto;max-width:100%}
table{border-collapse:collapse;font-size:14px}
th,td{text-align:left;padding:4px 8px;border-bottom:1px solid var(--line);vertical-align:top}
.word{min-width:14em}
.none{color:var(--mute);margin:4px 0}
.items{margin:0;padding-left:18px}.items li{margin:4px 0}
.conditions{margin:2px 0 6px;padding-left:18px;color:#3d444d}
.tag{display:inline-block;padding:0 6px;border-radius:4px;font-size:12px;font-weight:600;border:1px solid #0002}
.s-applied{background:#dafbe1;color:#0a3622}.s-declares-nothing{background:#eef6ef;color:#2a4a33}
.s-pending{background:#fff4c5;color:#5c4400}.s-never-ran{background:#ddf4ff;color:#0a3069}
.s-failed{background:#ffd8d3;color:#7a0d17}.s-unassigned{background:#eaeef2;color:#424a53}
.bad{background:#cf222e;color:#fff}
.legend{display:flex;flex-wrap:wrap;gap:4px 14px;margin:0 0 8px;padding:0;list-style:none;font-size:13px;color:var(--mute)}
.grid th,.grid td{border:1px solid var(--line);padding:0;text-align:center}
.grid th[scope=row]{padding:2px 8px;text-align:left;white-space:nowrap}
.grid .mod{vertical-align:bottom;height:9em;padding:4px 2px}
.grid .mod span{writing-mode:vertical-rl;transform:rotate(180deg);white-space:nowrap;font-weight:500}
.grid td a{display:block;min-width:3.2em;padding:4px 2px;color:inherit;text-decoration:none;font-weight:600;font-size:13px}
.grid td a:hover{text-decoration:underline}
.grid td.open{outline:3px solid #0969da;outline-offset:-3px}
.grid td.empty{color:#aab}
code{font:13px ui-monospace,SFMono-Regular,Menlo,monospace}
.value{color:var(--mute)}
pre{background:var(--soft);padding:8px;border-radius:6px;white-space:pre-wrap;font-size:13px;margin:0}
.events{margin:0;padding-left:0;list-style:none}.events li{padding:3px 0;border-bottom:1px solid var(--soft)}
.e-failing .tag{background:#ffd8d3;color:#7a0d17}.e-recovered .tag{background:#dafbe1;color:#0a3622}
.e-rotated .tag{background:#ddf4ff;color:#0a3069}.e-refused .tag{background:#eaeef2;color:#424a53}
.bar{position:relative;height:14px;background:#dafbe1;border:1px solid var(--line);border-radius:4px;margin:8px 0;overflow:hidden}
.bar .span{position:absolute;top:0;bottom:0;background:#cf222e}
@media (max-width:600px){body{font-size:14px}section{padding:10px 12px}.banner{margin:-10px -12px;padding:10px 12px}.asof{margin:0}
.list thead{display:none}.list,.list tbody,.list tr,.list td{display:block}.list tr{padding:6px 0;border-bottom:1px solid var(--line)}
.list td{border:0;padding:1px 0}.list td::before{content:attr(data-label)": ";color:var(--mute);font-size:13px}.word{min-width:0}}
`;

/**
 * Polls the page's parts every second (`fetch` of {@link PARTS_PATH} with the page's query, the
 * same origin, so a proxy's `Authorization` goes with it), replaces each part whose HTML changed
 * (keeping the focus on the same link), and says in a text line when it lost the set and when it is back.
 */
export const SCRIPT = `(()=>{const l=document.getElementById("live"),last={};let lost=0;const t=()=>new Date().toISOString().slice(11,19)+" UTC";
async function poll(){try{const r=await fetch("${PARTS_PATH}"+location.search,{cache:"no-store"});if(!r.ok)throw new Error("HTTP "+r.status);const p=(await r.json()).parts;
for(const id in p){const e=document.getElementById(id);if(!e||last[id]===p[id])continue;if(last[id]===undefined&&e.innerHTML===p[id]){last[id]=p[id];continue}
const a=document.activeElement,h=e.contains(a)&&a.getAttribute("href");e.innerHTML=p[id];last[id]=p[id];if(h){const n=e.querySelector('a[href="'+CSS.escape(h)+'"]');if(n)n.focus()}}
l.className="";l.textContent=lost?"Back at "+t()+", after "+Math.round((Date.now()-lost)/1000)+" s away; live":"Live: updated "+t();lost=0}
catch(err){if(!lost)lost=Date.now();l.className="lost";l.textContent="Lost the set at "+new Date(lost).toISOString().slice(11,19)+" UTC ("+err.message+"); trying again every second"}
setTimeout(poll,1000)}setTimeout(poll,1000)})()`;

/** An HTML document of the page's own style, titled `title`, `children` its body. */
const documentOf = (title: string, children: Child): string =>
  "<!DOCTYPE html>" +
  String(
    <html lang="en">
      <head>
        <meta charset="utf-8" />
        <meta name="viewport" content="width=device-width,initial-scale=1" />
        <title>{title}</title>
        <style>{raw(STYLE)}</style>
      </head>
      <body>{children}</body>
    </html>,
  );

/** The whole page (docs/page.md §10.1), as an HTML document. */
export function pageOf(o: Overview): string {
  const parts = PARTS;
  return documentOf(
    `${o.status.well ? "Well" : "Not well"} · mesh-provisioner`,
    <>
      <header>
        <h1>mesh-provisioner</h1>
        <p id="live" role="status" aria-live="polite">
          Live: updates every second
        </p>
      </header>
      <main>
        <section aria-label="filters">
          <Filters o={o} />
        </section>
        {Object.entries(parts).map(([id, Part]) => (
          <section id={id} aria-live={id === "banner" ? "polite" : undefined}>
            <Part o={o} />
          </section>
        ))}
      </main>
      <script>{raw(SCRIPT)}</script>
    </>,
  );
}

/** The page of a query refused (docs/page.md §10.2): each field at fault in words, and the way back. */
export function refusedPage(message: string): string {
  return documentOf(
    "Bad query · mesh-provisioner",
    <main>
      <section>
        <h1>This view cannot be shown</h1>
        <p id="refusal">{message}</p>
        <p>
          <a href="/">The whole mesh</a>
        </p>
      </section>
    </main>,
  );
}
