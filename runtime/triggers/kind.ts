/**
 * What a trigger kind is: the shape of its triggers in a function file, the checks made when the
 * file loads and when the set is checked against the config, how it binds on the bus, what the
 * seat's user needs for it, and how the start banner says it. Each kind is one file beside this
 * one; `index.ts` lists them (docs/runtime.md §6.9). The functions a kind binds are seen only
 * through {@link FunctionRef}: a kind knows nothing of how functions are defined or run.
 */
import type { NatsConnection } from "nats";
import type { Logger } from "pino";
import type { z } from "zod";
import type { Config } from "../config.ts";
import type { Clock, Outcome, RawInput, StreamUse } from "../types.ts";

/** What a kind sees of a function: its name and file, what it says of itself, its schemas and triggers. */
export interface FunctionRef {
  readonly name: string;
  readonly file: string;
  readonly description: string;
  /** The input schema; a strict empty object when the definition has none. */
  readonly input: z.core.$ZodType;
  readonly output?: z.core.$ZodType;
  readonly triggers: readonly object[];
}

/** One trigger of a kind with its function: `index` counts the function's triggers of that kind from 0. */
export interface Target<T, F extends FunctionRef = FunctionRef> {
  readonly fn: F;
  readonly trigger: T;
  readonly index: number;
}

/**
 * The name of a function's `index`-th trigger of one kind on the bus: the function's name, then
 * `-2`, `-3`… (the NATS service's endpoint names; the durable consumers earlier versions made per
 * event trigger, which the event kind replaces).
 */
export const bindingName = (fn: { readonly name: string }, index: number): string => (index === 0 ? fn.name : `${fn.name}-${index + 1}`);

/** A problem of one trigger, said by the loader as `<file>: triggers.<i>[.<at>]: <message>`. */
export interface Problem {
  /** The trigger's field at fault, when one is. */
  readonly at?: string;
  readonly message: string;
}

/** What `GET /healthz` and `GET /readyz` say is wrong: nothing (an empty list) when all is well. */
export interface Probes {
  /** Why the process cannot go on serving, and should be restarted. */
  live(): string[];
  /** Why the set cannot serve yet, or for now. */
  ready(): string[];
}

/** What a run says of its trigger (`ctx.trigger`): a `kind`, and the kind's own fields. */
export interface RunInfo {
  readonly kind: string;
}

/** What binding a kind is given: the shared connection, and the runtime's services it may use. */
export interface BindEnv<F extends FunctionRef = FunctionRef, I extends RunInfo = RunInfo> {
  readonly nc: NatsConnection;
  readonly config: Config;
  readonly log: Logger;
  /**
   * Runs `fn` once from its raw input (the runner: parsing, the input schema, the handler,
   * error → code, logs, metrics and records). Never throws.
   */
  run(fn: F, input: RawInput, trigger: I): Promise<Outcome>;
  /** Claims the run of `fn` scheduled at `scheduledAt` for this replica: `false` when another replica has. */
  claim(fn: string, scheduledAt: Date): Promise<boolean>;
  /** The server's clock (docs/runtime.md §6.15): what names a scheduled run across replicas. */
  readonly clock: Clock;
  /** The NATS service's version and description (the set's `package.json`). */
  readonly service: { readonly version: string; readonly description: string };
  /** How long stopping waits for what is in hand, in milliseconds. */
  readonly graceMs: number;
  readonly probes: Probes;
  /** The runtime's and the functions' metrics in Prometheus's text format, and its content type. */
  metrics(): Promise<{ readonly text: string; readonly contentType: string }>;
}

