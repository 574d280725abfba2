import { Cron } from "croner";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { coalesced } from "../runtime/serial.ts";
import { cron, dueAt, scheduleOf } from "../runtime/triggers/cron.ts";
import { z } from "zod";

const utc = (text: string) => new Date(text).toISOString();
const runs = (job: Cron, n: number, from: string) => job.nextRuns(n, new Date(from)).map((d) => d.toISOString());

describe("cron schedules (docs/runtime.md §6.3.3)", () => {
  let tz: string | undefined;
  beforeEach(() => {
    tz = process.env.TZ;
    // A machine whose clock shifts in spring and autumn.
    process.env.TZ = "Europe/Berlin";
  });
  afterEach(() => {
    if (tz === undefined) delete process.env.TZ;
    else process.env.TZ = tz;
  });

  it("run in UTC whatever the machine's time zone, through both changes of Europe/Berlin", () => {
    // The machine's own zone skips an hour at the autumn change (what croner does when given none).
    expect(runs(new Cron("*/30 * * * * *", { paused: true }), 1, "2026-10-25T00:59:30Z")).toEqual([utc("2026-10-25T02:00:00Z")]);

    expect(runs(scheduleOf({ cron: "*/30 * * * * *" }), 3, "2026-10-25T00:59:30Z")).toEqual([
      utc("2026-10-25T01:00:00Z"),
      utc("2026-10-25T01:00:30Z"),
      utc("2026-10-25T01:01:00Z"),
    ]);
    expect(runs(scheduleOf({ cron: "0 * * * *" }), 3, "2026-10-25T00:00:00Z")).toEqual([
      utc("2026-10-25T01:00:00Z"),
      utc("2026-10-25T02:00:00Z"),
      utc("2026-10-25T03:00:00Z"),
    ]);
    expect(runs(scheduleOf({ cron: "0 * * * *" }), 3, "2026-03-29T00:00:00Z")).toEqual([
      utc("2026-03-29T01:00:00Z"),
      utc("2026-03-29T02:00:00Z"),
      utc("2026-03-29T03:00:00Z"),
    ]);
    expect(runs(scheduleOf({ cron: "0 3 * * *" }), 2, "2026-10-24T12:00:00Z")).toEqual([
      utc("2026-10-25T03:00:00Z"),
      utc("2026-10-26T03:00:00Z"),
    ]);
  });

  it("run in the time zone a trigger names", () => {
    const three = scheduleOf({ cron: "0 3 * * *", timezone: "Europe/Berlin" });
    expect(runs(three, 2, "2026-03-28T12:00:00Z")).toEqual([utc("2026-03-29T01:00:00Z"), utc("2026-03-30T01:00:00Z")]);
    expect(runs(three, 2, "2026-10-24T12:00:00Z")).toEqual([utc("2026-10-25T02:00:00Z"), utc("2026-10-26T02:00:00Z")]);
    expect(cron.schema.safeParse({ cron: "0 3 * * *", timezone: "Mars/Olympus" }).success).toBe(false);
    expect(cron.describe({ cron: "0 3 * * *", timezone: "Europe/Berlin" })).toBe("cron 0 3 * * * Europe/Berlin");
  });

  it("name a late run by the time it was due, never by the next", () => {
    const everySecond = scheduleOf({ cron: "* * * * * *" });
    const t = new Date("2026-12-01T10:00:00Z");
    expect(dueAt(everySecond, t, new Date(t.getTime() + 700)).toISOString()).toBe(utc("2026-12-01T10:00:00Z"));
    expect(dueAt(everySecond, t, new Date(t.getTime() + 2300)).toISOString()).toBe(utc("2026-12-01T10:00:02Z"));
    const hourly = scheduleOf({ cron: "0 * * * *" });
    expect(dueAt(hourly, new Date("2026-12-01T10:00:00Z"), new Date("2026-12-01T10:59:59.9Z")).toISOString()).toBe(
      utc("2026-12-01T10:00:00Z"),
    );
  });
});

