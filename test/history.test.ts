import type { NatsConnection } from "nats";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { HistoryEntry } from "../functions/_lib/history.ts";
import type { Running } from "../runtime/index.ts";
import type { TestBus } from "../runtime/testing.ts";
import { request, startSet, testBus } from "./helpers.ts";

const VERB = "mesh-provisioner.provisioning";
let bus: TestBus;
let set: Running;
let seat: NatsConnection;
/** Each published event's stream sequence, in the order published. */
const seqs: number[] = [];
let between: string;

type Page = { what: string; entries: HistoryEntry[]; outOfShape: { key: string; reason: string }[]; next?: string };
const ask = async (body: Record<string, unknown>) => (await request(seat, VERB, { what: "history", ...body })).body as Page;

const publish = async (provider: string, event: string, body: unknown) => {
  const nc = await bus.connect(provider);
  const data = typeof body === "string" ? body : JSON.stringify(body);
  seqs.push((await nc.jetstream().publish(`${provider}.provisioner.${event}`, data)).seq);
};

beforeAll(async () => {
  bus = await testBus();
  set = await startSet(bus);
  seat = await bus.connect();
  await publish("keycloak", "failing", { machine: "dogwood", consumer: "grafana", word: "invalid_client", at: "2026-11-29T10:00:00Z" });
  await publish("postgres", "failing", { machine: "birch", consumer: "gitea", word: "too many connections", at: "2026-11-29T10:01:00Z" });
  await publish("keycloak", "rotated", { provision: "keycloak", revision: "r2", at: "2026-11-29T10:02:00Z" });
  // The server's stored times, not the providers', say `since`: this one is between the third and the fourth.
  await new Promise((r) => setTimeout(r, 20));
  between = new Date().toISOString();
  await new Promise((r) => setTimeout(r, 20));
  await publish("keycloak", "recovered", { machine: "dogwood", consumer: "grafana", at: "2026-11-29T10:03:00Z" });
  await publish("keycloak", "failing", "not json");
  await publish("postgres", "recovered", { machine: "birch", at: "2026-11-29T10:05:00Z" });
});
afterAll(async () => {
  await set?.stop();
  await bus?.stop();
});

