import fc from "fast-check";
import { headers, type NatsConnection } from "nats";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { STATUS } from "../functions/_lib/status.ts";
import { VERB } from "../functions/_lib/provisioning.ts";
import type { Running } from "../runtime/index.ts";
import { scan } from "../runtime/buckets.ts";
import type { TestBus } from "../runtime/testing.ts";
import { request, startSet, testBus } from "./helpers.ts";

let bus: TestBus;
let set: Running;
let node: NatsConnection;

beforeAll(async () => {
  // max_payload above 5 MiB, so a 5 MiB payload reaches the functions.
  bus = await testBus({ maxPayload: 8 * 1024 * 1024 });
  set = await startSet(bus);
  node = await bus.connect("alder");
  const needs = await bus.kv("needs", "alder");
  await needs.put("alder.gitea.config.db_url", '{"placeholder":"${config:db_url}"}');
  await (await bus.kv("collect", "alder")).put("alder.shell=3Azsh=3Anormal.zsh", '{"lines":[]}');
});
afterAll(async () => {
  await set.stop();
  await bus.stop();
});

const encoder = new TextEncoder();
const SUBJECTS = [VERB, STATUS];

/** A reply is an answer (no error headers, a JSON body) or a 400 refusal in the docs/verb.md §4 shape. */
async function answersOrRefuses(subject: string, payload: Uint8Array): Promise<number> {
  const reply = await request(node, subject, payload);
  if (reply.errorCode === undefined) {
    expect(reply.body).toBeTypeOf("object");
    return 200;
  }
  expect(reply.errorCode).toBe(400);
  // The header says the body's message (header values lose surrounding white space).
  expect(reply.body.error.code).toBe(400);
  expect(reply.errorText ?? "").toBe(reply.body.error.message.trim());
  return 400;
}

/** An HTTP GET's status, with its JSON body checked to be an answer or a refusal of that status. */
async function httpStatus(path: string, query: URLSearchParams): Promise<number> {
  const response = await fetch(`${set.httpUrl}${path}?${query}`);
  const body = (await response.json()) as { error?: { code: number }; well?: boolean };
  // A status of a mesh not well is a 503 that answers (docs/failing.md §5.6), not a refusal.
  if (path === "/status" && response.status === 503 && body.error === undefined) {
    expect(body.well).toBe(false);
    return 200;
  }
  if (response.status !== 200) expect(body.error?.code).toBe(response.status);
  return response.status;
}

const stillServes = async () => {
  const reply = await request(node, VERB, { what: "needs", node: "alder" });
  expect(reply.body.entries.map((e: { key: string }) => e.key)).toEqual(["alder.gitea.config.db_url"]);
};

