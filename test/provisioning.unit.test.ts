import { describe, expect, it } from "vitest";
import {
  answerPage as pageText,
  cursorAfter,
  provisioningRequest,
  requestFilters,
  type Answer,
  type BucketRequest,
} from "../functions/_lib/provisioning.ts";

/** A page as a client reads it: the parsed answer, and the bytes of its JSON. */
const answerPage = (...args: Parameters<typeof pageText>): Answer & { bytes: number } => {
  const { text } = pageText(...args);
  return { ...(JSON.parse(text) as Answer), bytes: Buffer.byteLength(text) };
};
import { formatIssues, ServiceError, type Entry } from "../runtime/index.ts";

// As a bucket gives them: each write its own revision (the verb knows an entry by key and revision).
let written = 0;
const entry = (key: string, value: string, revision = ++written): Entry => ({
  key,
  value: new TextEncoder().encode(value),
  revision,
  created: new Date("2026-11-29T18:00:00.000Z"),
  createdNanos: Date.parse("2026-11-29T18:00:00.000Z") * 1e6,
});
const parse = (raw: unknown) => provisioningRequest.parse(raw) as BucketRequest;
const refusal = (raw: unknown) => {
  const r = provisioningRequest.safeParse(raw);
  return r.success ? "accepted" : formatIssues(r.error.issues);
};

describe("the request (docs/verb.md §4)", () => {
  it("defaults to the registry and a limit of 1,000", () => {
    expect(parse({})).toEqual({ what: "registry", limit: 1000 });
  });

  it("takes a limit as a number or, from an HTTP query, as digits", () => {
    expect(parse({ what: "needs", limit: 5 }).limit).toBe(5);
    expect(parse({ what: "needs", limit: "5" }).limit).toBe(5);
    expect(refusal({ what: "needs", limit: "5x" })).toBe("limit: must be a whole number");
    expect(refusal({ what: "needs", limit: 10_001 })).toBe("limit: Too big: expected number to be <=10000");
    // Past the safe integers, said once: too big.
    expect(refusal({ what: "needs", limit: "99999999999999999999" })).toBe("limit: Too big: expected number to be <=10000");
  });

  it("names every field that does not apply, and what it narrows", () => {
    expect(refusal({ what: "registry", node: "n1", contributor: "docker" })).toBe(
      "node: does not apply to what=registry (it narrows needs, applied, collect, state, nodes, checks, holders); " +
        "contributor: does not apply to what=registry (it narrows collect)",
    );
  });

  it("refuses a collection name with a lone surrogate", () => {
    expect(refusal({ what: "collect", collection: "a\ud800" })).toBe("collection: must be well-formed Unicode (no lone surrogate)");
  });

  it("reads with a filter that never widens past the narrowing", () => {
    expect(requestFilters(parse({ what: "needs", node: "n1", kind: "secret" }))).toEqual(["n1.*.secret", "n1.*.secret.>"]);
    expect(requestFilters(parse({ what: "collect", collection: "a.b>*", contributor: "x" }))).toEqual([
      "*.a=2Eb=3E=2A.x",
      "*.a=2Eb=3E=2A.x.>",
    ]);
  });
});

describe("a page of the answer", () => {
  const rows = ["n1.a", "n1.b", "n1.c", "n1.d"].map((key) => entry(key, `{"v":"${key}"}`));

  it("continues after its cursor and stops at its limit", () => {
    const first = answerPage(parse({ what: "applied", limit: 3 }), rows, 1024 * 1024);
    expect(first.entries.map((e) => e.key)).toEqual(["n1.a", "n1.b", "n1.c"]);
    expect(first.next).toBe(cursorAfter(parse({ what: "applied" }), "n1.c"));
    const second = answerPage(parse({ what: "applied", limit: 3, cursor: first.next }), rows, 1024 * 1024);
    expect(second.entries.map((e) => e.key)).toEqual(["n1.d"]);
    expect(second.next).toBeUndefined();
  });

  it("keeps each page's JSON under max_payload and says a value too large for any reply", () => {
    const big = entry("n1.big", JSON.stringify({ blob: "x".repeat(5000) }));
    const small = (k: string) => entry(k, JSON.stringify({ blob: "y".repeat(900) }));
    const all = [small("n1.a"), big, small("n1.c"), small("n1.d"), small("n1.e")];
    const maxPayload = 4096;
    const pages = [];
    let cursor: string | undefined;
    do {
      const page = answerPage(parse({ what: "applied", ...(cursor ? { cursor } : {}) }), all, maxPayload);
      expect(page.bytes).toBeLessThanOrEqual(maxPayload - 1024);
      pages.push(page);
      cursor = page.next;
    } while (cursor !== undefined);
    expect(pages.map((p) => [...p.entries.map((e) => e.key), ...p.outOfShape.map((o) => o.key)].sort())).toEqual([
      ["n1.a"],
      ["n1.big", "n1.c", "n1.d"],
      ["n1.e"],
    ]);
    expect(pages[1]!.outOfShape).toEqual([
      { key: "n1.big", reason: expect.stringMatching(/^its entry \(\d+ bytes\) does not fit in one reply \(max_payload 4096\)$/) },
    ]);
  });

  it("says a registry value that is not a registry value, or of another kind", () => {
    const page = answerPage(
      parse({}),
      [entry("dir", '{"kind":"dir","module":"m"}'), entry("port", '{"kind":"seat","module":"m","verb":"a.b"}')],
      1024 * 1024,
    );
    expect(page.entries).toEqual([]);
    expect(page.outOfShape.map((o) => o.key)).toEqual(["dir", "port"]);
    expect(page.outOfShape[1]!.reason).toBe("value is of kind seat, not port");
  });

  it("refuses a cursor for another narrowing with a 400", () => {
    const cursor = cursorAfter(parse({ what: "needs", node: "n1" }), "n1.a.b.c");
    expect(() => answerPage(parse({ what: "needs", node: "n2", cursor }), [], 1 << 20)).toThrow(ServiceError);
  });
});
