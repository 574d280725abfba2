/**
 * The server's clock as this process reads it (docs/runtime.md §6.15): this host's clock plus an
 * offset measured from the time the server gave a write of its own. What the docs state in the
 * server's time (a grace since a stored write, how old a rotation is) is judged on it, so a host
 * clock set wrong decides nothing.
 */
import type { Logger } from "pino";
import type { Clock } from "./types.ts";

/** One measure: this host's clock just before a write and once it was acknowledged, and the server's time of it (ms since the epoch, with a fraction). */
export interface ClockSample {
  readonly sentAt: number;
  readonly ackedAt: number;
  readonly storedAt: number;
}

/** How often the offset is measured again, in milliseconds. */
export const CLOCK_EVERY_MS = 30_000;

/** The server's clock: `now()` is this host's time plus the last measured offset. */
export interface ServerClock extends Clock {
  /** The server's time less this host's, in ms, as last measured; `undefined` before a first measure succeeded. */
  offsetMs(): number | undefined;
  /** Measures the offset again now; a measure that fails keeps the last offset and is logged. */
  measure(): Promise<void>;
  /** Stops measuring. */
  stop(): void;
}

/**
 * A clock reading the server's time from `sample` (a write to the server and the time it stored
 * it), measured at once and every {@link CLOCK_EVERY_MS}: the offset is the stored time less the
 * midpoint of the write's round trip, so it is right to within half of it. `local` is this host's
 * clock (ms since the epoch). Until a first measure succeeds, `now()` is this host's clock.
 */
export function serverClock(sample: () => Promise<ClockSample>, log: Logger, local: () => number = Date.now): ServerClock {
  let offset: number | undefined;
  let said = false;
  const measure = async () => {
    try {
      const { sentAt, ackedAt, storedAt } = await sample();
      const measured = storedAt - (sentAt + ackedAt) / 2;
      // Said when it is more than a second, and when it comes back under.
      const far = Math.abs(measured) > 1000;
      if (far && (offset === undefined || Math.abs(measured - offset) > 1000)) {
        log.warn({ offsetMs: Math.round(measured) }, "this host's clock differs from the server's; times are judged on the server's");
      }
      offset = measured;
      said = false;
    } catch (err) {
      if (!said) {
        log.warn(
          { err: (err as Error).message },
          offset === undefined
            ? "the server's time could not be read; judging on this host's clock until it can"
            : "the server's time could not be read; judging on the last offset measured",
        );
      }
      said = true;
    }
  };
  const timer = setInterval(() => void measure(), CLOCK_EVERY_MS);
  timer.unref();
  return {
    now: () => new Date(local() + (offset ?? 0)),
    offsetMs: () => offset,
    measure,
    stop: () => clearInterval(timer),
  };
}