describe("hostile input, as an attacker would send it", () => {
  it("answers arbitrary bytes with an answer or a 400, never a 500", async () => {
    await fc.assert(
      fc.asyncProperty(fc.constantFrom(...SUBJECTS), fc.uint8Array({ maxLength: 512 }), async (subject, bytes) => {
        expect([200, 400]).toContain(await answersOrRefuses(subject, bytes));
      }),
      { numRuns: 150 },
    );
    await stillServes();
  });

  it("answers arbitrary JSON with an answer or a 400, never a 500", async () => {
    await fc.assert(
      fc.asyncProperty(fc.constantFrom(...SUBJECTS), fc.jsonValue({ maxDepth: 4 }), async (subject, value) => {
        expect([200, 400]).toContain(await answersOrRefuses(subject, encoder.encode(JSON.stringify(value))));
      }),
      { numRuns: 150 },
    );
    const fields = fc.constantFrom(
      "what",
      "node",
      "module",
      "kind",
      "contributor",
      "collection",
      "limit",
      "cursor",
      "provider",
      "machine",
      "consumer",
    );
    await fc.assert(
      fc.asyncProperty(
        fc.constantFrom(...SUBJECTS),
        fc.dictionary(fields, fc.oneof(fc.string(), fc.string({ unit: "binary" }), fc.integer(), fc.constant(null))),
        async (subject, request) => {
          expect([200, 400]).toContain(await answersOrRefuses(subject, encoder.encode(JSON.stringify(request))));
        },
      ),
      { numRuns: 150 },
    );
    await stillServes();
  });

  it("answers arbitrary HTTP queries with 200 or 400, never a 500", async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.constantFrom("/provisioning", "/status"),
        fc.array(fc.tuple(fc.string({ maxLength: 12 }), fc.string({ unit: "binary", maxLength: 40 })), { maxLength: 4 }),
        async (path, pairs) => {
          expect([200, 400]).toContain(await httpStatus(path, new URLSearchParams(pairs)));
        },
      ),
      { numRuns: 150 },
    );
    // Percent-escapes that decode to nothing valid.
    for (const raw of ["node=%ff", "node=%", "node=%00", "what=%E2%82", "%zz=1"]) {
      const response = await fetch(`${set.httpUrl}/provisioning?${raw}`);
      expect([200, 400]).toContain(response.status);
    }
    await stillServes();
  });

  it("never lets a narrowing widen the key filter", async () => {
    const injections = ["*", ">", "alder.>", "a.b", "a b", "", " ", "\t", "alder\n", ".", "..", "alder.*", "\u0000"];
    for (const field of ["node", "module", "kind"]) {
      for (const value of injections) {
        const reply = await request(node, VERB, { what: "needs", [field]: value });
        expect([field, value, reply.errorCode]).toEqual([field, value, 400]);
        expect(reply.errorText).toMatch(new RegExp(`^${field}: must be one token`));
      }
    }
    for (const value of injections) {
      expect((await request(node, VERB, { what: "collect", contributor: value })).errorCode).toBe(400);
      expect((await request(node, STATUS, { provider: value })).errorCode).toBe(400);
      // A collection is a name, encoded into one token: these reach no key, they never widen.
      const collection = await request(node, VERB, { what: "collect", collection: value });
      if (collection.errorCode === undefined) expect(collection.body.entries).toEqual([]);
      else expect(collection.errorText).toMatch(/^collection: /);
    }
  });

  it("refuses a query whose percent-encoding is not UTF-8, never reading it as the literal text", async () => {
    for (const raw of ["what=collect&collection=%FF", "what=collect&collection=%ED%A0%80", "what=needs&node=%", "what=needs&%FF=x"]) {
      const response = await fetch(`${set.httpUrl}/provisioning?${raw}`);
      expect([raw, response.status]).toEqual([raw, 400]);
      expect(((await response.json()) as { error: { message: string } }).error.message).toMatch(
        /^the query parameter \S+ is not percent-encoded UTF-8: /,
      );
    }
    // A browser asking for the page is answered a page, the message escaped.
    const page = await fetch(`${set.httpUrl}/?node=%FF%3Cb%3E`, { headers: { accept: "text/html,application/xhtml+xml" } });
    expect([page.status, page.headers.get("content-type")]).toEqual([400, "text/html; charset=UTF-8"]);
    const text = await page.text();
    expect(text).toContain("<h1>This request cannot be read</h1>");
    expect(text).toContain("the query parameter node is not percent-encoded UTF-8: &quot;node=%FF%3Cb%3E&quot;");
    // Well-formed, the same names are read: é is %C3%A9.
    expect((await fetch(`${set.httpUrl}/provisioning?what=collect&collection=%C3%A9`)).status).toBe(200);
    await stillServes();
  });

  it("reads a value written with a KV-Operation other than DEL or PURGE as a value, as nats.js does: never dropped", async () => {
    const js = node.jetstream();
    const written = [
      ["alder.ops.config.bogus", "KV-Operation", "BOGUS"],
      ["alder.ops.config.lower", "KV-Operation", "del"],
      ["alder.ops.config.longer", "KV-Operation", "PURGE-later"],
      ["alder.ops.config.other", "X-KV-Operation", "DEL"],
      ["alder.ops.config.name", "kv-operation", "DEL"],
    ] as const;
    for (const [key, name, operation] of written) {
      const h = headers();
      h.set(name, operation);
      await js.publish(`$KV.mesh-provisioner_needs.${key}`, '{"placeholder":"${config:x}"}', { headers: h });
    }
    for (const stale of [false, true]) {
      const answer = await request(node, VERB, encoder.encode(JSON.stringify({ what: "needs", node: "alder", module: "ops", stale })));
      expect((answer.body.entries as { key: string }[]).map((e) => e.key)).toEqual(written.map(([key]) => key).sort());
    }
    // The server's reads a view falls back on read them so too.
    const seat = await bus.connect();
    expect((await scan(seat, "mesh-provisioner_needs", "alder.ops.>", false)).map((r) => r.key).sort()).toEqual(
      written.map(([key]) => key).sort(),
    );
    await seat.close();
    const needs = await bus.kv("needs", "alder");
    expect((await needs.get("alder.ops.config.bogus"))?.string()).toBe('{"placeholder":"${config:x}"}');
    for (const [key] of written) await needs.delete(key);
  });

  it("refuses a 5 MiB payload, deeply nested JSON, a 10,000-character collection, control characters and invalid UTF-8", async () => {
    const cases: [string, Uint8Array][] = [
      ["5 MiB", encoder.encode(JSON.stringify({ what: "needs", node: "a".repeat(5 * 1024 * 1024) }))],
      ["nested", encoder.encode(`${"[".repeat(100_000)}${"]".repeat(100_000)}`)],
      ["nested object", encoder.encode(`{"what":${'{"a":'.repeat(50_000)}1${"}".repeat(50_000)}}`)],
      ["collection", encoder.encode(JSON.stringify({ what: "collect", collection: "c".repeat(10_000) }))],
      ["control", encoder.encode(JSON.stringify({ what: "needs", node: "al\u0007der" }))],
      ["utf-8", new Uint8Array([0x7b, 0x22, 0x77, 0x22, 0x3a, 0x22, 0xff, 0xfe, 0x22, 0x7d])],
    ];
    for (const [what, payload] of cases) {
      for (const subject of SUBJECTS) expect([what, subject, await answersOrRefuses(subject, payload)]).toEqual([what, subject, 400]);
    }
    const long = await fetch(`${set.httpUrl}/provisioning?what=collect&collection=${"c".repeat(8000)}`);
    expect(long.status).toBe(400);
    await stillServes();
  });
});
