import type { KV, NatsConnection } from "nats";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Running } from "../runtime/index.ts";
import type { TestBus } from "../runtime/testing.ts";
import { VERB } from "../functions/_lib/provisioning.ts";
import { request, startSet, testBus } from "./helpers.ts";

// docs/verb.md §4: an answer reflects every write acknowledged before the request was sent. The verb
// answers from a live view of each bucket, so these write and ask at once, never sleeping.

let bus: TestBus;
let set: Running;
let alder: KV;
let cedar: KV;
let asker: NatsConnection;

beforeAll(async () => {
  bus = await testBus();
  set = await startSet(bus);
  alder = await bus.kv("needs", "alder");
  cedar = await bus.kv("needs", "cedar");
  asker = await bus.connect("birch");
});
afterAll(async () => {
  await set.stop();
  await bus.stop();
});

/** The keys of the verb's answer for alder's needs of module `module`. */
async function keysOf(module: string): Promise<string[]> {
  const { body, errorCode } = await request(asker, VERB, { what: "needs", node: "alder", module });
  expect(errorCode).toBeUndefined();
  return body.entries.map((e: { key: string }) => e.key);
}

/** Writes a key and asks for it at once, then deletes it and asks again, `times` times. */
async function writeThenAsk(times: number, tag: string): Promise<{ present: number; absent: number }> {
  let present = 0;
  let absent = 0;
  for (let i = 0; i < times; i++) {
    const key = `alder.${tag}${i}.config.url`;
    await alder.put(key, JSON.stringify({ i }));
    if ((await keysOf(`${tag}${i}`)).includes(key)) present++;
    await alder.delete(key);
    if (!(await keysOf(`${tag}${i}`)).includes(key)) absent++;
  }
  return { present, absent };
}

describe("the verb reads its own writes", () => {
  it("holds a key written just before the request, and not one deleted just before, 1,000 times in a row", async () => {
    expect(await writeThenAsk(1000, "quiet")).toEqual({ present: 1000, absent: 1000 });
  });

  it("does the same while another node writes 10,000 keys", async () => {
    let writing = true;
    const writer = (async () => {
      for (let i = 0; i < 10_000; i++) await cedar.put(`cedar.load.config.k${i}`, JSON.stringify({ n: i }));
      writing = false;
    })();
    let duringWrites = 0;
    let present = 0;
    let absent = 0;
    for (let i = 0; i < 1000; i++) {
      const { present: p, absent: a } = await writeThenAsk(1, `busy${i}-`);
      present += p;
      absent += a;
      if (writing) duringWrites++;
    }
    await writer;
    expect({ present, absent }).toEqual({ present: 1000, absent: 1000 });
    // The writes really ran alongside: a good part of the asks happened while they went on.
    expect(duringWrites).toBeGreaterThan(100);
    const keys = new Set<string>();
    let cursor: string | undefined;
    do {
      const { body } = await request(asker, VERB, {
        what: "needs",
        node: "cedar",
        module: "load",
        limit: 10_000,
        ...(cursor ? { cursor } : {}),
      });
      for (const e of body.entries) keys.add(e.key);
      cursor = body.next;
    } while (cursor !== undefined);
    expect(keys.size).toBe(10_000);
  });
});
