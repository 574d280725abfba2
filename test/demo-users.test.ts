import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { writeDemo, type DemoBus } from "../cli/demo.ts";
import type { Running } from "../runtime/index.ts";
import type { TestBus } from "../runtime/testing.ts";
import { startSet, testBus } from "./helpers.ts";

// The demo on a server of your own (README, "The demo"): a user whose password the server refuses is named.
let bus: TestBus;
let set: Running;
beforeAll(async () => {
  bus = await testBus();
  // The buckets the demo writes exist once a set has started.
  set = await startSet(bus);
});
afterAll(async () => {
  await set?.stop();
  await bus?.stop();
});

describe("the demo's users", () => {
  it("names the user the server refused, and where its password comes from", async () => {
    const wrongFor = (refused: string): DemoBus => ({
      servers: [bus.url],
      credentials: (user) => ({ user, password: user === refused ? "not-its-password" : bus.server.users[user]!.password }),
    });
    await expect(writeDemo(bus.config, wrongFor("mesh-controller"))).rejects.toThrow(
      /^the demo's user mesh-controller cannot connect: .*\(its password is the one of \.state\/users\.json, or of the --users file on a server of your own\)$/,
    );
    await expect(writeDemo(bus.config, wrongFor("birch"))).rejects.toThrow(/^the demo's user birch cannot connect: /);
  });
});