describe("a cron trigger as a file loads", () => {
  const problems = (expression: string) => cron.checkFile!({ cron: expression }, { input: z.object({}) }).map((p) => p.message);

  it("takes 5 fields, or 6 with seconds, and croner's nicknames", () => {
    expect(problems("0 * * * *")).toEqual([]);
    expect(problems("*/5 * * * * *")).toEqual([]);
    expect(problems("@hourly")).toEqual([]);
  });

  it("refuses another count of fields, and a schedule that never comes", () => {
    expect(problems("0 0 0 1 1 * 2030")).toEqual(["has 7 fields: a cron expression has 5, or 6 with seconds first"]);
    expect(problems("0 0 *")).toEqual(["has 3 fields: a cron expression has 5, or 6 with seconds first"]);
    expect(problems("0 0 30 2 *")).toEqual(["never comes (no such day, e.g. 30 February)"]);
  });
});

describe("runs at start made again (docs/operations.md §13.4)", () => {
  it("never overlap: passes asked during one run once after it; stopping waits for the run under way and starts no other", async () => {
    let under = 0;
    let most = 0;
    const started: string[] = [];
    const ends: (() => void)[] = [];
    const fn = (name: string) => ({ name }) as never;
    const env = {
      graceMs: 5000,
      run: (f: { name: string }) => {
        started.push(f.name);
        most = Math.max(most, ++under);
        return new Promise((resolve) => ends.push(() => resolve((under--, { ok: true, value: null })))) as never;
      },
    } as never;
    const binding = await cron.bind(
      [
        { fn: fn("compile"), trigger: { cron: "0 0 1 1 *", onStart: true }, index: 0 },
        { fn: fn("hourly"), trigger: { cron: "0 * * * *" }, index: 0 },
        { fn: fn("index"), trigger: { cron: "0 0 1 1 *", onStart: true }, index: 0 },
      ],
      env,
    );
    const settle = () => new Promise((resolve) => setImmediate(resolve));
    const first = binding.afterBind!();
    await settle();
    // Buckets made again three times while the first pass runs: one more pass, after it.
    const again = [binding.madeAgain!(), binding.madeAgain!(), binding.madeAgain!()];
    await settle();
    expect(started).toEqual(["compile"]);
    ends.shift()!();
    await settle();
    expect(started).toEqual(["compile", "index"]);
    ends.shift()!();
    await first;
    await settle();
    expect(started).toEqual(["compile", "index", "compile"]);
    // Stopping now waits for the run under way, and the pass starts no other.
    let stopped = false;
    const stop = binding.stop!().then(() => (stopped = true));
    await settle();
    expect(stopped).toBe(false);
    ends.shift()!();
    await Promise.all([...again, stop]);
    expect(stopped).toBe(true);
    // Made again once stopping: nothing runs.
    await binding.madeAgain!();
    expect(started).toEqual(["compile", "index", "compile"]);
    expect(ends).toEqual([]);
    expect(most).toBe(1);
  });
});

describe("a coalesced task", () => {
  it("runs one at a time: a caller arriving as a run ends, before the queued one starts, gets the queued one", async () => {
    let under = 0;
    let most = 0;
    let runs = 0;
    const ends: (() => void)[] = [];
    const task = coalesced(() => {
      runs++;
      most = Math.max(most, ++under);
      return new Promise<number>((resolve) => ends.push(() => resolve((under--, runs))));
    });
    const first = task();
    const second = task();
    ends.shift()!();
    // A few microtasks after the first run ended: the second is queued, not started yet.
    for (let i = 0; i < 3; i++) await null;
    const third = task();
    expect(third).toBe(second);
    await new Promise((resolve) => setImmediate(resolve));
    ends.shift()!();
    expect([await first, await second, await third, most, runs]).toEqual([1, 2, 2, 1, 2]);
  });
});
