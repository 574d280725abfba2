/**
 * NATS subjects as the runtime checks them: matching a pattern, the shape of a pattern, and the
 * spaces a function may never bind or publish in. A leaf: it imports nothing.
 */

/** Whether `subject` matches a NATS subject `pattern` (`*` one token, a final `>` one or more). */
export function subjectMatches(pattern: string, subject: string): boolean {
  const want = pattern.split(".");
  const got = subject.split(".");
  for (let i = 0; i < want.length; i++) {
    if (want[i] === ">") return got.length > i;
    if (i >= got.length || (want[i] !== "*" && want[i] !== got[i])) return false;
  }
  return want.length === got.length;
}

/** Whether every subject `other` matches is matched by `pattern` too (both subjects or patterns). */
export function subjectCovers(pattern: string, other: string): boolean {
  const want = pattern.split(".");
  const got = other.split(".");
  for (let i = 0; i < want.length; i++) {
    if (want[i] === ">") return got.length > i;
    if (i >= got.length || got[i] === ">") return false;
    if (want[i] !== "*" && (got[i] === "*" || want[i] !== got[i])) return false;
  }
  return want.length === got.length;
}

/** Whether some subject matches both `a` and `b` (subjects or patterns), as a stream's subjects may not. */
export function subjectsOverlap(a: string, b: string): boolean {
  const x = a.split(".");
  const y = b.split(".");
  for (let i = 0; i < Math.max(x.length, y.length); i++) {
    if (x[i] === ">") return y.length > i;
    if (y[i] === ">") return x.length > i;
    if (i >= x.length || i >= y.length) return false;
    if (x[i] !== "*" && y[i] !== "*" && x[i] !== y[i]) return false;
  }
  return true;
}

/** `subjects` without those another of them covers ({@link subjectCovers}), each once, in their order. */
export function uncovered(subjects: readonly string[]): string[] {
  const unique = [...new Set(subjects)];
  // Two different subjects never cover each other both ways.
  return unique.filter((s) => !unique.some((other) => other !== s && subjectCovers(other, s)));
}

/** A subject, or a pattern of one: tokens or `*`, a final `>`; no spaces. */
export const SUBJECT_PATTERN = /^([^\s.*>]+|\*)(\.([^\s.*>]+|\*))*(\.>)?$|^>$/;

/**
 * Whether a subject (or pattern) starts in a space of the server or of replies: `$JS`, `$KV`,
 * `$SYS`, `$SRV`… or `_INBOX`. A function binding or publishing there would carry the seat's
 * rights to what its declarations do not name.
 */
export const reserved = (subject: string): boolean => {
  const first = subject.split(".")[0]!;
  return first.startsWith("$") || first.startsWith("_INBOX");
};

/** What the refusal of a {@link reserved} subject says. */
export const RESERVED = "must not start with $ (the server's subjects) or _INBOX (replies)";
