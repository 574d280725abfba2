/// <reference lib="dom" />
import { chromium, type Browser, type Page } from "playwright-core";
import { resolve } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { connectProvider } from "../client/index.ts";
import { publishDemoEvent, writeDemo, type DemoBus } from "../cli/demo.ts";
import { DEMO_FAILING } from "../demo/mesh.ts";
import { STATES } from "../functions/_lib/state.ts";
import type { Running } from "../runtime/index.ts";
import type { TestBus } from "../runtime/testing.ts";
import { ROOT, startSet, testBus, until } from "./helpers.ts";

/** Where a screenshot goes: `docs/` with UPDATE_SCREENSHOTS=1 (the README shows those), `.tmp/` otherwise, so a run changes no tracked file. */
const screenshot = (name: string) => (process.env.UPDATE_SCREENSHOTS === "1" ? resolve(ROOT, "docs", name) : resolve(ROOT, ".tmp", name));

/** Debian's chromium, never a browser download (docs/page.md §10.5). */
const CHROMIUM = "/usr/bin/chromium";
const ARGS = [
  "--headless",
  "--no-sandbox",
  "--disable-gpu",
  "--disable-quic",
  "--no-first-run",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
];
const DESKTOP = { width: 1280, height: 800 };
const PHONE = { width: 390, height: 844 };

let bus: TestBus;
let set: Running;
let demo: DemoBus;
let browser: Browser;
let url: string;

beforeAll(async () => {
  bus = await testBus();
  // A node unreachable one second after its last presence write (docs/presence.md §16.1).
  set = await startSet(bus, { presence: { ttlSeconds: 1 } } as object);
  url = set.httpUrl;
  demo = { servers: [bus.url], credentials: (user) => bus.server.users[user]! };
  await writeDemo(bus.config, demo);
  await publishDemoEvent(demo, "failing");
  browser = await chromium.launch({ executablePath: CHROMIUM, args: ARGS });
});
afterAll(async () => {
  await browser?.close();
  await set?.stop();
  await bus?.stop();
});

const open = async (path = "/", viewport = DESKTOP): Promise<Page> => {
  const page = await browser.newPage({ viewport });
  await page.goto(`${url}${path}`);
  return page;
};

/** Publishes as a demo provider through the client library. */
const asProvider = async (provider: string, act: (client: Awaited<ReturnType<typeof connectProvider>>) => Promise<unknown>) => {
  const client = await connectProvider({ servers: demo.servers, provider, credentials: demo.credentials(provider) });
  try {
    await act(client);
  } finally {
    await client.close();
  }
};

