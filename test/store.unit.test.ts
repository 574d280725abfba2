import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { RecordStore, type RecordParts } from "../runtime/views/store.ts";

// The compact store of a view's records (docs/runtime.md §6.13) must give back exactly what was
// set last for each key, whatever the values' sizes and however often the arena was copied anew.
// Small chunks here, so values of a chunk of their own and copies of the arena happen at once.

const keyOf = fc.array(fc.constantFrom("a", "b-c", "z"), { minLength: 1, maxLength: 2 }).map((t) => t.join("."));
const partsOf = fc.record({
  key: keyOf,
  // Up to 300 bytes against 256-byte chunks: some fill a chunk, some have their own.
  value: fc.uint8Array({ maxLength: 300 }),
  revision: fc.integer({ min: 1, max: 2 ** 40 }),
  createdMs: fc.integer({ min: 0, max: 2 ** 42 }),
  createdNanos: fc.double({ min: 0, max: 2 ** 62, noNaN: true }),
  deleted: fc.boolean(),
  cut: fc.boolean(),
});

describe("a view's record store", () => {
  it("gives back the last record set of each key, in key order, across copies of its arena", () => {
    fc.assert(
      fc.property(fc.array(partsOf, { maxLength: 200 }), (writes) => {
        const store = new RecordStore({ chunkBytes: 256, deadBytesKept: 512 });
        const model = new Map<string, RecordParts>();
        for (const parts of writes) {
          store.set(parts);
          model.set(parts.key, parts);
        }
        expect(store.size).toBe(model.size);
        const keys = [...model.keys()].sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
        expect([...store.entries("")].map(([key]) => key)).toEqual(keys);
        let live = 0;
        for (const [key, parts] of model) {
          const slot = store.slotOf(key)!;
          expect(store.keyOf(slot)).toBe(key);
          expect(store.deleted(slot)).toBe(parts.deleted);
          expect(store.cut(slot)).toBe(parts.cut);
          const record = store.record(slot);
          expect(record).toEqual({
            key,
            value: Buffer.from(parts.cut ? [] : parts.value),
            revision: parts.revision,
            created: new Date(parts.createdMs),
            createdNanos: parts.createdNanos,
            deleted: parts.deleted,
          });
          live += parts.cut ? 0 : parts.value.length;
        }
        expect(store.bytes.live).toBe(live);
      }),
      { numRuns: 300 },
    );
  });

  it("copies its arena anew once the dead bytes pass the live ones", () => {
    const store = new RecordStore({ chunkBytes: 1024, deadBytesKept: 2048 });
    const value = new Uint8Array(100).fill(7);
    const set = (key: string) => store.set({ key, value, revision: 1, createdMs: 0, createdNanos: 0, deleted: false, cut: false });
    for (let i = 0; i < 10; i++) set(`k${i}`);
    expect(store.bytes).toEqual({ arena: 1024, live: 1000 });
    // The same key written 30 times over: 3,000 bytes dead at most before a copy, 1,000 live.
    for (let i = 0; i < 30; i++) set("k0");
    expect(store.bytes.live).toBe(1000);
    expect(store.bytes.arena).toBeLessThanOrEqual(1024 * 5);
    expect([...store.record(store.slotOf("k0")!).value]).toEqual([...value]);
  });

  it("lets go of a value of a chunk of its own as soon as it is written over", () => {
    const store = new RecordStore({ chunkBytes: 1024 });
    const big = new Uint8Array(600).fill(1);
    store.set({ key: "big", value: big, revision: 1, createdMs: 0, createdNanos: 0, deleted: false, cut: false });
    expect(store.bytes).toEqual({ arena: 600, live: 600 });
    store.set({ key: "big", value: new Uint8Array(10), revision: 2, createdMs: 0, createdNanos: 0, deleted: false, cut: false });
    expect(store.bytes).toEqual({ arena: 1024, live: 10 });
  });
});
