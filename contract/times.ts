import * as z from "zod/mini";

const PARTS = /^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)$/;

const UTC = /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z$/;

/** A time's whole seconds since the epoch and its fraction's digits, trailing zeros dropped. */
function parts(at: string): { seconds: number; fraction: string } {
  const [, whole, fraction = "", zone] = PARTS.exec(at.toUpperCase())!;
  return { seconds: Date.parse(`${whole}${zone}`) / 1000, fraction: fraction.replace(/0+$/, "") };
}

/**
 * Orders two RFC 3339 times by the instant they name, whatever their offsets, to the last digit
 * of their fractions: negative when `a` is earlier, 0 when they are the same instant. Both must
 * have passed {@link rfc3339}.
 */
export function compareTimes(a: string, b: string): number {
  // Two UTC times of one shape (the same length: as many digits of fraction) order as strings.
  if (a.length === b.length && UTC.test(a) && UTC.test(b)) return a < b ? -1 : a > b ? 1 : 0;
  const x = parts(a);
  const y = parts(b);
  if (x.seconds !== y.seconds) return x.seconds < y.seconds ? -1 : 1;
  const width = Math.max(x.fraction.length, y.fraction.length);
  const [p, q] = [x.fraction.padEnd(width, "0"), y.fraction.padEnd(width, "0")];
  return p < q ? -1 : p > q ? 1 : 0;
}

/** Whether a time string names an instant in the years 0000 to 9999 once in UTC. */
function inRange(at: string): boolean {
  const ms = Date.parse(at);
  return !Number.isNaN(ms) && /^\d{4}-/.test(new Date(ms).toISOString());
}

const isoDatetime = z.iso.datetime({ offset: true });

/**
 * An RFC 3339 time with its offset (`2026-11-29T18:00:00Z`, `…T19:00:00.5+01:00`), naming an
 * instant of the years 0000 to 9999 in UTC (so it can be written back as RFC 3339).
 */
export const rfc3339 = z.string().check(
  z.maxLength(64, "must be an RFC 3339 time of at most 64 characters"),
  z.refine((s) => {
    const upper = s.toUpperCase();
    return PARTS.test(upper) && isoDatetime.safeParse(upper).success && inRange(s);
  }, "must be an RFC 3339 time with an offset, of the years 0000 to 9999 in UTC, e.g. 2026-11-29T18:00:00Z"),
);
