/**
 * The `{ cron, onStart? }` trigger kind: a cron schedule run by croner (5 fields, or 6 with
 * seconds), and once at start when `onStart`. Each scheduled time runs once across replicas:
 * the replica that claims it in `<seat>_claims` runs it (docs/runtime.md §6.3.3).
 */
import { Cron } from "croner";
import { z } from "zod";
import type { TriggerKind } from "./kind.ts";

/** `{ cron, onStart? }`: a cron expression croner takes, and whether to run once at start too. */
export type CronTrigger = { readonly cron: string; readonly onStart?: boolean };
/** What a scheduled run says of it: its schedule and the time it was scheduled for; or that it is the run at start. */
export type CronInfo = { readonly kind: "cron"; readonly cron: string; readonly scheduledAt: Date } | { readonly kind: "start" };

export const cron: TriggerKind<"cron", CronTrigger, CronInfo> = {
  key: "cron",
  shape: "{ cron, onStart? }",
  schema: z.strictObject({ cron: z.string().min(1), onStart: z.boolean().optional() }),
  checkFile(trigger, fn) {
    const problems = [];
    try {
      new Cron(trigger.cron, { paused: true }).stop();
    } catch (err) {
      problems.push({ at: "cron", message: (err as Error).message });
    }
    if (!fn.input.safeParse({}).success) problems.push({ message: "a cron run's input is {}, which the input schema refuses" });
    return problems;
  },
  describe: (trigger) => `cron ${trigger.cron}${trigger.onStart ? " (and at start)" : ""}`,

  /**
   * Once every kind is bound, runs every `{ cron, onStart: true }` function once (in order,
   * awaited), then schedules every trigger. A scheduled time is run only by the replica that
   * claims it; a claim that cannot be made skips the run; a run still going when the next is due
   * skips that one. Not ready while a function's run at start failed, until it runs again.
   */
  async bind(targets, env) {
    const failedAtStart = new Set<string>();
    let jobs: Cron[] = [];
    return {
      async afterBind() {
        for (const { fn, trigger } of targets) {
          if (!trigger.onStart) continue;
          const outcome = await env.run(fn, { value: {} }, { kind: "start" });
          if (!outcome.ok) failedAtStart.add(fn.name);
        }
        jobs = targets.map(
          ({ fn, trigger }) =>
            new Cron(trigger.cron, { protect: true }, async () => {
              // Schedules are whole seconds: the nearest one names this run the same on every replica.
              const scheduledAt = new Date(Math.round(Date.now() / 1000) * 1000);
              const claimed = await env.claim(fn.name, scheduledAt).catch((err: unknown) => {
                env.log.warn({ function: fn.name, scheduledAt, err }, "scheduled run not claimed; skipped");
                return false;
              });
              if (!claimed) return;
              const outcome = await env.run(fn, { value: {} }, { kind: "cron", cron: trigger.cron, scheduledAt });
              // A function that failed at start and has now run is no longer a reason to be not ready.
              if (outcome.ok) failedAtStart.delete(fn.name);
            }),
        );
      },
      notReady: () => [...failedAtStart].map((name) => `${name}: its run at start failed`),
      stop: async () => jobs.forEach((job) => job.stop()),
    };
  },
};
