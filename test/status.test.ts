import type { NatsConnection } from "nats";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { eventsOf, STATUS, type Status } from "../functions/_lib/status.ts";
import { failingFor } from "../cli/ask.ts";
import { formatStatus } from "../cli/status.ts";
import type { Running } from "../runtime/index.ts";
import type { TestBus } from "../runtime/testing.ts";
import { request, startSet, testBus, until } from "./helpers.ts";

const MAX_PAYLOAD = 64 * 1024;
let bus: TestBus;
let seat: NatsConnection;
let set: Running;

beforeAll(async () => {
  bus = await testBus({ maxPayload: MAX_PAYLOAD });
  seat = await bus.connect();
  set = await startSet(bus);
});
afterAll(async () => {
  await set.stop();
  await bus.stop();
});

describe("status at its limits", () => {
  it("fits in max_payload, keeping failing triples before out-of-shape keys, and counts what it left out", async () => {
    const failing = await bus.kv("failing");
    const value = JSON.stringify({ word: "w", since: "2026-11-29T12:00:00Z", at: "2026-11-29T12:00:00Z" });
    await Promise.all(Array.from({ length: 50 }, (_, i) => failing.put(`p.m.c${i}`, value)));
    await Promise.all(Array.from({ length: 1000 }, (_, i) => failing.put(`stray.${"x".repeat(100)}${i}`, "not json")));
    const reply = await request(seat, STATUS, {});
    expect(reply.errorCode).toBeUndefined();
    expect(reply.bytes).toBeLessThanOrEqual(MAX_PAYLOAD);
    const status = reply.body as Status;
    expect(status.well).toBe(false);
    expect(status.failing).toHaveLength(50);
    expect(status.outOfShape.length).toBeGreaterThan(0);
    expect(status.outOfShape.length + status.omitted).toBe(1000);
    const http = (await (await fetch(`${set.httpUrl}/status`)).json()) as Status;
    expect(http.omitted).toBe(status.omitted);
  });

  it("answers when a record of the runtime is damaged, and counts from it again", async () => {
    const records = await bus.kv("mesh-provisioner_runtime");
    await records.put("refused.provider-failing", "garbage");
    await records.put("ran.registry-compile", "garbage");
    const reply = await request(seat, STATUS, { provider: "p" });
    expect(reply.errorCode).toBeUndefined();
    expect(reply.body).toMatchObject({ rejectedEvents: 0, registry: { compiledAt: null } });
    await (await bus.connect("keycloak")).jetstream().publish("keycloak.provisioner.failing", "not json");
    await until(async () => (await request(seat, STATUS, { provider: "p" })).body.rejectedEvents === 1);
  });
});

describe("what status says of the events (docs/failing.md §5.6)", () => {
  it("says the mesh cannot record events while its stream does not exist, in the runtime's words", () => {
    const missing = "stream mesh-provisioner_events does not exist on the server: nothing is recorded in it";
    const events = eventsOf({
      checkedAt: "2026-11-29T15:12:29.000Z",
      refusing: null,
      account: null,
      streams: {
        events: {
          stream: "mesh-provisioner_events",
          bytes: 2048,
          maxBytes: null,
          messages: 12,
          ackWaitSeconds: 30,
          consumers: [{ durable: "mesh-provisioner-events", pending: 0, unacknowledged: 0 }],
          missing,
        },
      },
    });
    expect(events).toMatchObject({ recording: false, reason: missing });
  });
});

