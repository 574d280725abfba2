import type { NatsConnection, ServiceInfo, ServiceStats } from "nats";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Running } from "../runtime/index.ts";
import type { TestBus } from "../runtime/testing.ts";
import { VERB } from "../functions/_lib/provisioning.ts";
import { request, startSet, testBus } from "./helpers.ts";

let bus: TestBus;
let set: Running;
let operator: NatsConnection;

beforeAll(async () => {
  // An operator's tools ask $SRV subjects, which the derived permissions give no role.
  bus = await testBus({ seatPermissions: { publish: { allow: [">"] }, subscribe: { allow: [">"] } } });
  set = await startSet(bus);
  operator = await bus.connect();
});
afterAll(async () => {
  await set.stop();
  await bus.stop();
});

describe("the NATS service", () => {
  it("describes each request/reply function with the JSON Schema of its request and answer", async () => {
    const infos: ServiceInfo[] = [];
    for await (const info of await operator.services.client().info("mesh-provisioner")) infos.push(info);
    expect(infos).toHaveLength(1);
    // The service's own description and version: the package.json's.
    expect([infos[0]!.description, infos[0]!.version]).toEqual([
      "The provisioner's server of a self-hosted mesh: the registry of which domain answers which kind, and the read-only verb mesh-provisioner.provisioning, as a function set over NATS.",
      "0.1.0",
    ]);
    const endpoints = Object.fromEntries(infos[0]!.endpoints.map((e) => [e.name, e]));
    expect(Object.keys(endpoints).sort()).toEqual(["provisioning", "status"]);
    expect(endpoints.provisioning!.subject).toBe("mesh-provisioner.provisioning");
    const request = JSON.parse(endpoints.provisioning!.metadata!.request_schema!);
    expect(request.properties.what.enum).toEqual([
      "registry",
      "needs",
      "applied",
      "collect",
      "state",
      "nodes",
      "checks",
      "holders",
      "rotations",
      "history",
    ]);
    expect(request.additionalProperties).toBe(false);
    const answer = JSON.parse(endpoints.provisioning!.metadata!.response_schema!);
    expect(answer.required).toEqual(["what", "entries", "outOfShape"]);
    const status = JSON.parse(endpoints.status!.metadata!.response_schema!);
    expect(Object.keys(status.properties)).toEqual([
      "well",
      "failing",
      "outOfShape",
      "omitted",
      "registry",
      "rejectedEvents",
      "events",
      "provisioning",
      "stale",
      "nodes",
      "checks",
    ]);
    expect(endpoints.status!.metadata!.description).toMatch(/^Answers mesh-provisioner\.status/);
  });

  it("counts in $SRV.STATS every request, refusals as errors, and the whole time of each", async () => {
    const asker = await bus.connect("birch");
    for (let i = 0; i < 3; i++) await request(asker, VERB, { what: "registry" });
    for (let i = 0; i < 2; i++) expect((await request(asker, VERB, { what: "nope" })).errorCode).toBe(400);
    const all: ServiceStats[] = [];
    for await (const stats of await operator.services.client().stats("mesh-provisioner")) all.push(stats);
    const verb = all[0]!.endpoints!.find((e) => e.name === "provisioning")!;
    expect([verb.num_requests, verb.num_errors]).toEqual([5, 2]);
    expect(verb.last_error).toMatch(/^what: /);
    expect(verb.processing_time).toBeGreaterThan(0);
    expect(verb.average_processing_time).toBe(Math.round(verb.processing_time / 5));
  });
});
