import type { NatsConnection } from "nats";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { askAll } from "../cli/ask.ts";
import { VERB } from "../functions/_lib/provisioning.ts";
import type { TestBus } from "../runtime/testing.ts";
import { testBus } from "./helpers.ts";

// The command line's reading of several pages (docs/verb.md §4.6.1), against pages a responder on
// a real nats-server gives: each page's confirmedAt is what the test says.
let bus: TestBus;
let nc: NatsConnection;
/** The confirmedAt of each page, in the order asked. */
let pages: (string | null)[] = [];

beforeAll(async () => {
  bus = await testBus();
  nc = await bus.connect();
  nc.subscribe(VERB, {
    callback: (_err, msg) => {
      const { cursor } = msg.json<{ cursor?: string }>();
      const i = cursor === undefined ? 0 : Number(cursor);
      const next = i + 1 < pages.length ? { next: String(i + 1) } : {};
      msg.respond(JSON.stringify({ what: "needs", entries: [{ key: `k${i}` }], outOfShape: [], confirmedAt: pages[i], ...next }));
    },
  });
  await nc.flush();
});
afterAll(async () => {
  await nc?.close();
  await bus?.stop();
});

describe("every page of a stale answer", () => {
  it("says the oldest confirmedAt of its pages, never the last page's", async () => {
    pages = ["2026-12-04T02:00:02.000Z", "2026-12-04T02:00:01.000Z", "2026-12-04T02:00:03.000Z"];
    const answer = await askAll(nc, { what: "needs", stale: true });
    expect(answer.entries).toEqual([{ key: "k0" }, { key: "k1" }, { key: "k2" }]);
    expect(answer.confirmedAt).toBe("2026-12-04T02:00:01.000Z");
  });

  it("says never confirmed when one page was never confirmed", async () => {
    pages = ["2026-12-04T02:00:02.000Z", null, "2026-12-04T02:00:03.000Z"];
    expect((await askAll(nc, { what: "needs", stale: true })).confirmedAt).toBeNull();
  });
});
