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
