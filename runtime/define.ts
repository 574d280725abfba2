/**
 * How a function is defined: the object a function file default-exports ({@link defineFunction}),
 * the schema the loader checks it with, and the function as loaded. The contract between a
 * function's author and the runtime (docs/runtime.md §6.2).
 */
import { z } from "zod";
import { RESERVED, reserved, SUBJECT_PATTERN } from "./subjects.ts";
import type { Logger } from "pino";
import { KINDS, kindOf, type KindInfo, type Trigger } from "./triggers/index.ts";
import type { Clock, MetricDeclaration, MetricHandles, ReadBucket, RuntimeRecords, ViewBucket, WriteBucket } from "./types.ts";
import type { ReadStream } from "./streams.ts";

export type { Trigger };

/**
 * What triggered one run, as the handler sees it in `ctx.trigger`: what each trigger kind's runs
 * carry (`subject`, `event`, `cron` and `start`, `http`: see each kind's file), a run by `invoke`,
 * or a gauge's `collect` when `GET /metrics` is scraped.
 */
export type TriggerInfo = KindInfo | { readonly kind: "invoke" } | { readonly kind: "scrape" };

/** Everything a handler gets besides its input: only what its definition declared. */
export interface Context<
  Reads extends string = never,
  Writes extends string = never,
  Config = unknown,
  Views extends string = never,
  Declared extends Record<string, "counter" | "gauge"> = {},
> {
  /** The function's name: its file name without `.ts`. */
  readonly function: string;
  readonly trigger: TriggerInfo;
  /** A handle per declared bucket: read handles for `access.reads`, write handles for `access.writes`. */
  readonly buckets: { readonly [B in Reads]: ReadBucket } & { readonly [B in Writes]: WriteBucket };
  /**
   * A live view per bucket of `access.views`: the same reads as a {@link ReadBucket}, answered
   * from the function set's memory instead of by the server, as fresh (every write acknowledged
   * before the read is in it) at a cost that follows the answer, not the bucket.
   */
  readonly views: { readonly [B in Views]: ViewBucket };
  /**
   * A read handle per stream of `access.streams` (by its name in the config's `streams`): its
   * messages by sequence, newest first (docs/runtime.md §6.4); any other name throws an `AccessError`.
   */
  readonly streams: Readonly<Record<string, ReadStream>>;
  /** A handle per metric of the definition's `metrics`. */
  readonly metrics: MetricHandles<Declared>;
  readonly log: Logger;
  /** The part of the deployment's config the function's `config` schema asked for, parsed. */
  readonly config: Config;
  readonly clock: Clock;
  /** `maxPayload`: bytes, the largest message the NATS connection may carry. */
  readonly limits: { readonly maxPayload: number };
  /** What the runtime recorded about the whole function set: scheduled runs, refused events. */
  readonly runtime: RuntimeRecords;
  /**
   * Publishes on the shared connection (core NATS, no acknowledgement). Throws an
   * `AccessError` unless `subject` matches one of the definition's `access.publishes`.
   */
  publish(subject: string, data?: Uint8Array | string): void;
}

/** The context of a function seen from the runtime, whatever buckets and config it declared. */
export type AnyContext = Context<string, string, unknown, string, Record<string, "counter" | "gauge">>;

/** The object a function file default-exports, made with {@link defineFunction}. */
export interface FunctionDefinition<
  Reads extends string = string,
  Writes extends string = string,
  Input extends z.core.$ZodType = z.core.$ZodType,
  Config extends z.ZodObject = z.ZodObject,
  Output = unknown,
  Views extends string = string,
  Declared extends Record<string, "counter" | "gauge"> = {},
> {
  /** One sentence: what the function does. Printed at start. */
  readonly description: string;
  readonly triggers: readonly Trigger[];
  /** Schema of the input (request payload, HTTP query or body); `{}` when absent. */
  readonly input?: Input;
  /**
   * Schema of the answer, for describing the function (the NATS service's endpoint metadata);
   * answers are not checked against it.
   */
  readonly output?: z.core.$ZodType;
  /** Schema of the config fields the function reads; checked against the config at start. */
  readonly config?: Config;
  /**
   * What the function may touch: buckets (by their name in the config's `buckets`) it reads,
   * writes and reads through a live view (`views`: kept in memory by the function set, shared
   * by every function naming the bucket), streams (by their name in the config's `streams`) it
   * reads by sequence, and subjects (wildcards allowed) it publishes. The
   * seat's permissions are derived from these, and `ctx` hands out nothing else.
   */
  readonly access?: {
    readonly reads?: readonly Reads[];
    readonly writes?: readonly Writes[];
    readonly views?: readonly Views[];
    readonly streams?: readonly string[];
    readonly publishes?: readonly string[];
  };
  /** Metrics of the function's own, by name: `ctx.metrics.<name>` in the handler. */
  readonly metrics?: {
    readonly [M in keyof Declared]: MetricDeclaration<Context<Reads, Writes, z.output<Config>, Views, Declared>> & {
      readonly type: Declared[M];
    };
  };
  readonly handler: (input: z.output<Input>, ctx: Context<Reads, Writes, z.output<Config>, Views, Declared>) => Output | Promise<Output>;
}

