/**
 * The trigger kinds, in the order they are named to a function's author and bound at start
 * (each kind's `afterBind` runs in this order once all are bound). Adding a kind is a file
 * beside this one and its name in this list (docs/runtime.md §6.9).
 */
import { cron } from "./cron.ts";
import { event } from "./event.ts";
import { http } from "./http.ts";
import type { AnyKind, InfoOf, TriggerOf } from "./kind.ts";
import { subject } from "./subject.ts";

const LIST = [subject, event, cron, http] as const;

/** What makes a function run: a trigger of one of the kinds (docs/runtime.md §6.3). */
export type Trigger = TriggerOf<(typeof LIST)[number]>;

/** What the runs of every kind say of their trigger to the handler (`ctx.trigger`). */
export type KindInfo = InfoOf<(typeof LIST)[number]>;

export const KINDS: readonly AnyKind[] = LIST;

/** The kind of a trigger: the one whose key it holds. */
export const kindOf = (trigger: object): AnyKind | undefined => KINDS.find((kind) => kind.key in trigger);
