/**
 * The `{ cron, onStart?, timezone? }` trigger kind: a cron schedule run by croner (5 fields, or 6
 * with seconds), in UTC unless the trigger names an IANA time zone, and once at start when
 * `onStart`. Each scheduled time runs once across replicas: the replica that claims it in
 * `<seat>_claims`, by the time it was scheduled for on the server's clock, runs it
 * (docs/runtime.md §6.3.3, §6.15).
 */
import { Cron } from "croner";
import { z } from "zod";
import { coalesced } from "../serial.ts";
import type { TriggerKind } from "./kind.ts";

/**
 * `{ cron, onStart?, timezone? }`: a cron expression croner takes, whether to run once at start
 * too, and the IANA time zone its fields are read in (`UTC` when absent, whatever the machine's).
 */
export type CronTrigger = { readonly cron: string; readonly onStart?: boolean; readonly timezone?: string };
/** What a scheduled run says of it: its schedule and the time it was scheduled for; or that it is the run at start. */
export type CronInfo = { readonly kind: "cron"; readonly cron: string; readonly scheduledAt: Date } | { readonly kind: "start" };

/** A time zone `Intl` knows (`UTC`, `Europe/Berlin`). */
const timezone = z.string().refine((tz) => {
  try {
    new Intl.DateTimeFormat("en-US", { timeZone: tz });
    return true;
  } catch {
    return false;
  }
}, "must be an IANA time zone, e.g. UTC or Europe/Berlin");

/**
 * croner's options for the trigger's time zone: the zone it names, else UTC as an offset of 0.
 * An offset needs no `Intl` time-zone data, which costs a start about 15 ms and 9 MB of RSS
 * (docs/scale.md §11.2.2).
 */
const zoneOf = (trigger: CronTrigger) => (trigger.timezone === undefined ? { utcOffset: 0 } : { timezone: trigger.timezone });

/**
 * The schedule of a trigger, paused: croner's job in the trigger's time zone (UTC by default),
 * as the binding runs it. Throws what croner says of an expression it refuses.
 */
export function scheduleOf(trigger: CronTrigger): Cron {
  return new Cron(trigger.cron, { paused: true, ...zoneOf(trigger) });
}

/**
 * The scheduled time a run that fires `now` is for: the latest time of `job`'s schedule at or
 * before `now`, counted on from `from` (a time known to be scheduled, at or before it). A run
 * that fires late (the process stalled, or the last run held it) is named by the time it was due,
 * never by the next one, so two replicas never run one time under two names.
 */
export function dueAt(job: Cron, from: Date, now: Date): Date {
  let at = from;
  for (let next = job.nextRun(at); next !== null && next.getTime() <= now.getTime(); next = job.nextRun(at)) at = next;
  return at;
}

/** The time of `job`'s schedule nearest to `at`, the earlier on a tie. */
export function nearestRun(job: Cron, at: Date): Date {
  const t = at.getTime();
  const after = job.nextRun(new Date(t - 1));
  // The latest before `at`: looked for from further and further back (a second, 4 s, 16 s, … eight years).
  let before: Date | null = null;
  for (let back = 1000; before === null && back <= 4 ** 14 * 1000; back *= 4) {
    for (let next = job.nextRun(new Date(t - back)); next !== null && next.getTime() < t; next = job.nextRun(next)) before = next;
  }
  if (after === null) return before ?? at;
  if (before === null) return after;
  return t - before.getTime() <= after.getTime() - t ? before : after;
}

