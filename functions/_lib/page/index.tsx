/** @jsxImportSource hono/jsx */
/**
 * The page of docs/page.md §10, rendered on the server with hono/jsx: a banner, what fails, what
 * is stale or not well, the grid of nodes × modules, a module's details, a triple's timeline,
 * the registry and the recent events; every part also as HTML text for the live script (§10.3).
 * Nothing is loaded from elsewhere: the style and the script are inline.
 */
import type { Child } from "hono/jsx";
import { raw } from "hono/html";
import type { Overview } from "../overview.ts";
import { writtenOut } from "../text.ts";
import { PARTS_PATH, SCRIPT, STYLE } from "./look.ts";
import { Banner, Detail, FailingList, Grid, NotWellList } from "./mesh.tsx";
import { Filters, Recent, Registry, Timeline } from "./events.tsx";

export { PARTS_PATH, SCRIPT, STYLE };

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
  return Object.fromEntries(Object.entries(PARTS).map(([id, Part]) => [id, directionsShown(String(<Part o={o} />))]));
}

/**
 * `html` with every text direction control (U+200E, U+200F, U+202A–U+202E, U+2066–U+2069)
 * written as `\uXXXX`, as the command line writes them: a word a provider or node sent cannot
 * reorder what the page shows around it. The page's own markup holds none.
 */
const directionsShown = (html: string): string => writtenOut(html, /[\u200E\u200F\u202A-\u202E\u2066-\u2069]/g);

/** An HTML document of the page's own style, titled `title`, `children` its body. */
const documentOf = (title: string, children: Child): string =>
  "<!DOCTYPE html>" +
  directionsShown(
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
    ),
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
