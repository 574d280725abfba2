import { isDeepStrictEqual } from "node:util";
import { z } from "zod";
import { RevisionConflict, type WriteBucket } from "../../runtime/index.ts";
import { token } from "../../contract/keys.ts";

/** Kinds whose values are secrets or credentials: never in a bucket (docs/registry.md §3.3). */
export const SECRET_KINDS = ["secret", "consumers"] as const;

const subject = z.string().regex(/^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$/, "must be a subject: tokens joined by '.'");
const text = z.string().min(1);

/**
 * One row of the registry table in `wrangler-free.config.ts` (docs/registry.md §3): the kinds it answers,
 * the owning module, and where a client finds the values: `bucket` and `key` (plus
 * `collection` for collection kinds), or a `verb` asked by request/reply. Names in `<…>` are
 * filled in by the client.
 */
export const registryRow = z
  .strictObject({
    kinds: z.array(token).min(1),
    module: text,
    bucket: text.optional(),
    key: text.optional(),
    collection: text.optional(),
    verb: subject.optional(),
  })
  .superRefine((row, ctx) => {
    if ((row.bucket === undefined) === (row.verb === undefined)) {
      ctx.addIssue({ code: "custom", message: "needs exactly one of bucket (with key) or verb" });
    }
    if (row.bucket !== undefined && row.key === undefined) {
      ctx.addIssue({ code: "custom", path: ["key"], message: "a bucket needs its key shape" });
    }
    if (row.verb !== undefined && (row.key !== undefined || row.collection !== undefined)) {
      ctx.addIssue({ code: "custom", path: ["verb"], message: "a verb takes no key nor collection" });
    }
    if (row.bucket !== undefined) {
      for (const kind of row.kinds.filter((k) => (SECRET_KINDS as readonly string[]).includes(k))) {
        ctx.addIssue({
          code: "custom",
          path: ["bucket"],
          message: `a ${kind} is never in a bucket: answer kind ${kind} with a verb (docs/registry.md §3.3)`,
        });
      }
    }
  });

/** The registry table: rows whose kinds are answered once each. */
export const registryTable = z.array(registryRow).superRefine((rows, ctx) => {
  const seen = new Map<string, number>();
  rows.forEach((row, i) =>
    row.kinds.forEach((kind, j) => {
      const first = seen.get(kind);
      if (first !== undefined) {
        ctx.addIssue({ code: "custom", path: [i, "kinds", j], message: `kind ${kind} is answered twice (also by row ${first})` });
      } else {
        seen.set(kind, i);
      }
    }),
  );
});

export type RegistryRow = z.input<typeof registryRow>;
export type RegistryTable = z.output<typeof registryTable>;

/** A value of the registry bucket, under key `<kind>` (docs/registry.md §3). */
export const registryValue = z.union([
  z.strictObject({ kind: token, module: text, bucket: text, key: text, collection: text.optional() }),
  z.strictObject({ kind: token, module: text, verb: subject }),
]);
export type RegistryValue = z.output<typeof registryValue>;

/** The value each kind of the table compiles to, by kind, in kind order. */
export function compileTable(table: RegistryTable): Map<string, RegistryValue> {
  const values = new Map<string, RegistryValue>();
  for (const { kinds, module, bucket, key, collection, verb } of table) {
    for (const kind of kinds) {
      values.set(
        kind,
        verb !== undefined
          ? { kind, module, verb }
          : { kind, module, bucket: bucket!, key: key!, ...(collection !== undefined ? { collection } : {}) },
      );
    }
  }
  return new Map([...values].sort(([a], [b]) => (a < b ? -1 : 1)));
}

/** What one compile did: kinds written, kinds deleted, kinds already right. */
export interface CompileResult {
  readonly written: string[];
  readonly deleted: string[];
  readonly unchanged: number;
}

const MAX_TRIES = 5;

function parsed(value: Uint8Array): unknown {
  try {
    return JSON.parse(new TextDecoder().decode(value));
  } catch {
    return undefined;
  }
}

/**
 * Compiles the table into the registry bucket (docs/registry.md §3): writes each kind whose stored value
 * differs, deletes every key no row answers, touches nothing else. Every write is a
 * compare-and-set on the revision read, so replicas compiling at once converge; a lost race
 * re-reads the key and tries again (up to 5 times, then throws {@link RevisionConflict}).
 */
export async function compileRegistry(table: RegistryTable, bucket: WriteBucket): Promise<CompileResult> {
  const wanted = compileTable(table);
  const written: string[] = [];
  const deleted: string[] = [];
  let unchanged = 0;
  const stored = new Map((await bucket.list(">")).map((entry) => [entry.key, entry]));
  const keys = new Set([...wanted.keys(), ...stored.keys()]);

  for (const key of [...keys].sort()) {
    const want = wanted.get(key);
    let have = stored.get(key) ?? null;
    for (let tries = 1; ; tries++) {
      try {
        if (want === undefined) {
          if (have !== null) {
            await bucket.delete(key, { revision: have.revision });
            deleted.push(key);
          }
        } else if (have === null) {
          await bucket.create(key, JSON.stringify(want));
          written.push(key);
        } else if (!isDeepStrictEqual(parsed(have.value), want)) {
          await bucket.update(key, JSON.stringify(want), have.revision);
          written.push(key);
        } else {
          unchanged++;
        }
        break;
      } catch (err) {
        if (!(err instanceof RevisionConflict) || tries === MAX_TRIES) throw err;
        have = await bucket.get(key);
      }
    }
  }
  return { written, deleted, unchanged };
}
