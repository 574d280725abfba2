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
