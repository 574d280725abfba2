import type { NatsConnection } from "nats";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { askAll } from "../cli/ask.ts";
import { asJson } from "../cli/program.ts";
import { VERB } from "../functions/_lib/provisioning.ts";
import type { TestBus } from "../runtime/testing.ts";
import { testBus } from "./helpers.ts";

// The command line's reading of several pages (docs/verb.md §4.6.1), against pages a responder on
// a real nats-server gives: each page's confirmedAt is what the test says.
let bus: TestBus;
let nc: NatsConnection;
/** The confirmedAt of each page, in the order asked. */
let pages: (string | null)[] = [];
/** The value of each page's entry, as JSON text. */
let value = "1";

beforeAll(async () => {
  bus = await testBus();
  nc = await bus.connect();
  nc.subscribe(VERB, {
    callback: (_err, msg) => {
      const { cursor } = msg.json<{ cursor?: string }>();
      const i = cursor === undefined ? 0 : Number(cursor);
      const next = i + 1 < pages.length ? { next: String(i + 1) } : {};
      const page = JSON.stringify({
        what: "needs",
        entries: [{ key: `k${i}`, value: "VALUE" }],
        outOfShape: [],
        confirmedAt: pages[i],
        ...next,
      });
      msg.respond(page.replace('"VALUE"', value));
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
    expect(answer.entries.map((e) => e.key)).toEqual(["k0", "k1", "k2"]);
    expect(answer.confirmedAt).toBe("2026-12-04T02:00:01.000Z");
  });

  it("says never confirmed when one page was never confirmed", async () => {
    pages = ["2026-12-04T02:00:02.000Z", null, "2026-12-04T02:00:03.000Z"];
    expect((await askAll(nc, { what: "needs", stale: true })).confirmedAt).toBeNull();
  });
});

describe("numbers of an answer", () => {
  it("keep every digit past double precision in --json, and the others stay numbers", async () => {
    pages = [null];
    value = '{"big":12345678901234567890123456789,"small":42,"fraction":0.1,"exp":1e400}';
    const answer = await askAll(nc, { what: "needs" });
    const json = asJson(answer);
    expect(json).toContain('"big": 12345678901234567890123456789');
    expect(json).toContain('"small": 42');
    expect(json).toContain('"fraction": 0.1');
    expect(json).toContain('"exp": 1e400');
    expect((answer.entries[0] as unknown as { value: { small: unknown } }).value.small).toBe(42);
  });

  it("reads a value a node wrote with a key twice as JSON does, the last one kept", async () => {
    pages = [null];
    value = '{"file":"/a","file":"/b"}';
    expect((await askAll(nc, { what: "needs" })).entries[0]).toMatchObject({ value: { file: "/b" } });
  });
});