/** The triggers of one kind, bound. */
export interface Binding {
  /** What it does once every kind is bound (the cron kind's runs at start); awaited in the list's order. */
  afterBind?(): Promise<void>;
  /** Why this binding cannot serve for now (e.g. a run at start that failed); none when it can. */
  notReady?(): string[];
  /**
   * What it does when the connection came back: assert again what the server may have lost (a
   * server back with an empty store). Throws when it cannot; start tries again.
   */
  reconnected?(): Promise<void>;
  /**
   * What it does when the set made buckets again (found deleted behind it, or lost by a server
   * back with an empty store): the cron kind runs its `onStart` functions again.
   */
  madeAgain?(): Promise<void>;
  /** The config's streams it uses, by config name, as the server last said: their use and their durables' progress. */
  streams?(): Readonly<Record<string, StreamUse>>;
  /** Where it listens, for the start banner (the HTTP server's URL). */
  readonly url?: string;
  /** Unbinds: takes nothing new, finishes what is in hand within the grace. */
  stop(): Promise<void>;
}

/** The subjects a user needs, to publish and to subscribe to. */
export interface Grants {
  readonly publish: readonly string[];
  readonly subscribe: readonly string[];
}

/**
 * A trigger kind. `key` names it in a trigger object (`{ subject: … }`); `T` is its triggers'
 * shape; `I` what its runs say of their trigger to the handler (`ctx.trigger`). Every member but
 * `bind` may be left out when the kind has nothing to say there.
 */
export interface TriggerKind<
  K extends string = string,
  T extends { readonly [key in K]: unknown } = { readonly [key in K]: unknown },
  I extends RunInfo = RunInfo,
> {
  readonly key: K;
  /** How its trigger is written, for the refusal of an unknown trigger: `{ subject }`. */
  readonly shape: string;
  /** Its triggers' schema in a function file, strict: the loader refuses what it refuses. */
  readonly schema: z.ZodType<T>;
  /** Problems of one trigger of a file as it loads, e.g. a cron expression croner refuses. */
  checkFile?(trigger: T, fn: { readonly input: z.core.$ZodType }): Problem[];
  /** Problems of one trigger against the config and the runtime, e.g. a stream the config lacks. */
  checkConfig?(trigger: T, config: Config): Problem[];
  /**
   * Why the set must not start with this config, whatever its triggers (e.g. HTTP open to the
   * network without a token): each a sentence naming the setting and how to fix it. Asked by
   * start before it opens anything.
   */
  checkStart?(config: Config): string[];
  /** What two functions may not share ("subject a.b", "route GET /x"); none when any may. */
  exclusive?(trigger: T): string | undefined;
  /** Why two triggers of this kind (of one function or two) cannot both be bound, a sentence; none when they can. */
  conflict?(a: T, b: T): string | undefined;
  /** The start banner's words for one trigger. */
  describe(trigger: T): string;
  /** What the seat's user needs on the bus for these triggers (docs/runtime.md §6.7). */
  seatGrants?(targets: readonly Target<T>[], config: Config): Grants;
  /** Subjects every node and provider may request: the seat's verbs. */
  asked?(targets: readonly Target<T>[]): string[];
  /** Binds every trigger of this kind (also when there are none, if the kind serves anyway). */
  bind<F extends FunctionRef>(targets: readonly Target<T, F>[], env: BindEnv<F, I>): Promise<Binding>;
}

/** Each function paired with each of its triggers of `kind`, in load order. */
export function targetsOf<K extends string, T extends { readonly [key in K]: unknown }, F extends FunctionRef>(
  functions: readonly F[],
  kind: TriggerKind<K, T>,
): Target<T, F>[] {
  return functions.flatMap((fn) =>
    (fn.triggers as readonly T[]).filter((t) => kind.key in t).map((trigger, index) => ({ fn, trigger, index })),
  );
}

/** Any trigger kind, as the lists of kinds hold them. */
export type AnyKind = TriggerKind<string, any, any>;

/** The triggers' shape of a kind. */
export type TriggerOf<Kind> = Kind extends { readonly schema: z.ZodType<infer T> } ? T : never;

/** What the runs of a kind say of their trigger. */
export type InfoOf<Kind> = Kind extends { bind(targets: never, env: BindEnv<never, infer I>): unknown } ? I : never;
