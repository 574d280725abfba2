/**
 * What an answerer of the verb is (docs/verb.md §4.11): one entry of the table of `what`s
 * (whats.ts), and what it is given.
 */
import type { z } from "zod";
import type { Context } from "../../../runtime/index.ts";
import type { provisioningConfig, STATE_VIEWS } from "../state.ts";
import type { BaseRequest, Narrowing } from "./fields.ts";
import type { Cursors } from "./cursors.ts";
import type { PageSource } from "./page.ts";

/** The views the verb may read. */
export type View = "registry" | "needs" | "applied" | "collect" | (typeof STATE_VIEWS)[number];
/** The `ctx` of the verb's handler, as an answerer reads it. */
export type VerbContext = Context<never, never, z.output<typeof provisioningConfig>, View>;

/** What an answerer is given: the request, its narrowing as key fields, its cursors, the handler's `ctx`. */
export interface Asked<R> {
  readonly request: R;
  readonly narrowing: Readonly<Record<string, string>>;
  readonly cursors: Cursors;
  readonly ctx: VerbContext;
}

/** One `what` of the verb. `E` is its entry's type (for the CLI, type only); `F` its own fields beyond the narrowings. */
export interface WhatEntry<E = unknown, F extends z.ZodRawShape = z.ZodRawShape> {
  /** The narrowing fields it takes, in the order of NARROWINGS. */
  readonly narrowings: readonly Narrowing[];
  /** A narrowing it cannot do without, and what it is for. */
  readonly required?: { readonly field: Narrowing; readonly why: string };
  /** Its own fields (each optional), beyond the narrowings; they count in the narrowing, as narrowings do. */
  readonly fields?: F;
  /** Its entry's schema in the answer's JSON Schema ($SRV.INFO); none: said by another's. */
  readonly schema?: z.ZodType;
  /** The columns the CLI's table shows of it; none: the CLI prints it as JSON or its own way. */
  readonly columns?: readonly string[];
  /** The views and streams its answerer reads (the function's `access`). */
  readonly views: readonly View[];
  readonly streams?: readonly string[];
  /** Its page's items, from the request and `ctx`. */
  readonly answer: (asked: Asked<BaseRequest & Partial<z.output<z.ZodObject<F>>>>) => Promise<PageSource>;
  /** Type only: its entry's type. */
  readonly entry?: E;
}

/** One entry of the table, its types inferred. */
export const what = <E, F extends z.ZodRawShape = {}>(entry: WhatEntry<E, F>) => entry;
