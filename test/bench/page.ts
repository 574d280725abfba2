/**
 * Figures of the page (docs/page.md §10.5): its render's p50 over HTTP, the size of its HTML and
 * of its live parts, and of its own style and script. `bench.ts` prints them for the demo mesh
 * and for 1,000 nodes; `npx tsx test/bench/page.ts` prints the demo mesh's alone.
 */
import { pathToFileURL } from "node:url";
import { publishDemoEvent, writeDemo } from "../../cli/demo.ts";
import { PARTS_PATH, SCRIPT, STYLE } from "../../functions/_lib/page/index.tsx";
import { startSet, testBus } from "../helpers.ts";

export interface PageFigures {
  /** Milliseconds from request to the last byte of GET /, the median of `runs`. */
  readonly p50Ms: number;
  readonly runs: number;
  /** Bytes of the HTML of GET / and of the JSON of GET /page.json. */
  readonly htmlBytes: number;
  readonly partsBytes: number;
}

/** The page's own style and script, in bytes: what it carries whatever the mesh. */
export const OWN_BYTES = { style: Buffer.byteLength(STYLE), script: Buffer.byteLength(SCRIPT) };

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

/** The page of the set at `httpUrl`, asked `runs` times one after another (after 5 not counted). */
export async function pageFigures(httpUrl: string, runs = 50): Promise<PageFigures> {
  const times: number[] = [];
  let html = "";
  for (let i = 0; i < runs + 5; i++) {
    const t = performance.now();
    const answer = await fetch(`${httpUrl}/`);
    html = await answer.text();
    if (answer.status !== 200) throw new Error(`GET / answered ${answer.status}`);
    if (i >= 5) times.push(performance.now() - t);
  }
  const parts = await (await fetch(`${httpUrl}${PARTS_PATH}`)).text();
  return { p50Ms: median(times), runs, htmlBytes: Buffer.byteLength(html), partsBytes: Buffer.byteLength(parts) };
}

/** The page's figures on the demo mesh, with its failing published: a set on a nats-server of its own. */
export async function demoPageFigures(runs = 50): Promise<PageFigures> {
  const bus = await testBus();
  const set = await startSet(bus);
  try {
    const demo = { servers: [bus.url], credentials: (user: string) => bus.server.users[user]! };
    await writeDemo(bus.config, demo);
    await publishDemoEvent(demo, "failing");
    return await pageFigures(set.httpUrl, runs);
  } finally {
    await set.stop();
    await bus.stop();
  }
}

if (import.meta.url === pathToFileURL(process.argv[1]!).href) {
  process.env.LOG_LEVEL ??= "silent";
  const figures = await demoPageFigures();
  console.log(JSON.stringify({ demo: figures, own: OWN_BYTES }, null, 2));
}
