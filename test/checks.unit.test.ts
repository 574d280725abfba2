import fc from "fast-check";
import { describe, expect, it } from "vitest";
import type { CheckedEvent } from "../contract/events.ts";
import { decideCheck, type CheckValue } from "../functions/_lib/checks.ts";

// docs/presence.md §16.5: newest by `at` wins, and the streak is that result's.
const at = (s: number) => new Date(Date.UTC(2026, 11, 2, 6, 0, 0) + s * 1000).toISOString();
const applyAll = (events: readonly CheckedEvent[]) =>
  events.reduce<CheckValue | undefined>((kept, e) => decideCheck(kept, e).write ?? kept, undefined);

/** Distinct seconds, each with a result. */
const histories = fc
  .uniqueArray(fc.integer({ min: 0, max: 10_000 }), { minLength: 1, maxLength: 12 })
  .chain((seconds) =>
    fc.tuple(fc.constant(seconds.sort((a, b) => a - b)), fc.array(fc.boolean(), { minLength: seconds.length, maxLength: seconds.length })),
  )
  .map(([seconds, oks]) =>
    seconds.map((s, i): CheckedEvent => ({
      module: "m",
      provision: "p",
      ok: oks[i]!,
      ...(oks[i] ? {} : { reason: "AuthFailed" }),
      at: at(s),
    })),
  );

/** When the last run of one result began, in a history in time order. */
const streakStart = (events: readonly CheckedEvent[]) => {
  let i = events.length - 1;
  while (i > 0 && events[i - 1]!.ok === events[i]!.ok) i--;
  return events[i]!.at;
};

describe("a check's newest result and streak (unit)", () => {
  it("in time order: the newest result, its streak from the first of its last run", () => {
    fc.assert(
      fc.property(histories, (events) => {
        const kept = applyAll(events)!;
        expect(kept).toMatchObject({ ok: events.at(-1)!.ok, at: events.at(-1)!.at, since: streakStart(events) });
      }),
      { numRuns: 500 },
    );
  });

  it("in any order: the newest result, its streak never earlier than the true one nor later than its own time", () => {
    fc.assert(
      fc.property(
        histories.chain((events) => fc.tuple(fc.constant(events), fc.shuffledSubarray(events, { minLength: events.length }))),
        ([events, arrival]) => {
          const kept = applyAll(arrival)!;
          expect(kept.ok).toBe(events.at(-1)!.ok);
          expect(kept.at).toBe(events.at(-1)!.at);
          expect(kept.since >= streakStart(events)).toBe(true);
          expect(kept.since <= kept.at).toBe(true);
        },
      ),
      { numRuns: 500 },
    );
  });

  it("a failing result wins a tie, and the same event twice changes nothing", () => {
    const ok: CheckedEvent = { module: "m", provision: "p", ok: true, at: at(5) };
    const failing: CheckedEvent = { module: "m", provision: "p", ok: false, reason: "Timeout", at: at(5) };
    expect(applyAll([ok, failing])).toMatchObject({ ok: false, reason: "Timeout" });
    expect(applyAll([failing, ok])).toMatchObject({ ok: false, reason: "Timeout" });
    expect(decideCheck(applyAll([failing]), failing)).toEqual({ change: "older" });
  });

  it("an ok result at the instant of a later failing one cuts the streak there, in either order of arrival", () => {
    const failing1: CheckedEvent = { module: "m", provision: "p", ok: false, reason: "AuthFailed", at: at(1) };
    const failing2: CheckedEvent = { ...failing1, at: at(2) };
    const ok2: CheckedEvent = { module: "m", provision: "p", ok: true, at: at(2) };
    for (const arrival of [
      [failing1, failing2, ok2],
      [failing1, ok2, failing2],
      [ok2, failing1, failing2],
      [failing2, failing1, ok2],
    ]) {
      expect(applyAll(arrival)).toMatchObject({ ok: false, since: at(2), at: at(2) });
    }
  });
});