describe("status as the CLI prints it", () => {
  const now = new Date("2026-11-29T15:12:30Z");
  const status = (word: string): Status => ({
    well: false,
    failing: [
      { provider: "keycloak", machine: "dogwood", consumer: "grafana", word, since: "2026-11-29T12:00:00Z", at: "2026-11-29T15:00:00Z" },
    ],
    outOfShape: [],
    omitted: 0,
    registry: { kinds: ["config", "secret"], compiledAt: "2026-11-29T15:00:00.000Z" },
    rejectedEvents: 2,
    events: {
      recording: true,
      reason: null,
      checkedAt: "2026-11-29T15:12:29.000Z",
      stream: { name: "mesh-provisioner_events", bytes: 2048, maxBytes: 1024 ** 3, messages: 12 },
      account: { bytes: 5_000_000, maxBytes: null },
      pending: 0,
      unacknowledged: 0,
      ackWaitSeconds: 30,
    },
    provisioning: {
      counts: { unassigned: 0, "never-ran": 0, pending: 0, failed: 0, "declares-nothing": 0, applied: 3 },
      notWell: [],
      omitted: 0,
    },
    stale: [],
    nodes: { counts: { reachable: 0, unreachable: 0, silent: 0 }, unreachable: [] },
    checks: { failing: 0 },
  });

  it("says how long each has failed, in two units", () => {
    expect(failingFor("2026-11-29T12:00:00Z", now)).toBe("3h12m");
    expect(failingFor("2026-11-29T15:12:00Z", now)).toBe("30s");
    expect(failingFor("2026-11-27T15:00:00Z", now)).toBe("2d12m");
    expect(failingFor("2026-11-29T16:00:00Z", now)).toBe("0s");
  });

  it("prints a table, writing control characters out and cutting long words whole", () => {
    expect(formatStatus(status("invalid_client"), now).split("\n")).toEqual([
      "NOT WELL: 1 failing",
      "",
      "PROVIDER  MACHINE  CONSUMER  FAILING FOR  WORD",
      "keycloak  dogwood  grafana   3h12m        invalid_client",
      "",
      "registry: 2 kinds, compiled 12m30s ago (2026-11-29T15:00:00.000Z)",
      "rejected events: 2",
      "events stream mesh-provisioner_events: 12 events, 2 KiB of 1 GiB",
      "account storage: 4.77 MiB (no limit of its own: the server's applies)",
    ]);
    const hostile = formatStatus(status("a\u0000b\n\u001b[31mred"), now).split("\n")[3]!;
    expect(hostile.endsWith("a\\u0000b\\u000a\\u001b[31mred")).toBe(true);
    const bidi = formatStatus(status("abc\u202edef\u200b"), now).split("\n")[3]!;
    expect(bidi.endsWith("abc\\u202edef\\u200b")).toBe(true);
    const long = formatStatus(status("😀".repeat(100)), now).split("\n")[3]!;
    expect(long.endsWith(`${"😀".repeat(79)}…`)).toBe(true);
  });

  it("names each stale holder, and what was left out to fit one reply", () => {
    const stale: Status = {
      ...status("x"),
      failing: [],
      omitted: 1,
      stale: [
        {
          provider: "keycloak",
          provision: "grafana-oidc",
          node: "dogwood",
          module: "grafana",
          key: "dogwood.grafana.secret.grafana-oidc",
          revision: "r3",
          heldRevision: "r2",
          rotatedAt: "2026-11-29T15:00:00Z",
          appliedAt: null,
        },
      ],
    };
    expect(formatStatus(stale, now).split("\n").slice(0, 6)).toEqual([
      "NOT WELL: 1 stale holder",
      "",
      "PROVIDER  PROVISION     NODE     MODULE   HOLDS  SHOULD HOLD  ROTATED",
      "keycloak  grafana-oidc  dogwood  grafana  r2     r3           12m30s ago",
      "… and 1 more left out to fit one reply (narrow with --provider, --machine or --consumer)",
      "",
    ]);
  });

  it("says first when events cannot be recorded, and what a replica holds unacknowledged", () => {
    const full: Status = {
      ...status("x"),
      well: false,
      failing: [],
      events: {
        ...status("x").events,
        recording: false,
        reason: "JetStream refuses to store: insufficient resources",
        unacknowledged: 7,
        pending: 3,
      },
    };
    const lines = formatStatus(full, now).split("\n");
    expect(lines.slice(0, 2)).toEqual([
      "NOT WELL: events cannot be recorded",
      "events: JetStream refuses to store: insufficient resources",
    ]);
    expect(lines.slice(-2)).toEqual([
      "3 events not handled yet",
      "7 events delivered to a replica and not acknowledged yet: not in status until handled (a replica that stopped holds them for up to 30 s)",
    ]);
  });
});
