/**
 * The fields of the verb's request that every `what` shares (docs/verb.md §4.1): the narrowing
 * fields, each with the schema of its value and how the CLI asks for it (`--<field> <value>`, and
 * its help), in the order they are checked and offered; and `limit`, `cursor`, `stale`.
 */
import { z } from "zod";
import { collectionName, token } from "../../../contract/keys.ts";

export const NARROWING_FIELDS = {
  node: { schema: token, value: "node", help: "narrow to one node" },
  module: { schema: token, value: "module", help: "narrow to one module" },
  kind: { schema: token, value: "kind", help: "narrow to one kind" },
  contributor: { schema: token, value: "contributor", help: "narrow to one contributor" },
  collection: { schema: collectionName, value: "name", help: "narrow to one collection, by its name (shell:zsh:normal)" },
  provision: { schema: token, value: "provision", help: "the provision (holders: required; rotations, checks: narrow to one)" },
  provider: { schema: token, value: "provider", help: "narrow to one provider" },
  machine: { schema: token, value: "machine", help: "narrow to one machine (history)" },
  consumer: { schema: token, value: "consumer", help: "narrow to one consumer (history)" },
} as const satisfies Readonly<Record<string, { readonly schema: z.core.$ZodType<string>; readonly value: string; readonly help: string }>>;

/** A narrowing field of the request. */
export type Narrowing = keyof typeof NARROWING_FIELDS;
/** Every narrowing field, in the order of {@link NARROWING_FIELDS}. */
export const NARROWINGS = Object.keys(NARROWING_FIELDS) as Narrowing[];

export const DEFAULT_LIMIT = 1000;
export const MAX_LIMIT = 10_000;

/** A whole number given as a JSON number or, from an HTTP query, as digits. */
const count = z
  .union([z.number(), z.string().regex(/^\d+$/).transform(Number)], { error: "must be a whole number" })
  // Too big said alone: a number past the safe integers is not also said to be too big for an int.
  .pipe(z.number().min(1).max(MAX_LIMIT, { abort: true }).int());

type NarrowingSchemas = { [F in Narrowing]: z.ZodOptional<(typeof NARROWING_FIELDS)[F]["schema"]> };
/** The narrowing fields' schemas, each optional. */
export const narrowingSchemas = Object.fromEntries(
  NARROWINGS.map((field) => [field, z.optional(NARROWING_FIELDS[field].schema)]),
) as NarrowingSchemas;

/** `true` or `false`: a JSON boolean, or those words in an HTTP query. */
export const flag = z.union([z.boolean(), z.enum(["true", "false"]).transform((text) => text === "true")], {
  error: "must be true or false",
});

/**
 * `schema` with a field given as a list refused first, naming it: a query parameter given more
 * than once arrives as one (docs/verb.md §4.8), and is said so rather than as a value of another type.
 */
export const oneValueEach = <T extends z.ZodType>(schema: T) =>
  z.preprocess((request, ctx) => {
    if (typeof request === "object" && request !== null && !Array.isArray(request)) {
      for (const [field, value] of Object.entries(request)) {
        if (Array.isArray(value)) {
          ctx.issues.push({
            code: "custom",
            path: [field],
            input: value,
            message: "must be one value, not a list (a query parameter given more than once)",
          });
        }
      }
    }
    return request;
  }, schema);

/** The fields after the narrowings and each `what`'s own: paging and freshness. */
export const pagingSchemas = {
  limit: count.default(DEFAULT_LIMIT),
  cursor: z.string().min(1).optional(),
  // Answer from the live view without asking the server whether it is current (docs/verb.md §4.6).
  stale: flag.optional(),
};

/** A request as every `what`'s answerer sees it: its `what`, narrowings, paging and freshness. */
export type BaseRequest = { readonly what: string } & { readonly [F in Narrowing]?: string } & z.output<z.ZodObject<typeof pagingSchemas>>;
