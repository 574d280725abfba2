import { z } from "zod";
import type { Logger } from "pino";
import type { ReadBucket, WriteBucket } from "./buckets.ts";
import type { ViewBucket } from "./views/index.ts";

/** HTTP methods a function can be bound to. */
export const HTTP_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"] as const;
export type HttpMethod = (typeof HTTP_METHODS)[number];

/**
 * What makes a function run (SPEC §6):
 * - `{ subject }`: request/reply on a NATS subject, in the seat's queue group;
 * - `{ event, stream? }`: messages on a subject (wildcards allowed). With `stream` (a name in
 *   the config's `streams`), through a durable consumer of that stream: nothing published
 *   while the set is down is lost, up to 64 messages are handled at once in no set order (keep
 *   state with compare-and-set writes), a message is acknowledged once its handler returned, a
 *   handler's fault is redelivered with backoff, a refused message is acknowledged and counted.
 *   Without, a plain subscription in the seat's queue group;
 * - `{ cron, onStart? }`: a cron schedule (5 or 6 fields), and once at start when `onStart`;
 * - `{ http: "METHOD /path" }`: a route of the HTTP server.
 */
export type Trigger =
  | { readonly subject: string }
  | { readonly event: string; readonly stream?: string }
  | { readonly cron: string; readonly onStart?: boolean }
  | { readonly http: `${HttpMethod} /${string}` };

/** What triggered one run, as the handler sees it in `ctx.trigger`. */
export type TriggerInfo =
  | { readonly kind: "subject"; readonly subject: string }
  | {
      readonly kind: "event";
      readonly subject: string;
      /** With a stream: its name, the message's stream sequence and how often it was delivered. */
      readonly stream?: string;
      readonly sequence?: number;
      readonly deliveries?: number;
    }
  | { readonly kind: "http"; readonly method: string; readonly path: string }
  | { readonly kind: "cron"; readonly cron: string; readonly scheduledAt: Date }
  | { readonly kind: "start" }
  | { readonly kind: "invoke" }
  /** A gauge's `collect`, when `GET /metrics` is scraped. */
  | { readonly kind: "scrape" };

/** The clock a function reads time from; tests may hand in their own. */
export interface Clock {
  now(): Date;
}

/** Label values of one sample, by label name; only the labels the metric declared. */
export type Labels = Readonly<Record<string, string | number>>;

/** A counter a function declared: it only goes up. */
export interface CounterMetric {
  /** Adds `value` (default 1, never negative) to the sample of `labels`. */
  inc(value?: number, labels?: Labels): void;
}

/** A gauge a function declared: a value that goes up and down. */
export interface GaugeMetric {
  set(value: number, labels?: Labels): void;
  inc(value?: number, labels?: Labels): void;
  dec(value?: number, labels?: Labels): void;
}

/**
 * A metric a function declares, served on `GET /metrics` beside the runtime's: a Prometheus
 * name (`[a-zA-Z_:][a-zA-Z0-9_:]*`, once in the whole set), its help text and label names. A
 * gauge's `collect` is called at every scrape (trigger `scrape`, same `ctx` as the handler) and
 * the gauge is then its answer; a throw keeps the previous value and logs a warning.
 */
export type MetricDeclaration<Ctx = never> =
  | { readonly type: "counter"; readonly help: string; readonly labels?: readonly string[] }
  | {
      readonly type: "gauge";
      readonly help: string;
      readonly labels?: readonly string[];
      readonly collect?: (ctx: Ctx) => number | Promise<number>;
    };

/** The handle `ctx.metrics` holds for each declared metric, by the metric's type. */
export type MetricHandles<Declared> = {
  readonly [M in keyof Declared]: Declared[M] extends "counter" ? CounterMetric : GaugeMetric;
};

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

/** A function's last successful scheduled run (cron or start). */
export interface Run {
  readonly at: Date;
  readonly trigger: "cron" | "start";
}

/** Events refused by one function: how many, and the last one. */
export interface Refused {
  readonly count: number;
  readonly last?: { readonly subject: string; readonly reason: string; readonly at: string };
}

/** The runtime's records, kept in its own bucket `<seat>_runtime`, shared by every replica. */
export interface RuntimeRecords {
  /** The last successful scheduled run of the function named `name`, or `null` if none. */
  lastRun(name: string): Promise<Run | null>;
  /** Events refused (not JSON, or refused by the input schema or the handler), by function. */
  refusedEvents(): Promise<{ readonly count: number; readonly byFunction: Readonly<Record<string, Refused>> }>;
}

/** The object a function file default-exports, made with {@link defineFunction}. */
export interface FunctionDefinition<
  Reads extends string = string,
  Writes extends string = string,
  Input extends z.ZodType = z.ZodType,
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
  readonly output?: z.ZodType;
  /** Schema of the config fields the function reads; checked against the config at start. */
  readonly config?: Config;
  /**
   * What the function may touch: buckets (by their name in the config's `buckets`) it reads,
   * writes and reads through a live view (`views`: kept in memory by the function set, shared
   * by every function naming the bucket), and subjects (wildcards allowed) it publishes. The
   * seat's permissions are derived from these, and `ctx` hands out nothing else.
   */
  readonly access?: {
    readonly reads?: readonly Reads[];
    readonly writes?: readonly Writes[];
    readonly views?: readonly Views[];
    readonly publishes?: readonly string[];
  };
  /** Metrics of the function's own, by name: `ctx.metrics.<name>` in the handler. */
  readonly metrics?: {
    readonly [M in keyof Declared]: MetricDeclaration<Context<Reads, Writes, z.output<Config>, Views, Declared>> & { readonly type: Declared[M] };
  };
  readonly handler: (
    input: z.output<Input>,
    ctx: Context<Reads, Writes, z.output<Config>, Views, Declared>,
  ) => Output | Promise<Output>;
}

