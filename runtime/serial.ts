/**
 * A queue per key: `run(key, task)` starts `task` once every task given before with the same
 * key has ended (however it ended), and returns what `task` returns. Keys with nothing queued
 * are forgotten. For compare-and-set writers: the writes one process makes to one key never
 * race each other.
 */
export function keyedSerial(): <T>(key: string, task: () => Promise<T>) => Promise<T> {
  const tails = new Map<string, Promise<void>>();
  return <T>(key: string, task: () => Promise<T>): Promise<T> => {
    const run = (tails.get(key) ?? Promise.resolve()).then(task);
    const tail = run.then(
      () => {},
      () => {},
    );
    tails.set(key, tail);
    void tail.then(() => {
      if (tails.get(key) === tail) tails.delete(key);
    });
    return run;
  };
}

/**
 * Coalesces a task: a caller gets what a run of `task` started after it called resolves with,
 * and callers that arrive while one run is under way share the next one, started once it ends
 * (however it ended): one run at a time, at most one waiting. For a freshness probe (one asking
 * of the server serves a burst of reads) and for work that must not overlap itself.
 */
export function coalesced<T>(task: () => Promise<T>): () => Promise<T> {
  let inFlight: Promise<T> | undefined;
  let queued: Promise<T> | undefined;
  const start = () => {
    const sent = task().finally(() => {
      if (inFlight === sent) inFlight = undefined;
    });
    inFlight = sent;
    return sent;
  };
  return () => {
    // Once queued, it is the next run until it starts, even after the one before it ended.
    if (queued !== undefined) return queued;
    if (inFlight === undefined) return start();
    queued = inFlight
      .catch(() => undefined)
      .then(() => {
        queued = undefined;
        return start();
      });
    return queued;
  };
}
