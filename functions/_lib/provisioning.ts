/**
 * The verb `mesh-provisioner.provisioning` (docs/verb.md §4), made from its table of `what`s
 * (verb/whats.ts): the request's schema, the answer's, the access its function declares, and the
 * page of one request. One job a file in `verb/`: `fields.ts` (the fields every `what` shares),
 * `answerer.ts` (what a `what` is), `whats.ts` (the table), `buckets.ts` (the buckets' items),
 * `holders.ts` (holders and rotations), `cursors.ts`, `page.ts` (the one page-filler).
 */
import { z } from "zod";
import type { Entry, JsonText } from "../../runtime/index.ts";
import { filtersFor } from "../../contract/keys.ts";
import { NARROWINGS, NARROWING_FIELDS, narrowingSchemas, oneValueEach, pagingSchemas, type Narrowing } from "./verb/fields.ts";
import { WHAT_TABLE } from "./verb/whats.ts";
import type { VerbContext, WhatEntry } from "./verb/answerer.ts";
import { cursorAfterKey, cursorsFor, type Cursors, type Identity } from "./verb/cursors.ts";
import { answerMembers, fillPage } from "./verb/page.ts";
import { bucketItems } from "./verb/buckets.ts";

export { HEADROOM } from "./verb/page.ts";
export { DEFAULT_LIMIT, MAX_LIMIT, NARROWINGS, type Narrowing } from "./verb/fields.ts";
export type { BucketEntry } from "./verb/buckets.ts";

/** The verb's subject (docs/verb.md §4). */
export const VERB = "mesh-provisioner.provisioning";

type Table = typeof WHAT_TABLE;
/** Every `what` a request may name. */
export type Asked = keyof Table;
/** The `what`s of one bucket's keys (docs/verb.md §4.2). */
export type What = { [W in Asked]: Table[W] extends { readonly bucket: string } ? W : never }[Asked];
/** The entry of each `what` (type only). */
export type Entries = { readonly [W in Asked]: Exclude<Table[W]["entry"], undefined> };

const TABLE: Readonly<Record<Asked, WhatEntry<unknown, z.ZodRawShape>>> = WHAT_TABLE as never;
/** Every `what`, in the table's order; the first is the default. */
export const ASKED = Object.keys(WHAT_TABLE) as [Asked, ...Asked[]];
export const DEFAULT_WHAT = ASKED[0];
/** The bucket `what`s, in the table's order. */
export const WHATS = ASKED.filter((w): w is What => "bucket" in TABLE[w]);
export const STATE = "state" satisfies Asked;
export const HOLDERS = "holders" satisfies Asked;
export const ROTATIONS = "rotations" satisfies Asked;
export const HISTORY = "history" satisfies Asked;

/**
 * The shape of the verb, as the CLI reads it: each bucket `what`'s narrowings and the columns its
 * table shows; each narrowing field's schema and how it is asked for.
 */
export const VERB_SHAPE = {
  whats: WHAT_TABLE as { readonly [W in What]: Table[W] },
  narrowings: NARROWING_FIELDS,
};

/** Every `what`'s own fields, in the table's order: `state`, `since`. */
const OWN_FIELDS = Object.assign({}, ...ASKED.map((w) => TABLE[w].fields ?? {})) as z.ZodRawShape;
type OwnFields = { [W in Asked]: Table[W] extends { readonly fields: infer F } ? F : {} }[Asked];
const OWN_FIELD_NAMES = Object.keys(OWN_FIELDS);
/** Each `what`'s narrowings then own fields, made once: every request reads them. */
const FIELDS = Object.fromEntries(
  ASKED.map((w) => [w, [...TABLE[w].narrowings, ...Object.keys(TABLE[w].fields ?? {})]]),
) as unknown as Readonly<Record<Asked, readonly string[]>>;
const fieldsOf = (what: Asked): readonly string[] => FIELDS[what];

/** A field that does not apply to `what`: the `what`s it narrows. */
function doesNotApply(field: string, what: Asked): string {
  return `does not apply to what=${what} (it narrows ${ASKED.filter((w) => fieldsOf(w).includes(field)).join(", ")})`;
}

/**
 * The request of `mesh-provisioner.provisioning` (docs/verb.md §4.1, §4.3), made from the table:
 * `what` (default `registry`), the narrowings and own fields that apply to it, `limit` (1 to
 * 10,000, default 1,000), `cursor` and `stale`. An unknown field, a field that does not apply to
 * `what`, a required one missing, or a narrowing that is not one token (a collection: a
 * non-empty name) is refused, naming the field.
 */
