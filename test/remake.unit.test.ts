import { pino } from "pino";
import { describe, expect, it } from "vitest";
import { remaker } from "../runtime/remake.ts";

const silent = pino({ level: "silent" });

describe("making buckets again (runtime/remake.ts)", () => {
  it("asserts each bucket on its own: one that cannot be made rejects its callers alone", async () => {
    const asserted: string[][] = [];
    const r = remaker(async (only, created) => {
      asserted.push([...(only ?? [])]);
      if (only?.includes("wrong")) throw new Error("bucket wrong exists with other settings than the config");
      for (const b of only ?? []) created(b);
    }, silent);
    let told = 0;
    r.onMadeAgain(() => told++);
    const results = await Promise.allSettled([r.remake("a"), r.remake("wrong"), r.remake("b"), r.remake("a")]);
    expect(results.map((x) => x.status)).toEqual(["fulfilled", "rejected", "fulfilled", "fulfilled"]);
    expect(asserted.sort()).toEqual([["a"], ["b"], ["wrong"]]);
    // Once for the batch, not once a bucket, once the batch is done.
    await new Promise((resolve) => setTimeout(resolve, 10));
    expect(told).toBe(1);
  });

  it("starts again for a bucket found gone right as the last batch ended, whatever the callers' promise chains", async () => {
    // A caller whose continuation asks for another bucket some microtasks after its own was made.
    const second = await Promise.all(
      Array.from({ length: 8 }, async (_, depth) => {
        const r = remaker(async () => {}, silent);
        let p: Promise<unknown> = r.remake("a");
        for (let i = 0; i < depth; i++) p = p.then((x) => x);
        const b = p.then(() => r.remake("b"));
        const outcome = await Promise.race([b.then(() => "made"), new Promise((resolve) => setTimeout(resolve, 6000, "pending"))]);
        r.stop();
        return outcome;
      }),
    );
    expect(second).toEqual(Array(8).fill("made"));
  }, 15_000);

  it("makes nothing once stopped: a remake asked for then never settles, and nothing is asserted", async () => {
    const asserted: string[] = [];
    const r = remaker(async (only) => void asserted.push(...(only ?? [])), silent);
    const before = r.remake("a");
    r.stop();
    const outcome = await Promise.race([before.then(() => "made"), new Promise((resolve) => setTimeout(resolve, 2500, "pending"))]);
    expect(outcome).toBe("pending");
    expect(asserted).toEqual([]);
  }, 10_000);
});