describe("what=history", () => {
  it("answers every event the stream holds, newest first, a malformed one refused in its place with its reason", async () => {
    const page = await ask({});
    expect(page.entries.map((e) => [e.seq, e.event, e.provider])).toEqual([
      [seqs[3], "recovered", "keycloak"],
      [seqs[2], "rotated", "keycloak"],
      [seqs[1], "failing", "postgres"],
      [seqs[0], "failing", "keycloak"],
    ]);
    expect(page.entries[3]).toMatchObject({
      key: String(seqs[0]),
      machine: "dogwood",
      consumer: "grafana",
      word: "invalid_client",
      at: "2026-11-29T10:00:00Z",
    });
    expect(page.entries[1]).toMatchObject({ provision: "keycloak", revision: "r2" });
    expect(page.outOfShape).toEqual([
      {
        key: String(seqs[5]),
        reason: "postgres.provisioner.recovered: not a recovered event: consumer: Invalid input: expected string, received undefined",
      },
      { key: String(seqs[4]), reason: expect.stringMatching(/^keycloak\.provisioner\.failing: not JSON: /) },
    ]);
    expect(page.next).toBeUndefined();
  });

  it("narrows by provider, machine and consumer; a rotation of every holder reaches each, an unreadable event is shown", async () => {
    expect((await ask({ provider: "postgres" })).entries.map((e) => e.seq)).toEqual([seqs[1]]);
    const dogwood = await ask({ provider: "keycloak", machine: "dogwood", consumer: "grafana" });
    expect(dogwood.entries.map((e) => e.event)).toEqual(["recovered", "rotated", "failing"]);
    expect(dogwood.outOfShape.map((o) => o.key)).toEqual([String(seqs[4])]);
    const birch = await ask({ machine: "birch" });
    expect(birch.entries.map((e) => e.seq)).toEqual([seqs[2], seqs[1]]);
    // The malformed recovered says machine birch: reached; the text that is no JSON cannot be read: reached.
    expect(birch.outOfShape.map((o) => o.key)).toEqual([String(seqs[5]), String(seqs[4])]);
  });

  it("pages newest first under limit, each event once, the cursor tied to the narrowing", async () => {
    const seen: string[] = [];
    let page = await ask({ limit: 2 });
    seen.push(...page.entries.map((e) => e.key), ...page.outOfShape.map((o) => o.key));
    expect(seen).toEqual([String(seqs[5]), String(seqs[4])]);
    while (page.next !== undefined) {
      page = await ask({ limit: 2, cursor: page.next });
      seen.push(...page.entries.map((e) => e.key), ...page.outOfShape.map((o) => o.key));
    }
    expect(seen.map(Number).sort((a, b) => b - a)).toEqual([...seqs].reverse());
    const first = await ask({ limit: 1 });
    const refused = await request(seat, VERB, { what: "history", provider: "keycloak", cursor: first.next });
    expect(refused.errorCode).toBe(400);
    expect(refused.body.error.message).toBe("cursor: was issued for another what or narrowing; ask with the same ones");
  });

  it("keeps to `since`: the events stored at or after it", async () => {
    const page = await ask({ since: between });
    expect([...page.entries.map((e) => e.seq), ...page.outOfShape.map((o) => Number(o.key))].sort()).toEqual(seqs.slice(3).sort());
    expect((await ask({ since: "2999-01-01T00:00:00Z" })).entries).toEqual([]);
  });

  it("refuses since with another what, and a since that is no time, naming the field", async () => {
    const other = await request(seat, VERB, { what: "needs", since: between });
    expect(other.body.error.message).toBe("since: does not apply to what=needs (it narrows history)");
    const bad = await request(seat, VERB, { what: "history", since: "yesterday" });
    expect(bad.errorCode).toBe(400);
    expect(bad.body.error.message).toMatch(/^since: must be an RFC 3339 time/);
  });

  it("is served over HTTP as GET /provisioning?what=history", async () => {
    const answer = await fetch(`${set.httpUrl}/provisioning?what=history&provider=postgres`);
    expect(answer.status).toBe(200);
    expect(((await answer.json()) as Page).entries.map((e) => e.seq)).toEqual([seqs[1]]);
  });

  it("walks past many events of other subjects (the nodes' checks) to the providers' ones, missing none", async () => {
    const walk = async () => {
      const seen: string[] = [];
      let cursor: string | undefined;
      do {
        const page = await ask({ limit: 2, ...(cursor === undefined ? {} : { cursor }) });
        seen.push(...page.entries.map((e) => e.key), ...page.outOfShape.map((o) => `refused ${o.key}`));
        cursor = page.next;
      } while (cursor !== undefined);
      return seen;
    };
    const before = await walk();
    const alder = (await bus.connect("alder")).jetstream();
    for (let i = 0; i < 300; i++) {
      await alder.publish(
        "mesh-provisioner.checked.alder",
        JSON.stringify({ module: `m${i}`, provision: "p", ok: true, at: new Date().toISOString() }),
      );
    }
    expect(await walk()).toEqual(before);
    expect(before).toHaveLength(6);
  });

  // Last: it adds an event the others do not expect.
  it("says an event stamped more than 5 minutes ahead of its stored time refused, as the follower refuses it", async () => {
    const ahead = new Date(Date.now() + 2 * 3600_000).toISOString();
    await publish("keycloak", "failing", { machine: "elm", consumer: "grafana", word: "invalid_client", at: ahead });
    const page = await ask({ provider: "keycloak", limit: 1 });
    expect(page.entries).toEqual([]);
    expect(page.outOfShape).toEqual([
      {
        key: String(seqs.at(-1)),
        reason: expect.stringMatching(/^keycloak\.provisioner\.failing: at: .* is 120 minutes ahead of the server's time of the event/),
      },
    ]);
  });
});