/**
 * Declares one function. The returned value is the definition itself, typed so that `ctx`
 * carries exactly the buckets named in `access` and the config the `config` schema parses.
 */
export function defineFunction<
  const Reads extends string = never,
  const Writes extends string = never,
  Input extends z.ZodType = z.ZodObject<{}, z.core.$strict>,
  Config extends z.ZodObject = z.ZodObject<{}>,
  Output = unknown,
  const Views extends string = never,
  const Declared extends Record<string, "counter" | "gauge"> = {},
>(
  definition: FunctionDefinition<Reads, Writes, Input, Config, Output, Views, Declared>,
): FunctionDefinition<Reads, Writes, Input, Config, Output, Views, Declared> {
  return definition;
}

const zodSchema = z.custom<z.ZodType>(
  (value) => value instanceof z.ZodType,
  "must be a zod schema",
);
const zodObject = z.custom<z.ZodObject>(
  (value) => value instanceof z.ZodObject,
  "must be a zod object schema (z.object)",
);
const bucketNames = z.array(z.string().min(1)).readonly();

/**
 * Whether a subject (or pattern) starts in a space of the server or of replies: `$JS`, `$KV`,
 * `$SYS`, `$SRV`… or `_INBOX`. A function binding or publishing there would carry the seat's
 * rights to what its declarations do not name.
 */
const reserved = (subject: string) => {
  const first = subject.split(".")[0]!;
  return first.startsWith("$") || first.startsWith("_INBOX");
};
const RESERVED = "must not start with $ (the server's subjects) or _INBOX (replies)";

const subjectTrigger = z.strictObject({
  subject: z
    .string()
    .regex(/^[^\s.*>]+(\.[^\s.*>]+)*$/, "must be a NATS subject without wildcards or spaces")
    .refine((s) => !reserved(s), RESERVED),
});
/** A subject, or a pattern of one: tokens or `*`, a final `>`; no spaces. */
const SUBJECT_PATTERN = /^([^\s.*>]+|\*)(\.([^\s.*>]+|\*))*(\.>)?$|^>$/;

const eventTrigger = z.strictObject({
  event: z
    .string()
    .regex(SUBJECT_PATTERN, "must be a NATS subject (tokens, `*`, a final `>`) without spaces")
    .refine((s) => !s.startsWith(">"), "must not be > alone: that is every message of the bus")
    .refine(
      (s) => s.startsWith(">") || s.split(".").some((t) => t !== "*" && t !== ">"),
      "must hold a token besides wildcards: `*.>` is nearly every message of the bus, the server's own among them",
    )
    .refine((s) => !reserved(s), RESERVED),
  stream: z.string().min(1).optional(),
});
const cronTrigger = z.strictObject({ cron: z.string().min(1), onStart: z.boolean().optional() });
const httpTrigger = z.strictObject({
  http: z
    .string()
    .regex(
      new RegExp(`^(${HTTP_METHODS.join("|")}) /\\S*$`),
      `must be "METHOD /path" with METHOD one of ${HTTP_METHODS.join(", ")}`,
    ),
});

const labelNames = z
  .array(z.string().regex(/^[a-zA-Z_][a-zA-Z0-9_]*$/, "must be a Prometheus label name").refine((l) => !l.startsWith("__"), "must not start with __ (Prometheus's own)"))
  .refine((labels) => new Set(labels).size === labels.length, "must not name a label twice")
  .readonly()
  .optional();
const metricDeclaration = z.discriminatedUnion("type", [
  z.strictObject({ type: z.literal("counter"), help: z.string().min(1), labels: labelNames }),
  z.strictObject({
    type: z.literal("gauge"),
    help: z.string().min(1),
    labels: labelNames,
    collect: z.custom<(...args: unknown[]) => unknown>((value) => typeof value === "function", "must be a function (ctx) => number").optional(),
  }).refine((gauge) => gauge.collect === undefined || (gauge.labels ?? []).length === 0, { message: "a gauge with collect has no labels (collect gives one value)", path: ["labels"] }),
]);
/** A Prometheus metric name. */
export const METRIC_NAME = /^[a-zA-Z_:][a-zA-Z0-9_:]*$/;

/** How the loader checks a default export before binding it (SPEC §6). */
export const definitionSchema = z.strictObject({
  description: z.string().min(1, "must say what the function does"),
  triggers: z
    .array(
      z.unknown().superRefine((value, ctx) => {
        // The trigger's kind is its key: its own schema then says what is wrong with it.
        const kind = ["subject", "event", "cron", "http"].find((k) => typeof value === "object" && value !== null && k in value);
        const schema = { subject: subjectTrigger, event: eventTrigger, cron: cronTrigger, http: httpTrigger }[kind ?? ""];
        if (schema === undefined) {
          ctx.addIssue({ code: "custom", message: 'must be one of { subject }, { event, stream? }, { cron, onStart? }, { http: "METHOD /path" }' });
          return;
        }
        for (const issue of schema.safeParse(value).error?.issues ?? []) ctx.addIssue(issue as never);
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
        .refine((name) => !name.startsWith("__") && !(name in Object.prototype), "must not start with __ nor be a name every JavaScript object has"),
      metricDeclaration,
    )
    .optional(),
  handler: z.custom<(...args: unknown[]) => unknown>(
    (value) => typeof value === "function",
    "must be a function (input, ctx) => answer",
  ),
});
