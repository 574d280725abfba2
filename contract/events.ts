/**
 * The events providers publish and the subjects the set answers them on (docs/failing.md §5,
 * docs/rotation.md §8): what a client and the set both stand on. Imports zod and the contract only.
 */
import * as z from "zod/mini";
import { provisionName, token } from "./keys.ts";
import { rfc3339 } from "./times.ts";

/** The longest failing word kept, in characters; a longer one is cut, never refused. */
export const MAX_WORD = 1024;

const triple = { machine: token, consumer: token, at: rfc3339 };

/**
 * `<provider>.provisioner.failing` (docs/failing.md §5): `{ machine, consumer, word, at }`. Fields beyond
 * these are ignored, so a provider that says more still raises its failing.
 */
export const failingEvent = z.object({ ...triple, word: z.string().check(z.minLength(1, "must say what fails")) });
/** `<provider>.provisioner.recovered` (docs/failing.md §5): `{ machine, consumer, at }`; a `word` is ignored. */
export const recoveredEvent = z.object(triple);
export type FailingEvent = z.output<typeof failingEvent>;
export type RecoveredEvent = z.output<typeof recoveredEvent>;

/** The subject a node's notices go to (docs/rotation.md §8.5). */
export const refreshSubject = (node: string) => `mesh-provisioner.refresh.${node}`;
/** The subject a provider's releases go to (docs/rotation.md §8.6). */
export const releasedSubject = (provider: string) => `mesh-provisioner.released.${provider}`;

/** A rotation notice (docs/rotation.md §8.5): these modules of this node hold a provision rotated to `revision`. */
export const refreshNotice = z.object({
  provider: z.string(),
  provision: z.string(),
  revision: z.string(),
  at: z.string(),
  modules: z.array(z.string()),
});
export type RefreshNotice = z.output<typeof refreshNotice>;

/**
 * A release (docs/rotation.md §8.6): no holder uses what came before `revision` any more; with
 * `machine` and `consumer` both when the rotation released was of that one holder's credential.
 */
export const releasedNotice = z.object({
  provision: z.string(),
  revision: z.string(),
  at: z.string(),
  holders: z.number(),
  machine: z.optional(z.string()),
  consumer: z.optional(z.string()),
});
export type ReleasedNotice = z.output<typeof releasedNotice>;

/** The longest revision kept, in characters. */
export const MAX_REVISION = 256;

/**
 * `<provider>.provisioner.rotated` (docs/rotation.md §8.2): `{ provision, revision, at }`, and
 * `machine` and `consumer` together when only that holder's credential changed.
 */
export const rotatedEvent = z
  .object({
    provision: provisionName,
    revision: z.string().check(z.minLength(1, "must name the new revision"), z.maxLength(MAX_REVISION)),
    at: rfc3339,
    machine: z.optional(token),
    consumer: z.optional(token),
  })
  .check(
    z.refine((e) => (e.machine === undefined) === (e.consumer === undefined), {
      message: "machine and consumer go together: both (one holder) or neither (every holder)",
      path: ["consumer"],
    }),
  );
export type RotatedEvent = z.output<typeof rotatedEvent>;

/**
 * `<provider>.provisioner.acknowledged` (docs/rotation.md §8.6): the provider received the
 * release of the rotation `{ provision, revision }` (with `machine` and `consumer` for one
 * holder's), `at` by its clock. The fields of the rotated event it acknowledges.
 */
export const acknowledgedEvent = rotatedEvent;

/** The subject a node's checks go to (docs/presence.md §16.5): each node publishes its own only. */
export const checkedSubject = (node: string) => `mesh-provisioner.checked.${node}`;
/** A check's reason: one CamelCase word (`Unreachable`, `AuthFailed`, `Timeout`). */
export const CHECK_REASON = /^[A-Z][A-Za-z0-9]*$/;
/** A failing check's reason when it gives none. */
export const DEFAULT_CHECK_REASON = "CheckFailed";

/**
 * `mesh-provisioner.checked.<node>` (docs/presence.md §16.5): `{ module, provision, ok, reason?,
 * message?, revision?, at }`: the module on the node checked a provision it holds (reached the
 * provider, and the credential it holds was accepted) at `at`, with `revision` of it. A message
 * longer than {@link MAX_WORD} is cut when kept, never refused.
 */
export const checkedEvent = z.object({
  module: token,
  provision: provisionName,
  ok: z.boolean(),
  reason: z.optional(z.string().check(z.regex(CHECK_REASON, "must be one CamelCase word (AuthFailed)"), z.maxLength(64))),
  message: z.optional(z.string()),
  revision: z.optional(z.string().check(z.minLength(1, "must name the revision checked"), z.maxLength(MAX_REVISION))),
  at: rfc3339,
});
export type CheckedEvent = z.output<typeof checkedEvent>;
