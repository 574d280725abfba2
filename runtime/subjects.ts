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