export const cron: TriggerKind<"cron", CronTrigger, CronInfo> = {
  key: "cron",
  shape: "{ cron, onStart? }",
  schema: z.strictObject({ cron: z.string().min(1), onStart: z.boolean().optional(), timezone: timezone.optional() }),
  checkFile(trigger, fn) {
    const problems = [];
    const fields = trigger.cron.trim().split(/\s+/).length;
    if (!trigger.cron.trim().startsWith("@") && fields !== 5 && fields !== 6) {
      problems.push({ at: "cron", message: `has ${fields} fields: a cron expression has 5, or 6 with seconds first` });
    } else {
      try {
        const job = scheduleOf(trigger);
        const next = job.nextRun();
        job.stop();
        if (next === null) problems.push({ at: "cron", message: "never comes (no such day, e.g. 30 February)" });
      } catch (err) {
        problems.push({ at: "cron", message: (err as Error).message });
      }
    }
    if (!z.safeParse(fn.input, {}).success) problems.push({ message: "a cron run's input is {}, which the input schema refuses" });
    return problems;
  },
  describe: (trigger) => `cron ${trigger.cron}${trigger.timezone ? ` ${trigger.timezone}` : ""}${trigger.onStart ? " (and at start)" : ""}`,

  /**
   * Once every kind is bound, runs every `{ cron, onStart: true }` function once (in order,
   * awaited), and again whenever the set made buckets again (docs/operations.md §13.4; never two
   * such passes at once: one asked during a pass runs once after it), then
   * schedules every trigger. A scheduled time is run only by the replica that
   * claims it, by that time ({@link dueAt}); a claim that cannot be made skips the run; a run
   * still going when the next is due skips that one. Not ready while a function's run at start failed, until it runs again.
   * Stopping waits, within the grace, for the runs in hand, a pass at start to the end of the run
   * under way (it starts no other).
   */
  async bind(targets, env) {
    const failedAtStart = new Set<string>();
    let jobs: Cron[] = [];
    // Runs and passes at start in hand, which stop waits for (within the grace).
    const running = new Set<Promise<unknown>>();
    let stopping = false;
    // One pass at a time: buckets made again while a pass is under way run one more after it. A
    // pass ends at the next function once stopping began.
    const pass = coalesced(async () => {
      for (const { fn, trigger } of targets) {
        if (stopping) return;
        if (!trigger.onStart) continue;
        const outcome = await env.run(fn, { value: {} }, { kind: "start" });
        if (outcome.ok) failedAtStart.delete(fn.name);
        else failedAtStart.add(fn.name);
      }
    });
    const runAtStart = () => {
      const passing = pass();
      running.add(passing);
      return passing.finally(() => running.delete(passing));
    };
    return {
      // What is made at start is made again with the buckets that held it.
      madeAgain: runAtStart,
      async afterBind() {
        await runAtStart();
        jobs = targets.map(({ fn, trigger }) => {
          const schedule = scheduleOf(trigger);
          // The first time the job will fire for; each run is named from the one before.
          let due = schedule.nextRun() ?? new Date();
          return new Cron(trigger.cron, { protect: true, ...zoneOf(trigger) }, async () => {
            due = dueAt(schedule, due, new Date());
            // Named by the server's clock (docs/runtime.md §6.15): replicas whose hosts disagree
            // by a second or more name one time alike, so one of them runs it.
            const scheduledAt = nearestRun(schedule, new Date(due.getTime() + env.clock.now().getTime() - Date.now()));
            const claimed = await env.claim(fn.name, scheduledAt).catch((err: unknown) => {
              // NATS away or slow: the reason is enough, no stack to read.
              env.log.warn({ function: fn.name, scheduledAt, err: (err as Error).message }, "scheduled run not claimed; skipped");
              return false;
            });
            if (!claimed) return;
            const run = env.run(fn, { value: {} }, { kind: "cron", cron: trigger.cron, scheduledAt });
            running.add(run);
            const outcome = await run.finally(() => running.delete(run));
            // A function that failed at start and has now run is no longer a reason to be not ready.
            if (outcome.ok) failedAtStart.delete(fn.name);
          });
        });
      },
      notReady: () => [...failedAtStart].map((name) => `${name}: its run at start failed`),
      stop: async () => {
        stopping = true;
        for (const job of jobs) job.stop();
        let timer: NodeJS.Timeout | undefined;
        await Promise.race([Promise.allSettled(running), new Promise((r) => (timer = setTimeout(r, env.graceMs)))]);
        clearTimeout(timer);
      },
    };
  },
};
