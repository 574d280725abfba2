/**
 * Something derived from views and kept between requests: made whole from snapshots once, then
 * brought up to date from the keys changed since (docs/runtime.md §6.12), and made whole again
 * when those cannot be told.
 */
import type { Snapshot } from "../../runtime/index.ts";

/** The keys changed in each input since the kept value was made or updated. */
export type Changes<I> = { readonly [K in keyof I]: readonly string[] };

/**
 * A getter of the value derived from `inputs` (snapshots by name) and `params` (whatever else it
 * depends on, e.g. config values; compared as JSON): asked with the stamps and params of the
 * last call, it gives the same value; with newer stamps, `update(value, inputs, changes)` brings
 * the last value up to date; with other params, or when some input cannot say what changed,
 * `make(inputs, params)` makes it again. Calls are served one after another, each from the one
 * before. A call that failed is forgotten, so the next one makes the value again.
 */
export function keeping<I extends { readonly [K in keyof I]: Snapshot }, T, P = undefined>(
  make: (inputs: I, params: P) => Promise<T>,
  update: (kept: T, inputs: I, changes: Changes<I>) => Promise<T>,
): (inputs: I, params?: P) => Promise<T> {
  let last: { stamps: Record<string, string>; key: string; value: Promise<T> } | undefined;
  return (inputs, params) => {
    const key = JSON.stringify(params) ?? "";
    const names = Object.keys(inputs) as (keyof I & string)[];
    const before = last;
    if (before !== undefined && before.key === key && names.every((name) => before.stamps[name] === inputs[name].stamp))
      return before.value;
    const stamps = Object.fromEntries(names.map((name) => [name, inputs[name].stamp]));
    const value = (async () => {
      if (before === undefined || before.key !== key) return make(inputs, params as P);
      let kept: T;
      try {
        kept = await before.value;
      } catch {
        return make(inputs, params as P);
      }
      const changes: Record<string, readonly string[]> = {};
      for (const name of names) {
        const changed = before.stamps[name] === stamps[name] ? [] : inputs[name].changedSince(before.stamps[name]!);
        if (changed === undefined) return make(inputs, params as P);
        changes[name] = changed;
      }
      return update(kept, inputs, changes as Changes<I>);
    })();
    last = { stamps, key, value };
    value.catch(() => {
      if (last?.value === value) last = undefined;
    });
    return value;
  };
}