/**
 * Declares one function. The returned value is the definition itself, typed so that `ctx`
 * carries exactly the buckets named in `access` and the config the `config` schema parses.
 */
export function defineFunction<
  const Reads extends string = never,
  const Writes extends string = never,
  Input extends z.core.$ZodType = z.ZodObject<{}, z.core.$strict>,
  Config extends z.ZodObject = z.ZodObject<{}>,
  Output = unknown,
  const Views extends string = never,
  const Declared extends Record<string, "counter" | "gauge"> = {},
>(
  definition: FunctionDefinition<Reads, Writes, Input, Config, Output, Views, Declared>,
): FunctionDefinition<Reads, Writes, Input, Config, Output, Views, Declared> {
  return definition;
}

/** A function file that passed its checks: its name is the file name without `.ts`. */
export interface LoadedFunction {
  readonly name: string;
  readonly file: string;
  readonly definition: FunctionDefinition;
  /** The definition's description, output schema and triggers, as trigger kinds see them. */
  readonly description: string;
  readonly output?: z.core.$ZodType;
  readonly triggers: readonly Trigger[];
  /** The input schema; a strict empty object when the definition has none. */
  readonly input: z.core.$ZodType;
}

const zodSchema = z.custom<z.core.$ZodType>((value) => value instanceof z.core.$ZodType, "must be a zod schema");
const zodObject = z.custom<z.ZodObject>((value) => value instanceof z.ZodObject, "must be a zod object schema (z.object)");
const bucketNames = z.array(z.string().min(1)).readonly();

const labelNames = z
  .array(
    z
      .string()
      .regex(/^[a-zA-Z_][a-zA-Z0-9_]*$/, "must be a Prometheus label name")
      .refine((l) => !l.startsWith("__"), "must not start with __ (Prometheus's own)"),
  )
  .refine((labels) => new Set(labels).size === labels.length, "must not name a label twice")
  .readonly()
  .optional();
const metricDeclaration = z.discriminatedUnion("type", [
  z.strictObject({ type: z.literal("counter"), help: z.string().min(1), labels: labelNames }),
  z.strictObject({
    type: z.literal("gauge"),
    help: z.string().min(1),
    labels: labelNames,
    collect: z
      .custom<(...args: unknown[]) => unknown>((value) => typeof value === "function", "must be a function (ctx) => number or samples")
      .optional(),
  }),
]);
/** A Prometheus metric name. */
export const METRIC_NAME = /^[a-zA-Z_:][a-zA-Z0-9_:]*$/;

/** How the loader checks a default export before binding it (docs/runtime.md §6.2). */
export const definitionSchema = z.strictObject({
  description: z.string().min(1, "must say what the function does"),
  triggers: z
    .array(
      z.unknown().superRefine((value, ctx) => {
        // The trigger's kind is its key: its own schema then says what is wrong with it.
        const kind = typeof value === "object" && value !== null ? kindOf(value) : undefined;
        if (kind === undefined) {
          ctx.addIssue({ code: "custom", message: `must be one of ${KINDS.map((k) => k.shape).join(", ")}` });
          return;
        }
        for (const issue of kind.schema.safeParse(value).error?.issues ?? []) ctx.addIssue(issue as never);
      }),
    )
    .min(1, "a function needs at least one trigger"),
  input: zodSchema.optional(),
  output: zodSchema.optional(),
  config: zodObject.optional(),
  access: z
    .strictObject({
      reads: bucketNames.optional(),
      writes: bucketNames.optional(),
      views: bucketNames.optional(),
      streams: bucketNames.optional(),
      publishes: z
        .array(
          z
            .string()
            .regex(SUBJECT_PATTERN, "must be a NATS subject (tokens, `*`, a final `>`)")
            .refine((s) => !/^[*>]/.test(s), "must start with a token, not a wildcard (it would reach the server's subjects)")
            .refine((s) => !reserved(s), RESERVED),
        )
        .readonly()
        .optional(),
    })
    .optional(),
  metrics: z
    .record(
      z
        .string()
        .regex(METRIC_NAME, "must be a Prometheus metric name: letters, digits, _ and :, not starting with a digit")
        .refine(
          (name) => !name.startsWith("__") && !(name in Object.prototype),
          "must not start with __ nor be a name every JavaScript object has",
        ),
      metricDeclaration,
    )
    .optional(),
  handler: z.custom<(...args: unknown[]) => unknown>((value) => typeof value === "function", "must be a function (input, ctx) => answer"),
});
