import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { currentModel, modelOf, modulesOf, stateAt, STATE_VIEWS, type StateInputs } from "../functions/_lib/state.ts";
import { memoryBucket, type MemoryBucket } from "../runtime/testing.ts";

// docs/state.md §7.5: the model kept up to date from the keys changed since equals the model
// made from the whole of the views, after any writes. In memory: no nats-server.
const GRACE_SECONDS = 600;
const NOW = new Date(Date.UTC(2026, 0, 2));

/** Each module's state, as the verb answers it, in key order. */
const statesOf = async (model: Promise<Awaited<ReturnType<typeof modelOf>>>) => {
  const made = await model;
  return [...modulesOf(made.modules)].map((m) => stateAt(made, m, NOW, GRACE_SECONDS));
};

describe("the kept model (unit)", () => {
  const ids = { node: fc.integer({ min: 0, max: 2 }), module: fc.integer({ min: 0, max: 2 }) };
  const op = fc.oneof(
    fc.record({ op: fc.constantFrom("assign" as const, "unassign" as const), ...ids }),
    fc.record({
      op: fc.constantFrom("need" as const, "unneed" as const),
      ...ids,
      name: fc.integer({ min: 0, max: 2 }),
      provider: fc.option(fc.constantFrom("m0", "m1"), { nil: undefined }),
    }),
    fc.record({ op: fc.constant("apply" as const), ...ids, error: fc.boolean(), odd: fc.boolean() }),
    fc.record({ op: fc.constant("fail" as const), ...ids, recovered: fc.boolean() }),
  );

  it("equals the model made whole after every write of random assignments, needs, applied records and failings", async () => {
    await fc.assert(
      fc.asyncProperty(fc.array(op, { minLength: 1, maxLength: 40 }), async (ops) => {
        let nanos = Date.UTC(2026, 0, 1) * 1e6;
        // One clock for every bucket, as one server's: each write a microsecond after the last.
        const clock = () => (nanos += 1000);
        const buckets = Object.fromEntries(STATE_VIEWS.map((name) => [name, memoryBucket(name, clock)])) as Record<
          (typeof STATE_VIEWS)[number],
          MemoryBucket
        >;
        const inputs = (): StateInputs =>
          Object.fromEntries(STATE_VIEWS.map((name) => [name, buckets[name].snapshot()])) as unknown as StateInputs;
        const node = (n: number) => ["alder", "birch", "cedar"][n]!;
        for (const o of ops) {
          const key = `${node(o.node)}.m${o.module}`;
          if (o.op === "assign") buckets.assignments.put(key, "{}");
          if (o.op === "unassign") buckets.assignments.delete(key);
          if (o.op === "need") buckets.needs.put(`${key}.bound.n${o.name}`, JSON.stringify(o.provider ? { provider: o.provider } : {}));
          if (o.op === "unneed") buckets.needs.delete(`${key}.bound.n${o.name}`);
          if (o.op === "apply") buckets.applied.put(key, o.odd ? '{"error":42}' : JSON.stringify(o.error ? { error: "no" } : {}));
          if (o.op === "fail") {
            const at = new Date(nanos / 1e6).toISOString();
            buckets.failing.put(
              `m${o.module}.${node(o.node)}.m${(o.module + 1) % 3}`,
              JSON.stringify(o.recovered ? { recovered: at } : { word: "refused", since: at, at }),
            );
          }
          const now = inputs();
          expect(await statesOf(currentModel(now, GRACE_SECONDS))).toEqual(await statesOf(modelOf(now, GRACE_SECONDS)));
        }
      }),
      { numRuns: 200 },
    );
  }, 60_000);
});
