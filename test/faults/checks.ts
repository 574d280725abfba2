/**
 * The rules a cluster run is held to (docs/runtime.md §6.14), over what workload.ts recorded,
 * by the values written (a writer's count), not by revisions (nats-server 2.9.10 may number one
 * write differently on two replicas once they diverged):
 * no acknowledged write or event lost; no fresh answer missing a write acknowledged before its
 * request was sent; `/readyz` not ready while a replica cannot answer fresh; fresh answers
 * again within 10 s of the servers recovering. Each returns what broke it, so a failure says
 * which answer, key and revision.
 */
import type { Answer, Poll, Recording, Write } from "./workload.ts";

/** A fresh answer that lacked an acknowledged write. */
export interface Missed {
  readonly via: string;
  readonly node: string;
  readonly sentAt: number;
  readonly key: string;
  /** The count of the newest write of the key acknowledged at least the margin before the request. */
  readonly wanted: number;
  /** The count the answer held, if any. */
  readonly got: number | undefined;
  /** How long before the request that write was acknowledged, in ms. */
  readonly ackedBeforeMs: number;
}

/** The acknowledged writes of each key, in the order acknowledged (one writer a key, one write at a time). */
function writesByKey(writes: readonly Write[]): Map<string, Write[]> {
  const byKey = new Map<string, Write[]>();
  for (const w of writes) {
    const list = byKey.get(w.key) ?? [];
    list.push(w);
    byKey.set(w.key, list);
  }
  for (const list of byKey.values()) list.sort((a, b) => a.ackedAt - b.ackedAt);
  return byKey;
}

/** The index of the last write acknowledged at or before `at`; -1 when none. */
function lastBefore(list: readonly Write[], at: number): number {
  let lo = 0;
  let hi = list.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (list[mid]!.ackedAt <= at) lo = mid + 1;
    else hi = mid;
  }
  return lo - 1;
}

/**
 * Every fresh answer that misses a write acknowledged at least `marginMs` before its request was
 * sent: `answers` the answers with a miss, `writes` the writes they missed in all, `missed` each
 * (answer, key).
 */
export function missedWrites(recording: Recording, marginMs = 2): { answers: number; writes: number; missed: Missed[] } {
  const byKey = writesByKey(recording.writes);
  const missed: Missed[] = [];
  let writes = 0;
  const withMiss = new Set<Answer>();
  for (const answer of recording.answers) {
    if (!answer.ok) continue;
    for (const key of recording.keys.get(answer.node) ?? []) {
      const list = byKey.get(key) ?? [];
      const i = lastBefore(list, answer.sentAt - marginMs);
      if (i < 0) continue;
      const wanted = list[i]!;
      const got = answer.counts.get(key);
      if (got !== undefined && got >= wanted.n) continue;
      withMiss.add(answer);
      writes += list.slice(0, i + 1).filter((w) => got === undefined || w.n > got).length;
      missed.push({
        via: answer.via,
        node: answer.node,
        sentAt: answer.sentAt,
        key,
        wanted: wanted.n,
        got,
        ackedBeforeMs: answer.sentAt - wanted.ackedAt,
      });
    }
  }
  return { answers: withMiss.size, writes, missed };
}

/**
 * The acknowledged writes missing from the stream at the end: for each key, the last record the
 * stream holds (`finals`, read from its leader) must be at or after the key's newest
 * acknowledged write.
 */
export function lostWrites(
  recording: Recording,
  finals: ReadonlyMap<string, number>,
): { key: string; acked: number; held: number | undefined }[] {
  const lost: { key: string; acked: number; held: number | undefined }[] = [];
  for (const [key, list] of writesByKey(recording.writes)) {
    const acked = Math.max(...list.map((w) => w.n));
    const held = finals.get(key);
    if (held === undefined || held < acked) lost.push({ key, acked, held });
  }
  return lost;
}

/** The failing events acknowledged by the stream that `failing` (the consumers status names) lacks. */
export function lostEvents(recording: Recording, failing: ReadonlySet<string>): string[] {
  return recording.events.filter((e) => !failing.has(e.consumer)).map((e) => e.consumer);
}

/**
 * Each poll of `/readyz` that said ready while its replica could not answer fresh: at least two
 * fresh HTTP reads of that replica answered (or timed out) in the `windowMs` before the poll,
 * all of them refused, and none succeeding until `graceMs` after it.
 */
export function readyWhileFailing(recording: Recording, windowMs = 2000, graceMs = 500): Poll[] {
  const wrong: Poll[] = [];
  for (const poll of recording.polls) {
    if (poll.ready !== true) continue;
    const near = recording.answers.filter((a) => a.via === poll.replica && a.doneAt >= poll.at - windowMs && a.doneAt <= poll.at + graceMs);
    const before = near.filter((a) => a.doneAt <= poll.at);
    if (before.length >= 2 && near.every((a) => !a.ok)) wrong.push(poll);
  }
  return wrong;
}

/** The fresh reads that did not answer (refused or timed out) among those sent in [from, to). */
export function failedBetween(recording: Recording, from: number, to: number): Answer[] {
  return recording.answers.filter((a) => a.sentAt >= from && a.sentAt < to && !a.ok);
}

/** The longest time in [from, to) during which `via` gave no fresh answer, in ms. */
export function longestGap(recording: Recording, via: string, from: number, to: number): number {
  const times = recording.answers
    .filter((a) => a.via === via && a.ok && a.doneAt >= from && a.doneAt < to)
    .map((a) => a.doneAt)
    .sort((a, b) => a - b);
  let longest = 0;
  let previous = from;
  for (const t of [...times, to]) {
    longest = Math.max(longest, t - previous);
    previous = t;
  }
  return longest;
}

/** The first write of each node acknowledged after `after`: when writes go through everywhere again (the latest of them). */
export function writesBackAt(recording: Recording, after: number): number | undefined {
  let latest = 0;
  for (const node of recording.keys.keys()) {
    const prefix = `${node}.`;
    const first = recording.writes.find((w) => w.key.startsWith(prefix) && w.ackedAt > after);
    if (first === undefined) return undefined;
    latest = Math.max(latest, first.ackedAt);
  }
  return latest;
}
