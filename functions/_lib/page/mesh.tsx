/** @jsxImportSource hono/jsx */
/** The page's parts about the mesh (docs/page.md §10.1): the banner, what fails, what is not well, the grid, a module's details. */
import type { Failing } from "../follower.ts";
import { GRID_NODES, LISTED, type Overview } from "../overview.ts";
import type { StaleHolder } from "../rotation.ts";
import { STATES, type ModuleState } from "../state.ts";
import { plural } from "../text.ts";
import { lasted, linkTo, ListTable, STATE_WORDS, Time } from "./words.tsx";

export function Banner({ o }: { o: Overview }) {
  const { status } = o;
  const counts = [
    plural(status.failing.length + status.outOfShape.length, "failing"),
    plural(status.stale.length, "stale holder"),
    plural(status.provisioning.notWell.length + status.provisioning.omitted, "module not well", "modules not well"),
    plural(status.outOfShape.length, "failing key out of shape", "failing keys out of shape"),
    plural(status.nodes.counts.unreachable, "node unreachable", "nodes unreachable"),
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

export function FailingList({ o }: { o: Overview }) {
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

export function NotWellList({ o }: { o: Overview }) {
  const modules = o.notWell.slice(0, LISTED);
  return (
    <>
      <h2>
        Stale holders ({o.stale.length}) and modules not well ({o.notWell.length}
        {o.notWellUnnarrowed ? ", not narrowed by provider" : ""})
      </h2>
      {o.notWellUnnarrowed ? (
        <p class="none">A module names no provider: the provider filter leaves the modules not well as they are.</p>
      ) : (
        ""
      )}
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

/** How many cells not well the line above the grid names. */
const CUED = 10;

export function Grid({ o }: { o: Overview }) {
  const { nodes, modules, cells } = o.grid;
  // Said in words in the row, not by colour alone (docs/presence.md §16.3).
  const unreachable = new Map(o.status.nodes.unreachable.map((u) => [u.node, u]));
  const notWell = new Set(o.grid.notWell);
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
          <span class="tag nw">!</span> counts against the mesh, whatever its state
        </li>
      </ul>
      {o.grid.notWell.length === 0 ? (
        ""
      ) : (
        // Named above the grid: on a narrow screen a cell may be out of sight (docs/page.md §10.1).
        <p class="cue">
          Not well in the grid ({o.grid.notWell.length}):{" "}
          {o.grid.notWell.slice(0, CUED).map((key, i) => (
            <>
              {i === 0 ? "" : ", "}
              <a href={`${linkTo(o.query, { open: key })}#detail`}>{key.replace(".", " / ")}</a>
            </>
          ))}
          {o.grid.notWell.length > CUED ? `, and ${o.grid.notWell.length - CUED} more` : ""}
        </p>
      )}
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
                  <th scope="row">
                    {n}
                    {unreachable.has(n) ? (
                      <span class="off">
                        unreachable for {lasted(unreachable.get(n)!.since, o.now)}, last seen <Time at={unreachable.get(n)!.lastSeen} />
                      </span>
                    ) : (
                      ""
                    )}
                  </th>
                  {modules.map((m) => {
                    const cell = cells.get(`${n}.${m}`);
                    if (cell === undefined) return <td class="empty">·</td>;
                    const bad = notWell.has(cell.key);
                    const open = o.query.open === cell.key;
                    return (
                      <td class={`s-${cell.state}${bad ? " nw" : ""}${open ? " open" : ""}`}>
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

export function Detail({ o }: { o: Overview }) {
  const d = o.opened;
  if (d === null) return <></>;
  const m = d.state;
  const strays = d.needs.filter((n) => n.outOfShape !== undefined).length;
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
      <h3>
        Needs ({d.needs.length - strays}
        {strays === 0 ? "" : `, and ${plural(strays, "key")} out of shape`})
      </h3>
      {d.needs.length === 0 ? (
        <p class="none">None.</p>
      ) : (
        <ul class="items">
          {d.needs.map((n) => (
            <li>
              <code>{n.key.split(".").slice(2).join(".")}</code> <code class="value">{n.value}</code>
              {n.outOfShape === undefined ? "" : <span class="stray"> out of shape: {n.outOfShape}</span>}
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