export const provisioningRequest = oneValueEach(
  z
    .strictObject({
      what: z.enum(ASKED).default(DEFAULT_WHAT),
      ...narrowingSchemas,
      ...(OWN_FIELDS as { [K in keyof UnionToFields<OwnFields>]: UnionToFields<OwnFields>[K] }),
      ...pagingSchemas,
    })
    .superRefine((request, ctx) => {
      const { what } = request;
      const applies = fieldsOf(what);
      const given = (field: string) => (request as Record<string, unknown>)[field] !== undefined;
      for (const field of NARROWINGS) {
        if (given(field) && !applies.includes(field)) ctx.addIssue({ code: "custom", path: [field], message: doesNotApply(field, what) });
      }
      const { required } = TABLE[what];
      if (required !== undefined && !given(required.field)) {
        ctx.addIssue({ code: "custom", path: [required.field], message: `is required with what=${what}: ${required.why}` });
      }
      for (const field of OWN_FIELD_NAMES) {
        if (given(field) && !applies.includes(field)) ctx.addIssue({ code: "custom", path: [field], message: doesNotApply(field, what) });
      }
    }),
);

type UnionToFields<U> = (U extends unknown ? (u: U) => void : never) extends (i: infer I) => void ? I : never;

export type ProvisioningRequest = z.output<typeof provisioningRequest>;
/** A request of one bucket's view. */
export type BucketRequest = ProvisioningRequest & { readonly what: What };

/** The schemas of the entries, each once (the buckets share one), for the answer's JSON Schema. */
const ENTRY_SCHEMAS = [...new Set(ASKED.flatMap((w) => TABLE[w].schema ?? []))] as [z.ZodType, z.ZodType, ...z.ZodType[]];

/** An answer page as a schema, for the service's description of it ($SRV.INFO). */
export const answerSchema = z.object(answerMembers(z.enum(ASKED), z.union(ENTRY_SCHEMAS) as z.ZodType<Entries[Asked]>));

/** One page of the verb's answer (docs/verb.md §4). */
export type Answer = z.output<typeof answerSchema>;

/** The views and streams the verb's function reads: every `what`'s, each once. */
export const ACCESS = {
  views: [...new Set(ASKED.flatMap((w) => TABLE[w].views))],
  streams: [...new Set(ASKED.flatMap((w) => TABLE[w].streams ?? []))],
};

/** The narrowing of a request, as key fields: its narrowings, then its `what`'s own fields. */
function narrowingOf(request: ProvisioningRequest): Record<string, string> {
  const given = request as unknown as Readonly<Record<string, string | undefined>>;
  const narrowing: Record<string, string> = {};
  for (const field of fieldsOf(request.what)) if (given[field] !== undefined) narrowing[field] = given[field];
  return narrowing;
}

const identityOf = (request: ProvisioningRequest, narrowing = narrowingOf(request)): Identity => [request.what, narrowing];

/** The key filters a request reads with: never the whole bucket when it narrows. */
export function requestFilters(request: BucketRequest): string[] {
  return filtersFor(request.what, narrowingOf(request));
}

/** The opaque cursor of the page after `key`, tied to the request's narrowing (docs/verb.md §4.5). */
export const cursorAfter = (request: ProvisioningRequest, key: string): string => cursorAfterKey(identityOf(request), key);

/** A request's cursors; throws a 400 for a cursor not issued for it. */
export const cursorsOf = (request: ProvisioningRequest): Cursors => cursorsFor(request.cursor, identityOf(request));

/** The page answering `request` (docs/verb.md §4.4): its `what`'s answerer's items, filled into one page. */
export async function answer(request: ProvisioningRequest, ctx: VerbContext): Promise<JsonText> {
  const narrowing = narrowingOf(request);
  const cursors = cursorsFor(request.cursor, identityOf(request, narrowing));
  const source = await TABLE[request.what].answer({ request, narrowing, cursors, ctx });
  return fillPage(request.what, { limit: request.limit, maxPayload: ctx.limits.maxPayload, cursors }, source);
}

/**
 * One page of a bucket's answer from the entries the request's filters `reached`, in key order
 * (those after the cursor's key, and one more than `limit`, are enough): what the bucket
 * `what`s answer, given their entries.
 */
export function answerPage(
  request: BucketRequest,
  reached: readonly Entry[],
  maxPayload: number,
  cursors: Cursors = cursorsOf(request),
  confirmedAt?: Date | null,
): JsonText {
  return fillPage(
    request.what,
    { limit: request.limit, maxPayload, cursors },
    { items: bucketItems(request.what, reached, cursors.after), confirmedAt },
  );
}