describe("the page GET /", () => {
  it("shows the demo's failing keycloak → grafana on dogwood and every module state the demo writes", async () => {
    const page = await open();
    expect(await page.title()).toBe("Not well · mesh-provisioner");
    await expect.poll(() => page.locator(".verdict").innerText()).toMatch(/Not well/);
    const row = page.locator("#failing tbody tr").filter({ hasText: "keycloak" });
    expect(await row.locator("td").allInnerTexts()).toEqual([
      "keycloak",
      "dogwood",
      "grafana",
      DEMO_FAILING.word,
      expect.stringMatching(/^\d+ s$/),
    ]);
    const labels = await page.locator(".grid td a").evaluateAll((cells) => cells.map((a) => a.getAttribute("aria-label")!));
    const states = new Set(labels.map((l) => l.replace(/^\S+ \S+: /, "").replace(/, not well$/, "")));
    expect([...states].sort()).toEqual([...STATES].sort());
    expect(labels).toContain("cedar mesh-artifact-store: failed, not well");
    expect(await page.locator("#registry").innerText()).toMatch(/Registry \(\d+ kinds\)/);
    await page.screenshot({ path: screenshot("page-1280.png"), fullPage: true });
    await page.close();
  });

  it("says in its grid row that a node is unreachable, with Unconfirmed in its details, without a reload; and takes it away when it writes again", async () => {
    const page = await open();
    await page.evaluate(() => ((window as unknown as { kept: number }).kept = 7));
    const presence = await bus.kv("presence", "alder");
    const row = page.locator(".grid tbody tr").filter({ has: page.locator("th", { hasText: /^alder/ }) });
    const said = row.locator("th .off");
    expect(await said.count()).toBe(0);
    await presence.put("alder", JSON.stringify({ everySeconds: 1 }));
    const lastSeen = (await presence.get("alder"))!.created;
    // No write after it: time alone makes the node unreachable.
    await said.waitFor({ timeout: 8000 });
    expect(await said.innerText()).toMatch(
      new RegExp(`^unreachable for \\d+ s, last seen ${lastSeen.toISOString().slice(0, 19).replace("T", " ")} UTC$`),
    );
    expect(await page.locator("#notwell").innerText()).toContain("Unconfirmed (NodeUnreachable): node alder is unreachable");
    expect(await page.locator(".banner").innerText()).toMatch(/1 node unreachable/);
    await presence.put("alder", JSON.stringify({ everySeconds: 60 }));
    await said.waitFor({ state: "detached", timeout: 3000 });
    expect(await page.evaluate(() => (window as unknown as { kept: number }).kept)).toBe(7);
    await page.close();
  });

  it("shows a failing check of a module in its details without a reload, and takes it away when the check is ok again", async () => {
    const page = await open("/?node=birch");
    await page.evaluate(() => ((window as unknown as { kept: number }).kept = 9));
    const said = page.locator("#notwell .conditions li", { hasText: "CheckFailing (Unreachable): check of postgres fails" });
    expect(await said.count()).toBe(0);
    const birch = (await bus.connect("birch")).jetstream();
    const check = (ok: boolean, at: string) =>
      birch.publish(
        "mesh-provisioner.checked.birch",
        JSON.stringify({
          module: "gitea",
          provision: "postgres",
          ok,
          ...(ok ? {} : { reason: "Unreachable", message: "connect ECONNREFUSED" }),
          at,
        }),
      );
    await check(false, new Date().toISOString());
    await said.waitFor({ timeout: 5000 });
    expect(await said.innerText()).toBe("CheckFailing (Unreachable): check of postgres fails: Unreachable: connect ECONNREFUSED");
    await check(true, new Date(Date.now() + 1).toISOString());
    await said.waitFor({ state: "detached", timeout: 5000 });
    expect(await page.evaluate(() => (window as unknown as { kept: number }).kept)).toBe(9);
    await page.close();
  });

  it("shows a failing a provider publishes without a reload, and takes it away on its recovery", async () => {
    const page = await open();
    await page.evaluate(() => ((window as unknown as { kept: number }).kept = 42));
    const row = page.locator("#failing tbody tr").filter({ hasText: "postgres" });
    expect(await row.count()).toBe(0);
    await asProvider("postgres", (p) => p.failing("birch", "gitea", "too many connections for role gitea"));
    await row.waitFor({ timeout: 2000 });
    expect(await row.locator("td").nth(3).innerText()).toBe("too many connections for role gitea");
    await asProvider("postgres", (p) => p.recovered("birch", "gitea"));
    await row.waitFor({ state: "detached", timeout: 2000 });
    // A direction control in a word is written out, never reordering what is shown around it
    // (a triple of its own: the timeline below counts birch's gitea's events).
    const bidi = page.locator("#failing tbody tr").filter({ hasText: "bidi-probe" });
    await asProvider("postgres", (p) => p.failing("alder", "bidi-probe", "login \u202efailed"));
    await bidi.waitFor({ timeout: 2000 });
    expect(await bidi.locator("td").nth(3).innerText()).toBe("login \\u202efailed");
    await asProvider("postgres", (p) => p.recovered("alder", "bidi-probe"));
    await bidi.waitFor({ state: "detached", timeout: 2000 });
    // The same document throughout: no reload.
    expect(await page.evaluate(() => (window as unknown as { kept: number }).kept)).toBe(42);
    expect(await page.locator("#live").innerText()).toMatch(/^Live: updated \d\d:\d\d:\d\d UTC$/);
    await page.close();
  });

  it("narrows with a filter kept in the query string, the same after a reload", async () => {
    const page = await open();
    await page.selectOption("select[name=node]", "dogwood");
    await Promise.all([page.waitForURL(/node=dogwood/), page.click("button[type=submit]")]);
    const rows = () => page.locator(".grid tbody th").allInnerTexts();
    expect(await rows()).toEqual(["dogwood"]);
    await page.reload();
    expect(new URL(page.url()).searchParams.get("node")).toBe("dogwood");
    expect(await rows()).toEqual(["dogwood"]);
    expect(await page.locator("select[name=node]").inputValue()).toBe("dogwood");
    // The provider filter narrows the failing list: postgres fails nothing now.
    await page.goto(`${url}/?provider=postgres`);
    expect(await page.locator("#failing tbody tr").count()).toBe(0);
    await page.close();
  });

  it("refuses a bad filter with a 400 page naming the field", async () => {
    const page = await browser.newPage();
    const answer = await page.goto(`${url}/?node=not.one&colour=red`);
    expect(answer!.status()).toBe(400);
    expect(answer!.headers()["content-type"]).toBe("text/html; charset=utf-8");
    expect(await page.locator("#refusal").innerText()).toBe(
      "node: must be one token (A-Z a-z 0-9 - _ / =): no '.', '*', '>', white space, nor nothing; colour: unknown field",
    );
    // A parameter named as an object's prototype is a field like any other, for the page as for its parts.
    expect((await page.goto(`${url}/?__proto__=1`))!.status()).toBe(400);
    expect(await page.locator("#refusal").innerText()).toBe("__proto__: unknown field");
    const parts = await fetch(`${url}/page.json?__proto__=1`);
    expect([parts.status, await parts.json()]).toEqual([400, { error: { code: 400, message: "__proto__: unknown field" } }]);
    await page.close();
  });

  it("opens a module's needs, applied record and conditions from its grid cell", async () => {
    const page = await open();
    await page.click('.grid a[aria-label^="cedar mesh-artifact-store:"]');
    await page.waitForURL(/open=cedar\.mesh-artifact-store/);
    const detail = page.locator("#detail");
    expect(await detail.locator("h2").innerText()).toBe("cedar / mesh-artifact-store");
    expect(await detail.innerText()).toMatch(/error of its last pass: zot: listen tcp :5000: address already in use/);
    expect(await detail.locator("h3").allInnerTexts()).toEqual(["Conditions", "Needs (2)", "Applied record"]);
    expect(await detail.locator("pre").innerText()).toMatch(/"error":"zot: listen tcp :5000/);
    await page.close();
  });

  it("marks every module that counts against the mesh, whatever its state, and names those cells above the grid", async () => {
    const page = await open();
    const banner = Number(/(\d+) modules? not well/.exec(await page.locator(".banner").innerText())![1]);
    expect(banner).toBeGreaterThan(1);
    // Applied, and not well (grafana on dogwood: its provider keycloak fails it): not green.
    const grafana = page.locator(".grid td").filter({ has: page.locator('a[aria-label="dogwood grafana: applied, not well"]') });
    expect(await grafana.getAttribute("class")).toBe("s-applied nw");
    expect(await grafana.evaluate((td) => getComputedStyle(td).backgroundColor)).toBe("rgb(255, 216, 211)");
    const applied = page.locator(".grid td.s-applied:not(.nw)").first();
    expect(await applied.evaluate((td) => getComputedStyle(td).backgroundColor)).toBe("rgb(218, 251, 225)");
    expect(await page.locator(".grid td.nw").count()).toBe(banner);
    const cue = page.locator("#grid .cue");
    expect(await cue.innerText()).toMatch(new RegExp(`^Not well in the grid \\(${banner}\\): .*dogwood / grafana`));
    expect(await cue.locator("a").count()).toBe(banner);
    await page.close();
    // At the phone's width the cue is on screen where the grid's cells may not be, and opens the module.
    const phone = await open("/", PHONE);
    const box = (await phone.locator("#grid .cue").boundingBox())!;
    expect(box.x + box.width).toBeLessThanOrEqual(PHONE.width);
    await phone.locator("#grid .cue a", { hasText: "dogwood / grafana" }).click();
    await phone.waitForURL(/open=dogwood\.grafana/);
    await phone.close();
  });

  it("keeps the modules not well under a provider filter, saying so", async () => {
    const page = await open("/?provider=keycloak");
    const banner = Number(/(\d+) modules? not well/.exec(await page.locator(".banner").innerText())![1]);
    expect(await page.locator("#notwell h2").innerText()).toMatch(
      new RegExp(`modules not well \\(${banner}, not narrowed by provider\\)$`),
    );
    await page.close();
  });

  it("counts a module's needs as its state does, and says a key out of shape", async () => {
    const page = await open("/?open=dogwood.grafana");
    const detail = page.locator("#detail");
    const needs = Number(/(\d+) needs?/.exec(await detail.locator("p").filter({ hasText: "since" }).innerText())![1]);
    expect(await detail.locator("h3").nth(1).innerText()).toBe(`Needs (${needs}, and 1 key out of shape)`);
    expect((await detail.locator(".stray").innerText()).trim()).toBe("out of shape: needs keys have 4 tokens, this has 3");
    await page.close();
  });

  it("shows a triple's history as a timeline: its failing span, its recovery", async () => {
    const page = await open("/?triple=postgres.birch.gitea");
    const timeline = page.locator("#timeline");
    expect(await timeline.locator("h2").innerText()).toBe("History of postgres → gitea on birch");
    expect(await timeline.locator(".events .tag").allInnerTexts()).toEqual(["failing", "recovered"]);
    expect(await timeline.innerText()).toMatch(
      /1 failing span in the 2 events the stream holds, failing for \d+ s in all; not failing now\./,
    );
    expect(await timeline.locator(".bar .span").count()).toBe(1);
    await page.close();
  });

  it("has no horizontal scroll at the phone's width", async () => {
    const page = await open("/", PHONE);
    const widths = await page.evaluate(() => [document.documentElement.scrollWidth, window.innerWidth]);
    expect(widths[0]).toBeLessThanOrEqual(widths[1]!);
    await page.screenshot({ path: screenshot("page-390.png"), fullPage: true });
    await page.close();
  });

  it("reaches every link, select and button with Tab", async () => {
    const page = await open();
    const controls = await page.locator("a[href], select, button").count();
    const reached = new Set<string>();
    for (let i = 0; i < controls + 5; i++) {
      await page.keyboard.press("Tab");
      const id = await page.evaluate(() => {
        const e = document.activeElement!;
        const all = Array.from(document.querySelectorAll("a[href], select, button"));
        return all.includes(e) ? String(all.indexOf(e)) : "";
      });
      if (id !== "") reached.add(id);
    }
    expect(reached.size).toBe(controls);
    await page.close();
  });

  it("says when it lost the set and when it is back; with HTTP_TOKEN the page and its script pass the proxy's header", async () => {
    const token = "page-test-token-0123456789";
    const context = await browser.newContext({ viewport: DESKTOP, extraHTTPHeaders: { authorization: `Bearer ${token}` } });
    const page = await context.newPage();
    await page.goto(`${url}/`);
    const live = page.locator("#live");
    await until(async () => /^Live: updated/.test(await live.innerText()));
    const port = Number(new URL(url).port);
    await set.stop();
    await until(async () => /^Lost the set at \d\d:\d\d:\d\d UTC/.test(await live.innerText()));
    expect(await live.getAttribute("class")).toBe("lost");
    set = await startSet(bus, { http: { ...bus.config.http, port, token } });
    await until(async () => /^Back at \d\d:\d\d:\d\d UTC, after \d+ s away; live$/.test(await live.innerText()));
    expect(await live.getAttribute("class")).toBe("");
    expect((await fetch(`${url}/`)).status).toBe(401);
    await context.close();
  });
});
