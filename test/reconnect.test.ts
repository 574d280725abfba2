import type { NatsConnection } from "nats";
import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { start, type Running } from "../runtime/index.ts";
import type { TestBus } from "../runtime/testing.ts";
import { STATUS } from "../functions/_lib/status.ts";
import { VERB } from "../functions/_lib/provisioning.ts";
import { request, testBus, until } from "./helpers.ts";

let bus: TestBus;
let set: Running;
let asker: NatsConnection;
let keycloak: NatsConnection;
const lines: string[] = [];

beforeAll(async () => {
  bus = await testBus();
  set = await start({ config: bus.config, log: pino({ level: "info" }, { write: (line: string) => void lines.push(line) }) });
  asker = await bus.connect("birch");
  keycloak = await bus.connect("keycloak");
});
afterAll(async () => {
  await set.stop();
  await bus.stop();
});

/** Whether a request gets an answer now (short timeout: the bus may be down). */
const answers = async (subject: string, payload: unknown) =>
  asker.request(subject, JSON.stringify(payload), { timeout: 500 }).then(
    (m) => !m.headers?.get("Nats-Service-Error-Code"),
    () => false,
  );

describe("when nats-server restarts", () => {
  it("reconnects: the verb answers again, a failing published afterwards shows in status, no stack trace", async () => {
    const needs = await bus.kv("needs", "alder");
    await needs.put("alder.gitea.config.before", '{"v":1}');
    expect(await answers(VERB, { what: "needs", node: "alder" })).toBe(true);

    await bus.restart();
    const back = Date.now();
    await until(() => answers(VERB, { what: "needs", node: "alder" }), 10_000, "the verb answers after the restart");
    expect(Date.now() - back).toBeLessThan(10_000);

    await keycloak
      .jetstream()
      .publish(
        "keycloak.provisioner.failing",
        JSON.stringify({ machine: "alder", consumer: "gitea", word: "after the restart", at: new Date().toISOString() }),
      );
    await until(
      async () => (await request(asker, STATUS, { provider: "keycloak" })).body.failing?.length === 1,
      10_000,
      "the failing in status",
    );
    const { body } = await request(asker, VERB, { what: "needs", node: "alder" });
    expect(body.entries.map((e: { key: string }) => e.key)).toEqual(["alder.gitea.config.before"]);
    expect(lines.filter((line) => /\\n\s+at /.test(line))).toEqual([]);
  });
});
